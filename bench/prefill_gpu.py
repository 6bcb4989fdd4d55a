"""A prefill's projections on an NVIDIA GPU: rocmc's hand-written tiled GEMM (linear_mm) against IREE's generated
code and torch, at a 7B Llama's shapes with a symbolic row count, as a prefill compiles them.

    python -m bench.prefill_gpu compile [--out out/prefill_gpu]   # CPU machine: .vmfb files for cuda:sm_80
    python -m bench.prefill_gpu run [--out out/prefill_gpu]       # GPU machine: iree-base-runtime, torch

Each projection is one op with its epilogue, as the 7B prefill has them: q/k/v joined (linear), o + residual
(fused_linear), gate/up joined with silu(gate) * up (gated_linear), down + residual, lm_head; and a 4096^3 GEMM
(static rows) for TFLOP/s against torch's. Every variant's output is checked against torch's (f32 accumulation)
before it is timed; torch's own error is measured against float64 on the smallest row count. Writes
<out>/prefill_gpu.json and prints a table: median ms (wall clock around calls that return on completion) and
TFLOP/s.
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
HIDDEN, INTER, VOCAB = 4096, 11008, 32000
# name: (op, w rows, k)
SHAPES = {
    "qkv": ("linear", 3 * HIDDEN, HIDDEN),
    "o_residual": ("fused_linear", HIDDEN, HIDDEN),
    "gate_up_silu": ("gated_linear", 2 * INTER, HIDDEN),
    "down_residual": ("fused_linear", HIDDEN, INTER),
    "lm_head": ("linear", VOCAB, HIDDEN),
}
ROWS = (128, 512, 2048)
VARIANTS = {"kernel": "kernel", "generated": "generated"}


def _graph(name, op, rows_w, k, rows="s"):
    import rocmc
    from rocmc import ops

    g = rocmc.Graph(name)
    x = g.input("x", (1, rows, k), "f16")
    w = g.input("w", (rows_w, k), "f16")
    if op == "gated_linear":
        g.output(ops.gated_linear(x, w, activation="silu"))
    elif op == "fused_linear":
        g.output(ops.fused_linear(x, w, residual=g.input("r", (1, rows, rows_w), "f16")))
    else:
        g.output(ops.linear(x, w))
    return g


def compile_all(out: Path, variants) -> None:
    import rocmc

    out.mkdir(parents=True, exist_ok=True)
    cases = {n: (*s, "s") for n, s in SHAPES.items()} | {"gemm4096": ("linear", HIDDEN, HIDDEN, HIDDEN)}
    for name, (op, rows_w, k, rows) in cases.items():
        for variant in variants:
            impl = VARIANTS[variant]
            art = rocmc.compile(_graph(name, op, rows_w, k, rows), TARGET, impl={op: impl}, cache=False)
            kernels = [x["symbol"] for x in art.metadata.get("kernels", [])]
            assert (variant == "kernel") == bool(kernels), (name, variant, kernels)
            art.save(out / f"{name}.{variant}.vmfb")
            print(name, variant, kernels, flush=True)


def _torch_op(torch, op):
    F = torch.nn.functional
    if op == "gated_linear":

        def gated(x, w):
            g, u = F.linear(x, w).chunk(2, dim=-1)
            return F.silu(g) * u

        return gated
    if op == "fused_linear":
        return lambda x, w, r: F.linear(x, w) + r
    return F.linear


def _reference64(op, x, w, r=None):
    y = x.astype(np.float64) @ w.astype(np.float64).T
    if op == "gated_linear":
        g, u = np.split(y.astype(np.float16).astype(np.float64), 2, axis=-1)
        return (g / (1 + np.exp(-g))) * u
    return y + r if r is not None else y


def run_all(out: Path, variants) -> int:
    import rocmc
    import torch
    from iree import runtime as rt

    rng = np.random.default_rng(int(time.time()))
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": torch.cuda.get_device_name(0)}
    rows_out = []
    cases = [(n, *s, m) for n, s in SHAPES.items() for m in ROWS] + [("gemm4096", "linear", HIDDEN, HIDDEN, HIDDEN)]
    mods: dict = {}
    for name, op, rows_w, k, m in cases:
        x = rng.uniform(-1, 1, (1, m, k)).astype(np.float16)
        w = (rng.uniform(-1, 1, (rows_w, k)) / np.sqrt(k)).astype(np.float16)
        n_out = rows_w // 2 if op == "gated_linear" else rows_w
        args = [x, w] + ([rng.uniform(-1, 1, (1, m, n_out)).astype(np.float16)] if op == "fused_linear" else [])
        targs = [torch.from_numpy(a).cuda() for a in args]
        fn = _torch_op(torch, op)
        want = fn(*(t.float() for t in targs)).cpu().numpy()  # f32 accumulation, the comparison's yardstick
        row = {"case": name, "m": m, "n": n_out, "k": k, "flop": 2.0 * m * rows_w * k}
        if m == ROWS[0]:
            ref = _reference64(op, *args)
            got = fn(*targs).float().cpu().numpy()
            row["torch_rel_l2_vs_f64"] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        for variant in variants:
            path = out / f"{name}.{variant}.vmfb"
            mod = mods.get(path) or mods.setdefault(path, rocmc.load(path, device="cuda"))
            dev = [rt.asdevicearray(mod.device, a) for a in args]
            got = np.asarray(mod(*dev)).astype(np.float32)
            row[f"{variant}_rel_l2"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            row[f"{variant}_ms"] = median_ms(lambda: mod(*dev, output="device"), reps=30)

        def torch_fn():
            fn(*targs)
            torch.cuda.synchronize()

        row["torch_ms"] = median_ms(torch_fn, reps=30)
        for v in (*variants, "torch"):
            row[f"{v}_tflops"] = row["flop"] / (row[f"{v}_ms"] * 1e-3) / 1e12
        rows_out.append(row)
        print(
            f"{name:14s} m={m:5d} "
            + " | ".join(f"{v} {row[f'{v}_ms']:8.3f} ms {row[f'{v}_tflops']:6.1f} TF/s" for v in (*variants, "torch"))
            + " | err "
            + " ".join(f"{v} {row[f'{v}_rel_l2']:.1e}" for v in variants),
            flush=True,
        )
    res["rows"] = rows_out
    (out / "prefill_gpu.json").write_text(json.dumps(res, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("compile", "run"))
    ap.add_argument("--out", type=Path, default=Path("out/prefill_gpu"))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS))
    a = ap.parse_args()
    variants = a.variants.split(",")
    if a.mode == "compile":
        compile_all(a.out, variants)
        return 0
    return run_all(a.out, variants)


if __name__ == "__main__":
    sys.exit(main())
