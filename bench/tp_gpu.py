"""Tensor-parallel Llama on NVIDIA GPUs: N processes, one per GPU, NCCL all-reduces enqueued by IREE;
against the same model on one GPU.

    python -m bench.tp_gpu compile [--dir out/tp_gpu]       # CPU machine with rocmc: a config.json per shape
                                                           # and one .vmfb per (shape, degree), cuda:sm_80
    bench/tp_gpu.sh run [OUTDIR]                           # GPU machine: every run below, then the report
    python -m bench.tp_gpu run --shape 7b --tp 2 ...       # one run (under `rocmc launch -n 2` for --tp 2)
    python -m bench.tp_gpu report [--dir out/tp_gpu]       # the table of BENCHMARKS.md from the runs' JSON

Weights are made in memory by each rank, never written (a 70B checkpoint is 140 GB): every tensor is
BLOCKS blocks along the axis the plan splits it on (axis 0 for a tensor held whole), block k drawn on the
GPU by torch's generator seeded with (the tensor's index, k). A rank draws only the blocks of its slices,
so the model of every degree is the same model. Matrices N(0, 0.02), norm weights 1 + N(0, 0.01); f16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench import llm_gpu

BLOCKS = 8  # degrees 1, 2, 4 and 8 take whole blocks
SHAPES = {
    "small": {
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "vocab_size": 8000,
    },
    "7b": llm_gpu.SHAPES["7b"],
    "70b": {
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    },
}
RUNS = [("small", 1), ("small", 2), ("7b", 1), ("7b", 2), ("70b", 2)]
MAX_SEQ_LEN = 512


def config_json(shape: str) -> dict:
    return llm_gpu.llama_config({**SHAPES[shape], "max_position_embeddings": 4096})


def vmfb(d: Path, shape: str, tp: int) -> Path:
    return d / f"{shape}_tp{tp}.vmfb"


def compile_all(a) -> None:
    import rocmc

    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    for shape, tp in RUNS:
        (d / shape).mkdir(exist_ok=True)
        (d / shape / "config.json").write_text(json.dumps(config_json(shape), indent=1))
        t = time.perf_counter()
        art = rocmc.llm.compile_hf(
            d / shape / "config.json", "cuda:sm_80", max_seq_len=MAX_SEQ_LEN, max_batch=1, tensor_parallel=tp
        )
        art.save(vmfb(d, shape, tp))
        print(
            f"{shape} tp={tp}: {time.perf_counter() - t:.0f} s, {vmfb(d, shape, tp).stat().st_size} bytes", flush=True
        )


# ---- weights ----------------------------------------------------------------------------------------


def weights(torch, cfg, plan, rank: int, degree: int, dev: str) -> dict:
    """This rank's slice of every parameter, drawn block by block on the GPU (see the module docstring)."""
    from rocmc.llm import sharding
    from rocmc.llm.config import param_names

    shapes = dict(param_names(cfg))
    index = {n: i for i, n in enumerate(shapes)}
    # The blocks run along the axis the plan splits (whatever the degree, 1 included): one model for all. A joined
    # projection (q/k/v, gate/up) is each checkpoint tensor's blocks of the rank, concatenated, as the runtime
    # joins a checkpoint's.
    shards = (plan or sharding.plan(cfg, 1)).shards
    out = {}
    for name, sh in shards.items():
        axis = 0 if sh.axis is None else sh.axis
        split = sh.axis is not None and degree > 1
        blocks = range(rank * BLOCKS // degree, (rank + 1) * BLOCKS // degree) if split else range(BLOCKS)
        parts = []
        for source in sh.sources:
            for k in blocks:
                shape = list(shapes[source])
                shape[axis] //= BLOCKS
                gen = torch.Generator(device=dev).manual_seed(index[source] * 1000 + k)
                x = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32)
                x = x * 0.01 + 1.0 if len(shape) == 1 else x * 0.02
                parts.append(x.to(torch.float16))
        out[name] = torch.cat(parts, dim=axis).cpu().numpy()
        del parts
    torch.cuda.empty_cache()
    return out


# ---- one run ----------------------------------------------------------------------------------------


