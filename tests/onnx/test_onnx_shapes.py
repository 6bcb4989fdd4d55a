"""Shapes as values: the shape subgraphs exporters write over dynamic axes import with symbolic dims.

Each model is built with onnx.helper the way torch's exporters spell it (Shape -> Gather -> arithmetic ->
Concat -> Reshape / Range / Expand / ConstantOfShape / Slice), imported, compiled for the CPU, and run
at several sizes of its dynamic axes against ONNX's reference implementation.
"""

import numpy as np
import pytest

import rocmc

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _c(name, value, dtype=np.int64):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, dtype), name))


def _model(nodes, inputs, outputs, opset=18):
    g = helper.make_graph(nodes, "shapes", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return m


def _dim(x, i, out):
    """Shape(x)[i] as a scalar, the exporters' spelling of x.size(i)."""
    return [
        helper.make_node("Shape", [x], [out + "_shape"]),
        _c(out + "_i", i),
        helper.make_node("Gather", [out + "_shape", out + "_i"], [out], axis=0),
    ]


def _check(model, feeds_list, rtol=1e-6):
    mod = rocmc.load(rocmc.compile(rocmc.import_onnx(model)))
    ref = ReferenceEvaluator(model)
    for feeds in feeds_list:
        want = ref.run(None, feeds)
        got = mod(*feeds.values())
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)
    return mod


def test_view_minus_one_seq_and_positions(rng):
    """GPT-2's x.view(-1, seq) and position ids Range(past, past + seq)."""
    nodes = [
        *_dim("x", 1, "seq"),
        _c("m1", [-1]),
        _c("ax0", [0]),
        helper.make_node("Unsqueeze", ["seq", "ax0"], ["seq1"]),
        helper.make_node("Concat", ["m1", "seq1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        _c("past", 3),
        _c("one", 1),
        helper.make_node("Add", ["seq", "past"], ["end"]),
        helper.make_node("Range", ["past", "end", "one"], ["pos"]),
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["b", "s", 4])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("pos", I64, None)],
    )
    g = rocmc.import_onnx(m)
    assert [str(v.type) for v in g.outputs] == ["f32[(b*4),s]", "i64[s]"]
    _check(m, [{"x": rng.standard_normal((b, s, 4)).astype(np.float32)} for b, s in ((2, 5), (1, 9), (3, 2))])


def test_arithmetic_on_sizes_stays_symbolic(rng):
    """(seq+1)//2, seq % 2, min/max and products of sizes: Reshape and Expand take what they compute."""
    nodes = [
        *_dim("x", 0, "b"),
        *_dim("x", 1, "s"),
        _c("two", 2),
        _c("one", 1),
        _c("big", 1000),
        helper.make_node("Mul", ["b", "s"], ["bs"]),
        helper.make_node("Add", ["s", "one"], ["s1"]),
        helper.make_node("Div", ["s1", "two"], ["half"]),
        helper.make_node("Mod", ["s", "two"], ["odd"]),
        helper.make_node("Min", ["s", "big"], ["smin"]),
        helper.make_node("Max", ["b", "one"], ["bmax"]),
        _c("ax0", [0]),
        *[helper.make_node("Unsqueeze", [v, "ax0"], [v + "_1"]) for v in ("bs", "half", "odd", "smin", "bmax")],
        _c("eight", [8]),
        helper.make_node("Concat", ["bs_1", "eight"], ["flat"], axis=0),
        helper.make_node("Reshape", ["x", "flat"], ["y"]),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s_1"]),
        helper.make_node("Concat", ["bmax_1", "s_1", "eight"], ["full"], axis=0),
        helper.make_node("Expand", ["x", "full"], ["z"]),
        helper.make_node("Concat", ["half_1", "odd_1", "smin_1"], ["sizes"], axis=0),
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["b", "s", 8])],
        [helper.make_tensor_value_info(n, t, None) for n, t in (("y", F), ("z", F), ("sizes", I64))],
    )
    g = rocmc.import_onnx(m)
    assert [str(v.type) for v in g.outputs] == ["f32[(b*s),8]", "f32[b,s,8]", "i64[3]"]
    _check(m, [{"x": rng.standard_normal((b, s, 8)).astype(np.float32)} for b, s in ((2, 5), (3, 8), (1, 3))])


