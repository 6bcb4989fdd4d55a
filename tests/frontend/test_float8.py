"""The float8 element types (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz): conversions to and from every other kind, rounding
and the range's ends with and without saturation, arithmetic (in f32, each op's result rounded), symbolic dims; against
ml_dtypes and rocmc.evaluate on the CPU, compiled for the GPUs; through the torch and ONNX importers against torch
and onnx.reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.dtypes import FLOAT8, float8_max

from helpers import CpuBatch

NAMES = [d.name for d in FLOAT8]
SPECIAL = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-9, -1e-9, 449.0, 241.0, 1e6, -7e4, 57344.0, 0.3], np.float32)


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit for bit, NaN's encodings aside."""
    g, w = np.asarray(got), np.asarray(want).astype(got.dtype)
    nan = np.isnan(g.astype(np.float32)) & np.isnan(w.astype(np.float32))
    return bool(((g.view(np.uint8) == w.view(np.uint8)) | nan).all())


def _inputs(rng, name, n):
    """f32 values over the type's whole range (and past it), and values of the type itself."""
    top = float8_max(rocmc.dtype(name))
    x = np.concatenate([SPECIAL, rng.uniform(-1.2 * top, 1.2 * top, n), rng.standard_normal(n).astype(np.float32)])
    q = rng.uniform(-top, top, 2 * n).astype(rocmc.dtype(name).np)
    return x.astype(np.float32), q


def _f16s_graph(name):
    g = rocmc.Graph("f16s")
    h, x = g.input("h", ("n",), "f16"), g.input("x", ("m",), "f32")
    g.output(ops.cast(h, name), ops.cast(x, name))
    return g


# A parametrized test's graphs are the functions of one module (helpers.CpuBatch): a compile a module, not a test.
F16S_BATCH = CpuBatch(_f16s_graph, [(name,) for name in NAMES])


@pytest.mark.parametrize("name", NAMES)
def test_every_f16_value_converts_as_ml_dtypes(name):
    """Every f16 value, from f16 and from f32, rounds to the float8 type as ml_dtypes does, bit for bit. Among them
    the values that round up from the largest subnormal to the smallest normal, which IREE 3.13's truncation
    turned into 0 (the emitter sets them first); f32 values between f16's too."""
    d = rocmc.dtype(name)
    _, module = F16S_BATCH(name)
    hs = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    tiny = float(ml_dtypes.finfo(d.np).smallest_normal)
    xs = np.concatenate([hs.astype(np.float32), np.linspace(-1.05 * tiny, 1.05 * tiny, 4099, dtype=np.float32)])
    with np.errstate(over="ignore", invalid="ignore"):
        from_h, from_x = module(hs, xs)
        assert _same(from_h, hs.astype(d.np)) and _same(from_x, xs.astype(d.np))


def _f8_conversions_graph(name):
    g = rocmc.Graph("f8")
    x = g.input("x", ("n",), "f32")
    q = g.input("q", ("m",), name)
    g.output(
        ops.cast(x, name),  # rounded to nearest even; past the range: NaN (inf in e5m2)
        ops.cast(x, name, saturate=True),
        ops.cast(ops.cast(x, "f16"), name),
        ops.cast(q, "f32"),
        ops.cast(q, "bf16"),
        ops.cast(q, "i32"),
        ops.cast(ops.cast(x, "i32"), name, saturate=True),
        q * q + q,  # each op in f32, rounded to the type
    )
    return g


CONVERSIONS_BATCH = CpuBatch(_f8_conversions_graph, [(name,) for name in NAMES])


@pytest.mark.parametrize("name", NAMES)
def test_conversions_and_arithmetic_match_ml_dtypes(rng, name):
    d = rocmc.dtype(name)
    g, mod = CONVERSIONS_BATCH(name)
    for n in (1, 37):
        xs, qs = _inputs(rng, name, n)
        got = list(mod(xs, qs))
        top = float8_max(d)
        with np.errstate(over="ignore", invalid="ignore"):
            want = [
                xs.astype(d.np),
                np.clip(xs, -top, top).astype(d.np),
                xs.astype(np.float16).astype(d.np),
                qs.astype(np.float32),
                qs.astype(ml_dtypes.bfloat16),
                qs.astype(np.float32).astype(np.int32),
                np.clip(np.trunc(xs) + 0.0, -top, top).astype(d.np),  # an integer has no -0; compared where x fits
                # each op in f32, its result rounded to the type (the product first)
                ((qs.astype(np.float32) ** 2).astype(d.np).astype(np.float32) + qs.astype(np.float32)).astype(d.np),
            ]
        fits = np.isfinite(xs) & (np.abs(xs) < 2**31)  # float -> int is undefined past the range, as in C
        got[6], want[6] = got[6][fits], want[6][fits]
        for i, (a, b) in enumerate(zip(got, want)):
            if a.dtype == d.np:
                assert _same(a, b), (i, a, b)
            else:
                np.testing.assert_array_equal(a, b, err_msg=str(i))
        ref = rocmc.evaluate(g, x=xs, q=qs, round_to_dtype=True)  # each result in its type, as stored
        for i in (0, 1, 2, 7):
            assert _same(got[i], ref[i]), i
    # the saturated conversion keeps NaN, clamps infinities and finite overflow to the largest value
    sat = mod(SPECIAL, np.zeros(1, d.np))[1].astype(np.float32)
    assert np.isnan(sat[2]) and sat[3] == top and sat[4] == -top and sat[9] == top and sat[10] == -top


