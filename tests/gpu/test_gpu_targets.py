"""Modules beyond the default cuda:sm_80 ones: a cuda:sm_90 module (IREE 3.13 has no sm_90 tables, so rocmc
generates sm_80 code for it and records that) and an artifact of format 2, made before the library roles were
renamed (imports `hipblaslt.*`, implementation `hip`), which must still load and run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rocmc
from rocmc import ops

from gpu_harness import Case, Compiler, rel_l2

DATA = Path(__file__).resolve().parents[1] / "data"


def _block():
    rng = np.random.default_rng(11)
    g = rocmc.Graph("sm90")
    x = g.input("x", (3, "seq", 64), "f16")
    w = g.constant("w", (1 + 0.1 * rng.standard_normal(64)).astype(np.float16))
    wm = g.constant("wm", (0.1 * rng.standard_normal((64, 48))).astype(np.float16))
    h = ops.rms_norm(x, w, eps=1e-5)
    g.output(h, ops.silu(ops.matmul(h, wm)))
    return g


def _inputs(rng, n):
    return [rng.uniform(-2, 2, size=(3, n, 64)).astype(np.float16)]


SM90 = Case("sm90_block", _block, _inputs, 2e-3, rel_l2, sizes=(1, 17, 130), calls="kernels", target="cuda:sm_90")


@pytest.mark.gpu
def test_sm90_module(gpu, gpu_step):
    if isinstance(gpu_step, Compiler):
        art = rocmc.compile(_block(), "cuda:sm_90")
        assert "sm_80 code generated for sm_90" in art.summary()
    gpu(SM90)


@pytest.mark.gpu
def test_format2_artifact_runs(gpu_step, rng):
    """tests/data/format2_cuda.vmfb (see tests/data/README.md): rms_norm by the hand-written kernel, then a
    blas matmul, against float64."""
    art = rocmc.artifact.Artifact.load(DATA / "format2_cuda.vmfb")
    assert art.metadata["format"] == 2
    if isinstance(gpu_step, Compiler):
        pytest.skip("nothing to compile: the artifact was made by an earlier version")
    r = np.random.default_rng(7)
    w = (1 + 0.1 * r.standard_normal(64)).astype(np.float16).astype(np.float64)
    wm = (0.1 * r.standard_normal((64, 48))).astype(np.float16).astype(np.float64)
    mod = rocmc.load(art, device="cuda")
    for n in (5, 33):
        x = rng.uniform(-2, 2, size=(3, n, 64)).astype(np.float16)
        x64 = x.astype(np.float64)
        h = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5) * w
        got_h, got_y = mod(x)
        assert rel_l2(got_h.astype(np.float64), h) < 2e-3
        assert rel_l2(got_y.astype(np.float64), h @ wm) < 2e-3


def _four_bit():
    """4-bit inputs and outputs (an odd count: 15 values, the last byte half padding), converted, wrapping and back."""
    g = rocmc.Graph("int4")
    x = g.input("x", (3, 5), "i4")
    u = g.input("u", (3, 5), "u4")
    s = g.input("s", (5,), "f32")
    y = ops.mul(ops.cast(x, "f32"), s)
    g.output(y, ops.cast(ops.round(ops.div(y, s)), "i4"), ops.add(ops.mul(x, x), ops.cast(u, "i4")), ops.add(u, u))
    return g


def _four_bit_inputs(rng, n):
    import ml_dtypes

    return [
        rng.integers(-8, 8, (3, 5)).astype(ml_dtypes.int4),
        rng.integers(0, 16, (3, 5)).astype(ml_dtypes.uint4),
        rng.uniform(0.5, 2, 5).astype(np.float32),
    ]


FOUR_BIT = Case("int4_boundary", _four_bit, _four_bit_inputs, 1e-6, rel_l2)


@pytest.mark.gpu
def test_four_bit_values_cross_a_gpu_module(gpu):
    gpu(FOUR_BIT)


def _long_topk():
    """An LLM's `sample` topk: 64 of a 32000-entry row, ranked in chunks on a GPU (codegen/index.py)."""
    g = rocmc.Graph("long_topk")
    x = g.input("x", ("n", 32000), "f32")
    g.output(*ops.topk(x, 64))
    return g


def _long_topk_inputs(rng, n):
    a = rng.standard_normal((n, 32000)).astype(np.float32)
    a[0, rng.integers(0, 32000, 50)] = a[0, 3]  # ties, broken by position
    a[-1] = -np.abs(a[-1]) - 1  # a row of negative values only
    return [a]


def _differs(got, want) -> float:
    return float(not np.array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64)))


LONG_TOPK = Case("long_topk", _long_topk, _long_topk_inputs, 0.5, _differs, sizes=(1, 3, 32))


@pytest.mark.gpu
def test_topk_of_a_long_row_in_chunks(gpu):
    gpu(LONG_TOPK)
