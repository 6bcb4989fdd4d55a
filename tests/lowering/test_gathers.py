"""take_along_axis (ONNX GatherElements) and gather_nd (ONNX GatherND) against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import rocmc
from rocmc import ops
from helpers import check, compile_gpu, rand


def test_take_along_axis(rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 7, 5), "f32")
    i1 = g.input("i1", ("n", 3, 5), "i64")
    i2 = g.input("i2", ("m", 7, 2), "i32")
    g.output(ops.take_along_axis(x, i1, 1), ops.take_along_axis(x, i2, -1))
    for n in (2, 5):
        check(
            g,
            rand(rng, (n, 7, 5)),
            rng.integers(-9, 9, size=(n, 3, 5)),
            rng.integers(-6, 6, size=(n - 1, 7, 2)).astype(np.int32),
        )
    # against numpy's own, for in-range indices
    xx, ii = rand(rng, (3, 7, 5)), rng.integers(0, 7, size=(3, 4, 5))
    want = np.take_along_axis(xx, ii, 1)
    h = rocmc.Graph("u")
    h.output(ops.take_along_axis(h.input("x", (3, 7, 5)), h.input("i", (3, 4, 5), "i64"), 1))
    np.testing.assert_array_equal(rocmc.load(rocmc.compile(h, "cpu"))(xx, ii), want)


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(rng, batch_dims):
    g = rocmc.Graph("nd")
    x = g.input("x", (4, 6, 5), "f32")
    k = 2
    shape = (4, 3, k) if batch_dims else (3, 2, k)
    idx = g.input("idx", shape, "i64")
    g.output(ops.gather_nd(x, idx, batch_dims=batch_dims))
    got = check(g, rand(rng, (4, 6, 5)), rng.integers(-7, 7, size=shape))[0]
    assert got.shape == shape[:-1] + (4, 6, 5)[batch_dims + k :]


def test_gather_nd_matches_onnx_semantics(rng):
    x = rand(rng, (2, 3, 4))
    idx = np.array([[0, 1], [1, 2], [1, 0]])
    g = rocmc.Graph("o")
    g.output(ops.gather_nd(g.input("x", (2, 3, 4)), g.input("i", (3, 2), "i64")))
    np.testing.assert_array_equal(rocmc.load(rocmc.compile(g, "cpu"))(x, idx), x[idx[:, 0], idx[:, 1]])


def test_gathers_compile_for_gpus(rng):
    g = rocmc.Graph("gpu")
    x = g.input("x", ("n", 6, 5), "f16")
    g.output(ops.take_along_axis(x, g.input("i", ("n", 2, 5), "i64"), 1), ops.gather_nd(x, g.input("j", (3, 2), "i64")))
    compile_gpu(g)


def test_gather_errors():
    g = rocmc.Graph("e")
    x = g.input("x", (4, 5), "f32")
    with pytest.raises(rocmc.GraphError, match="same rank"):
        ops.take_along_axis(x, g.input("i", (4,), "i64"), 0)
    with pytest.raises(rocmc.GraphError, match="int tensor"):
        ops.take_along_axis(x, g.input("f", (4, 5), "f32"), 0)
    with pytest.raises(rocmc.GraphError, match="larger than 4"):
        ops.take_along_axis(x, g.input("big", (9, 5), "i64"), 1)
    with pytest.raises(rocmc.GraphError, match="don't fit"):
        ops.gather_nd(x, g.input("t", (2, 3), "i64"))
    with pytest.raises(rocmc.GraphError, match="static last dim"):
        ops.gather_nd(x, g.input("s", (2, "k"), "i64"))


@pytest.mark.parametrize(
    "op, attrs, ishape",
    [
        ("GatherElements", {"axis": 1}, (3, 2, 5)),
        ("GatherElements", {"axis": -1}, (3, 4, 2)),
        ("GatherND", {}, (2, 2)),
        ("GatherND", {"batch_dims": 1}, (3, 2, 1)),
    ],
)
def test_onnx_gathers_match_onnxruntime(rng, op, attrs, ishape):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    x = rand(rng, (3, 4, 5))
    n = 4 if op == "GatherElements" and attrs["axis"] == 1 else 5
    hi = [3, 4] if op == "GatherND" and not attrs else [4] if op == "GatherND" else [n]
    idx = (
        np.stack([rng.integers(0, h, size=ishape[:-1]) for h in hi], -1)
        if op == "GatherND"
        else rng.integers(-n, n, size=ishape)
    )
    out = "y"
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "i"], [out], **attrs)],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
            helper.make_tensor_value_info("i", TensorProto.INT64, idx.shape),
        ],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "i": idx.astype(np.int64)}
    )[0]
    g = rocmc.import_onnx(model)
    np.testing.assert_array_equal(rocmc.load(rocmc.compile(g, "cpu"))(x, idx.astype(np.int64)), want)
