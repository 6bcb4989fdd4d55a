"""ONNX models quantized by ONNX Runtime's own tools (quantize_dynamic: DynamicQuantizeLinear with MatMulInteger or
ConvInteger; quantize_static in the QDQ format: QuantizeLinear and DequantizeLinear, per tensor and per channel,
int8 and float8 e4m3fn; and in the QOperator format: QLinearMatMul, QLinearConv) import and match ONNX Runtime's
run of the same quantized model."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import rocmc  # noqa: E402

IN, HIDDEN, OUT = 48, 96, 40


def _cnn(path, rng):
    """x (batch, 3, 12, 12) -> Conv 3x3 pad 1 (8 channels) + bias -> Relu -> Conv 3x3 stride 2 (4 channels)."""
    inits = {
        "w1": rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
        "b1": rng.normal(0, 0.1, (8,)).astype(np.float32),
        "w2": rng.normal(0, 0.2, (4, 8, 3, 3)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h0"], ["h1"]),
        helper.make_node("Conv", ["h1", "w2"], ["y"], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _mlp(path, rng, opset=17):
    """x (batch, 48) -> MatMul + Add -> Relu -> MatMul + Add (batch, 40), float32 weights."""
    inits = {
        "w1": rng.normal(0, 0.2, (IN, HIDDEN)).astype(np.float32),
        "b1": rng.normal(0, 0.1, (HIDDEN,)).astype(np.float32),
        "w2": rng.normal(0, 0.2, (HIDDEN, OUT)).astype(np.float32),
        "b2": rng.normal(0, 0.1, (OUT,)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["y0"]),
        helper.make_node("Add", ["y0", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, str(path))


class _Calibration(quantization.CalibrationDataReader):
    def __init__(self, rng, shape):
        self.batches = iter([{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self.batches, None)


def _quantize(kind, src, dst, rng, shape):
    conv = kind.startswith("conv_")
    kind = kind.removeprefix("conv_")
    if kind == "dynamic":
        types = ["Conv"] if conv else None
        quantization.quantize_dynamic(
            str(src), str(dst), weight_type=quantization.QuantType.QUInt8, op_types_to_quantize=types
        )
        return
    fmt = quantization.QuantFormat.QOperator if kind.startswith("qoperator") else quantization.QuantFormat.QDQ
    if kind == "qdq_float8":  # float8 e4m3fn activations and weights (ONNX Runtime's float8 calibration)
        quantization.quantize_static(
            str(src),
            str(dst),
            _Calibration(rng, shape),
            quant_format=fmt,
            activation_type=quantization.QuantType.QFLOAT8E4M3FN,
            weight_type=quantization.QuantType.QFLOAT8E4M3FN,
            calibrate_method=quantization.CalibrationMethod.Distribution,
            extra_options={"scenario": "same"},
        )
        return
    # 4-bit weights (int4 / uint4 initializers; ONNX's own DequantizeLinear takes them from opset 21 on)
    weight = {"qdq_int4": quantization.QuantType.QInt4, "qdq_uint4": quantization.QuantType.QUInt4}
    quantization.quantize_static(
        str(src),
        str(dst),
        _Calibration(rng, shape),
        quant_format=fmt,
        per_channel=kind.endswith("per_channel"),
        activation_type=quantization.QuantType.QUInt8,
        weight_type=weight.get(kind.removesuffix("_per_channel"), quantization.QuantType.QInt8),
        # QOperator's Add is com.microsoft's QLinearAdd (a contrib op, not ONNX): the products alone there.
        op_types_to_quantize=(["Conv"] if conv else ["MatMul"]) if kind.startswith("qoperator") else None,
    )


CASES = {
    "dynamic": {"DynamicQuantizeLinear", "MatMulInteger"},
    "qdq": {"QuantizeLinear", "DequantizeLinear"},
    "qdq_per_channel": {"QuantizeLinear", "DequantizeLinear"},
    "qdq_float8": {"QuantizeLinear", "DequantizeLinear"},
    "qdq_int4_per_channel": {"QuantizeLinear", "DequantizeLinear"},
    "qdq_uint4": {"QuantizeLinear", "DequantizeLinear"},
    "qoperator": {"QuantizeLinear", "QLinearMatMul", "DequantizeLinear"},
    "conv_dynamic": {"DynamicQuantizeLinear", "ConvInteger"},
    "conv_qdq_per_channel": {"QuantizeLinear", "DequantizeLinear"},
    "conv_qoperator": {"QuantizeLinear", "QLinearConv", "DequantizeLinear"},
    "conv_qoperator_per_channel": {"QuantizeLinear", "QLinearConv", "DequantizeLinear"},
}


@pytest.mark.parametrize("kind", list(CASES))
def test_onnxruntime_quantized_models_match_onnxruntime(tmp_path, rng, kind):
    src, dst = tmp_path / "model.onnx", tmp_path / f"model_{kind}.onnx"
    conv = kind.startswith("conv_")
    four_bit = "int4" in kind
    if conv:
        _cnn(src, rng)
    else:
        _mlp(src, rng, opset=21 if four_bit else 17)
    _quantize(kind, src, dst, rng, (4, 3, 12, 12) if conv else (4, IN))
    quantized = onnx.load(str(dst))
    ops = {(n.domain or "ai.onnx", n.op_type) for n in quantized.graph.node}
    assert {("ai.onnx", op) for op in CASES[kind]} <= ops, ops
    stored = {t.data_type for t in quantized.graph.initializer}
    if kind == "qdq_float8":  # the weights and zero points are float8 tensors
        assert TensorProto.FLOAT8E4M3FN in stored
    if four_bit:  # the weights and their zero points are 4-bit tensors
        assert (TensorProto.UINT4 if kind.startswith("qdq_uint4") else TensorProto.INT4) in stored
    session = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    module = rocmc.load(rocmc.compile(rocmc.import_onnx(str(dst)), "cpu"))
    float_session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = rng.normal(0, 1, (batch, 3, 12, 12) if conv else (batch, IN)).astype(np.float32)
        want_y = session.run(None, {"x": x})[0]
        got = np.asarray(module(x))
        # The same integers and scales: equal up to float rounding, or one quantization step where a value
        # lands on a rounding tie differently (ONNX Runtime may divide by the scale as a multiplication).
        # A step is the output's own quantization scale where a DequantizeLinear makes it.
        step = max(np.abs(float_session.run(None, {"x": x})[0]).max() / 127, _output_scale(quantized)) * (1 + 1e-5)
        assert got.shape == want_y.shape and np.abs(got - want_y).max() <= step, (kind, np.abs(got - want_y).max())
        assert np.mean(np.abs(got - want_y) > 1e-5 * np.abs(want_y).max()) < 0.05


def _output_scale(model):
    """The largest scale of the DequantizeLinear making the model's output (0 where another op makes it)."""
    out = model.graph.output[0].name
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if out in node.output and node.op_type == "DequantizeLinear" and node.input[1] in inits:
            return float(np.abs(inits[node.input[1]]).max())
    return 0.0


