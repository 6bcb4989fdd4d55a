"""ONNX import: ONNX's own backend node tests, the importer's folding and errors, and two real models."""

import os
import zlib
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import rocmc  # noqa: E402

from bench import onnx_conformance as conformance  # noqa: E402
from helpers import compile_gpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"

CASES = conformance.supported_cases()

# Cases that fail because of a known defect outside the importer, name -> defect (the case still
# runs: a fix passes). None at present.
KNOWN_FAILURES: dict[str, str] = {}


# ---- ONNX backend node tests ------------------------------------------------------------------


# The expanded cases (an ONNX function's body in its ops, each op covered by its own cases) are a quarter of the
# cases and of their time: a run takes a third of them, another third for another seed, so the suite keeps to its
# time and every case runs over a few runs. ROCMC_CONFORMANCE=all, or naming the case, runs every one; the report
# (bench/onnx_conformance.py) always does.
EXPANDED_THIRDS = 3


def _runs_in_this_run(case, config) -> bool:
    if "_expanded" not in case.name or os.environ.get("ROCMC_CONFORMANCE") == "all":
        return True
    if any(case.name[5:] in arg for arg in config.args):
        return True
    return zlib.crc32(case.name.encode()) % EXPANDED_THIRDS == config.rocmc_seed % EXPANDED_THIRDS


_RESULTS: dict = {}  # case name -> its Result, filled a batch at a time


def _result(case, config):
    """The case's Result, from a batch of the cases this run takes (conformance.run_batch: one module a batch;
    a worker that gets part of a batch runs all of it)."""
    if case.name not in _RESULTS:
        running = [c for c in CASES if _runs_in_this_run(c, config)]
        first = running.index(case) // conformance.BATCH * conformance.BATCH
        for r in conformance.run_batch(running[first : first + conformance.BATCH]):
            _RESULTS[r.case.name] = r
    return _RESULTS.pop(case.name)


@pytest.mark.parametrize("case", CASES, ids=[c.name[5:] for c in CASES])
def test_backend_node(case, request):
    if not _runs_in_this_run(case, request.config):
        pytest.skip("an expanded case of another third of the runs (ROCMC_CONFORMANCE=all runs it)")
    result = _result(case, request.config)
    if result.status == "skipped":
        pytest.skip(result.reason)
    if result.status == "failed" and case.name in KNOWN_FAILURES:
        pytest.xfail(f"{KNOWN_FAILURES[case.name]} ({result.reason[:200]})")
    assert result.status == "passed", result.reason


def test_conformance_covers_every_issue_op():
    ops = {c.op for c in CASES}
    for op in (
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "BatchNormalization",
        "LRN",
        "Gemm",
        "MatMul",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Relu",
        "Sigmoid",
        "Tanh",
        "Elu",
        "LeakyRelu",
        "Gelu",
        "Erf",
        "Softmax",
        "LogSoftmax",
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "Reshape",
        "Transpose",
        "Concat",
        "Slice",
        "Gather",
        "Unsqueeze",
        "Squeeze",
        "Flatten",
        "Expand",
        "Cast",
        "Where",
        "Equal",
        "Less",
        "Greater",
        "Shape",
        "Dropout",
        "Identity",
        "Constant",
        "RotaryEmbedding",
        "RMSNormalization",
        "Attention",
        "LayerNormalization",
    ):
        assert op in ops, f"no backend node test case for {op}"


# ---- the importer -----------------------------------------------------------------------------


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def test_shape_arithmetic_folds_with_symbolic_dims(rng):
    # x[b, seq, 24] -> reshape to [b, seq, 4, 6] with the target built from Shape at run time in ONNX.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i01"], ["bs"], axis=0),
        helper.make_node("Concat", ["bs", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Softmax", ["y"], ["z"], axis=-1),
    ]
    inits = [
        numpy_helper.from_array(np.array([0, 1], np.int64), "i01"),
        numpy_helper.from_array(np.array([4, 6], np.int64), "tail"),
    ]
    m = _model(nodes, [_info("x", TensorProto.FLOAT, ["b", "seq", 24])], [_info("z", TensorProto.FLOAT, None)], inits)
    g = rocmc.import_onnx(m)
    assert [n.op for n in g.nodes] == ["reshape", "softmax"]
    assert g.outputs[0].shape == ("b", "seq", 4, 6)
    module = rocmc.load(rocmc.compile(g, "cpu"))
    for shape in [(2, 5, 24), (1, 3, 24)]:  # one compiled module, several sizes
        x = rng.standard_normal(shape).astype(np.float32)
        y = x.astype(np.float64).reshape(*shape[:2], 4, 6)
        want = np.exp(y - y.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        np.testing.assert_allclose(module(x), want, rtol=2e-5, atol=2e-6)


def test_inputs_initializers_and_names(rng):
    w = rng.standard_normal((5, 3)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["input.1", "fc.weight"], ["out:0"])]
    m = _model(
        nodes,
        [_info("input.1", TensorProto.FLOAT, ["n", 5])],
        [_info("out:0", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "fc.weight")],
    )
    g = rocmc.import_onnx(m.SerializeToString(), name="fc")
    assert g.name == "fc"
    assert [(v.name, v.shape) for v in g.inputs] == [("input_1", ("n", 5))]
    np.testing.assert_array_equal(g.constants["fc_weight"], w)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(rocmc.load(rocmc.compile(g, "cpu"))(x), x @ w, rtol=1e-5, atol=1e-5)


def test_dims_option_pins_symbolic_dims():
    m = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [_info("x", TensorProto.FLOAT, ["b", 3])],
        [_info("y", TensorProto.FLOAT, None)],
    )
    assert rocmc.import_onnx(m, dims={"b": 2}).inputs[0].shape == (2, 3)


