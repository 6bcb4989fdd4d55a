"""Mistakes a user can make reach them as one typed rocmc error that names what is wrong: compile
options, impossible sizes, gather indices, the command line and ONNX models."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import rocmc
from rocmc import ops


def _tanh_graph():
    g = rocmc.Graph("t")
    g.output(ops.tanh(g.input("x", (2, 3))))
    return g


# ---- compile options --------------------------------------------------------------------------------


def _no_lowering(*args, **kwargs):
    raise AssertionError("options were not checked before lowering")


@pytest.mark.parametrize(
    "impl, libraries, message",
    [
        ("genrated", (), r"impl='genrated'\): unknown implementation; known: .*generated"),
        ({"rms_norm": "bogus"}, (), r"unknown implementation of rms_norm; known: .*generated"),
        ({"not_an_op": "generated"}, (), r"unknown op 'not_an_op'; known: .*rms_norm"),
        (None, ["bogus"], r"libraries=\['bogus'\]\): unknown library; known: blas, dnn"),
        (None, "dnn", r"expected a list of library names"),
    ],
)
def test_compile_rejects_unknown_options_before_lowering(monkeypatch, impl, libraries, message):
    import rocmc.lowering as lowering

    monkeypatch.setattr(lowering, "lower", _no_lowering)
    with pytest.raises(rocmc.LoweringError, match=message):
        rocmc.compile(_tanh_graph(), "cpu", impl=impl, libraries=libraries, cache=False)


def test_compile_accepts_known_options():
    art = rocmc.compile(_tanh_graph(), "cpu", impl={"tanh": "generated"}, libraries=["dnn"], cache=False)
    assert art.size > 0


# ---- sizes IREE can't represent ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, message",
    [
        ((2**70,), "has a dim larger than 2\\*\\*63-1"),
        ((0, 2**63), "has a dim larger than 2\\*\\*63-1"),
        ((2**40, 2**22), "holds 4611686018427387904 elements"),  # 2**64 bytes of f32
    ],
)
def test_input_too_large_for_iree(shape, message):
    with pytest.raises(rocmc.GraphError, match=f"input 'x': .*{message}"):
        rocmc.Graph("big").input("x", shape)


def test_result_too_large_for_iree():
    x = rocmc.Graph("big").input("x", (2,))
    with pytest.raises(rocmc.GraphError, match=r"broadcast_to\(%0\): .*has a dim larger than 2\*\*63-1"):
        ops.broadcast_to(x, (2**70, 2))


def test_huge_but_representable_shape_compiles():
    g = rocmc.Graph("big")
    g.output(ops.relu(g.input("x", (2**40, 2**20))))  # 2**62 bytes: legal, never allocated here
    assert rocmc.compile(g, "cpu", cache=False).size > 0


# ---- gather: negative indices count from the end, out-of-range ones clamp -----------------------------


def _gather_reference(x, idx, axis):
    n = x.shape[axis]
    i = np.clip(np.where(idx < 0, idx + n, idx), 0, n - 1)
    return np.take(x.astype(np.float64), i, axis=axis)


INDICES = np.array([[0, 4, -1, -5], [7, -6, 2, 100]])  # in range, from the end, and beyond either end


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_out_of_range_agrees_with_evaluate(rng, axis):
    g = rocmc.Graph("gather")
    x = g.input("x", (5, 5, 3))
    i = g.input("i", INDICES.shape, "i32")
    g.output(ops.gather(x, i, axis))
    xv = rng.standard_normal((5, 5, 3)).astype(np.float32)
    iv = INDICES.astype(np.int32)
    want = _gather_reference(xv, iv, axis)
    np.testing.assert_array_equal(rocmc.evaluate(g, xv, iv), want)
    np.testing.assert_array_equal(rocmc.load(rocmc.compile(g, "cpu"))(xv, iv), want.astype(np.float32))


def test_embedding_out_of_range_agrees_with_evaluate(rng):
    g = rocmc.Graph("embed")
    ids = g.input("ids", ("n",), "i64")
    w = g.input("w", ("vocab", 4))
    g.output(ops.embedding(ids, w))
    idv = INDICES.reshape(-1).astype(np.int64)
    wv = rng.standard_normal((5, 4)).astype(np.float32)
    want = _gather_reference(wv, idv, 0)
    np.testing.assert_array_equal(rocmc.evaluate(g, idv, wv), want)
    np.testing.assert_array_equal(rocmc.load(rocmc.compile(g, "cpu"))(idv, wv), want.astype(np.float32))


def test_gather_from_an_empty_axis():
    g = rocmc.Graph("empty")
    with pytest.raises(rocmc.GraphError, match=r"gather\(%0, %1\): gathers from axis 0 of f32\[0,3\], which is empty"):
        ops.gather(g.input("x", (0, 3)), g.input("i", (2,), "i32"))


def _gather_from_symbolic_axis():
    g = rocmc.Graph("empty")
    g.output(ops.gather(g.input("x", ("n", 3)), g.input("i", ("k",), "i32")))
    return g


def test_gather_from_an_empty_symbolic_axis_in_evaluate():
    with pytest.raises(rocmc.InputError, match=r"gather\(%0, %1\): gathers 2 indices from axis 0 .* empty"):
        rocmc.evaluate(_gather_from_symbolic_axis(), np.zeros((0, 3), np.float32), np.array([0, 1], np.int32))


def test_gather_from_an_empty_symbolic_axis_in_the_module():
    module = rocmc.load(rocmc.compile(_gather_from_symbolic_axis(), "cpu"))
    assert module(np.zeros((0, 3), np.float32), np.zeros(0, np.int32)).shape == (0, 3)
    with pytest.raises(rocmc.InputError, match=r"gather\(%0, %1\): gathers from axis 0 of x, which is empty"):
        module(np.zeros((0, 3), np.float32), np.array([0, 1], np.int32))


# ---- the command line: one `rocmc: error:` line and exit code 2 ---------------------------------------

MODEL = """
import rocmc
from rocmc import ops
def build_graph(width=4):
    g = rocmc.Graph("cli")
    g.output(ops.tanh(g.input("x", ("n", width))))
    return g
