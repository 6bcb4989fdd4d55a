"""Reductions against the float64 reference: axes, keepdims, symbolic and odd sizes, dtypes, errors."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.frontend.ops.reduce import REDUCTIONS

from helpers import TOL, CpuBatch, check, compile_gpu, rand

FLOAT_DTYPES = ["f32", "f16", "bf16"]
INT_REDUCTIONS = sorted(k for k, (kinds, _) in REDUCTIONS.items() if "int" in kinds)


def sum_tol(dtype, n):
    """Dtype tolerance, with an absolute term growing with the number of f32 additions (a sum of
    n values of magnitude ~1 legitimately differs from float64 by ~n * 1e-7 at worst)."""
    rtol, atol = TOL[dtype]
    return rtol, max(atol, 1e-6 * n)


def sample(rng, name, shape, dtype):
    # Products of many values in [-2, 2] over/underflow f16; keep factors near 1, with signs.
    if name == "prod":
        return (rand(rng, shape, dtype, 0.7, 1.3) * rng.choice([-1, 1], size=shape)).astype(rocmc.dtype(dtype).np)
    return rand(rng, shape, dtype)


# Each test's graph is a function of a module of its parametrization's graphs (helpers.CpuBatch): a compile a
# module, not a test. Keys in the order the tests run (the last parametrize decorator's values outermost).


def _axes_graph(name, dtype):
    g = rocmc.Graph("t")
    x = g.input("x", (2, "seq", 37), dtype)
    fn = getattr(ops, name)
    g.output(
        fn(x),
        fn(x, axis=1),
        fn(x, axis=-1),
        fn(x, axis=(0, 2), keepdims=True),
        fn(x, axis=(-2, -1)),
        fn(x, keepdims=True),
    )
    return g


AXES_BATCH = CpuBatch.grid(_axes_graph, sorted(REDUCTIONS), FLOAT_DTYPES, size=12)


@AXES_BATCH.parametrize("name,dtype")
def test_reduction_axes_symbolic(name, dtype, rng):
    """Every way of choosing axes, on a tensor with a symbolic dim (mean divides by its runtime size)."""
    g, module = AXES_BATCH(name, dtype)
    check(g, sample(rng, name, (2, 5, 37), dtype), tol=sum_tol(dtype, 2 * 5 * 37), module=module)


ODD_NAMES = ["sum", "mean", "max", "min", "norm2"]


def _odd_graph(name, dtype):
    g = rocmc.Graph("t")
    a, b = g.input("a", (3, 4097), dtype), g.input("b", (1, 1, 5), dtype)
    fn = getattr(ops, name)
    g.output(fn(a, axis=1), fn(a), fn(b, axis=(0, 1)), fn(b, axis=2, keepdims=True))
    return g


ODD_BATCH = CpuBatch.grid(_odd_graph, ODD_NAMES, ["f32", "bf16"])


@ODD_BATCH.parametrize("name,dtype")
def test_reduction_odd_sizes(name, dtype, rng):
    """Rows of 4097 (not a multiple of any vector width) and size-1 dims."""
    g, module = ODD_BATCH(name, dtype)
    check(g, rand(rng, (3, 4097), dtype), rand(rng, (1, 1, 5), dtype), tol=sum_tol(dtype, 3 * 4097), module=module)


def _int_graph(name, dtype):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 7), dtype)
    fn = getattr(ops, name)
    g.output(fn(x, axis=1), fn(x, axis=0, keepdims=True), fn(x))
    return g


INT_BATCH = CpuBatch.grid(_int_graph, INT_REDUCTIONS, ["i32", "i64"])


@INT_BATCH.parametrize("name,dtype")
def test_reduction_int_exact(name, dtype, rng):
    g, module = INT_BATCH(name, dtype)
    if name == "prod":  # small nonzero factors: a product of 7 stays exact in i32
        xs = rng.choice([-3, -2, -1, 1, 2, 3, 5], size=(6, 7)).astype(rocmc.dtype(dtype).np)
    else:
        xs = rand(rng, (6, 7), dtype, -1000, 1000)
    out = check(g, xs, module=module)
    assert out[0].dtype == rocmc.dtype(dtype).np


def test_max_is_amax(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (4, "n"), "f16")
    g.output(ops.max(x, axis=1), ops.amax(x, axis=1))
    a, b = check(g, rand(rng, (4, 9), "f16"))
    np.testing.assert_array_equal(a, b)


def test_zero_d_and_empty_axes(rng):
    """A 0-d tensor reduces over no axes; axis=() reduces nothing (numpy semantics)."""
    g = rocmc.Graph("t")
    x = g.input("x", (3, "n"), "f32")
    s = ops.sum(x)
    outs = [ops.mean(s), ops.norm2(s, keepdims=True), ops.max(x, axis=()), ops.norm1(x, axis=())]
    assert [o.shape for o in outs] == [(), (), (3, "n"), (3, "n")]
    g.output(*outs)
    check(g, rand(rng, (3, 4), "f32"))


def test_attributes_are_normalized():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3, 4), "f32")
    y = ops.prod(x, axis=(-1, 0), keepdims=np.bool_(True))
    assert y.producer.attrs == {"axes": [0, 2], "keepdims": True}
    assert y.shape == (1, 3, 1)
    assert ops.sum(x).producer.attrs == {"axes": [0, 1, 2], "keepdims": False}
    assert ops.sum(x).shape == ()


def test_gpu_targets_compile():
    """Compile-only for gfx942 and sm_80, generated lowering: every reduction, f16 and i32, symbolic dims."""
    g = rocmc.Graph("t")
    x, i = g.input("x", (4, "seq", 64), "f16"), g.input("i", ("seq", 8), "i32")
    g.output(
        *(getattr(ops, n)(x, axis=-1) for n in sorted(REDUCTIONS)),
        ops.mean(x, axis=(0, 1), keepdims=True),
        ops.norm2(x),
        *(getattr(ops, n)(i, axis=0) for n in INT_REDUCTIONS),
    )
    compile_gpu(g, impl="generated")


# ---- errors ---------------------------------------------------------------------------------------


def test_axis_out_of_range():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3), "f32")
    with pytest.raises(rocmc.GraphError, match=r"sum: axis=2 is out of range for rank 2; expected -2\.\.1"):
        ops.sum(x, axis=2)
    with pytest.raises(rocmc.GraphError, match=r"mean: axis=-3 is out of range"):
        ops.mean(x, axis=(0, -3))
    with pytest.raises(rocmc.GraphError, match=r"max: axis=0 is out of range for rank 0; a 0-d tensor has no axes"):
        ops.max(g.input("s", (), "f32"), axis=0)


def test_bad_axis_values():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3), "f32")
    with pytest.raises(rocmc.GraphError, match=r"prod: axis 1 repeated"):
        ops.prod(x, axis=(1, -1))
    with pytest.raises(rocmc.GraphError, match=r"min: axis=1.5 must be None, an int or a tuple"):
        ops.min(x, axis=1.5)
    with pytest.raises(rocmc.GraphError, match=r"amax: keepdims=1, expected a bool"):
        ops.amax(x, 0, 1)


@pytest.mark.parametrize("name", ["mean", "norm1", "norm2"])
def test_float_only_reductions_reject_ints(name):
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3), "i32")
    with pytest.raises(rocmc.GraphError, match=rf"{name}\(%0\): 'x' has dtype i32, {name} expects a float tensor"):
        getattr(ops, name)(x)


def test_bool_is_rejected():
    g = rocmc.Graph("t")
    with pytest.raises(rocmc.GraphError, match=r"sum\(%0\): 'x' has dtype bool, sum expects a float or int"):
        ops.sum(g.input("x", (2,), "bool"))


def test_unknown_keyword_and_attribute():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3), "f32")
    with pytest.raises(rocmc.GraphError, match=r"sum: .*dim.*expected arguments \(x, axis, keepdims\)"):
        ops.sum(x, dim=1)
    with pytest.raises(rocmc.GraphError, match=r"sum: unknown attribute 'dim'; expected axes, keepdims"):
        g.apply("sum", [x], {"axes": [1], "keepdims": False, "dim": 1})


def test_unnormalized_axes_attribute():
    """Nodes built directly (importers) must carry normalized axes."""
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3), "f32")
    with pytest.raises(rocmc.GraphError, match=r"sum\(%0\): axes=\[1, 0\], expected a sorted list"):
        g.apply("sum", [x], {"axes": [1, 0], "keepdims": False})
    with pytest.raises(rocmc.GraphError, match=r"sum\(%0\): axes=None, expected a sorted list"):
        g.apply("sum", [x], {"keepdims": False})
