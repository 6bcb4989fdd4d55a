"""Elementwise ops against the float64 reference (static and symbolic dims, broadcasting, dtypes)."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.frontend.ops.elementwise import BINARY, COMPARE, UNARY

from helpers import CpuBatch, check, compile_gpu, rand

DTYPES = ["f32", "f16", "bf16"]

# Each test's graph is a function of a module of its parametrization's graphs (helpers.CpuBatch): a compile a
# module, not a test. Keys in the order the tests run (the last parametrize decorator's values outermost).


def _binary_graph(name, dtype):
    g = rocmc.Graph("t")
    a = g.input("a", (2, "n", 7), dtype)
    b = g.input("b", (1, 7), dtype)
    g.output(getattr(ops, name)(a, b))
    return g


BINARY_BATCH = CpuBatch.grid(_binary_graph, sorted(BINARY), DTYPES)


@BINARY_BATCH.parametrize("name,dtype")
def test_binary_broadcast_symbolic(name, dtype, rng):
    g, module = BINARY_BATCH(name, dtype)
    lo = 0.5 if name == "pow" else -2.0
    x, y = rand(rng, (2, 5, 7), dtype, lo, 2.0), rand(rng, (1, 7), dtype, lo, 2.0)
    if name == "div":
        y = np.where(np.abs(y.astype(np.float32)) < 0.25, 1.0, y).astype(y.dtype)
    check(g, x, y, module=module)


INT_BINARY = sorted(k for k, v in BINARY.items() if "int" in v[0])


def _binary_int_graph(name, dtype):
    g = rocmc.Graph("t")
    a, b = g.input("a", (3, 5), dtype), g.input("b", (3, 5), dtype)
    g.output(getattr(ops, name)(a, b))
    return g


BINARY_INT_BATCH = CpuBatch.grid(_binary_int_graph, INT_BINARY, ["i32", "i64"])


@BINARY_INT_BATCH.parametrize("name,dtype")
def test_binary_int(name, dtype, rng):
    g, module = BINARY_INT_BATCH(name, dtype)
    x, y = rand(rng, (3, 5), dtype), rand(rng, (3, 5), dtype)
    y[y == 0] = 3
    check(g, x, y, module=module)


UNARY_NAMES = sorted(k for k in UNARY if k != "logical_not")


def _unary_graph(name, dtype):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 13), dtype)
    g.output(getattr(ops, name)(x))
    return g


UNARY_BATCH = CpuBatch(_unary_graph, [(n, d) for d in DTYPES for n in UNARY_NAMES], size=len(UNARY_NAMES))


@pytest.mark.parametrize("name", UNARY_NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_unary(name, dtype, rng):
    g, module = UNARY_BATCH(name, dtype)
    lo = 0.1 if name in ("log", "sqrt", "rsqrt") else -3.0
    check(g, rand(rng, (9, 13), dtype, lo, 3.0), module=module)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "leaky_relu", "negative_slope": 0.2},
        {"name": "elu", "alpha": 0.7},
        {"name": "clipped_relu", "ceiling": 1.5},
        {"name": "gelu", "approximate": "tanh"},
    ],
)
def test_unary_attributes(kwargs, rng):
    kwargs = dict(kwargs)
    name = kwargs.pop("name")
    g = rocmc.Graph("t")
    x = g.input("x", (4, 33), "f32")
    g.output(getattr(ops, name)(x, **kwargs))
    check(g, rand(rng, (4, 33), "f32", -3, 3))


def _compare_graph(name):
    g = rocmc.Graph("t")
    a, b = g.input("a", (4, "n"), "f32"), g.input("b", (4, 1), "f32")
    g.output(getattr(ops, name)(a, b))
    return g


COMPARE_BATCH = CpuBatch(_compare_graph, [(n,) for n in sorted(COMPARE)])


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_compare(name, rng):
    g, module = COMPARE_BATCH(name)
    x = rand(rng, (4, 6), "f32")
    check(g, x, x[:, :1].copy(), module=module)


def test_where_and_logical(rng):
    g = rocmc.Graph("t")
    c, a, b = g.input("c", (5, 1), "bool"), g.input("a", (5, 4), "f16"), g.input("b", (4,), "f16")
    g.output(ops.where(ops.logical_and(c, ops.greater(a, 0.0)), a, b), ops.logical_not(c))
    check(g, rand(rng, (5, 1), "bool"), rand(rng, (5, 4), "f16"), rand(rng, (4,), "f16"))


CASTS = [
    ("f32", "f16"),
    ("f16", "f32"),
    ("bf16", "f16"),
    ("f32", "i32"),
    ("i64", "f32"),
    ("i32", "i64"),
    ("i64", "i32"),
    ("f32", "bool"),
    ("bool", "f32"),
]


def _cast_graph(src, dst):
    g = rocmc.Graph("t")
    x = g.input("x", (3, "n"), src)
    g.output(ops.cast(x, dst))
    return g


CAST_BATCH = CpuBatch(_cast_graph, CASTS)


@pytest.mark.parametrize("src,dst", CASTS)
def test_cast(src, dst, rng):
    g, module = CAST_BATCH(src, dst)
    check(g, rand(rng, (3, 10), src, -50, 50), module=module)


def test_scalar_operands_and_operators(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (6,), "f32")
    g.output((x * 2.0 + 1.0) / 3.0 - x**2.0)
    check(g, rand(rng, (6,), "f32"))


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_every_elementwise_op_compiles_for_gpu_targets(dtype):
    """Compile-only (no GPU here): one graph with every elementwise op, for gfx942 and cuda:sm_80."""
    g = rocmc.Graph("t")
    x, y = g.input("x", (2, "n", 64), dtype), g.input("y", (64,), dtype)
    outs = [getattr(ops, name)(x, y) for name in BINARY]
    outs += [getattr(ops, name)(x) for name in UNARY if name != "logical_not"]
    cmp = [getattr(ops, name)(x, y) for name in COMPARE]
    outs += [
        ops.where(ops.logical_not(ops.logical_xor(cmp[0], cmp[1])), x, y),
        ops.cast(cmp[2], dtype),
        ops.cast(ops.cast(x, "i32"), dtype),
    ]
    g.output(*outs)
    compile_gpu(g)


def test_dtype_mismatch_is_a_graph_error():
    g = rocmc.Graph("t")
    a, b = g.input("a", (2,), "f32"), g.input("b", (2,), "f16")
    with pytest.raises(rocmc.GraphError, match=r"add\(%0, %1\).*f32.*f16"):
        ops.add(a, b)


def test_broadcast_mismatch_is_a_graph_error():
    g = rocmc.Graph("t")
    a, b = g.input("a", (2, 3), "f32"), g.input("b", (4,), "f32")
    with pytest.raises(rocmc.GraphError, match="do not broadcast"):
        ops.mul(a, b)


def test_unsupported_dtype_for_op():
    g = rocmc.Graph("t")
    a = g.input("a", (2,), "i32")
    with pytest.raises(rocmc.GraphError, match="exp.*i32.*float"):
        ops.exp(a)


def test_unknown_attribute():
    g = rocmc.Graph("t")
    a = g.input("a", (2,), "f32")
    with pytest.raises(rocmc.GraphError, match="leaky_relu.*alpha"):
        ops.leaky_relu(a, alpha=0.1)
