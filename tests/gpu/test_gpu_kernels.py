"""The hand-written kernels (rms_norm, layer_norm, rope) on an NVIDIA GPU against float64: odd and tiny
rows, very long rows, symbolic rows and columns, reductions over trailing axes, no affine terms, shifted
and outlier rows (the one-pass LayerNorm's cancellation), and rope's half/interleaved forms, layouts,
partial rotation, batched and broadcast tables and position ids. Each module runs on NaN inputs first,
so an output element a kernel fails to write keeps the NaN and fails the test."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import rocmc
from rocmc import ops

from gpu_harness import Case, ids, rel_l2

DTYPES = ("f32", "f16", "bf16")
# Relative L2 error bound per storage type (outputs rounded once from f32).
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.5e-2}


def _rand(rng, shape, dtype, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(rocmc.dtype(dtype).np)


def _with_first(x, first):
    """x with the first element of every row set to `first` (None: unchanged)."""
    if first is not None:
        x = x.copy()
        x.reshape(-1, x.shape[-1])[:, 0] = first
    return x


def _loose(case: Case, tol: float | None) -> Case:
    """The case with a wider tolerance (None: its own)."""
    return case if tol is None else replace(case, tol=tol)


def norm_case(name, op, dtype, shape, sym=None, axis=-1, weight=True, bias=True, shift=0.0, first=None) -> Case:
    """rms_norm / layer_norm over x.shape[axis:]; `sym` makes dim 0 symbolic ("all": every dim); `first`: the
    value of every row's first element (an outlier: the one-pass LayerNorm shifts by that element)."""
    xs = tuple(f"d{i}" for i in range(len(shape))) if sym == "all" else (sym,) + tuple(shape[1:]) if sym else shape
    ax = axis % len(shape)
    affine = [weight, op == "layer_norm" and bias]

    def graph():
        g = rocmc.Graph("n")
        x = g.input("x", xs, dtype)
        w = g.input("w", xs[ax:], dtype) if affine[0] else None
        b = g.input("b", xs[ax:], dtype) if affine[1] else None
        g.output(
            ops.layer_norm(x, w, b, eps=1e-5, axis=axis)
            if op == "layer_norm"
            else ops.rms_norm(x, w, eps=1e-6, axis=axis)
        )
        return g

    def inputs(rng, _):
        out = [_with_first(_rand(rng, shape, dtype, -2 + shift, 2 + shift), first)]
        if affine[0]:
            out.append(_rand(rng, shape[ax:], dtype, 0.5, 1.5))
        if affine[1]:
            out.append(_rand(rng, shape[ax:], dtype))
        return out

    return Case(name, graph, inputs, TOL[dtype], rel_l2, poison=True, calls="kernels")


def rope_case(
    name, dtype, b, h, t, d, interleaved=False, layout="bhsd", rot=None, table="shared", pos=None, T=None
) -> Case:
    """rope of x (b,h,t,d) or (b,t,h,d); table: "shared" (T, r), "batched" (b, t, r), "one" (1, t, r);
    pos: None, "int32" or "int64" position ids (b, t) into a (T, r) table."""
    rot = rot or d
    T = T or t + 3
    xs = (b, h, t, d) if layout == "bhsd" else (b, t, h, d)
    tshape = {"shared": (T, rot // 2), "batched": (b, t, rot // 2), "one": (1, t, rot // 2)}[table]

    def graph():
        g = rocmc.Graph("r")
        x = g.input("x", xs, dtype)
        c, s = g.input("cos", tshape, dtype), g.input("sin", tshape, dtype)
        p = g.input("pos", (b, t), pos) if pos else None
        g.output(ops.rope(x, c, s, interleaved=interleaved, layout=layout, rotary_dim=rot, position_ids=p))
        return g

    def inputs(rng, _):
        npt = rocmc.dtype(dtype).np
        angles = rng.uniform(0, 6.3, tshape)
        out = [_rand(rng, xs, dtype), np.cos(angles).astype(npt), np.sin(angles).astype(npt)]
        if pos:
            out.append(rng.integers(0, T, size=(b, t)).astype(pos))
        return out

    return Case(name, graph, inputs, TOL[dtype], rel_l2, poison=True, calls="kernels")


def _cases() -> list[Case]:
    out = []
    for dt in DTYPES:
        for op in ("rms_norm", "layer_norm"):
            out += [
                norm_case(f"{op}_{dt}_4096", op, dt, (6, 4096), sym="n"),
                norm_case(f"{op}_{dt}_odd", op, dt, (7, 1001)),
                norm_case(f"{op}_{dt}_1x1", op, dt, (1, 1)),
                norm_case(f"{op}_{dt}_short", op, dt, (300, 24), sym="n"),
                norm_case(f"{op}_{dt}_20000", op, dt, (3, 20000)),
                norm_case(f"{op}_{dt}_axis1", op, dt, (2, 3, 40), axis=1, weight=dt != "f16"),
                norm_case(f"{op}_{dt}_dyncols", op, dt, (5, 3000), sym="all"),
                norm_case(f"{op}_{dt}_noaffine", op, dt, (5, 777), weight=False, bias=False),
            ]
        out += [
            # f32 rows centred on 300: each element keeps 8 fewer bits of its deviation from the mean than an
            # unshifted row (300 / 1.15), so the kernel's f32 error is ~1e-5 (1.002e-5 on a 2026-11-27 seed)
            _loose(
                norm_case(f"layer_norm_{dt}_shifted", "layer_norm", dt, (4, 2048), shift=300.0 if dt == "f32" else 8.0),
                3e-5 if dt == "f32" else None,
            ),
            norm_case(f"layer_norm_{dt}_outlier", "layer_norm", dt, (4, 2048), first=1000.0 if dt == "f32" else 200.0),
            norm_case(f"layer_norm_{dt}_nobias", "layer_norm", dt, (4, 512), bias=False),
        ]
        for inter in (False, True):
            v = f"rope_{'i' if inter else 'h'}_{dt}"
            out += [
                rope_case(f"{v}_bhsd", dt, 2, 3, 5, 64, interleaved=inter),
                rope_case(f"{v}_bshd", dt, 3, 4, 7, 128, interleaved=inter, layout="bshd"),
                rope_case(f"{v}_partial", dt, 2, 2, 9, 96, interleaved=inter, rot=32, table="batched"),
                rope_case(f"{v}_pos32", dt, 2, 3, 6, 64, interleaved=inter, pos="int32", T=50),
                rope_case(f"{v}_pos64", dt, 2, 5, 3, 6, interleaved=inter, pos="int64", T=9, layout="bshd"),
                rope_case(f"{v}_pair", dt, 2, 1, 3, 2, interleaved=inter, table="one"),
                rope_case(f"{v}_oddrot", dt, 2, 3, 5, 20, interleaved=inter, rot=6),
            ]
    return [replace(c, name=f"kernel.{c.name}") for c in out]


CASES = _cases()


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hand_written_kernel(case, gpu):
    gpu(case)
