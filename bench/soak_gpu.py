"""A fault soak of a 7B prefill and batched decode on a GPU, in one process: prompts of random lengths
(1 .. --longest tokens, seeded) prefilled whole (one call each, at the lengths drawn) into the slots of a
max_batch module, then decoded together by the engine (rocmc.llm.engine) until at least --steps batched decode
steps have run. Clean means: no error from the runtime, every request complete, every token inside the
vocabulary. Also counted: the prompts whose first token (greedy) is the one the same prompt gets alone in a fresh
engine (the prefill of one row reads nothing of the others; random weights leave near ties, so a count).

Then the batched prefill of the prefill issue: max_batch prompts of 1024 / max_batch tokens, each prefilled into its
slot (one call each: rows are prefilled one at a time), against one prompt of 1024 tokens prefilled whole, wall
time until the last row's first token is on the host (median of 3, fresh slot tables).

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
    """Seconds (median of 3) to prefill `rows` prompts of total / rows tokens into their slots, and one prompt of
    `total` tokens, each whole in one call (fresh slot tables)."""
    from rocmc.llm.runtime import _SlotTable

    def run(prompts) -> float:
        slots = _SlotTable(lm.sizes, lm.config, chunk=total)
        t = time.perf_counter()
        for r, ids in enumerate(prompts):
            for feeds in slots.prefill(r, ids):
                out = lm.module.prefill(**feeds, output="device")
            out[0].to_host()
        return time.perf_counter() - t

    many = [[int(t) for t in rng.integers(3, vocab, total // rows)] for _ in range(rows)]
    one = [[int(t) for t in rng.integers(3, vocab, total)]]
    run(many), run(one)  # warm: each length's first call
    t_many = statistics.median(run(many) for _ in range(3))
    t_one = statistics.median(run(one) for _ in range(3))
    return {"rows": rows, "tokens": total, "rows_ms": 1e3 * t_many, "one_ms": 1e3 * t_one, "ratio": t_many / t_one}


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