"""


@pytest.fixture
def cli(tmp_path, capsys):
    """Runs `rocmc ARGS` in tmp_path (holding model.py and its compiled m.vmfb); returns (code, stderr)."""
    from rocmc.cli import main

    (tmp_path / "model.py").write_text(MODEL)
    assert main(["compile", str(tmp_path / "model.py"), "-o", str(tmp_path / "m.vmfb")]) == 0
    capsys.readouterr()

    def run(*args):
        code = main([str(a) for a in args])
        return code, capsys.readouterr().err

    return run


def _one_error_line(err: str, *parts: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rocmc: error: "), err
    for part in parts:
        assert part in lines[0], err


def test_cli_set_without_value(cli, tmp_path):
    code, err = cli("compile", tmp_path / "model.py", "--set", "width")
    assert code == 2
    _one_error_line(err, "--set 'width': expected KEY=VALUE")


def test_cli_set_unknown_parameter(cli, tmp_path):
    code, err = cli("compile", tmp_path / "model.py", "--set", "bogus=3")
    assert code == 2
    _one_error_line(err, "no parameter 'bogus'", "its parameters: width")


def test_cli_output_in_missing_directory(cli, tmp_path):
    code, err = cli("compile", tmp_path / "model.py", "-o", tmp_path / "absent" / "m.vmfb")
    assert code == 2
    _one_error_line(err, "-o", "does not exist")


def test_cli_output_onto_directory(cli, tmp_path):
    code, err = cli("compile", tmp_path / "model.py", "-o", tmp_path)
    assert code == 2
    _one_error_line(err, "is a directory")


def test_cli_dump_ir_onto_existing_file(cli, tmp_path):
    code, err = cli("compile", tmp_path / "model.py", "-o", tmp_path / "n.vmfb", "--dump-ir", tmp_path / "model.py")
    assert code == 2
    _one_error_line(err, "--dump-ir", "is an existing file")
    assert not (tmp_path / "n.vmfb").exists()


def test_cli_run_save_in_missing_directory(cli, tmp_path, rng):
    np.save(tmp_path / "x.npy", rng.standard_normal((2, 4)).astype(np.float32))
    code, err = cli(
        "run", tmp_path / "m.vmfb", "--input", f"x=@{tmp_path / 'x.npy'}", "--save", tmp_path / "absent" / "y.npz"
    )
    assert code == 2
    _one_error_line(err, "--save", "does not exist")


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_cli_inspect_damaged_file(cli, tmp_path, damage):
    data = (tmp_path / "m.vmfb").read_bytes()
    (tmp_path / "m.vmfb").write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x17" * len(data))
    code, err = cli("inspect", tmp_path / "m.vmfb")
    assert code == 2
    _one_error_line(err, "m.vmfb")


def test_cli_inspect_edited_metadata(cli, tmp_path):
    data = (tmp_path / "m.vmfb").read_bytes()
    edited = data.replace(b'"target": "cpu"', b'"tarxet": "cpu"')
    assert edited != data
    (tmp_path / "m.vmfb").write_bytes(edited)
    code, err = cli("inspect", tmp_path / "m.vmfb")
    assert code == 2
    _one_error_line(err)


def test_cli_model_path_is_a_directory(cli, tmp_path):
    code, err = cli("compile", tmp_path)
    assert code == 2
    _one_error_line(err, "is a directory")


def test_cli_as_a_process(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "rocmc.cli", "compile", str(tmp_path / "absent.py")], capture_output=True, text=True
    )
    assert proc.returncode == 2
    _one_error_line(proc.stderr, "absent.py", "does not exist")


# ---- ONNX import --------------------------------------------------------------------------------------


def _model(nodes, inputs, outputs, inits=(), **graph):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits), **graph)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _import_error(model) -> str:
    with pytest.raises(rocmc.ModelImportError) as err:
        rocmc.import_onnx(model)
    return str(err.value)


@pytest.mark.parametrize(
    "declared, message",
    [
        (
            helper.make_tensor_value_info("y", TensorProto.INT64, [2, 3]),
            "declared with element type INT64, but the model computes f32[2,3]",
        ),
        (_f32("y", [2, 4]), r"declared with shape [2,4], but the model computes f32[2,3]"),
        (_f32("y", [2, 3, 1]), r"declared with shape [2,3,1], but the model computes f32[2,3]"),
    ],
)
def test_onnx_declared_output_type_differs(declared, message):
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_f32("x", [2, 3])], [declared])
    err = _import_error(m)
    assert "(output) 'y'" in err and message in err


def test_onnx_declared_output_type_may_leave_dims_open():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_f32("x", ["n", 3])], [_f32("y", [None, 3])])
    assert rocmc.import_onnx(m).outputs[0].shape == ("n", 3)


def test_onnx_two_nodes_write_one_value():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="first"), helper.make_node("Neg", ["x"], ["y"], name="second")]
    err = _import_error(_model(nodes, [_f32("x", [2])], [_f32("y", [2])]))
    assert "'y': is written twice: by Relu node 'first' and by Neg node 'second'" in err


def test_onnx_node_overwrites_an_input():
    err = _import_error(_model([helper.make_node("Relu", ["x"], ["x"], name="r")], [_f32("x", [2])], [_f32("x", [2])]))
    assert "'x': is written twice: by a graph input and by Relu node 'r'" in err


def test_onnx_unknown_attribute():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r", alpha=0.5)], [_f32("x", [2])], [_f32("y", [2])])
    err = _import_error(m)
    assert "Relu 'r': unknown attribute 'alpha'" in err


def test_onnx_sparse_initializer():
    values = numpy_helper.from_array(np.array([1.0], np.float32), "w")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([1], np.int64)), [3])
    m = _model(
        [helper.make_node("Add", ["x", "w"], ["y"])], [_f32("x", [3])], [_f32("y", [3])], sparse_initializer=[sparse]
    )
    err = _import_error(m)
    assert "'w': sparse initializers are not supported" in err and "not defined" not in err


def _int64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.mark.parametrize(
    "node, inits",
    [
        (helper.make_node("ConstantOfShape", ["shape"], ["y"], name="big"), [_int64("shape", [1 << 16, 1 << 16])]),
        (
            helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="big"),
            [_int64("start", 0), _int64("limit", 1 << 40), _int64("delta", 1)],
        ),
    ],
)
def test_onnx_fold_into_a_huge_constant(node, inits):
    import tracemalloc

    m = _model([node], [], [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)], inits)
    tracemalloc.start()
    try:
        err = _import_error(m)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{node.op_type} 'big': {node.op_type} would fold into a constant of" in err
    assert "the limit is 1 GiB per folded constant" in err
    assert peak < 64 << 20


def test_onnx_broadcast_too_large_to_fold_is_computed_at_run_time():
    r = [
        _int64("start", 0),
        _int64("limit", 1 << 14),
        _int64("delta", 1),
        _int64("row", [1, -1]),
        _int64("col", [-1, 1]),
    ]
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
        helper.make_node("Reshape", ["r", "row"], ["a"]),
        helper.make_node("Reshape", ["r", "col"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]  # (1, 16384) + (16384, 1): 2 GiB of int64
    g = rocmc.import_onnx(_model(nodes, [], [helper.make_tensor_value_info("y", TensorProto.INT64, None)], r))
    assert [n.op for n in g.nodes if n.op != "constant"] == ["add"]