def _one_node(op, inputs, attrs=None, opset=21):
    """A model of one `op` node over `inputs` (name -> array; the first an input, the rest initializers)."""
    names = list(inputs)
    x = inputs[names[0]]
    node = helper.make_node(op, names, ["y"], **(attrs or {}))
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info(names[0], helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(v, k) for k, v in list(inputs.items())[1:]],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_quantize_linear_odd_blocks_and_int16_match_the_reference(rng):
    """Blocks of 4 over 10 values along axis 1 (the last block short), int16 output, against ONNX's reference."""
    from onnx.reference import ReferenceEvaluator

    x = rng.normal(0, 3, (3, 10)).astype(np.float32)
    scale = rng.uniform(0.01, 0.1, (3, 3)).astype(np.float32)
    zero = rng.integers(-50, 50, (3, 3)).astype(np.int16)
    model = _one_node("QuantizeLinear", {"x": x, "s": scale, "z": zero}, {"axis": 1, "block_size": 4})
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = rocmc.load(rocmc.compile(rocmc.import_onnx(model), "cpu"))(x)
    assert got.dtype == np.int16 and np.array_equal(got, want)


@pytest.mark.parametrize(
    "inputs,attrs,needle",
    [
        ({"s": np.ones(5, np.float32)}, {"axis": 1}, "y_scale is f32[5]: expected a scalar or 6 values along axis 1"),
        ({"s": np.ones((2, 3), np.float32)}, {"axis": 1, "block_size": 4}, "expected shape [2, 2] for blocks"),
        ({"s": np.ones(1, np.float32), "z": np.zeros(1, np.int32)}, {}, "quantized type i32"),
    ],
)
def test_bad_quantization_parameters_are_reported(inputs, attrs, needle):
    x = np.ones((2, 6), np.float32)
    model = _one_node("QuantizeLinear", {"x": x, **inputs}, attrs)
    with pytest.raises(rocmc.ModelImportError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        rocmc.import_onnx(model)


@pytest.mark.parametrize("kind", ["int4", "uint4"])
def test_four_bit_weights_dequantize_as_the_reference(rng, kind):
    """x @ DequantizeLinear(w) with w a 4-bit initializer (10 x 6) in blocks of 4 along axis 0 (the last block
    short), 4-bit zero points at the range ends among others, against ONNX's reference."""
    from onnx.reference import ReferenceEvaluator
    import ml_dtypes

    lo, hi = (-8, 7) if kind == "int4" else (0, 15)
    narrow = getattr(ml_dtypes, kind)
    w = rng.integers(lo, hi + 1, (10, 6)).astype(narrow)
    z = rng.integers(lo, hi + 1, (3, 6))
    z[0, :2] = lo, hi
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(rng.uniform(0.01, 0.1, (3, 6)).astype(np.float32), "s"),
        numpy_helper.from_array(z.astype(narrow), "z"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0, block_size=4),
        helper.make_node("MatMul", ["x", "wf"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dq4",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 6])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = rng.normal(0, 1, (3, 10)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    ref64 = x.astype(np.float64) @ (
        (w.astype(np.float64) - np.repeat(z, 4, 0)[:10])
        * np.repeat(numpy_helper.to_array(inits[1]).astype(np.float64), 4, 0)[:10]
    )
    got = rocmc.load(rocmc.compile(rocmc.import_onnx(model), "cpu"))(x)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5) and np.allclose(got, ref64, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "op,inputs,needle",
    [
        # a 4-bit x with an 8-bit zero point: ONNX wants one type, and widening must not hide the mismatch
        ("DequantizeLinear", {"s": np.float32(0.1), "z": np.int8(0)}, "x_zero_point is int8, x int4"),
        # 2-bit values: a type rocmc lacks (4-bit ones are i4 / u4: tests/frontend/test_int4.py)
        ("QuantizeLinear", {"s": np.float32(0.1), "z": "int2"}, "element type int2"),
    ],
)
def test_narrow_values_rocmc_cannot_take_are_reported(op, inputs, needle):
    import ml_dtypes

    z = inputs["z"]
    z = np.zeros((), getattr(ml_dtypes, z)) if isinstance(z, str) else np.asarray(z)
    if op == "DequantizeLinear":
        nodes = [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"])]
        inits = {"w": np.ones((2, 3), ml_dtypes.int4), "s": np.asarray(inputs["s"]), "z": z}
        graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])]
    else:
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])]
        inits = {"s": np.asarray(inputs["s"]), "z": z}
        graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    graph = helper.make_graph(
        nodes,
        "bad4",
        graph_inputs,
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(rocmc.ModelImportError, match=needle):
        rocmc.import_onnx(model)


@pytest.mark.parametrize("bits,symmetric,block", [(4, True, 16), (4, False, 16), (8, False, 16), (4, False, 32)])
def test_matmul_nbits_models_match_onnxruntime(tmp_path, rng, bits, symmetric, block):
    """ONNX Runtime's MatMulNBitsQuantizer (blocks of 16 along K: 3 and 6 blocks a row, so packed 4-bit zero points
    end in half a byte; blocks of 32: K=48 ends in half a block, padding the quantizer wrote) writes com.microsoft
    MatMulNBits nodes; rocmc imports them as quantized_linear and matches ONNX Runtime's run of the model."""
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    src = tmp_path / "model.onnx"
    _mlp(src, rng)
    config = nbits.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric, bits=bits)
    quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(src)), algo_config=config)
    quantizer.process()
    model = quantizer.model.model
    found = [n for n in model.graph.node if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]
    assert len(found) == 2 and all(len(n.input) == (3 if symmetric else 4) for n in found), found
    ks = [next(a.i for a in n.attribute if a.name == "K") for n in found]
    assert any(k % block for k in ks) == (block == 32), ks  # the case of a last block past K is the one meant
    dst = tmp_path / "nbits.onnx"
    onnx.save(model, str(dst))
    session = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    art = rocmc.compile(rocmc.import_onnx(str(dst)), "cpu")
    assert "quantized_linear" in art.summary()
    module = rocmc.load(art)
    for batch in (1, 5):
        x = rng.normal(0, 1, (batch, IN)).astype(np.float32)
        want, got = session.run(None, {"x": x})[0], np.asarray(module(x))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize(
    "attrs,extra,needle",
    [
        ({"bits": 3}, {}, "bits=3: rocmc's quantized_linear takes 4 or 8"),
        ({"block_size": 3}, {}, "block_size=3: expected a positive number of whole bytes of 4-bit values"),
        ({}, {"g_idx": np.arange(32, dtype=np.int32) % 2}, "g_idx other than k // block_size"),
    ],
)
def test_bad_matmul_nbits_are_reported(attrs, extra, needle):
    """What MatMulNBits rocmc does not take is reported by name, as is another com.microsoft op."""
    attrs = {"K": 32, "N": 4, "bits": 4, "block_size": 16, **attrs}
    inits = {"B": np.zeros((4, 2, 8), np.uint8), "s": np.ones(8, np.float32)}
    names = ["x", "B", "s"]
    if "g_idx" in extra:
        inits.update({"z": np.full(4, 0x88, np.uint8), "g": extra["g_idx"]})
        names += ["z", "g"]
    nodes = [
        helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", **attrs),
        helper.make_node("QLinearAdd", ["y"], ["y2"], domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes,
        "nbits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
        [helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    with pytest.raises(rocmc.ModelImportError) as e:
        rocmc.import_onnx(helper.make_model(graph, opset_imports=opsets))
    assert needle in str(e.value) and "of 'com.microsoft': MatMulNBits" in str(e.value), str(e.value)