def test_half_precision_model(rng):
    nodes = [helper.make_node("MatMul", ["a", "b"], ["ab"]), helper.make_node("Add", ["ab", "c"], ["y"])]
    m = _model(
        nodes,
        [
            _info("a", TensorProto.FLOAT16, [3, 33]),
            _info("b", TensorProto.FLOAT16, [33, 7]),
            _info("c", TensorProto.FLOAT16, [7]),
        ],
        [_info("y", TensorProto.FLOAT16, None)],
    )
    g = rocmc.import_onnx(m)
    a, b, c = (rng.uniform(-1, 1, s).astype(np.float16) for s in [(3, 33), (33, 7), (7,)])
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_allclose(
        rocmc.load(rocmc.compile(g, "cpu"))(a, b, c).astype(np.float64), want, rtol=4e-3, atol=4e-3
    )


def test_every_unsupported_node_in_one_error():
    nodes = [
        helper.make_node("Tan", ["x"], ["s"], name="the_tan"),
        helper.make_node("Conv", ["v", "w"], ["c"], name="conv4d"),
        helper.make_node("Gelu", ["x"], ["g"], name="bad_gelu", approximate="erf"),
        helper.make_node("Relu", ["d"], ["r"], name="after_double"),
        helper.make_node("Custom", ["x"], ["u"], name="custom", domain="com.example"),
    ]
    m = _model(
        nodes,
        [
            _info("x", TensorProto.FLOAT, [2, 3]),
            _info("v", TensorProto.FLOAT, [1, 2, 4, 4, 4, 4]),
            _info("d", TensorProto.COMPLEX64, [2]),
        ],
        [_info(n, TensorProto.FLOAT, None) for n in "scgru"],
        [numpy_helper.from_array(np.ones((2, 2, 3, 3, 3, 3), np.float32), "w")],
        opset=20,
    )
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(rocmc.ModelImportError) as err:
        rocmc.import_onnx(m)
    text = str(err.value)
    assert "Tan 'the_tan': op type is not supported" in text
    assert "Conv 'conv4d': 4-D convolution" in text
    assert "Gelu 'bad_gelu': attribute approximate='erf'" in text
    assert "input 'd' has element type COMPLEX64 (rocmc has FLOAT" in text
    assert "Custom 'custom': domain 'com.example'" in text
    assert "after_double" not in text  # downstream of a reported input, not itself unsupported


def test_op_newer_than_opset_23_is_reported():
    m = _model(
        [helper.make_node("Attention", ["q", "k", "v"], ["y"], name="attn24")],
        [_info(n, TensorProto.FLOAT, [1, 2, 3, 4]) for n in "qkv"],
        [_info("y", TensorProto.FLOAT, None)],
        opset=24,
    )
    with pytest.raises(rocmc.ModelImportError, match=r"Attention 'attn24': Attention-24 \(opset 24\) is newer"):
        rocmc.import_onnx(m)