def test_constant_of_shape_and_causal_mask_from_range(rng):
    """The mask exporters build: ConstantOfShape([s, s]) filled, Range / Less comparison, Where."""
    nodes = [
        *_dim("x", 1, "s"),
        _c("ax0", [0]),
        _c("zero", 0),
        _c("one", 1),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s_1"]),
        helper.make_node("Concat", ["s_1", "s_1"], ["ss"], axis=0),
        helper.make_node(
            "ConstantOfShape", ["ss"], ["fill"], value=onnx.numpy_helper.from_array(np.asarray([-1e9], np.float32))
        ),
        helper.make_node("Range", ["zero", "s", "one"], ["r"]),
        _c("ax1", [1]),
        helper.make_node("Unsqueeze", ["r", "ax1"], ["rows"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["cols"]),
        helper.make_node("Less", ["rows", "cols"], ["future"]),
        _c("zf", 0.0, np.float32),
        helper.make_node("Where", ["future", "fill", "zf"], ["mask"]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "xt"], ["scores"]),
        helper.make_node("Add", ["scores", "mask"], ["y"]),
    ]
    m = _model(
        nodes, [helper.make_tensor_value_info("x", F, ["b", "s", 4])], [helper.make_tensor_value_info("y", F, None)]
    )
    _check(m, [{"x": rng.standard_normal((b, s, 4)).astype(np.float32)} for b, s in ((2, 5), (1, 7))], rtol=1e-5)


def test_comparison_decided_by_assuming_two_and_checked_at_call(rng):
    """`seq == 1` is decided false as torch.export decides it (symbols >= 2); a call with seq = 1 is refused."""
    nodes = [
        *_dim("x", 1, "s"),
        _c("one", 1),
        _c("a", 10.0, np.float32),
        _c("b", 20.0, np.float32),
        helper.make_node("Equal", ["s", "one"], ["single"]),
        helper.make_node("Where", ["single", "a", "b"], ["k"]),
        helper.make_node("Mul", ["x", "k"], ["y"]),
    ]
    m = _model(
        nodes, [helper.make_tensor_value_info("x", F, ["b", "s"])], [helper.make_tensor_value_info("y", F, None)]
    )
    g = rocmc.import_onnx(m)
    assert [c.describe() for c in g.assumptions] == ["Equal node 'single' (imported assuming s >= 2): s >= 2"]
    mod = _check(m, [{"x": rng.standard_normal((2, s)).astype(np.float32)} for s in (2, 6)])
    with pytest.raises(
        rocmc.InputError,
        match=r"^input 'x' dim 1 \('s'\) is 1; allowed range is \[2, inf\) "
        r"\(Equal node 'single' \(imported assuming s >= 2\)\)$",
    ):
        mod(rng.standard_normal((2, 1)).astype(np.float32))
    with pytest.raises(rocmc.InputError, match="imported assuming s >= 2"):
        rocmc.evaluate(g, rng.standard_normal((2, 1)).astype(np.float32))