def run(a) -> int:
    import torch
    import rocmc
    from rocmc.llm import sharding
    from rocmc.llm.config import load_config
    from bench.common import timings

    d = Path(a.dir)
    rank = int(os.environ.get("RANK", "0"))
    dev = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    torch.cuda.set_device(dev)
    cfg = load_config(d / a.shape)
    plan = sharding.plan(cfg, a.tp) if a.tp > 1 else None
    t = time.perf_counter()
    arrays = weights(torch, cfg, plan, rank, a.tp, dev)
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    lm = rocmc.llm.load(vmfb(d, a.shape, a.tp), d / a.shape, tensor_parallel=a.tp, parameters=arrays)
    del arrays
    load_s = time.perf_counter() - t
    free, total = torch.cuda.mem_get_info()
    rng = np.random.default_rng(0)
    prompt = [int(x) for x in rng.integers(3, cfg.vocab_size, a.prompt_len)]
    tokens = lm.generate(prompt, a.new_tokens, stop_tokens=())

    run1 = llm_gpu.OnePrompt(lm, prompt)
    pre = timings(lambda: run1.prefill()[0], a.reps, 2)
    state = {"nxt": run1.prefill()[0]}
    steps = []
    for _ in range(a.new_tokens):
        t = time.perf_counter()
        state["nxt"] = lm.module.decode(**run1.decode_feeds(state["nxt"]), output="device")[0].to_host()
        steps.append(time.perf_counter() - t)
    step_ms = 1e3 * statistics.median(steps[4:])
    state = {"nxt": run1.prefill()[0]}

    def decode():
        state["nxt"] = lm.module.decode(**run1.decode_feeds(state["nxt"]), output="device")[0].to_host()

    if lm.group is not None:
        lm.group.barrier()  # the ranks start profiling together: NCCL kernels wait for the slower rank
    prof = llm_gpu.kernel_profile(torch, decode, 48)
    nccl = sum(k["ms_per_call"] for k in prof["top"] if "nccl" in k["name"].lower())
    res = {
        "shape": a.shape,
        "tp": a.tp,
        "rank": rank,
        "device": torch.cuda.get_device_name(dev),
        "gpus": torch.cuda.device_count(),
        "weights_gen_s": gen_s,
        "load_s": load_s,
        "device_used_gib": (total - free) / 2**30,
        "prompt_len": a.prompt_len,
        "tokens": tokens,
        "prefill_ms": pre["median_ms"],
        "decode_ms_per_token": step_ms,
        "decode_tokens_per_s": 1e3 / step_ms,
        "decode_profile": {
            "wall_ms": prof["wall_ms_per_call"],
            "gpu_busy_ms": prof["gpu_busy_ms_per_call"],
            "nccl_kernel_ms": nccl,
            "kernels": prof["kernels_per_call"],
        },
        "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
    }
    if rank == 0:
        Path(a.json).write_text(json.dumps(res, indent=1))
        print(json.dumps({k: v for k, v in res.items() if k != "tokens"}), flush=True)
    return 0


def report(a) -> int:
    d = Path(a.dir)
    rows = {(r["shape"], r["tp"]): r for r in (json.loads(p.read_text()) for p in sorted(d.glob("run_*.json")))}
    print(
        "| shape | GPUs | memory used per GPU | prefill 128 tok (ms) | decode (tok/s) | speed-up vs 1 GPU | NCCL kernel "
        "share of a decode step | greedy tokens equal to 1 GPU |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (shape, tp), r in sorted(rows.items(), key=lambda kv: (list(SHAPES).index(kv[0][0]), kv[0][1])):
        one = rows.get((shape, 1))
        speed = (
            f"{r['decode_tokens_per_s'] / one['decode_tokens_per_s']:.2f}x (efficiency "
            f"{r['decode_tokens_per_s'] / one['decode_tokens_per_s'] / tp:.0%})"
            if one and tp > 1
            else "-"
        )
        same = (
            "-"
            if not one or tp == 1
            else (
                "yes"
                if r["tokens"] == one["tokens"]
                else f"first {next(i for i, (x, y) in enumerate(zip(r['tokens'], one['tokens'])) if x != y)} of {len(one['tokens'])}"
            )
        )
        share = r["decode_profile"]["nccl_kernel_ms"] / r["decode_profile"]["wall_ms"]
        print(
            f"| {shape} | {tp} | {r['device_used_gib']:.1f} GiB | {r['prefill_ms']:.1f} | "
            f"{r['decode_tokens_per_s']:.1f} | {speed} | {share:.0%} ({r['decode_profile']['nccl_kernel_ms']:.2f} of "
            f"{r['decode_profile']['wall_ms']:.2f} ms) | {same} |"
        )
    first = next(iter(rows.values()), None)
    if first:
        print(f"\n{first['device']} x {first['gpus']}, NCCL_NVLS_ENABLE={first['nccl_nvls_enable']}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=("compile", "run", "report"))
    ap.add_argument("--dir", default="out/tp_gpu")
    ap.add_argument("--shape", choices=list(SHAPES), default="7b")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if a.cmd == "compile":
        compile_all(a)
        return 0
    if a.cmd == "report":
        return report(a)
    a.json = a.json or str(Path(a.dir) / f"run_{a.shape}_tp{a.tp}.json")
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
