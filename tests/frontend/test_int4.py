"""The 4-bit integer types (i4, u4): graph inputs and outputs as their bytes at the module's boundary (odd counts, odd
innermost sizes, scalars), conversions to and from floats, arithmetic wrapping as numpy's int4 does (ml_dtypes),
constants; against ml_dtypes and rocmc.evaluate on the CPU, compiled for the GPUs; symbolic sizes, which the boundary
refuses; ONNX's INT4 / UINT4 graph inputs and outputs (DequantizeLinear, QuantizeLinear, Cast) against the reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.dtypes import pack_nibbles, unpack_nibbles

from helpers import compile_gpu

RANGE = {"i4": (-8, 7), "u4": (0, 15)}


def _values(rng, name, shape):
    lo, hi = RANGE[name]
    v = rng.integers(lo, hi + 1, shape)
    v.reshape(-1)[:2] = [lo, hi][: v.size]  # the range's ends
    return v.astype(rocmc.dtype(name).np)


def _graph(name, shape):
    """x (4-bit) and s (f32, along the last dim): y = x * s in f32, x back from y / s rounded, x + x and x * x - 3
    (both wrapping), and a 4-bit constant added."""
    g = rocmc.Graph("q4")
    x = g.input("x", shape, name)
    s = g.input("s", shape[-1:], "f32")
    y = ops.mul(ops.cast(x, "f32"), s)
    back = ops.cast(ops.round(ops.div(y, s)), name)
    k = g.constant("k", np.arange(shape[-1]).astype(rocmc.dtype(name).np))
    g.output(
        y, back, ops.add(x, x), ops.add(ops.sub(ops.mul(x, x), ops.cast(g.constant("three", np.int8(3)), name)), k)
    )
    return g


@pytest.mark.parametrize("name", ["i4", "u4"])
@pytest.mark.parametrize("shape", [(6,), (1,), (4, 5), (3, 5), (3, 5, 2), (2, 3, 7)])
def test_four_bit_values_cross_the_boundary_and_wrap_as_numpy(rng, name, shape):
    g = _graph(name, shape)
    m = rocmc.load(rocmc.compile(g, "cpu"))
    x = _values(rng, name, shape)
    s = rng.uniform(0.5, 2.0, shape[-1]).astype(np.float32)
    y, back, twice, poly = m(x, s)
    k = np.arange(shape[-1]).astype(x.dtype)
    np.testing.assert_allclose(y, x.astype(np.float64) * s, rtol=1e-6)
    assert back.dtype == x.dtype and np.array_equal(back, x)
    for got, want in ((twice, x + x), (poly, x * x - np.array(3).astype(x.dtype) + k)):  # ml_dtypes' wrapping
        assert got.dtype == x.dtype and np.array_equal(got, want), (got, want)
    ref = rocmc.evaluate(g, x=x, s=s)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(ref[1:], (back, twice, poly)))


def test_casts_between_the_four_bit_types_and_integers_wrap(rng):
    g = rocmc.Graph("c")
    x, u = g.input("x", (3, 5), "i4"), g.input("u", (3, 5), "u4")
    w = g.input("w", (3, 5), "i32")
    g.output(
        ops.cast(u, "i4"),
        ops.cast(x, "u4"),
        ops.cast(w, "i4"),
        ops.cast(x, "i32"),
        ops.add(ops.mul(x, x), ops.cast(u, "i4")),
    )
    xv, uv = _values(rng, "i4", (3, 5)), _values(rng, "u4", (3, 5))
    wv = rng.integers(-300, 300, (3, 5)).astype(np.int32)
    got = rocmc.load(rocmc.compile(g, "cpu"))(xv, uv, wv)
    i4, u4 = ml_dtypes.int4, ml_dtypes.uint4
    wrap = lambda a, t: np.asarray(a).astype(np.int64).astype(t)  # noqa: E731
    want = (wrap(uv, i4), wrap(xv, u4), wrap(wv, i4), xv.astype(np.int32), xv * xv + wrap(uv, i4))
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b), (a, b)
    for a, b in zip(rocmc.evaluate(g, x=xv, u=uv, w=wv), want):
        assert np.array_equal(np.asarray(a), b)


@pytest.mark.parametrize("name", ["i4", "u4"])
def test_floats_past_the_range_wrap_as_ml_dtypes_converts(rng, name):
    g = rocmc.Graph("c")
    g.output(ops.cast(g.input("x", (4, 6), "f32"), name))
    x = rng.uniform(-40, 40, (4, 6)).astype(np.float32)
    got = rocmc.load(rocmc.compile(g, "cpu"))(x)
    assert np.array_equal(got, x.astype(rocmc.dtype(name).np))


def test_the_packed_layout_is_two_values_a_byte_low_nibble_first():
    x = np.array([-8, -1, 0, 7, 3], ml_dtypes.int4)
    assert list(pack_nibbles(x)) == [0xF8, 0x70, 0x03]
    assert np.array_equal(unpack_nibbles(pack_nibbles(x), rocmc.dtype("i4"), (5,)), x)
    u = np.array([[15, 0], [9, 1]], ml_dtypes.uint4)
    assert np.array_equal(unpack_nibbles(pack_nibbles(u), rocmc.dtype("u4"), (2, 2)), u)


def test_a_scalar_crosses_in_a_byte(rng):
    g = rocmc.Graph("s")
    x = g.input("x", (), "u4")
    g.output(ops.add(x, x), ops.cast(x, "f32"))
    twice, f = rocmc.load(rocmc.compile(g, "cpu"))(np.array(13, ml_dtypes.uint4))
    assert twice.shape == () and int(twice) == 10 and float(f) == 13.0


def test_symbolic_sizes_at_the_boundary_are_reported():
    g = rocmc.Graph("bad")
    g.output(ops.cast(g.input("x", ("n", 4), "i4"), "f32"))
    with pytest.raises(rocmc.LoweringError, match=r"input 'x': i4\[n, ?4\] has symbolic sizes"):
        rocmc.compile(g, "cpu")
    g = rocmc.Graph("bad_out")
    g.output(ops.cast(g.input("x", ("n", 4), "f32"), "u4"))
    with pytest.raises(rocmc.LoweringError, match=r"output .* has symbolic sizes"):
        rocmc.compile(g, "cpu")


def test_four_bit_modules_build_for_the_gpus():
    compile_gpu(_graph("i4", (4, 5)))


@pytest.mark.parametrize("kind", ["int4", "uint4"])
def test_onnx_four_bit_inputs_and_outputs_match_the_reference(rng, kind):
    """An INT4 / UINT4 graph input dequantized per channel, a float quantized to 4 bits, and a Cast to 4 bits (of
    values past the range: ONNX wraps them), against onnx.reference."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    name = {"int4": "i4", "uint4": "u4"}[kind]
    et = {"int4": TensorProto.INT4, "uint4": TensorProto.UINT4}[kind]
    lo, hi = RANGE[name]
    narrow = getattr(ml_dtypes, kind)
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], axis=1),
        helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["xq"]),
        helper.make_node("Cast", ["x"], ["xc"], to=et),
    ]
    inits = [
        numpy_helper.from_array(rng.uniform(0.05, 0.2, 6).astype(np.float32), "s"),
        numpy_helper.from_array(rng.integers(lo, hi + 1, 6).astype(narrow), "z"),
        numpy_helper.from_array(np.array(0.3, np.float32), "s0"),
        numpy_helper.from_array(np.array(lo + 5, narrow), "z0"),
    ]
    graph = helper.make_graph(
        nodes,
        "q4",
        [helper.make_tensor_value_info("q", et, [4, 6]), helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [
            helper.make_tensor_value_info("d", TensorProto.FLOAT, [4, 6]),
            helper.make_tensor_value_info("xq", et, [4, 6]),
            helper.make_tensor_value_info("xc", et, [4, 6]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    q = _values(rng, name, (4, 6))
    x = rng.normal(0, 6, (4, 6)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"q": q, "x": x})
    got = rocmc.load(rocmc.compile(rocmc.import_onnx(model), "cpu"))(q, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)
    for a, b in zip(got[1:], want[1:]):
        assert a.dtype == narrow and np.array_equal(a, b), (a, b)