def test_slice_to_a_symbolic_end_assumes_it_fits(rng):
    """BERT's position_ids[:, :seq] of a 16-entry buffer: seq <= 16 is assumed and checked per call."""
    buf = onnx.numpy_helper.from_array(np.arange(16, dtype=np.int64).reshape(1, 16) * 3, "buf")
    nodes = [
        *_dim("x", 1, "s"),
        _c("zero", [0]),
        _c("ax0", [0]),
        _c("ax1", [1]),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s_1"]),
        helper.make_node("Slice", ["buf", "zero", "s_1", "ax1"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=F),
        helper.make_node("Add", ["x", "posf"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "slice",
        [helper.make_tensor_value_info("x", F, ["b", "s"])],
        [helper.make_tensor_value_info("y", F, None)],
        initializer=[buf],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    mod = _check(m, [{"x": rng.standard_normal((2, s)).astype(np.float32)} for s in (3, 16)])
    with pytest.raises(rocmc.InputError, match=r"imported assuming s <= 16"):
        mod(rng.standard_normal((2, 17)).astype(np.float32))


def test_sizes_used_as_data(rng):
    """A size cast to float (a scale computed from the sequence length) becomes a run-time value."""
    nodes = [
        *_dim("x", 1, "s"),
        *_dim("x", 0, "b"),
        helper.make_node("Mul", ["s", "b"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=F),
        helper.make_node("Size", ["x"], ["count"]),
        helper.make_node("Cast", ["count"], ["cf"], to=F),
        helper.make_node("Div", ["x", "nf"], ["y"]),
        helper.make_node("Sub", ["y", "cf"], ["z"]),
    ]
    m = _model(
        nodes, [helper.make_tensor_value_info("x", F, ["b", "s", 3])], [helper.make_tensor_value_info("z", F, None)]
    )
    _check(m, [{"x": rng.standard_normal((b, s, 3)).astype(np.float32)} for b, s in ((2, 5), (4, 1))])


def test_undecided_size_comparison_is_computed_at_run_time(rng):
    """`sq == sk` for two independent symbols holds for some calls and not others: as data it is
    computed by the module; as a shape it cannot be, and the node that needs it is named."""
    nodes = [
        *_dim("q", 1, "sq"),
        *_dim("k", 1, "sk"),
        _c("a", 1.0, np.float32),
        _c("b", 2.0, np.float32),
        helper.make_node("Equal", ["sq", "sk"], ["same"]),
        helper.make_node("Where", ["same", "a", "b"], ["w"]),
        helper.make_node("Mul", ["q", "w"], ["y"]),
    ]
    ins = [helper.make_tensor_value_info("q", F, ["b", "sq"]), helper.make_tensor_value_info("k", F, ["b", "sk"])]
    m = _model(nodes, ins, [helper.make_tensor_value_info("y", F, None)])
    _check(
        m,
        [
            {"q": rng.standard_normal((2, sq)).astype(np.float32), "k": rng.standard_normal((2, sk)).astype(np.float32)}
            for sq, sk in ((3, 3), (3, 5))
        ],
    )
    nodes = nodes[:-2] + [
        _c("n1", [-1]),
        _c("n2", [2]),
        helper.make_node("Where", ["same", "n1", "n2"], ["target"]),
        helper.make_node("Reshape", ["q", "target"], ["y"]),
    ]
    with pytest.raises(rocmc.ModelImportError, match=r"Reshape 'y': input 'shape' \(target\) must be known at import"):
        rocmc.import_onnx(_model(nodes, ins, [helper.make_tensor_value_info("y", F, None)]))


def test_absurd_symbolic_fill_is_refused_before_allocating():
    """A static shape computed from constants that would fold into a 4 TiB constant: an import error."""
    nodes = [
        _c("shape", [1 << 20, 1 << 20]),
        helper.make_node("ConstantOfShape", ["shape"], ["big"]),
        helper.make_node("Add", ["x", "big"], ["y"]),
    ]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [1])], [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(rocmc.ModelImportError, match=r"ConstantOfShape 'big'.*GiB"):
        rocmc.import_onnx(m)


def test_string_tensors_are_reported_not_taken_for_sizes():
    """Strings are data rocmc has no type for, whatever they spell ('seq' is not a size here)."""
    strings = onnx.helper.make_tensor("names", TensorProto.STRING, [2], [b"seq", b"two words"])
    nodes = [
        helper.make_node(
            "Constant", [], ["c"], value=onnx.helper.make_tensor("v", TensorProto.STRING, [1], [b"x"]), name="const_str"
        ),
        helper.make_node("Identity", ["x"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "s",
        [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, None)],
        initializer=[strings],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(rocmc.ModelImportError) as err:
        rocmc.import_onnx(m)
    assert "(initializer) 'names': string tensors are not supported" in str(err.value)
    assert "Constant 'const_str': string tensors are not supported" in str(err.value)
