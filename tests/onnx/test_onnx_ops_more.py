"""Float predicates, rounding, trigonometry and Mod: the ops against their float64 references, the ONNX
mappings against onnxruntime, and import-time folding of elementwise nodes on constants."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import rocmc  # noqa: E402
from rocmc import ops  # noqa: E402
from rocmc.frontend import onnx as onnx_import  # noqa: E402

from helpers import CpuBatch, check, compile_gpu, rand  # noqa: E402

NEW_UNARY = ("cos", "sin", "sign", "floor", "ceil", "round", "reciprocal")
SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0, 0.5, -0.5, 1.5, -2.5, 2.5]


def _with_specials(x):
    """x with IEEE special values and rounding ties written over its first elements."""
    flat = x.reshape(-1)
    flat[: len(SPECIALS)] = np.asarray(SPECIALS).astype(x.dtype)
    return x


# ---- the ops ------------------------------------------------------------------------------------


# A parametrized test's graphs are the functions of one module (helpers.CpuBatch): a compile a module, not a test.
# Keys in the order the tests run (the last parametrize decorator's values outermost).


def _unary_graph(name, dtype):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 11), dtype)
    g.output(getattr(ops, name)(x))
    return g


UNARY_BATCH = CpuBatch.grid(_unary_graph, NEW_UNARY, ["f32", "f16", "bf16"])


@UNARY_BATCH.parametrize("name,dtype")
def test_unary_with_special_values(name, dtype, rng):
    g, module = UNARY_BATCH(name, dtype)
    check(g, _with_specials(rand(rng, (7, 11), dtype, -6.0, 6.0)), module=module)


def test_sign_of_integers(rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("n",), "i64")
    g.output(ops.sign(x))
    v = rand(rng, (29,), "i64", -5, 5)
    v[:3] = [0, np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    check(g, v)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_isnan_isinf(dtype, rng):
    g = rocmc.Graph("t")
    x = g.input("x", (3, "n"), dtype)
    g.output(
        ops.isnan(x),
        ops.isinf(x),
        ops.isinf(x, detect_negative=0),
        ops.isinf(x, detect_positive=0),
        ops.isinf(x, detect_positive=0, detect_negative=0),
    )
    v = _with_specials(rand(rng, (3, 9), dtype))
    got = check(g, v)
    assert got[0].dtype == np.bool_ and got[0].reshape(-1)[0] and got[1].reshape(-1)[1:3].all()


def _mod_graph(fmod, dtype, shapes):
    g = rocmc.Graph("t")
    a, b = (g.input(name, shape, dtype) for name, shape in zip("ab", shapes))
    g.output(ops.mod(a, b, fmod=fmod))
    return g


FLOAT_MOD_BATCH = CpuBatch(
    lambda fmod, dtype: _mod_graph(fmod, dtype, (("n", 5), (5,))),
    [(m, d) for d in ("f32", "f16", "bf16") for m in (0, 1)],
)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_float_mod(fmod, dtype, rng):
    g, module = FLOAT_MOD_BATCH(fmod, dtype)
    x = rand(rng, (13, 5), dtype, -20.0, 20.0)
    x[0] = np.asarray([-0.0, np.inf, 3.0, -3.0, np.nan]).astype(x.dtype)
    y = rand(rng, (5,), dtype, -4.0, 4.0)
    y[2:4] = np.asarray([0.0, np.inf]).astype(y.dtype)
    check(g, x, y, module=module)


INT_MOD_BATCH = CpuBatch(
    lambda fmod, dtype: _mod_graph(fmod, dtype, ((4, "n"), (4, "n"))),
    [(m, d) for d in ("i32", "i64") for m in (0, 1)],
)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["i32", "i64"])
def test_integer_mod_by_zero_is_zero(fmod, dtype, rng):
    """Integer division by zero does not trap: the remainder is defined as 0 (and INT_MIN % -1 is 0)."""
    g, module = INT_MOD_BATCH(fmod, dtype)
    x, y = rand(rng, (4, 7), dtype, -30, 30), rand(rng, (4, 7), dtype, -6, 6)
    y[0, :3] = [0, 0, -1]
    x[0, :3] = [5, -5, np.iinfo(x.dtype).min]
    got = check(g, x, y, module=module)[0]
    assert (got[0, :3] == 0).all()
    safe = np.where(y == 0, 1, y)
    np.testing.assert_array_equal(got[1:], np.where(y == 0, 0, (np.fmod if fmod else np.mod)(x, safe))[1:])


def test_bad_attributes_and_dtypes_are_graph_errors():
    g = rocmc.Graph("t")
    x, i = g.input("x", (2,), "f32"), g.input("i", (2,), "i32")
    with pytest.raises(rocmc.GraphError, match=r"mod\(.*fmod=2, expected 0 or 1"):
        ops.mod(x, x, fmod=2)
    with pytest.raises(rocmc.GraphError, match=r"isinf\(.*detect_positive=0.5"):
        ops.isinf(x, detect_positive=0.5)
    with pytest.raises(rocmc.GraphError, match="isnan.*i32.*float"):
        ops.isnan(i)
    with pytest.raises(rocmc.GraphError, match="cos.*i32.*float"):
        ops.cos(i)


def test_new_ops_compile_for_gpu_targets():
    """Compile-only (no GPU here): one graph with every new op, for gfx942 and cuda:sm_80."""
    g = rocmc.Graph("t")
    x, y = g.input("x", (2, "n", 64), "f16"), g.input("y", (64,), "f16")
    i, j = g.input("i", (2, "n", 64), "i32"), g.input("j", (64,), "i32")
    outs = [getattr(ops, name)(x) for name in NEW_UNARY]
    outs += [
        ops.isnan(x),
        ops.isinf(x, detect_negative=0),
        ops.mod(x, y),
        ops.mod(x, y, fmod=1),
        ops.mod(i, j),
        ops.mod(i, j, fmod=1),
        ops.sign(i),
    ]
    g.output(*outs)
    compile_gpu(g)


# ---- ONNX mappings against onnxruntime -------------------------------------------------------------


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, *inputs):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: v for i, v in zip(sess.get_inputs(), inputs)})


def _compare_all(model, *inputs, batched=None):
    """rocmc compiled for the CPU (or the model's graph and compiled function from a CpuBatch: `batched`) and
    rocmc's reference both agree with onnxruntime."""
    graph, module = batched if batched is not None else (rocmc.import_onnx(model), None)
    got = (module or rocmc.load(rocmc.compile(graph, "cpu")))(*inputs)
    ref = rocmc.evaluate(graph, *inputs)
    got, ref = (got if isinstance(got, tuple) else (got,)), (ref if isinstance(ref, tuple) else (ref,))
    for g, r, w in zip(got, ref, _ort(model, *inputs)):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6)
            np.testing.assert_allclose(r, w, rtol=2e-6, atol=2e-6)
        else:
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(r, w)
    return graph


