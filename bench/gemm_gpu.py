"""GEMM library calls on an NVIDIA GPU (cuBLASLt, the twin of hipBLASLt): correctness against float64,
where the size rule's threshold comes from, and what one more library call costs inside a module.

    python bench/gemm_gpu.py compile [--out out/gemm_gpu]   # CPU machine: .vmfb files for cuda:sm_80
    python bench/gemm_gpu.py run [--out out/gemm_gpu]       # GPU machine: iree-base-runtime, torch

1. check: linear (bias, symbolic rows), batched matmuls (transposes, a broadcast matrix, symbolic
   dims) in f32, f16 and bf16 through `hipblaslt.matmul`, each against numpy in float64 on fresh
   random inputs for several row counts.
2. rows: y = x @ W^T with W 4096 x 4096 f16, x of M rows for M from 1 to 2048: the library call
   against IREE's generated code (static M, as a decode step has, and symbolic M) and torch.
3. chain: 8 vs 7 dependent 64 x 1024 x 1024 GEMMs through the library: the marginal cost of a call.
Writes <out>/gemm_gpu.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

TARGET = "cuda:sm_80"
LIB = {"matmul": "hipblaslt", "linear": "hipblaslt"}
GEN = {"matmul": "generated", "linear": "generated"}
ROWS = (1, 16, 32, 64, 128, 512, 2048)
HIDDEN = 4096
CHAIN = (7, 8)


def _check_graphs():
    """name -> (graph, input shapes per row count m, reference fn)."""
    import rocmc
    from rocmc import ops
    out = {}
    for dt in ("f32", "f16", "bf16"):
        g = rocmc.Graph(f"linear_{dt}")
        x = g.input("x", ("m", 320), dt)
        w = g.input("w", (515, 320), dt)
        b = g.input("b", (515,), dt)
        g.output(ops.linear(x, w, b))
        out[g.name] = (g, lambda m: [(m, 320), (515, 320), (515,)], lambda x, w, b: x @ w.T + b)
        g = rocmc.Graph(f"bmm_tt_{dt}")
        a = g.input("a", (6, 96, "m"), dt)
        c = g.input("c", (6, 200, 96), dt)
        g.output(ops.matmul(a, c, transpose_a=True, transpose_b=True))
        out[g.name] = (g, lambda m: [(6, 96, m), (6, 200, 96)],
                       lambda a, c: np.swapaxes(a, 1, 2) @ np.swapaxes(c, 1, 2))
        g = rocmc.Graph(f"bmm_bcast_{dt}")
        a = g.input("a", (2, 4, "m", 72), dt)
        c = g.input("c", (72, 130), dt)
        g.output(ops.matmul(a, c))
        out[g.name] = (g, lambda m: [(2, 4, m, 72), (72, 130)], lambda a, c: a @ c)
        g = rocmc.Graph(f"sdpa_gqa_causal_{dt}")
        q = g.input("q", (2, 8, "m", 64), dt)
        k = g.input("k", (2, 2, "m", 64), dt)
        v = g.input("v", (2, 2, "m", 64), dt)
        g.output(ops.sdpa(q, k, v, is_causal=True))
        out[g.name] = (g, lambda m: [(2, 8, m, 64), (2, 2, m, 64), (2, 2, m, 64)], _attention)
    return out


def _attention(q, k, v):
    """Causal grouped-query attention in float64."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


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
    for name, (g, _, _) in _check_graphs().items():
        rocmc.compile(g, TARGET, impl={**LIB, "sdpa": "hipblaslt"}).save(out / f"check.{name}.vmfb")
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


def _median_ms(fn, runs=50, warmup=5):
    for _ in range(warmup):
        fn()
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return float(np.median(t) * 1e3)


def run_check(out: Path, rng) -> list:
    import rocmc
    rows = []
    for name, (g, shapes, ref) in _check_graphs().items():
        dt = name.rsplit("_", 1)[1]
        mod = rocmc.load(out / f"check.{name}.vmfb", device="cuda")
        for m in (1, 77, 300):
            ins = [_rand(rng, s, dt) for s in shapes(m)]
            got = np.asarray(mod(*ins)).astype(np.float64)
            want = ref(*[a.astype(np.float64) for a in ins])
            err = float(np.abs(got - want).max() / np.abs(want).max())
            tol = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}[dt]
            rows.append({"case": name, "m": m, "rel_err": err, "ok": err < tol})
            print(f"check {name:16s} m={m:4d} rel err {err:.2e} {'ok' if err < tol else 'FAIL'}", flush=True)
    return rows


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
        for variant, path in (("library", out / f"rows.{rows}.lib.vmfb"), ("generated_static", out / f"rows.{rows}.gen.vmfb"),
                              ("library_symbolic", out / "rows.m.lib.vmfb"), ("generated_symbolic", out / "rows.m.gen.vmfb")):
            if not path.exists():
                continue
            mod = mods.get(path) or mods.setdefault(path, rocmc.load(path, device="cuda"))
            args = [rt.asdevicearray(mod.device, a) for a in (x_host, w_host)]
            row[variant] = _median_ms(lambda: mod(*args, output="device"))

        def torch_fn():
            torch.nn.functional.linear(xt, wt)
            torch.cuda.synchronize()
        row["torch"] = _median_ms(torch_fn)
        results.append(row)
        print("rows " + "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
              flush=True)
    return results


def run_chain(out: Path, rng) -> dict:
    import rocmc
    from iree import runtime as rt
    times = {}
    x, w = _rand(rng, (64, 1024), "f16"), (_rand(rng, (1024, 1024), "f16") * 0.03).astype(np.float16)
    for n in CHAIN:
        mod = rocmc.load(out / f"chain.{n}.vmfb", device="cuda")
        args = [rt.asdevicearray(mod.device, a) for a in (x, w)]
        times[n] = _median_ms(lambda: mod(*args, output="device"), runs=200)
    res = {"calls": list(CHAIN), "ms": [times[n] for n in CHAIN], "marginal_us": (times[8] - times[7]) * 1e3}
    print(f"chain {res}", flush=True)
    return res


def run_all(out: Path) -> int:
    import torch
    rng = np.random.default_rng(int(time.time()))
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": torch.cuda.get_device_name(0),
           "target": TARGET}
    res["check"] = run_check(out, rng)
    res["rows"] = run_rows(out, rng)
    res["chain"] = run_chain(out, rng)
    (out / "gemm_gpu.json").write_text(json.dumps(res, indent=1))
    return 0 if all(r["ok"] for r in res["check"]) else 1


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