def test_runtime_shape_input_is_reported():
    m = _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")],
        [_info("x", TensorProto.FLOAT, [2, 3]), _info("shape", TensorProto.INT64, [2])],
        [_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(rocmc.ModelImportError, match=r"Reshape 'r': input 'shape' \(shape\) must be known at import"):
        rocmc.import_onnx(m)


def test_bad_model_arguments():
    with pytest.raises(rocmc.ModelImportError, match="cannot read ONNX model"):
        rocmc.import_onnx(str(ROOT / "no-such-model.onnx"))
    with pytest.raises(rocmc.ModelImportError, match="cannot parse ONNX model bytes"):
        rocmc.import_onnx(b"\xff not a model")
    with pytest.raises(rocmc.ModelImportError, match="expected a path, bytes or onnx.ModelProto"):
        rocmc.import_onnx(42)


# ---- real models ------------------------------------------------------------------------------
# Built with onnx.helper (make_models.py: opset-23 RMSNormalization/RotaryEmbedding/Attention) and
# exported from PyTorch (export_torch.py: what torch.onnx.export produces for the same layouts).
# name -> (dims pinned at import, inputs)
REAL_MODELS = {
    "resnet18_narrow.onnx": ({}, lambda rng: {"image": rng.standard_normal((2, 3, 64, 64)).astype(np.float32)}),
    "resnet18_narrow_torch.onnx": ({}, lambda rng: {"image": rng.standard_normal((3, 3, 64, 64)).astype(np.float32)}),
    "llama2l_decoder.onnx": (
        {},
        lambda rng: {
            "input_ids": rng.integers(0, 256, (2, 7)).astype(np.int64),
            "position_ids": np.stack([np.arange(7), np.arange(5, 12)]).astype(np.int64),
        },
    ),
    # The exporter slices its rotary tables to [:seq]: seq stays symbolic (assumed within the tables).
    "llama2l_decoder_torch.onnx": ({}, lambda rng: {"input_ids": rng.integers(0, 256, (2, 9)).astype(np.int64)}),
}


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_matches_onnxruntime(name, rng):
    ort = pytest.importorskip("onnxruntime")
    path = MODELS / name
    assert path.stat().st_size < 5e6
    dims, make_inputs = REAL_MODELS[name]
    g = rocmc.import_onnx(path, dims=dims)
    assert isinstance(g.inputs[0].shape[0], str)  # the batch dim stays symbolic
    feeds = make_inputs(rng)
    got = rocmc.load(rocmc.compile(g, "cpu"))(**feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_symbolic_slice_of_rotary_tables_is_assumed_to_fit(rng):
    """The exporter's cos_cached[:seq] keeps seq symbolic: seq <= the tables' length is assumed, so any
    length up to it runs (matching ONNX Runtime) and a longer one is an InputError naming the Slice."""
    ort = pytest.importorskip("onnxruntime")
    path = MODELS / "llama2l_decoder_torch.onnx"
    g = rocmc.import_onnx(path)
    assert [str(v.type) for v in g.inputs] == ["i64[batch,seq]"]
    limits = [c for c in g.assumptions if "imported assuming seq <=" in c.node]
    assert limits, [c.describe() for c in g.assumptions]
    most = limits[0].lhs.value
    mod = rocmc.load(rocmc.compile(g, "cpu"))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, seq in ((1, 3), (2, most)):
        ids = rng.integers(0, 256, (batch, seq)).astype(np.int64)
        want = session.run(None, {"input_ids": ids})[0]
        np.testing.assert_allclose(mod(ids), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    with pytest.raises(rocmc.InputError, match=rf"Slice node '.*' \(imported assuming seq <= {most}\)"):
        mod(rng.integers(0, 256, (1, most + 1)).astype(np.int64))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("resnet18_narrow.onnx", {("conv2d", "dnn")}),
        ("resnet18_narrow_torch.onnx", {("conv2d", "dnn")}),
        ("llama2l_decoder.onnx", {("rms_norm", "kernel"), ("rope", "kernel")}),
    ],
)
def test_real_model_compiles_for_gfx942(name, expected):
    """Compile-only (no AMD GPU here): the imported model reaches the hand-written kernels and the DNN library."""
    g = rocmc.import_onnx(MODELS / name)
    art = rocmc.compile(g, "gfx942")
    chosen = {(i["op"], i["impl"]) for i in art.metadata["implementations"]}
    assert expected <= chosen, chosen
    compile_gpu(g, targets=("cuda:sm_80",))


def test_causal_attention_with_fewer_queries_than_keys(rng):
    """ONNX aligns the causal mask top-left without a past; rocmc's is_causal is bottom-right, so the
    importer spells the mask out (checked against ONNX's reference evaluator)."""
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], is_causal=1)
    m = _model(
        [node],
        [
            _info("q", TensorProto.FLOAT, [2, 4, 3, 8]),
            _info("k", TensorProto.FLOAT, [2, 2, 5, 8]),
            _info("v", TensorProto.FLOAT, [2, 2, 5, 8]),
            _info("mask", TensorProto.FLOAT, [3, 5]),
        ],
        [_info("y", TensorProto.FLOAT, None)],
        opset=23,
    )
    feeds = {
        "q": rng.standard_normal((2, 4, 3, 8)),
        "k": rng.standard_normal((2, 2, 5, 8)),
        "v": rng.standard_normal((2, 2, 5, 8)),
        "mask": rng.uniform(-1, 0, (3, 5)),
    }
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    got = rocmc.load(rocmc.compile(rocmc.import_onnx(m), "cpu"))(**feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