ONNX_UNARY = ["Cos", "Sin", "Sign", "Floor", "Ceil", "Round", "Reciprocal", "IsNaN"]


def _unary_model(op_type):
    out_type = TensorProto.BOOL if op_type == "IsNaN" else TensorProto.FLOAT
    return _model(
        [helper.make_node(op_type, ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 7])],
        [helper.make_tensor_value_info("y", out_type, ["n", 7])],
    )


ONNX_UNARY_BATCH = CpuBatch(lambda op_type: rocmc.import_onnx(_unary_model(op_type)), [(t,) for t in ONNX_UNARY])


@pytest.mark.parametrize("op_type", ONNX_UNARY)
def test_unary_onnx_ops_match_onnxruntime(op_type, rng):
    m = _unary_model(op_type)
    graph = _compare_all(m, _with_specials(rand(rng, (5, 7), "f32", -5.0, 5.0)), batched=ONNX_UNARY_BATCH(op_type))
    assert [n.op for n in graph.nodes if n.op != "constant"] == [onnx_import.elementwise._UNARY[op_type]]


@pytest.mark.parametrize("attrs", [{}, {"detect_positive": 0}, {"detect_negative": 0}])
def test_isinf_attributes_match_onnxruntime(attrs, rng):
    m = _model(
        [helper.make_node("IsInf", ["x"], ["y"], **attrs)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 11])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [3, 11])],
    )
    _compare_all(m, _with_specials(rand(rng, (3, 11), "f32")))


ONNX_MODS = [(TensorProto.FLOAT, 1), (TensorProto.INT32, 0), (TensorProto.INT64, 0), (TensorProto.INT64, 1)]


def _mod_model(elem, fmod):
    return _model(
        [helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)],
        [helper.make_tensor_value_info("a", elem, ["n", 6]), helper.make_tensor_value_info("b", elem, [6])],
        [helper.make_tensor_value_info("y", elem, ["n", 6])],
    )


