"""End-to-end check of the hand-written kernels on an NVIDIA GPU: compile here, run there.

    python bench/gpu_kernels.py compile [--out out/gpu_kernels]   # needs iree-base-compiler and clang
    python bench/gpu_kernels.py run [--out out/gpu_kernels]       # needs iree-base-runtime and a GPU

`compile` builds every case for cuda:sm_80 (the rms_norm/layer_norm/rope nodes become the PTX kernels)
and writes <case>.vmfb. `run` rebuilds the same graphs (for their float64 references), loads each .vmfb
on the cuda device, and for fresh random inputs: first runs it on NaN inputs (so the pooled output memory
the real run gets back holds NaN: an element the kernel fails to write shows up), then on the real
inputs, and compares with the float64 reference. Exit status 1 if any case fails.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import rocmc  # noqa: E402
from rocmc import ops  # noqa: E402

TARGET = "cuda:sm_80"
DTYPES = ("f32", "f16", "bf16")
# Relative L2 error bound per storage type (outputs rounded once from f32).
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.5e-2}


def _rand(rng, shape, dtype, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(rocmc.dtype(dtype).np)


# ---- cases: name -> (graph, inputs(rng)) -----------------------------------------------------------------

def _with_first(x, first):
    """x with the first element of every row set to `first` (None: unchanged)."""
    if first is not None:
        x = x.copy()
        x.reshape(-1, x.shape[-1])[:, 0] = first
    return x


def norm_case(op, dtype, shape, sym=None, axis=-1, weight=True, bias=True, shift=0.0, first=None):
    """rms_norm / layer_norm over x.shape[axis:]; `sym` makes dim 0 symbolic ("all": every dim); `first`: the
    value of every row's first element (an outlier: the one-pass LayerNorm shifts by that element)."""
    g = rocmc.Graph("n")
    xs = tuple(f"d{i}" for i in range(len(shape))) if sym == "all" else (sym,) + tuple(shape[1:]) if sym else shape
    x = g.input("x", xs, dtype)
    ax = axis % len(shape)
    inputs = [lambda rng: _with_first(_rand(rng, shape, dtype, -2 + shift, 2 + shift), first)]
    w = b = None
    if weight:
        w = g.input("w", xs[ax:], dtype)
        inputs.append(lambda rng: _rand(rng, shape[ax:], dtype, 0.5, 1.5))
    if op == "layer_norm":
        if bias:
            b = g.input("b", xs[ax:], dtype)
            inputs.append(lambda rng: _rand(rng, shape[ax:], dtype))
        g.output(ops.layer_norm(x, w, b, eps=1e-5, axis=axis))
    else:
        g.output(ops.rms_norm(x, w, eps=1e-6, axis=axis))
    return g, inputs


def rope_case(dtype, b, h, t, d, interleaved=False, layout="bhsd", rot=None, table="shared", pos=None, T=None):
    """rope of x (b,h,t,d) or (b,t,h,d); table: "shared" (T, r), "batched" (b, t, r), "one" (1, t, r);
    pos: None, "i32" or "i64" position ids (b, t) into a (T, r) table."""
    rot = rot or d
    r = rot // 2
    T = T or t + 3
    g = rocmc.Graph("r")
    xs = (b, h, t, d) if layout == "bhsd" else (b, t, h, d)
    x = g.input("x", xs, dtype)
    tshape = {"shared": (T, r), "batched": (b, t, r), "one": (1, t, r)}[table]
    c, s = g.input("cos", tshape, dtype), g.input("sin", tshape, dtype)
    inputs = [lambda rng: _rand(rng, xs, dtype),
              lambda rng: np.cos(rng.uniform(0, 6.3, tshape)).astype(rocmc.dtype(dtype).np),
              lambda rng: np.sin(rng.uniform(0, 6.3, tshape)).astype(rocmc.dtype(dtype).np)]
    p = None
    if pos:
        p = g.input("pos", (b, t), pos)
        inputs.append(lambda rng: rng.integers(0, T, size=(b, t)).astype(pos))
    g.output(ops.rope(x, c, s, interleaved=interleaved, layout=layout, rotary_dim=rot, position_ids=p))
    return g, inputs


