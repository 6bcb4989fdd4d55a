"""Compile time and compile memory: cold (empty cache) and cached compiles of each model for each target.

    python -m bench.compile_time [--models llama_h1024_f32,...] [--targets cpu,gfx942,cuda:sm_80] [--out out/bench]

Each measurement runs in a fresh process with its own cache directory: "cold" compiles into the empty
cache (graph -> MLIR -> iree-compile), "cached" is a second process asking for the same module (graph
hash, key, the entry's trust checks and the sha256 of its files: a process verifies an entry the first
time it uses it), and "again" a second compile in that process (the entry's stamp only). The graph is built before the clock starts. Peak RSS: the Python
process (VmHWM) and the largest iree-compile child (RUSAGE_CHILDREN).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import models

# Graphs (sequence length / batch as built for the CPU runs: the llama block's sequence is symbolic).
MODELS = {
    "llama_h1024_f32": "llama_h1024_s128_f32",
    "llama_h4096_f16": "llama_h4096_s128_f16",
    "resnet18_b1_f32": "resnet18_b1_f32",
}
TARGETS = ("cpu", "gfx942", "cuda:sm_80")


def vm_hwm_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one(model: str, target: str) -> dict:
    import rocmc

    t = time.perf_counter()
    g = models.rocmc_graph(models.parse(MODELS[model]))
    build = time.perf_counter() - t
    t = time.perf_counter()
    art = rocmc.compile(g, target)
    dt = time.perf_counter() - t
    again = None
    if art.cached:
        t = time.perf_counter()
        rocmc.compile(g, target)
        again = time.perf_counter() - t
    return {
        "seconds": dt,
        "again_seconds": again,
        "graph_build_s": build,
        "cached": art.cached,
        "vmfb_mb": art.size / 2**20,
        "peak_rss_mb": vm_hwm_mb(),
        "iree_compile_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(*a.one)))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg_start": os.getloadavg()[0],
        "rows": [],
    }
    for model in a.models.split(","):
        for target in a.targets.split(","):
            with tempfile.TemporaryDirectory(prefix="rocmc-cache-") as cache:
                env = dict(os.environ, ROCMC_CACHE_DIR=cache, ROCMC_CACHE="1")
                row = {"model": model, "target": target}
                for label in ("cold", "cached", "cached"):
                    if label == "cached" and row.get("cached", {}).get("cached"):
                        break
                    p = subprocess.run(
                        [sys.executable, "-m", "bench.compile_time", "--one", model, target],
                        env=env,
                        capture_output=True,
                        text=True,
                    )
                    if p.returncode:
                        row[label] = {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
                        print(f"{model} {target} {label}: FAILED {row[label]['error']}", flush=True)
                        break
                    # The cache key includes a digest of rocmc's sources: an edit between the two
                    # processes makes the second one a miss, so a miss is retried once (and recorded).
                    row["cached_retries"] = row.get("cached_retries", -1) + (label == "cached")
                    row[label] = json.loads(p.stdout.strip().splitlines()[-1])
                results["rows"].append(row)
                if "seconds" in row.get("cached", {}):
                    c, w = row["cold"], row["cached"]
                    print(
                        f"{model:16s} {target:11s} cold {c['seconds']:6.2f} s (RSS {c['peak_rss_mb']:.0f} MB, "
                        f"iree-compile {c['iree_compile_peak_rss_mb']:.0f} MB)  cached {w['seconds'] * 1e3:7.1f} ms"
                        f"  again {w['again_seconds'] * 1e3:6.1f} ms"
                        f"  vmfb {c['vmfb_mb']:.1f} MB",
                        flush=True,
                    )
    results["load_avg_end"] = os.getloadavg()[0]
    (out / "compile_time.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {out / 'compile_time.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
