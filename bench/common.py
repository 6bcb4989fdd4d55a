"""The benchmarks' one timing loop (wall-clock times of repeated calls, after warm-up calls) and the command line of
the kernel sweeps."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def timings(fn, runs: int, warmup: int, sync=None) -> dict:
    """Median, min and 90th percentile (ms) of `runs` calls of fn after `warmup` untimed ones. `sync`
    (a device synchronize) runs after the warm-up and inside every timed call, so a call that only
    queues work is timed to its completion."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t)
    t = np.array(times) * 1e3
    return {
        "median_ms": float(np.median(t)),
        "min_ms": float(t.min()),
        "p90_ms": float(np.percentile(t, 90)),
        "runs": runs,
    }


def median_ms(fn, warmup: int = 5, reps: int = 50, sync=None) -> float:
    """The median (ms) of `reps` timed calls of fn after `warmup` untimed ones."""
    return timings(fn, reps, warmup, sync)["median_ms"]


def build_at(kernels, source: str, arch: str, switches, rev: str | None = None):
    """Kernel `source` built for `arch` with -D `switches`: from the working tree's custom_kernels/, or (rev) from
    that git revision's (a baseline in the same run as the working tree's version)."""
    if rev is None:
        return kernels.build(source, arch, switches)
    import subprocess
    import tarfile
    import tempfile

    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", rev, "custom_kernels"], capture_output=True, check=True
        )
        tar_path = Path(tmp) / "src.tar"
        tar_path.write_bytes(archive.stdout)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        saved = kernels.KERNEL_DIR
        kernels.KERNEL_DIR = Path(tmp) / "custom_kernels"
        try:
            return kernels.build(source, arch, switches)
        finally:
            kernels.KERNEL_DIR = saved


# A sweep version's flags: -D switches of the kernel source, and these words of the sweep's own: BLOCK=n (the
# families' workgroup size for that build), REV=<git revision> (that revision's sources: a baseline in the same run).
SWEEP_WORDS = ("BLOCK=", "REV=")


def sweep_value(flags, name: str, default: int) -> int:
    """The int a version's flags give `name` (a -D switch or BLOCK), else `default`."""
    return next((int(f.split("=", 1)[1]) for f in flags if f.startswith(name + "=")), default)


def build_version(kernels, families, source: str, arch: str, flags, **fields):
    """Kernel `source` built for `arch` as a sweep version's flags say (its -D switches, its REV=), with `fields`
    (block: a workgroup size, local_memory: a launch's dynamic shared memory) set on `families` for this build
    only (the header the build writes states them)."""
    from dataclasses import replace

    saved = {n: kernels.FAMILIES[n] for n in families}
    rev = next((f[4:] for f in flags if f.startswith("REV=")), None)
    switches = [f"-D{f}" for f in flags if not f.startswith(SWEEP_WORDS)]
    try:
        for n in families:
            kernels.FAMILIES[n] = replace(saved[n], **fields)
        return build_at(kernels, source, arch, switches, rev)
    finally:
        kernels.FAMILIES.update(saved)


def sweep_main(doc: str, default_out: str, compile_all, run_all, argv=None) -> int:
    """A kernel sweep's command line (bench/linear_sweep.py, bench/quant_sweep.py): `compile` builds the versions
    here into --out, `run` times them there from it."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("compile", "run"))
    ap.add_argument("--out", type=Path, default=Path(default_out))
    a = ap.parse_args(argv)
    (compile_all if a.step == "compile" else run_all)(a.out)
    return 0
