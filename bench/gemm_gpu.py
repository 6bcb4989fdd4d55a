"""GEMM library calls on an NVIDIA GPU (cuBLASLt, the twin of hipBLASLt): where the size rule's
threshold comes from, and what one more library call costs inside a module.

    python -m bench.gemm_gpu compile [--out out/gemm_gpu]   # CPU machine: .vmfb files for cuda:sm_80
    python -m bench.gemm_gpu run [--out out/gemm_gpu]       # GPU machine: iree-base-runtime, torch

(The library's numerics against float64 are tests: tests/gpu/test_gpu_gemm.py.)

1. rows: y = x @ W^T with W 4096 x 4096 f16, x of M rows for M from 1 to 2048: the library call
   against IREE's generated code (static M, as a decode step has, and symbolic M) and torch.
2. chain: 8 vs 7 dependent 64 x 1024 x 1024 GEMMs through the library: the marginal cost of a call.
Writes <out>/gemm_gpu.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import median_ms

TARGET = "cuda:sm_80"
LIB = {"matmul": "blas", "linear": "blas"}
GEN = {"matmul": "generated", "linear": "generated"}
ROWS = (1, 16, 32, 64, 128, 512, 2048)
HIDDEN = 4096
CHAIN = (7, 8)


def _rows_graph(rows, dtype="f16"):
    import rocmc
    from rocmc import ops

    g = rocmc.Graph(f"rows_{rows}")
    x = g.input("x", (rows, HIDDEN), dtype)
    w = g.input("w", (HIDDEN, HIDDEN), dtype)
    g.output(ops.linear(x, w))
    return g


def _chain_graph(n):
    import rocmc
    from rocmc import ops

    g = rocmc.Graph(f"chain_{n}")
    h = g.input("x", (64, 1024), "f16")
    w = g.input("w", (1024, 1024), "f16")
    for _ in range(n):
        h = ops.linear(h, w)
    g.output(h)
    return g


def compile_all(out: Path):
    import rocmc

    out.mkdir(parents=True, exist_ok=True)
    for rows in [*ROWS, "m"]:
        for variant, impl in (("lib", LIB), ("gen", GEN)):
            rocmc.compile(_rows_graph(rows), TARGET, impl=impl).save(out / f"rows.{rows}.{variant}.vmfb")
    for n in CHAIN:
        rocmc.compile(_chain_graph(n), TARGET, impl=LIB).save(out / f"chain.{n}.vmfb")
    print(f"compiled into {out}")


def _rand(rng, shape, dtype):
    import ml_dtypes

    np_dt = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]
    return rng.uniform(-1, 1, shape).astype(np_dt)


def run_rows(out: Path, rng) -> list:
    import rocmc
    import torch
    from iree import runtime as rt

    results = []
    w_host = _rand(rng, (HIDDEN, HIDDEN), "f16")
    wt = torch.from_numpy(w_host).cuda()
    mods = {}
    for rows in ROWS:
        x_host = _rand(rng, (rows, HIDDEN), "f16")
        xt = torch.from_numpy(x_host).cuda()
        row = {"m": rows}
        for variant, path in (
            ("library", out / f"rows.{rows}.lib.vmfb"),
            ("generated_static", out / f"rows.{rows}.gen.vmfb"),
            ("library_symbolic", out / "rows.m.lib.vmfb"),
            ("generated_symbolic", out / "rows.m.gen.vmfb"),
        ):
            if not path.exists():
                continue
            mod = mods.get(path) or mods.setdefault(path, rocmc.load(path, device="cuda"))
            args = [rt.asdevicearray(mod.device, a) for a in (x_host, w_host)]
            row[variant] = median_ms(lambda: mod(*args, output="device"))

        def torch_fn():
            torch.nn.functional.linear(xt, wt)
            torch.cuda.synchronize()

        row["torch"] = median_ms(torch_fn)
        results.append(row)
        print(
            "rows " + "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
            flush=True,
        )
    return results


def run_chain(out: Path, rng) -> dict:
    import rocmc
    from iree import runtime as rt

    times = {}
    x, w = _rand(rng, (64, 1024), "f16"), (_rand(rng, (1024, 1024), "f16") * 0.03).astype(np.float16)
    for n in CHAIN:
        mod = rocmc.load(out / f"chain.{n}.vmfb", device="cuda")
        args = [rt.asdevicearray(mod.device, a) for a in (x, w)]
        times[n] = median_ms(lambda: mod(*args, output="device"), reps=200)
    res = {"calls": list(CHAIN), "ms": [times[n] for n in CHAIN], "marginal_us": (times[8] - times[7]) * 1e3}
    print(f"chain {res}", flush=True)
    return res


def run_all(out: Path) -> int:
    import torch

    rng = np.random.default_rng(int(time.time()))
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(0),
        "target": TARGET,
    }
    res["rows"] = run_rows(out, rng)
    res["chain"] = run_chain(out, rng)
    (out / "gemm_gpu.json").write_text(json.dumps(res, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("compile", "run"))
    ap.add_argument("--out", type=Path, default=Path("out/gemm_gpu"))
    a = ap.parse_args()
    if a.mode == "compile":
        compile_all(a.out)
        return 0
    return run_all(a.out)


if __name__ == "__main__":
    sys.exit(main())
