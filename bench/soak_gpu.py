"""A fault soak of a 7B prefill and batched decode on a GPU, in one process: prompts of random lengths
(1 .. --longest tokens, seeded) prefilled whole (one call each, at the lengths drawn) into the slots of a
max_batch module, then decoded together by the engine (rocmc.llm.engine) until at least --steps batched decode
steps have run. Clean means: no error from the runtime, every request complete, every token inside the
vocabulary. Also counted: the prompts whose first token (greedy) is the one the same prompt gets alone in a fresh
engine (the prefill of one row reads nothing of the others; random weights leave near ties, so a count).

Then the batched prefill: max_batch prompts of 1024 / max_batch tokens prefilled into their slots, one call a row
and all rows in one call, against one prompt of 1024 tokens prefilled whole, wall time until every row's last
logits are on the host (median of 3, fresh slot tables), and how far the rows' last logits of the two ways differ.

    python -m bench.llm_gpu compile --dir out/soak --targets cuda:sm_80 --batches 8 --max-seq-len 1280   # here
    python3 -m bench.soak_gpu --dir out/soak --max-batch 8 --json out.json                               # GPU machine
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.engine_gpu import module_arguments
from bench.llm_gpu import vmfb_name, write_checkpoint


def batched_prefill(lm, vocab: int, rows: int, rng, total: int) -> dict:
    """Seconds (median of 3; fresh slot tables) to prefill `rows` prompts of total / rows tokens into their slots,
    one call each and all in one call (rows folded into the projections' rows), against one prompt of `total`
    tokens in one call; and the largest relative difference of a row's last logits between the two ways."""
    from rocmc.llm.runtime import _SlotTable

    def run(prompts, together: bool):
        slots = _SlotTable(lm.sizes, lm.config, chunk=total)
        pairs = list(enumerate(prompts))
        calls = list(slots.prefill_rows(pairs)) if together else [c for p in pairs for c in slots.prefill_rows([p])]
        t = time.perf_counter()
        outs = [(call, lm.module.prefill(**feeds, output="device")) for call, feeds in calls]
        logits = {slot: out[1].to_host()[j] for call, out in outs for j, slot in enumerate(call)}
        return time.perf_counter() - t, logits, len(calls)

    many = [[int(t) for t in rng.integers(3, vocab, total // rows)] for _ in range(rows)]
    one = [[int(t) for t in rng.integers(3, vocab, total)]]
    _, alone, _ = run(many, False)  # (and warm: each length's first call)
    _, together, n_calls = run(many, True)
    run(one, False)
    diff = max(
        float(np.linalg.norm(together[r].astype(np.float64) - alone[r]) / np.linalg.norm(alone[r])) for r in alone
    )
    t_alone = statistics.median(run(many, False)[0] for _ in range(3))
    t_together = statistics.median(run(many, True)[0] for _ in range(3))
    t_one = statistics.median(run(one, False)[0] for _ in range(3))
    return {
        "rows": rows,
        "tokens": total,
        "one_call_a_row_ms": 1e3 * t_alone,
        "rows_in_one_call_ms": 1e3 * t_together,
        "calls": n_calls,
        "one_prompt_ms": 1e3 * t_one,
        "ratio": t_together / t_one,
        "ratio_one_call_a_row": t_alone / t_one,
        "last_logits_rel_diff": diff,
    }


def main() -> int:
    ap = module_arguments(8, __doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--longest", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    import rocmc
    from rocmc.llm.engine import Engine

    cfg = json.loads((Path(a.dir) / "config.json").read_text())
    write_checkpoint(cfg, Path(a.ckpt))
    lm = rocmc.llm.load(Path(a.dir) / vmfb_name(a.target, a.max_batch), Path(a.ckpt), device=a.device)
    vocab, rng = cfg["vocab_size"], np.random.default_rng(11)
    lengths = [int(n) for n in rng.integers(1, a.longest + 1, a.prompts)]
    prompts = [[int(t) for t in rng.integers(3, vocab, n)] for n in lengths]
    new = -(-a.steps * a.max_batch // a.prompts)  # tokens a request: enough steps with every slot busy
    out = {"lengths": lengths, "new_tokens": new, "max_batch": a.max_batch, "errors": []}

    # Each prompt alone first: its last position's logits in slot 0 of a fresh engine, one prefill call.
    alone = []
    for ids in prompts:
        e = Engine(lm, prefill_chunk=a.longest)
        req = e.submit(ids, max_new_tokens=1, do_sample=False, stop_tokens=())
        while not e.idle:
            e.step()
        alone.append(req.tokens[0] if req.tokens else None)

    # Then all of them through the engine: prefills at the lengths drawn, into whichever slot is free, between
    # batched decode steps of the rows in flight.
    engine = Engine(lm, prefill_chunk=a.longest)
    reqs = [engine.submit(ids, max_new_tokens=new, do_sample=False, stop_tokens=()) for ids in prompts]
    t0, steps = time.perf_counter(), 0
    try:
        while not engine.idle:
            engine.step()
            steps += 1
    except Exception as e:  # noqa: BLE001 - the soak reports what stopped it
        out["errors"].append(f"{type(e).__name__}: {e}")
    out["engine_steps"] = steps
    out["decode_steps"] = engine.steps
    out["wall_s"] = time.perf_counter() - t0
    tokens = [r.tokens for r in reqs]
    out["tokens_in_vocab"] = all(0 <= t < vocab for ts in tokens for t in ts)
    out["complete"] = all(len(ts) == new for ts in tokens)
    out["first_token_equals_alone"] = sum(ts[:1] == [t] for ts, t in zip(tokens, alone))
    out["clean"] = not out["errors"] and out["tokens_in_vocab"] and out["complete"]
    total = min(1024, lm.sizes.max_seq_len) // a.max_batch * a.max_batch
    out["batched_prefill"] = batched_prefill(lm, vocab, a.max_batch, rng, total)
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(out), flush=True)
    return 0 if out["clean"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
