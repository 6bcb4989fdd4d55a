"""Continuous batching on a GPU (rocmc.llm.engine, the scheduler under `rocmc serve`), without HTTP.

A fixed mix of requests (prompt lengths 64-768, outputs 32-256 tokens, greedy, seeded) runs through the engine
with C of them in flight at once (C clients, each sending its next request when its last one ends), for C in
--concurrency. Per C: output tokens/s, time to first token and inter-token latency (p50, p99), and the decode
steps that ran no prefill chunk ("between admissions") against the raw batched decode step of the same module
(every slot filled, then steps timed alone, as bench/llm_gpu.py's batches).

    python -m bench.llm_gpu compile --dir out/llm --targets cuda:sm_80 --batches 32     # here
    python3 -m bench.engine_gpu --dir out/llm --ckpt /tmp/ck --json out.json            # GPU machine

Each concurrency runs once with the engine's decode steps issued ahead of the tokens read (its default) and once
with every step read before the next is issued (--modes). --sample draws every request (temperature 0.7, top-k
50, top-p 0.9, seeded) instead of greedy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.llm_gpu import fill_slots, time_decode, vmfb_name, write_checkpoint


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if xs else None


def mix(n: int, vocab: int, seed: int = 3, longest: int = 768) -> list:
    """n (prompt ids, output length) pairs: prompts of 64..longest tokens, outputs of 32..256."""
    rng = np.random.default_rng(seed)
    return [
        ([int(t) for t in rng.integers(3, vocab, int(p))], int(o))
        for p, o in zip(rng.integers(64, longest + 1, n), rng.integers(32, 257, n))
    ]


# --sample: every request drawn with these settings (its seed its index in the mix), as chat clients ask
SAMPLED = {"do_sample": True, "temperature": 0.7, "top_k": 50, "top_p": 0.9}


def run_clients(lm, requests: list, clients: int, issue_ahead: bool = True, sample: bool = False) -> dict:
    from rocmc.llm.engine import Engine

    prefills = [0]
    real = lm.module.prefill

    def counted(**kw):
        prefills[0] += 1
        return real(**kw)

    lm.module.prefill = counted
    engine = Engine(lm, prefill_chunk=512, issue_ahead=issue_ahead)
    todo, sent, first, last, ttft, itl, tokens = list(requests), {}, {}, {}, [], [], 0
    pure_steps = []  # (seconds, decoding rows) of steps that ran no prefill chunk
    t0 = time.perf_counter()
    try:
        while todo or not engine.idle:
            while todo and len(engine.running) + len(engine.waiting) < clients:
                ids, n = todo.pop(0)
                settings = SAMPLED | {"seed": len(requests) - len(todo)} if sample else {"do_sample": False}
                req = engine.submit(ids, max_new_tokens=n, stop_tokens=(), **settings)
                sent[req.id] = time.perf_counter()
            before, rows = prefills[0], sum(r.state == "decode" for r in engine.running)
            t = time.perf_counter()
            events = engine.step()
            dt = time.perf_counter() - t
            now = time.perf_counter()
            if prefills[0] == before and rows:
                pure_steps.append((dt, rows))
            for ev in events:
                if ev.token is None:
                    continue
                tokens += 1
                rid = ev.request.id
                if rid not in first:
                    first[rid] = now
                    ttft.append(now - sent[rid])
                else:
                    itl.append(now - last[rid])
                last[rid] = now
    finally:
        lm.module.prefill = real
    wall = time.perf_counter() - t0
    full = [dt for dt, rows in pure_steps if rows == lm.sizes.max_batch]
    return {
        "issue_ahead": issue_ahead,
        "sampled": sample,
        "clients": clients,
        "requests": len(requests),
        "output_tokens": tokens,
        "wall_s": wall,
        "output_tok_s": tokens / wall,
        "ttft_s_p50_p99": [pct(ttft, 50), pct(ttft, 99)],
        "itl_s_p50_p99": [pct(itl, 50), pct(itl, 99)],
        "decode_steps_without_prefill": len(pure_steps),
        "full_batch_step_ms_median": 1e3 * statistics.median(full) if full else None,
        "decode_steps": engine.steps,
        "prefill_calls": prefills[0],
    }


def raw_step_ms(lm, vocab: int, steps: int = 24) -> float:
    """Every slot prefilled (prompts of 400 tokens), then decode steps alone: the median step."""
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, vocab, 400)] for _ in range(lm.sizes.max_batch)]
    times, _ = time_decode(lm, *fill_slots(lm, prompts), steps)
    return 1e3 * statistics.median(times[4:])


def module_arguments(max_batch: int, description: str | None = None) -> argparse.ArgumentParser:
    """The options naming a compiled max_batch module and its checkpoint (the GPU benchmarks of the engine)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--dir", required=True, help="where bench.llm_gpu compiled the module (and its config.json)")
    ap.add_argument("--ckpt", default="/tmp/llm_gpu_ckpt")
    ap.add_argument("--json", required=True)
    ap.add_argument("--target", default="cuda:sm_80")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-batch", type=int, default=max_batch)
    return ap


def arguments(concurrency: str, requests: int) -> argparse.ArgumentParser:
    """The options of a load benchmark (this one and bench/serve_gpu.py)."""
    ap = module_arguments(32)
    ap.add_argument("--concurrency", default=concurrency, help="clients at once, a run each")
    ap.add_argument("--requests", type=int, default=requests)
    return ap


def main() -> int:
    ap = arguments("1,8,32", 64)
    ap.add_argument(
        "--modes",
        default="ahead,in-turn",
        help="the engine's decode steps issued ahead of the tokens read, or each read before the next (a run each)",
    )
    ap.add_argument("--sample", action="store_true", help="requests sampled (temperature 0.7, top-k 50, top-p 0.9)")
    a = ap.parse_args()
    import rocmc

    cfg = json.loads((Path(a.dir) / "config.json").read_text())
    write_checkpoint(cfg, Path(a.ckpt))
    lm = rocmc.llm.load(Path(a.dir) / vmfb_name(a.target, a.max_batch), Path(a.ckpt), device=a.device)
    out = {"max_batch": a.max_batch, "raw_full_batch_step_ms": raw_step_ms(lm, cfg["vocab_size"]), "runs": []}
    requests = mix(a.requests, cfg["vocab_size"])
    alone = run_clients(lm, requests[:1], 1)
    out["one_request_alone"] = alone
    for c in [int(x) for x in a.concurrency.split(",")]:
        for mode in a.modes.split(","):
            res = run_clients(lm, requests if c > 1 else requests[:8], c, mode == "ahead", a.sample)
            out["runs"].append(res)
            print(json.dumps(res), flush=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("max_batch", "raw_full_batch_step_ms")}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