def cases() -> dict:
    out = {}
    for dt in DTYPES:
        for op in ("rms_norm", "layer_norm"):
            out[f"{op}_{dt}_4096"] = norm_case(op, dt, (6, 4096), sym="n")
            out[f"{op}_{dt}_odd"] = norm_case(op, dt, (7, 1001))
            out[f"{op}_{dt}_1x1"] = norm_case(op, dt, (1, 1))
            out[f"{op}_{dt}_short"] = norm_case(op, dt, (300, 24), sym="n")
            out[f"{op}_{dt}_20000"] = norm_case(op, dt, (3, 20000))
            out[f"{op}_{dt}_axis1"] = norm_case(op, dt, (2, 3, 40), axis=1, weight=dt != "f16")
            out[f"{op}_{dt}_dyncols"] = norm_case(op, dt, (5, 3000), sym="all")
            out[f"{op}_{dt}_noaffine"] = norm_case(op, dt, (5, 777), weight=False, bias=False)
        out[f"layer_norm_{dt}_shifted"] = norm_case("layer_norm", dt, (4, 2048), shift=300.0 if dt == "f32" else 8.0)
        out[f"layer_norm_{dt}_outlier"] = norm_case("layer_norm", dt, (4, 2048), first=1000.0 if dt == "f32" else 200.0)
        out[f"layer_norm_{dt}_nobias"] = norm_case("layer_norm", dt, (4, 512), bias=False)
        for inter in (False, True):
            v = "i" if inter else "h"
            out[f"rope_{v}_{dt}_bhsd"] = rope_case(dt, 2, 3, 5, 64, interleaved=inter)
            out[f"rope_{v}_{dt}_bshd"] = rope_case(dt, 3, 4, 7, 128, interleaved=inter, layout="bshd")
            out[f"rope_{v}_{dt}_partial"] = rope_case(dt, 2, 2, 9, 96, interleaved=inter, rot=32, table="batched")
            out[f"rope_{v}_{dt}_pos32"] = rope_case(dt, 2, 3, 6, 64, interleaved=inter, pos="int32", T=50)
            out[f"rope_{v}_{dt}_pos64"] = rope_case(dt, 2, 5, 3, 6, interleaved=inter, pos="int64", T=9,
                                                    layout="bshd")
            out[f"rope_{v}_{dt}_pair"] = rope_case(dt, 2, 1, 3, 2, interleaved=inter, table="one")
            out[f"rope_{v}_{dt}_oddrot"] = rope_case(dt, 2, 3, 5, 20, interleaved=inter, rot=6)
    return out


# ---- compile here ----------------------------------------------------------------------------------------

def compile_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for name, (g, _) in cases().items():
        art = rocmc.compile(g, TARGET)
        hand = [d for d in art.metadata["kernels"]]
        assert hand, f"{name}: no hand-written kernel in the artifact"
        art.save(out / f"{name}.vmfb")
    print(f"compiled {len(cases())} cases for {TARGET} in {time.time() - t0:.1f} s -> {out}")


# ---- run there -------------------------------------------------------------------------------------------

def rel_err(got, want) -> float:
    got = got.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def run_all(out: Path) -> int:
    rng = np.random.default_rng()
    failures = 0
    rows = []
    for name, (g, makers) in cases().items():
        path = out / f"{name}.vmfb"
        mod = rocmc.load(path)
        ins = [m(rng) for m in makers]
        poison = [np.full_like(a, np.nan) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else a for a in ins]
        mod(*poison)                         # leaves NaN in the pooled memory the next output gets
        got = mod(*ins)
        want = rocmc.evaluate(g, *ins)
        dt = g.outputs[0].dtype.name
        err = rel_err(got, want)
        finite = bool(np.isfinite(got.astype(np.float64)).all())
        ok = finite and err <= TOL[dt] and got.shape == want.shape
        failures += not ok
        kernels = ",".join(k["symbol"] for k in mod.artifact.metadata["kernels"])
        rows.append((name, kernels, list(got.shape), err, finite, ok))
        mod.close()
        del mod
        gc.collect()
    for name, k, shape, err, finite, ok in rows:
        print(f"{'ok  ' if ok else 'FAIL'} {name:<28} {k:<24} {str(shape):<20} rel_err={err:.2e}"
              f"{'' if finite else ' NON-FINITE (unwritten output)'}")
    print(f"{len(rows) - failures}/{len(rows)} cases passed on the GPU")
    return 1 if failures else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("compile", "run"))
    p.add_argument("--out", default=str(ROOT / "out" / "gpu_kernels"))
    a = p.parse_args(argv)
    if a.mode == "compile":
        compile_all(Path(a.out))
        return 0
    return run_all(Path(a.out))


if __name__ == "__main__":
    sys.exit(main())