@pytest.mark.parametrize("name", ["f8e4m3fn", "f8e5m2fnuz"])
def test_float8_constants_and_parameters(rng, name):
    """Weights stored in float8: a large constant (a module resource), a small one (inline), a returned one, and a
    parameter given at load; the product in f32."""
    d = rocmc.dtype(name)
    w = rng.uniform(-4, 4, (64, 16)).astype(d.np)
    small = np.array([0.5, -2.0, 3.0], d.np)
    g = rocmc.Graph("c8")
    x = g.input("x", ("n", 64), "f32")
    g.output(
        ops.matmul(x, ops.cast(g.constant("w", w), "f32")), ops.cast(g.constant("s", small), "f32"), g.constant("w2", w)
    )
    xs = rng.standard_normal((3, 64)).astype(np.float32)
    want = xs.astype(np.float64) @ w.astype(np.float64)
    a, b, c = rocmc.load(rocmc.compile(g, "cpu"))(xs)
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(b, small.astype(np.float32))
    assert c.dtype == d.np and _same(c, w)
    np.testing.assert_allclose(rocmc.evaluate(g, x=xs)[0], want, rtol=1e-12)
    p = rocmc.Graph("p8")
    x = p.input("x", ("n", 64), "f32")
    p.output(ops.matmul(x, ops.cast(p.parameter("w", (64, 16), name), "f32")))
    mod = rocmc.load(rocmc.compile(p, "cpu"), parameters={"w": w})
    np.testing.assert_allclose(mod(xs), want, rtol=1e-5, atol=1e-5)


def test_saturate_applies_to_float8_only():
    g = rocmc.Graph("bad")
    x = g.input("x", (3,), "f32")
    with pytest.raises(rocmc.GraphError, match="saturate=True applies to the float8 types, not f16"):
        ops.cast(x, "f16", saturate=True)
    with pytest.raises(rocmc.GraphError, match="saturate=1: expected True or False"):
        ops.cast(x, "f8e4m3fn", saturate=1)


EMULATE = "--iree-llvmgpu-enable-small-float-emulation"


def _f8_graph(*names):
    g = rocmc.Graph("f8")
    x = g.input("x", ("n", 64), "f16")
    w = g.input("w", (64, 64), names[0])
    y = ops.matmul(x, ops.cast(w, "f16"))
    g.output(*(ops.cast(y, n, saturate=True) for n in names[1:]))
    return g


@pytest.mark.parametrize(
    "target,names,emulated",
    [
        ("gfx942", ("f8e4m3fnuz", "f8e5m2fnuz"), False),  # MI300 converts its fnuz types itself
        ("gfx942", ("f8e4m3fn", "f8e5m2"), True),
        ("gfx950", ("f8e4m3fn", "f8e5m2"), False),
        ("gfx90a", ("f8e4m3fnuz", "f8e5m2"), True),
        ("gfx1100", ("f8e5m2fnuz", "f8e4m3fn"), True),
    ],
)
def test_float8_compiles_for_amd_gpus_in_software_where_the_chip_lacks_it(target, names, emulated):
    art = rocmc.compile(_f8_graph(*names), target)  # compile-only: no AMD GPU runs here
    assert art.metadata["signature"]["inputs"][1]["dtype"] == names[0]
    assert (EMULATE in art.metadata["compile_flags"]) == emulated


def test_float8_on_cuda_is_a_typed_error():
    with pytest.raises(rocmc.LoweringError, match=r"f8e4m3fn, f8e5m2 on cuda:sm_80: IREE .*CUDA backend can't"):
        rocmc.compile(_f8_graph("f8e4m3fn", "f8e5m2"), "cuda:sm_80")


def test_torch_float8_conversions_import_as_torch_converts(rng):
    torch = pytest.importorskip("torch")

    class M(torch.nn.Module):
        def forward(self, x, q):
            a = x.to(torch.float8_e4m3fn).to(torch.float32)  # torch saturates e4m3fn
            b = x.to(torch.float8_e5m2).to(torch.float32)  # and not e5m2
            return a * 2, b, q.to(torch.float32) + 1

    x = torch.from_numpy(np.concatenate([SPECIAL[:5], SPECIAL[7:], rng.uniform(-600, 600, 20).astype(np.float32)]))
    q = torch.from_numpy(rng.uniform(-50, 50, 9).astype(np.float32)).to(torch.float8_e5m2)
    m = M()
    g = rocmc.import_torch(m, (x, q))
    got = rocmc.load(rocmc.compile(g, "cpu"))(x, q)
    for a, b in zip(got, m(x, q)):
        np.testing.assert_array_equal(a, b.numpy())


def test_onnx_float8_quantization_matches_onnx_reference(rng, tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1),
        helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT8E5M2, saturate=0),
    ]
    scale = rng.uniform(0.5, 2.0, 6).astype(np.float32)
    inits = [
        numpy_helper.from_array(scale, "s"),
        helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [6], [0.0] * 6),
    ]
    graph = helper.make_graph(
        nodes,
        "f8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 6])],
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT8E4M3FN, ["b", 6]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 6]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT8E5M2, ["b", 6]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model)
    path = tmp_path / "f8.onnx"
    onnx.save(model, path)
    mod = rocmc.load(rocmc.compile(rocmc.import_onnx(path), "cpu"))
    x = rng.uniform(-900, 900, (5, 6)).astype(np.float32)
    x[0, :3] = [np.inf, -np.inf, np.nan]
    x[1, :2] = [1e5, -1e5]
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = mod(x)
    assert _same(got[0], want[0]) and _same(got[2], want[2])
    np.testing.assert_array_equal(got[1], want[1])
