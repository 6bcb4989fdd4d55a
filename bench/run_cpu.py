"""CPU benchmark: rocmc (llvm-cpu, local-task) vs ONNX Runtime (the same model's ONNX export) vs PyTorch eager.

    python -m bench.run_cpu [--cases llama_h1024_s128_f32,...] [--runs 20] [--threads 2] [--out out/bench]

Every system runs the same weights on the same inputs with the same number of threads. Each
(case, system) runs in a fresh process, so thread pools never compete and the peak RSS is that
system's alone; the parent compares the outputs and writes <out>/cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import models
from bench.common import timings

DEFAULT_CASES = ("llama_h1024_s128_f32", "llama_h1024_s2048_f32", "resnet18_b1_f32", "resnet18_b32_f32")
SYSTEMS = ("rocmc", "rocmc_tuned", "onnxruntime", "torch")
# rocmc's iree-compile flags per rocmc system and model: the default (none), and "tuned": IREE's CPU data
# tiling (packed mmt4d matmuls), plus im2col for the CNN's convolutions (convolutions become matmuls that
# data tiling then packs). rocmc does not pass these by default; BENCHMARKS.md has the effect of each.
DATA_TILING = ("--iree-opt-data-tiling",)
ROCMC_FLAGS = {
    "rocmc": {"llama": (), "resnet18": ()},
    "rocmc_tuned": {"llama": DATA_TILING, "resnet18": ("--iree-global-opt-use-im2col-for-convs",) + DATA_TILING},
}
WARMUP = 3
# A system whose first call takes longer than SLOW_S runs fewer times (at least MIN_RUNS, within about
# SLOW_BUDGET_S): a 15 s call timed 20 times would take the whole benchmark's budget. The result says so.
SLOW_S, MIN_RUNS, SLOW_BUDGET_S = 2.0, 5, 60.0


def _median_ms(fn, runs: int, first_s: float) -> dict:
    if first_s > SLOW_S:
        runs = max(MIN_RUNS, min(runs, int(SLOW_BUDGET_S / first_s)))
    return timings(fn, runs, 1 if first_s > SLOW_S else WARMUP)


# ---- one system, in its own process ---------------------------------------------------------------


def _rocmc_runner(system):
    def run(case, xs, threads, work: Path):
        import iree.runtime as rt

        rt.flags.parse_flags(f"--task_topology_group_count={threads}")  # before the device exists
        import rocmc

        vmfb = work / f"{case.graph_key}.{system}.vmfb"
        if not vmfb.exists() and vmfb.with_suffix(".error").exists():
            raise SystemExit(f"compile failed: {vmfb.with_suffix('.error').read_text()}")
        mod = rocmc.load(vmfb, device="local-task")
        return lambda: mod(*xs)

    return run


def _run_onnxruntime(case, xs, threads, work: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(work / f"{case.name}.onnx"), so, providers=["CPUExecutionProvider"])
    feed = {"x": xs[0]}
    return lambda: sess.run(None, feed)[0]


def _run_torch(case, xs, threads, work: Path):
    import torch

    torch.set_num_threads(threads)
    module = models.torch_module(case)
    args = [torch.from_numpy(x) for x in xs]

    def call():
        with torch.inference_mode():
            return module(*args).numpy()

    return call


RUNNERS = {
    "rocmc": _rocmc_runner("rocmc"),
    "rocmc_tuned": _rocmc_runner("rocmc_tuned"),
    "onnxruntime": _run_onnxruntime,
    "torch": _run_torch,
}


def worker(case_name: str, system: str, runs: int, threads: int, work: Path) -> dict:
    case = models.parse(case_name)
    xs = models.inputs(case)
    fn = RUNNERS[system](case, xs, threads, work)
    t = time.perf_counter()
    y = fn()
    first = time.perf_counter() - t
    np.save(work / f"{case.name}.{system}.npy", np.asarray(y))
    res = _median_ms(fn, runs, first)
    res["first_call_s"] = first
    res["peak_rss_mb"] = _vm_hwm_mb()
    return res


def _vm_hwm_mb() -> float:
    """Peak RSS of this process (ru_maxrss would carry the parent's peak over fork + exec)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---- the parent -----------------------------------------------------------------------------------


def prepare(case, work: Path) -> None:
    """Compile the rocmc module (through the cache) and export the ONNX model, once per case."""
    import rocmc

    graph = None
    for system, per_model in ROCMC_FLAGS.items():
        flags = per_model[case.model]
        # Always through rocmc.compile: its cache makes a repeat cheap, and a stale .vmfb from older
        # sources is never measured.
        vmfb = work / f"{case.graph_key}.{system}.vmfb"
        vmfb.unlink(missing_ok=True)
        vmfb.with_suffix(".error").unlink(missing_ok=True)
        graph = graph or models.rocmc_graph(case)
        t = time.perf_counter()
        try:
            art = rocmc.compile(graph, "cpu", flags=flags)
        except rocmc.RocmcError as e:  # recorded; that system's worker then reports it
            first = next((l for l in str(e).splitlines() if "error:" in l), str(e).splitlines()[0])
            vmfb.with_suffix(".error").write_text(first.strip()[:300])
            print(f"  {case.graph_key} ({system}): compile failed: {first.strip()[:200]}", flush=True)
            continue
        art.save(vmfb)
        print(
            f"  compiled {case.graph_key} for cpu ({system}) in {time.perf_counter() - t:.1f} s"
            f"{' (cache)' if art.cached else ''}",
            flush=True,
        )
    # Exported on every run (the weights follow the examples' code), in a child process: the
    # exporter's memory and threads stay out of the measurements.
    subprocess.run(
        [sys.executable, "-m", "bench.run_cpu", "--export", case.name, "--out", str(work.parent)], check=True
    )


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def versions() -> dict:
    out = {"python": platform.python_version(), "cpu": _cpu_model(), "cores": os.cpu_count()}
    for mod in ("torch", "onnxruntime", "onnx", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            pass
    from importlib.metadata import version

    out["iree-base-runtime"] = version("iree-base-runtime")
    out["iree-base-compiler"] = version("iree-base-compiler")
    return out


def _cpu_model() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--worker", nargs=2, metavar=("CASE", "SYSTEM"), help=argparse.SUPPRESS)
    ap.add_argument("--export", metavar="CASE", help=argparse.SUPPRESS)
    a = ap.parse_args()
    out = Path(a.out)
    work = out / "cpu"
    work.mkdir(parents=True, exist_ok=True)
    if a.export:
        models.export_onnx(models.parse(a.export), work / f"{a.export}.onnx")
        return 0
    if a.worker:
        print(json.dumps(worker(*a.worker, a.runs, a.threads, work)))
        return 0

    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "threads": a.threads,
        "runs": a.runs,
        "warmup": WARMUP,
        "versions": versions(),
        "cases": {},
    }
    for name in a.cases.split(","):
        case = models.parse(name)
        print(f"{name}:", flush=True)
        prepare(case, work)
        row = {"flops": case.flops, "load_avg_before": os.getloadavg()[0]}
        for system in a.systems.split(","):
            cmd = [
                sys.executable,
                "-m",
                "bench.run_cpu",
                "--worker",
                name,
                system,
                "--runs",
                str(a.runs),
                "--threads",
                str(a.threads),
                "--out",
                str(out),
            ]
            t = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode:
                print(f"  {system}: FAILED\n{p.stderr[-2000:]}", flush=True)
                row[system] = {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"}
                continue
            row[system] = json.loads(p.stdout.strip().splitlines()[-1])
            print(
                f"  {system:12s} median {row[system]['median_ms']:9.2f} ms  peak RSS "
                f"{row[system]['peak_rss_mb']:7.0f} MB  ({time.perf_counter() - t:.0f} s)",
                flush=True,
            )
        ref = work / f"{name}.torch.npy"
        for system in a.systems.split(","):
            got = work / f"{name}.{system}.npy"
            if system != "torch" and ref.exists() and got.exists() and "error" not in row.get(system, {}):
                row[system]["rel_err_vs_torch"] = rel_err(np.load(got), np.load(ref))
        if "median_ms" in row.get("rocmc", {}) and "median_ms" in row.get("onnxruntime", {}):
            row["rocmc_over_ort"] = row["rocmc"]["median_ms"] / row["onnxruntime"]["median_ms"]
        if "median_ms" in row.get("rocmc_tuned", {}) and "median_ms" in row.get("onnxruntime", {}):
            row["rocmc_tuned_over_ort"] = row["rocmc_tuned"]["median_ms"] / row["onnxruntime"]["median_ms"]
        if "median_ms" in row.get("rocmc", {}) and "median_ms" in row.get("torch", {}):
            row["rocmc_over_torch"] = row["rocmc"]["median_ms"] / row["torch"]["median_ms"]
        print(
            "  "
            + ", ".join(f"{k} {v:.3g}" for k, v in row.items() if "_over_" in k)
            + "".join(
                f", {s} err {row[s]['rel_err_vs_torch']:.1e}" for s in SYSTEMS if "rel_err_vs_torch" in row.get(s, {})
            ),
            flush=True,
        )
        row["load_avg_after"] = os.getloadavg()[0]
        results["cases"][name] = row
    (out / "cpu.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {out / 'cpu.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
