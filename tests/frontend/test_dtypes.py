"""The element types beyond f32/f16/bf16/i32/i64: i8, i16, u8, u16, u32, u64 and f64, compiled for the
CPU against numpy. Integers over their whole range (so wraparound, unsigned order and unsigned division
are exercised) match exactly; f64 matches at float64 precision. One module per dtype, many outputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import rocmc
from rocmc import ops
from rocmc.lowering import registry
from rocmc.lowering.target import Target

INTS = ["i8", "i16", "u8", "u16", "u32", "u64"]
N = 257


def full_range(rng, d, n: int = N) -> np.ndarray:
    """Integers over the dtype's whole range, with its extremes, 0, 1 and -1 (as the dtype) mixed in."""
    lo, hi = d.limits
    a = rng.integers(lo, hi, size=n, endpoint=True, dtype=d.np)
    specials = np.array([lo, hi, 0, 1], dtype=d.np)
    a[rng.choice(n, size=8, replace=False)] = np.resize(np.concatenate([specials, np.array([-1]).astype(d.np)]), 8)
    return a


def divisors(rng, d, n: int = N) -> np.ndarray:
    """Like full_range, plus many small divisors (so quotients are not all 0) and zeros and -1 (x/0, INT_MIN/-1)."""
    b = full_range(rng, d, n)
    small = rng.integers(1, 8, size=n // 2).astype(d.np)
    if not d.unsigned:
        small = np.where(rng.random(n // 2) < 0.5, small, -small).astype(d.np)
    b[: n // 2] = small
    b[rng.choice(n, size=6, replace=False)] = np.array([0, 0, 0, -1, -1, -1]).astype(d.np)
    return b


def _int_graph(name: str):
    """Every integer op on x, y (two full-range tensors) and f (float64 values in the dtype's range)."""
    d = rocmc.dtype(name)
    g = rocmc.Graph(f"ints_{name}")
    x, y = g.input("x", (N,), name), g.input("y", (N,), name)
    f = g.input("f", (N,), "f64")
    outs = {
        "add": ops.add(x, y),
        "sub": ops.sub(x, y),
        "mul": ops.mul(x, y),
        "div": ops.div(x, y),
        "mod": ops.mod(x, y),
        "fmod": ops.mod(x, y, fmod=1),
        "less": ops.less(x, y),
        "less_equal": ops.less_equal(x, y),
        "greater": ops.greater(x, y),
        "greater_equal": ops.greater_equal(x, y),
        "equal": ops.equal(x, y),
        "not_equal": ops.not_equal(x, y),
        "maximum": ops.maximum(x, y),
        "minimum": ops.minimum(x, y),
        "to_f64": ops.cast(x, "f64"),
        "to_f32": ops.cast(x, "f32"),
        "to_i64": ops.cast(x, "i64"),
        "to_u8": ops.cast(x, "u8"),
        "to_bool": ops.cast(x, "bool"),
        "from_f64": ops.cast(f, name),
        "from_i64": ops.cast(ops.cast(f, "i64"), name),
        "sum": ops.sum(x),
        "max": ops.max(x),
        "min": ops.min(x),
        "where": ops.where(ops.less(x, y), x, y),
        "abs": ops.abs(x),
        "neg": ops.neg(x),
        "sign": ops.sign(x),
        "relu": ops.relu(x),
        "cumsum": ops.cumsum(x, axis=0),
        "argmax": ops.argmax(x, axis=0),
    }
    topv, topi = ops.topk(x, 5, largest=False)
    outs.update(topk_values=topv, topk_indices=topi)
    for v in outs.values():
        g.output(v)
    return g, list(outs), d


@pytest.mark.parametrize("name", INTS)
def test_integer_ops_match_numpy_exactly(name, rng):
    g, names, d = _int_graph(name)
    x, y = full_range(rng, d), divisors(rng, d)
    lo, hi = d.limits
    f = rng.uniform(max(lo, -(2.0**62)), min(hi, 2.0**62), N)  # truncates into range
    got = rocmc.load(rocmc.compile(g, "cpu"))(x, y, f)
    want = rocmc.evaluate(g, x, y, f)
    for op, a, w, v in zip(names, got, want, g.outputs):
        expect = w.astype(v.dtype.np)
        assert a.dtype == v.dtype.np, f"{op}: {a.dtype} vs {v.dtype.np}"
        np.testing.assert_array_equal(a, expect, err_msg=f"{name} {op}")
    _check_against_numpy(dict(zip(names, got)), x, y, f, d)


def _check_against_numpy(got: dict, x, y, f, d) -> None:
    """The reference's own semantics, spelled out in numpy: wraparound at the dtype's width, unsigned
    order, truncating division with x / 0 = x and INT_MIN / -1 = INT_MIN."""
    t = d.np
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got["add"], (x + y).astype(t))
        np.testing.assert_array_equal(got["mul"], (x * y).astype(t))
        np.testing.assert_array_equal(got["less"], x < y)
        np.testing.assert_array_equal(got["maximum"], np.maximum(x, y))
        np.testing.assert_array_equal(got["to_f64"], x.astype(np.float64))
        np.testing.assert_array_equal(got["from_f64"], np.trunc(f).astype(t))
        np.testing.assert_array_equal(got["sum"], x.sum(dtype=t))
        np.testing.assert_array_equal(got["neg"], (-x).astype(t))
        wide = [int(a) for a in x], [int(b) for b in y]
        div = [a if b == 0 else _wrap(-a, d) if b == -1 else _trunc_div(a, b) for a, b in zip(*wide)]
        np.testing.assert_array_equal(got["div"], np.array(div, dtype=object).astype(t))
        mod = [0 if b in (0, -1) else a - b * (a // b) for a, b in zip(*wide)]
        np.testing.assert_array_equal(got["mod"], np.array(mod, dtype=object).astype(t))
    assert not np.all(got["div"] == 0), "no quotient but 0: the divisors are too large to test division"


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _wrap(v: int, d) -> int:
    lo, hi = d.limits
    return (v - lo) % (hi - lo + 1) + lo


def test_float64_ops_at_float64_precision(rng):
    g = rocmc.Graph("doubles")
    x, y = g.input("x", (4, 33), "f64"), g.input("y", (4, 33), "f64")
    exact = {
        "add": ops.add(x, y),
        "sub": ops.sub(x, y),
        "mul": ops.mul(x, y),
        "div": ops.div(x, y),
        "fmod": ops.mod(x, y, fmod=1),
        "mod": ops.mod(x, y),
        "less": ops.less(x, y),
        "maximum": ops.maximum(x, y),
        "minimum": ops.minimum(x, y),
        "max": ops.max(x, axis=1),
        "where": ops.where(ops.greater(x, y), x, y),
        "abs": ops.abs(x),
        "neg": ops.neg(x),
        "floor": ops.floor(x),
        "round": ops.round(x),
        "sqrt": ops.sqrt(ops.abs(x)),
        "to_f32": ops.cast(x, "f32"),
        "to_i64": ops.cast(x, "i64"),
        "to_u16": ops.cast(ops.abs(x), "u16"),
        "from_i64": ops.cast(ops.cast(x, "i64"), "f64"),
        "topk": ops.topk(x, 3, axis=1)[0],
        "argmax": ops.argmax(x, axis=1),
    }
    close = {
        "sum": ops.sum(x, axis=1),
        "mean": ops.mean(x, axis=0),
        "exp": ops.exp(ops.div(x, 100.0)),
        "log": ops.log(ops.abs(x)),
        "tanh": ops.tanh(ops.div(x, 1e4)),
        "tanh_big": ops.tanh(ops.div(x, 1e2)),
        "sigmoid": ops.sigmoid(ops.div(x, 100.0)),
        "pow": ops.pow(ops.abs(x), ops.div(y, 1e3)),
        "gelu_tanh": ops.gelu(ops.div(x, 100.0), approximate="tanh"),
        "matmul": ops.matmul(x, ops.transpose(x, 0, 1)),
        "cumsum": ops.cumsum(x, axis=1),
        "softmax": ops.softmax(ops.div(x, 100.0), axis=1),
        "log_softmax": ops.log_softmax(ops.div(x, 100.0), axis=1),
        "layer_norm": ops.layer_norm(x, axis=1),
        "rms_norm": ops.rms_norm(x, axis=1),
    }
    close["arange"] = ops.arange(g, 0.1, 5.0, 0.3, dtype="f64")  # start + i * delta, maybe one fma
    for v in list(exact.values()) + list(close.values()):
        g.output(v)
    a = rng.standard_normal((4, 33)) * 1e3
    b = rng.standard_normal((4, 33)) * 10.0
    b[0, :4] = [np.inf, -np.inf, 0.5, 3.0]
    got = rocmc.load(rocmc.compile(g, "cpu"))(a, b)
    want = rocmc.evaluate(g, a, b)
    for i, name in enumerate(exact):
        np.testing.assert_array_equal(got[i], want[i], err_msg=name)
    for j, name in enumerate(close, len(exact)):
        assert got[j].dtype == np.float64, name
        # An absolute term of the output's scale: a sum that cancels (terms of 1e3 adding to 15) keeps f64's error
        # of its terms, not of its result (gelu: 1 + tanh cancels too); f32 arithmetic would be 1e8 times past it.
        scale = float(np.abs(want[j][np.isfinite(want[j])]).max(initial=1.0))
        np.testing.assert_allclose(got[j], want[j], rtol=1e-13, atol=1e-13 * scale, err_msg=name)
    np.testing.assert_array_equal(got[list(exact).index("fmod")], np.fmod(a, b))


def test_float64_ops_without_a_lowering_are_refused_at_build():
    x = rocmc.Graph("g").input("x", (3,), "f64")
    for fn in (ops.sin, ops.cos, ops.erf, ops.gelu):
        with pytest.raises(rocmc.GraphError, match=rf"{fn.__name__}\(%0\): operand %0 has dtype f64"):
            fn(x)


def test_gpu_kernels_are_not_chosen_for_types_they_lack():
    g = rocmc.Graph("g")
    x = g.input("x", (2, 64), "f64")
    y = ops.rms_norm(x, axis=1)
    node = g.nodes[-1]
    choice = registry.choose(node, Target.parse("gfx942"))
    assert choice.impl.name == "generated"
    assert any(name == "kernel" and "f64" in why for name, why in choice.skipped)
    assert y.dtype == rocmc.f64


def test_dtype_spellings():
    assert rocmc.dtype("uint8") is rocmc.u8 and rocmc.dtype(np.uint64) is rocmc.u64
    assert rocmc.dtype("float64") is rocmc.f64 and rocmc.dtype(np.dtype("int16")) is rocmc.i16
    assert rocmc.u32.mlir == rocmc.i32.mlir == "i32" and rocmc.u32.unsigned and not rocmc.i32.unsigned
    assert rocmc.u16.limits == (0, 65535) and rocmc.i8.limits == (-128, 127)


def test_every_dtype_crosses_the_module_boundary_as_its_facts_say(rng):
    # One module passing every dtype through: the results carry each DType's HAL element type (i4 and u4: their
    # bytes, int8), and the values (bf16 passed as tagged raw bits, bool as int8, 4-bit values two a byte) come back
    # unchanged.
    g = rocmc.Graph("g")
    data, outs = {}, []
    for d in rocmc.dtypes.ALL.values():
        x = g.input(f"x_{d.name}", (5,), d)
        outs.append(ops.logical_not(ops.logical_not(x)) if d.kind == "bool" else ops.cast(ops.cast(x, "f64"), d))
        data[x.name] = (rng.random(5) < 0.5) if d.kind == "bool" else rng.integers(0, 100, 5).astype(d.np)
    g.output(*outs)
    module = rocmc.load(rocmc.compile(g, "cpu"))
    on_device = module(**data, output="device")
    for d, r, got in zip(rocmc.dtypes.ALL.values(), on_device, module(**data)):
        hal = rocmc.i8.hal_element_type() if d.packed else d.hal_element_type()
        assert int(r._buffer_view.element_type) == int(hal), d
        assert list(r._buffer_view.shape) == d.abi_shape([5]), d
        assert got.dtype == d.np and np.array_equal(got, data[f"x_{d.name}"]), d


def test_accumulation_and_mlir_lookup():
    dt = rocmc.dtypes
    assert [d.acc_mlir for d in (rocmc.f16, rocmc.bf16, rocmc.f32, rocmc.f64, rocmc.u8, rocmc.bool_)] == [
        "f32",
        "f32",
        "f32",
        "f64",
        "i8",
        "i1",
    ]
    assert dt.of_mlir("i8") is rocmc.i8 and dt.acc_mlir("bf16") == "f32" and dt.is_float_mlir("f16")
    assert not dt.is_float_mlir("i64")
    with pytest.raises(rocmc.GraphError, match="'index' is none of rocmc's"):
        dt.of_mlir("index")


def test_evaluate_wraps_integer_inputs_of_another_width(rng):
    g = rocmc.Graph("g")
    x = g.input("x", (5,), "u8")
    g.output(ops.add(x, x))
    a = rng.integers(200, 1000, 5)
    np.testing.assert_array_equal(rocmc.evaluate(g, a), (a.astype(np.uint8) * 2).astype(np.uint8))


def test_onnx_model_with_small_ints_and_doubles(rng):
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Div", ["a", "b"], ["q"]),
        helper.make_node("Mul", ["d", "d"], ["m"]),
        helper.make_node("Cast", ["s"], ["sd"], to=TensorProto.DOUBLE),
    ]
    graph = helper.make_graph(
        nodes,
        "m",
        [
            helper.make_tensor_value_info("a", TensorProto.UINT8, [16]),
            helper.make_tensor_value_info("b", TensorProto.UINT8, [16]),
            helper.make_tensor_value_info("d", TensorProto.DOUBLE, [16]),
        ],
        [
            helper.make_tensor_value_info(n, t, [16])
            for n, t in (
                ("s", TensorProto.UINT8),
                ("q", TensorProto.UINT8),
                ("m", TensorProto.DOUBLE),
                ("sd", TensorProto.DOUBLE),
            )
        ],
    )
    g = rocmc.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    a, b = rng.integers(0, 256, 16).astype(np.uint8), rng.integers(1, 256, 16).astype(np.uint8)
    d = rng.standard_normal(16)
    s, q, m, sd = rocmc.load(rocmc.compile(g, "cpu"))(a, b, d)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(q, a // b)
    np.testing.assert_array_equal(m, d * d)
    np.testing.assert_array_equal(sd, (a + b).astype(np.float64))


@pytest.mark.parametrize("target", ["gfx942", "cuda:sm_80"])
def test_new_dtypes_compile_for_gpu_targets(target):
    """Compile only (no GPU here): the integer ops of u64 and f64's mod, tanh, norms and topk, each
    through the generated lowering (f64 remainders use the device's own fmod there)."""
    rocmc.compile(_int_graph("u64")[0], target)
    g = rocmc.Graph("doubles")
    x = g.input("x", (4, 64), "f64")
    for v in (ops.mod(x, x), ops.tanh(x), ops.rms_norm(x, axis=1), ops.layer_norm(x, axis=1), ops.topk(x, 3)[0]):
        g.output(v)
    art = rocmc.compile(g, target)
    assert len(art.vmfb) > 0
