"""Shared test helpers: fresh random inputs, running graphs, comparing with the float64 reference."""
from __future__ import annotations

import numpy as np

import rocmc

# (rtol, atol) per dtype, for results compared with the float64 reference.
TOL = {"f32": (2e-5, 2e-5), "f16": (4e-3, 4e-3), "bf16": (2.5e-2, 2.5e-2)}
GPU_TARGETS = ("gfx942", "cuda:sm_80")


def rand(rng: np.random.Generator, shape, dtype="f32", low=-2.0, high=2.0):
    """Fresh random values (never zeros) of a rocmc dtype."""
    d = rocmc.dtype(dtype)
    if d.kind == "float":
        return rng.uniform(low, high, size=shape).astype(d.np)
    if d.kind == "int":
        return rng.integers(int(low) - 3, int(high) + 4, size=shape).astype(d.np)
    return rng.random(size=shape) < 0.5


def run(graph, *inputs, target="cpu", **kw):
    art = rocmc.compile(graph, target, **kw)
    return rocmc.load(art)(*inputs)


def check(graph, *inputs, tol=None, **compile_kw):
    """Compile for the CPU, run, and compare every output with the float64 reference."""
    got = run(graph, *inputs, **compile_kw)
    want = rocmc.evaluate(graph, *inputs)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w, v in zip(got, want, graph.outputs):
        assert g.shape == w.shape, f"shape {g.shape} vs reference {w.shape}"
        if v.dtype.kind == "float":
            rtol, atol = tol or TOL[v.dtype.name]
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
    return got


def compile_gpu(graph, targets=GPU_TARGETS, **kw):
    """Compile-only check for the GPU targets (no GPU here): the module builds."""
    for t in targets:
        art = rocmc.compile(graph, t, **kw)
        assert len(art.vmfb) > 0