ONNX_MOD_BATCH = CpuBatch(lambda elem, fmod: rocmc.import_onnx(_mod_model(elem, fmod)), ONNX_MODS)


@pytest.mark.parametrize("elem,fmod", ONNX_MODS)
def test_mod_matches_onnxruntime(elem, fmod, rng):
    dtype = {TensorProto.FLOAT: "f32", TensorProto.INT32: "i32", TensorProto.INT64: "i64"}[elem]
    a, b = rand(rng, (9, 6), dtype, -40, 40), rand(rng, (6,), dtype, -7, 7)
    b[b == 0] = 3
    _compare_all(_mod_model(elem, fmod), a, b, batched=ONNX_MOD_BATCH(elem, fmod))


# ---- folding at import --------------------------------------------------------------------------


def _rope_table_model(table):
    nodes = [
        helper.make_node("Cos", ["table"], ["c"]),
        helper.make_node("Sin", ["table"], ["s"]),
        helper.make_node("Mul", ["x", "c"], ["xc"]),
        helper.make_node("Mul", ["x", "s"], ["xs"]),
        helper.make_node("Sub", ["xc", "xs"], ["y"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", *table.shape])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", *table.shape])],
        [numpy_helper.from_array(table, "table")],
    )


def test_cos_sin_of_a_constant_table_fold_to_constants(rng):
    table = rand(rng, (6, 16), "f32", -8.0, 8.0)
    m = _rope_table_model(table)
    graph = _compare_all(m, rand(rng, (3, 6, 16), "f32"))
    assert sorted(n.op for n in graph.nodes if n.op != "constant") == ["mul", "mul", "sub"]
    folded = [graph.constants[n.attrs["name"]] for n in graph.nodes if n.op == "constant"]
    np.testing.assert_allclose(folded[0], np.cos(table.astype(np.float64)), rtol=1e-7, atol=1e-7)


def test_folding_chains_and_rounds_to_the_node_dtype(rng):
    """Elementwise nodes on folded values fold too, each result rounded to its dtype (here f16)."""
    table = rand(rng, (4, 5), "f16", -3.0, 3.0)
    nodes = [
        helper.make_node("Sin", ["t"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("IsNaN", ["r"], ["n"]),
        helper.make_node("Where", ["n", "t", "r"], ["w"]),
        helper.make_node("Add", ["x", "w"], ["y"]),
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 5])],
        [numpy_helper.from_array(table, "t")],
    )
    graph = rocmc.import_onnx(m)
    assert [n.op for n in graph.nodes if n.op != "constant"] == ["add"]
    (w,) = [graph.constants[n.attrs["name"]] for n in graph.nodes if n.op == "constant" and n.attrs["name"] != "t"]
    s = np.sin(table.astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(w, (1.0 / s.astype(np.float64)).astype(np.float16))


def test_folding_respects_the_size_limit(monkeypatch, rng):
    """A result larger than MAX_FOLDED_BYTES stays a node of the graph and is computed at run time."""
    monkeypatch.setattr(onnx_import.values, "MAX_FOLDED_BYTES", 64)
    table = rand(rng, (6, 16), "f32", -8.0, 8.0)
    graph = _compare_all(_rope_table_model(table), rand(rng, (2, 6, 16), "f32"))
    assert {"cos", "sin"} <= {n.op for n in graph.nodes}


@pytest.mark.parametrize(
    "op_type, attrs, rank, message",
    [
        ("Softmax", {"axis": 5}, 2, r"Softmax: axis=5 is out of range for rank 2; expected -2\.\.1"),
        ("Flatten", {"axis": -3}, 2, r"axis=-3 is out of range for rank 2"),
        ("ReduceSum", {"axes": [3], "keepdims": 1}, 3, r"axes=3 is out of range for rank 3"),
    ],
)
def test_an_out_of_range_axis_is_an_import_error_naming_the_node(op_type, attrs, rank, message):
    """An exporter's axis outside -rank..rank-1 is refused, never wrapped around."""
    shape = [2, 3, 4][:rank]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    node_inputs = ["x"]
    inits = []
    if op_type == "ReduceSum":  # opset 18: axes is an input
        inits = [numpy_helper.from_array(np.array(attrs.pop("axes"), np.int64), "axes")]
        node_inputs.append("axes")
    node = helper.make_node(op_type, node_inputs, ["y"], name="the_node", **attrs)
    with pytest.raises(rocmc.ModelImportError, match=message) as e:
        rocmc.import_onnx(_model([node], ins, outs, inits))
    assert "the_node" in str(e.value)
