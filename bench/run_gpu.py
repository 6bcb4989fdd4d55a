"""GPU benchmark (NVIDIA): rocmc for cuda:sm_80 (hand-written kernels on/off, cuDNN externs on/off) vs
PyTorch eager and torch.compile, same weights, same inputs.

    python -m bench.run_gpu compile [--out out/bench/gpu]   # CPU machine: one .vmfb per case and variant
    python -m bench.run_gpu run [--out out/bench/gpu]       # GPU machine: iree-base-runtime, torch, nvidia-ml-py

The modules take their weights as inputs (models.weights_as_inputs): a module with embedded weights
is as large as the weights, and the modules travel to the GPU machine. There the weights are rebuilt
from the same seed, uploaded once and kept on the device, as PyTorch keeps its parameters. Each
(case, system) runs in its own process; the parent compares every output with torch eager's and writes
<out>/gpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import models
from bench.common import timings

TARGET = "cuda:sm_80"
# case -> {variant: rocmc.compile options}. "kernels" is the default implementation choice (hand-written
# RMSNorm/RoPE kernels on GPU targets); "generated" turns them off; "cudnn" routes convolutions, pooling,
# batch norm and activations to the DNN library role (cuDNN on CUDA) through the extern-call path; "cudnn_conv" only the convolutions
# (with the rewrite stage's epilogues: batch norm folded, bias + residual + ReLU in the cuDNN call);
# "cudnn_conv_unfused" the convolutions alone, the graph compiled as given (rewrite=False).
# "+static" fixes the symbolic sequence length to the case's (2048): with a dynamic M, IREE 3.13 gives
# every matmul a GEMV-style reduction strategy on CUDA instead of tensor-core MMA (BENCHMARKS.md).
# "kernels" is the default (hand-written kernels, GEMMs and attention in IREE's code); "blas" adds the
# GEMM library role (cuBLASLt on CUDA, hipBLASLt on ROCm) for the projections and attention's two GEMMs;
# "blas_iree_attention" the library for the projections only.
_LIB = {"libraries": ["blas"]}
_LIB_IREE_ATTENTION = {**_LIB, "impl": {"sdpa": "generated"}}
_LLAMA = {
    "kernels": {},
    "blas": _LIB,
    "blas_iree_attention": _LIB_IREE_ATTENTION,
    "kernels+static": {"static": True},
    "blas+static": {**_LIB, "static": True},
    "blas_iree_attention+static": {**_LIB_IREE_ATTENTION, "static": True},
    # weights embedded (h1024 only: an h4096 module is 400 MB): the rewrite makes each x @ W of a constant W a
    # linear of W^T (linear_mm on the GPU, the skip connections in its epilogue); "matmul+const" without it
    "kernels+const": {"const": True},
    "matmul+const": {"const": True, "rewrite": False},
}
CASES = {
    "llama_h1024_s2048_f16": _LLAMA,
    "llama_h4096_s2048_f16": _LLAMA,
    "resnet18_b32_f32": {
        "generated": {"impl": "generated"},
        "cudnn_conv": {"impl": {"conv2d": "dnn", "fused_conv2d": "dnn"}},
        "cudnn_conv_unfused": {"impl": {"conv2d": "dnn"}, "rewrite": False},
        # weights embedded: batch norm folded into them at compile time (too large to
        # carry with the others: compile these with --only-variants and run them alone)
        "cudnn_conv+const": {"impl": {"conv2d": "dnn", "fused_conv2d": "dnn"}, "const": True},
        "cudnn_conv_unfused+const": {"impl": {"conv2d": "dnn"}, "rewrite": False, "const": True},
        "cudnn": {"libraries": ["dnn"]},
    },
}
WARMUP, RUNS = 5, 50


def compile_all(out: Path, only=None, variants=None) -> None:
    import rocmc

    out.mkdir(parents=True, exist_ok=True)
    for name, chosen in CASES.items():
        if only and name not in only:
            continue
        case = models.parse(name)
        base = models.rocmc_graph(case)
        dynamic = models.weights_as_inputs(base)
        static = models.rebuild(base, weights_as_inputs=True, sizes={"seq": case.seq}) if case.seq else dynamic
        for variant, opts in chosen.items():
            if variants and variant not in variants:
                continue
            opts = dict(opts)
            g = static if opts.pop("static", False) else dynamic
            if opts.pop("const", False):
                g = base
            t = time.perf_counter()
            art = rocmc.compile(g, TARGET, **opts)
            art.save(out / f"{name}.{variant}.vmfb")
            print(
                f"{name}.{variant}: {time.perf_counter() - t:.1f} s{' (cache)' if art.cached else ''}; "
                + ", ".join(f"{d['kind']} {d['name']}" for d in art.dispatches() if d["kind"] != "generated"),
                flush=True,
            )


# ---- one system, in its own process ---------------------------------------------------------------


def _device_memory_mb() -> float:
    """Device memory this process holds (NVML), context included."""
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pid = os.getpid()
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == pid and p.usedGpuMemory:
            return p.usedGpuMemory / 2**20
    info = pynvml.nvmlDeviceGetMemoryInfo(h)  # no per-process figure (containers): whole-device use
    return info.used / 2**20


def _time(fn, sync, first_s: float) -> dict:
    # A call slower than a second runs fewer times (at least 5, about 30 s in all): the whole GPU run
    # must fit one 10-minute command.
    runs = max(5, min(RUNS, int(30 / first_s))) if first_s > 1.0 else RUNS
    return timings(fn, runs, WARMUP if first_s <= 1.0 else 1, sync)


def _rocmc(case, variant, out: Path):
    import rocmc
    from iree import runtime as rt
    from rocmc.runtime.providers.cudnn import prepare_cuda

    prepare_cuda()  # library calls (cuDNN, cuBLASLt) need exportable device buffers
    g = models.rocmc_graph(case)
    mod = rocmc.load(out / f"{case.name}.{variant}.vmfb")
    weights = [] if variant.endswith("+const") else models.weight_arrays(g)
    args = [rt.asdevicearray(mod.device, a) for a in models.inputs(case) + weights]
    del g
    fn = lambda: mod(*args, output="device")
    return fn, (lambda r: r.to_host()), (lambda: None)


def _torch(case, mode, out: Path):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # f32 stays f32, as in rocmc
    torch.backends.cudnn.allow_tf32 = False
    module = models.torch_module(case).cuda()
    if mode == "compile":
        module = torch.compile(module)
    xs = [torch.from_numpy(a).cuda() for a in models.inputs(case)]

    def fn():
        with torch.inference_mode():
            return module(*xs)

    return fn, (lambda r: r.float().cpu().numpy()), torch.cuda.synchronize


def worker(case_name: str, system: str, out: Path) -> dict:
    case = models.parse(case_name)
    kind, _, variant = system.partition(":")
    fn, to_host, sync = {"rocmc": _rocmc, "torch": _torch}[kind](case, variant, out)
    t = time.perf_counter()
    y = fn()
    first = time.perf_counter() - t
    np.save(out / f"{case.name}.{system.replace(':', '-')}.npy", to_host(y).astype(np.float32))
    t = time.perf_counter()
    fn()
    sync()
    second = time.perf_counter() - t  # the first call may include compilation (torch.compile, PTX JIT)
    res = _time(fn, sync, second)
    res["first_call_s"] = first
    res["device_mb"] = _device_memory_mb()
    return res


def systems_tag(systems) -> str:
    return "_".join(sorted(s.replace(":", "-").replace("+", "_") for s in systems))


def systems_for(name: str) -> list[str]:
    return [f"rocmc:{v}" for v in CASES[name]] + ["torch:eager", "torch:compile"]


def run_all(out: Path, only=None, systems=None) -> int:
    # No CUDA context in this process: the workers' device memory readings stay their own.
    import pynvml
    from importlib.metadata import version

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(h)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "target": TARGET,
        "device": name.decode() if isinstance(name, bytes) else name,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "torch": version("torch"),
        "iree-base-runtime": version("iree-base-runtime"),
        "warmup": WARMUP,
        "runs": RUNS,
        "cases": {},
    }
    try:
        results["cudnn"] = version("nvidia-cudnn-cu13")
    except Exception:
        pass
    print(results["device"], flush=True)
    status = 0
    for name in CASES:
        if only and name not in only:
            continue
        row = {"flops": models.parse(name).flops}
        for system in systems_for(name):
            if systems and system not in systems:
                continue
            t = time.perf_counter()
            p = subprocess.run(
                [sys.executable, "-m", "bench.run_gpu", "worker", name, system, "--out", str(out)],
                capture_output=True,
                text=True,
            )
            if p.returncode:
                tail = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
                row[system] = {"error": tail}
                print(f"{name} {system}: FAILED {tail}\n{p.stderr[-1500:]}", flush=True)
                status = 1
                continue
            row[system] = json.loads(p.stdout.strip().splitlines()[-1])
            print(
                f"{name} {system:16s} median {row[system]['median_ms']:8.3f} ms  device {row[system]['device_mb']:7.0f} MB"
                f"  ({time.perf_counter() - t:.0f} s)",
                flush=True,
            )
        ref = out / f"{name}.torch-eager.npy"
        for system in systems_for(name):
            f = out / f"{name}.{system.replace(':', '-')}.npy"
            if ref.exists() and f.exists() and "error" not in row.get(system, {}):
                a, b = np.load(f).astype(np.float64), np.load(ref).astype(np.float64)
                row[system]["rel_err_vs_eager"] = float(np.abs(a - b).max() / np.abs(b).max())
        results["cases"][name] = row
    (out / (f"gpu_{systems_tag(systems)}.json" if systems else "gpu.json")).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=("compile", "run", "worker"))
    ap.add_argument("args", nargs="*")
    ap.add_argument("--out", default="out/bench/gpu")
    ap.add_argument("--cases", default="")
    ap.add_argument("--systems", default="", help="e.g. rocmc:kernels+static,torch:eager (default: all)")
    ap.add_argument("--variants", default="", help="compile: only these variants (default: all)")
    a = ap.parse_args()
    out = Path(a.out)
    only = set(a.cases.split(",")) - {""}
    if a.cmd == "compile":
        compile_all(out, only, set(a.variants.split(",")) - {""})
        return 0
    if a.cmd == "worker":
        print(json.dumps(worker(a.args[0], a.args[1], out)))
        return 0
    return run_all(out, only, set(a.systems.split(",")) - {""})


if __name__ == "__main__":
    sys.exit(main())
