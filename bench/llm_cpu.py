"""A 1.1B LLM on this machine's CPU: a TinyLlama-1.1B-shaped model with random f16 weights written as a
safetensors checkpoint (bench/llm_gpu.py's writer: seeded numpy, Hugging Face naming), compiled for the CPU
(f32, the weights converted once at load) and run: prefill latency and decode tokens/s.

    python -m bench.llm_cpu [--ckpt /tmp/rocmc-tinyllama] [--prompt-len 32] [--new 16]

Compile time and memory of a 7B config from config.json alone: `python -m bench.llm_gpu compile`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.compile_time import vm_hwm_mb
from bench.llm_gpu import config_json, write_checkpoint


def run(ckpt: Path, prompt_len: int, new: int) -> dict:
    import rocmc

    cfg = config_json("tinyllama")
    t = time.perf_counter()
    weights = write_checkpoint(cfg, ckpt)
    print(json.dumps({"weights": weights, "seconds": round(time.perf_counter() - t, 1)}), flush=True)
    t = time.perf_counter()
    lm = rocmc.llm.load_hf(ckpt, "cpu", max_seq_len=prompt_len + new + 16, cache=False)
    load_s = time.perf_counter() - t
    ids = [int(i) for i in np.random.default_rng(1).integers(3, cfg["vocab_size"], size=prompt_len)]
    t = time.perf_counter()
    steps = []
    for _ in lm.stream(ids, new, stop_tokens=()):
        steps.append(time.perf_counter() - t)
        t = time.perf_counter()
    return {
        "compile_and_load_s": round(load_s, 1),
        "prefill_ms": round(steps[0] * 1e3, 1),
        "decode_ms_per_token_median": round(float(np.median(steps[1:])) * 1e3, 1),
        "decode_tokens_per_s": round(1 / float(np.median(steps[1:])), 2),
        "python_peak_mb": round(vm_hwm_mb()),
        "parameter_notes": len(lm.module.parameter_notes),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="/tmp/rocmc-tinyllama")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=16)
    a = ap.parse_args()
    print(json.dumps(run(Path(a.ckpt), a.prompt_len, a.new)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
