"""ONNX indexing and layout converters (rocmc/frontend/onnx/indexing.py) on small hand-built models,
compiled for the CPU and compared with ONNX's own reference implementation."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import rocmc  # noqa: E402
from helpers import CpuBatch, rand  # noqa: E402

_ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}


def _model(op, inputs: dict, attrs=None, consts=None, opset=18, shapes=None, outputs=1):
    """One-node model: `inputs` {name: example array} are graph inputs (shape from `shapes` or the
    array's), `consts` {name: array} initializers, in the order inputs then consts ("" skips one)."""
    consts = consts or {}
    shapes = shapes or {}
    names = list(inputs) + list(consts)
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], **(attrs or {}))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(k, _ELEM[v.dtype], shapes.get(k, v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None) for i in range(outputs)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, inputs: dict, exact=False, reference=None, batched=None):
    """rocmc (imported, compiled for the CPU; or the model's graph and compiled function from a CpuBatch:
    `batched`) against onnx.reference on the same inputs (running `reference` instead, for an op it lacks)."""
    want = ReferenceEvaluator(reference or model).run(None, inputs)
    graph, module = batched if batched is not None else (rocmc.import_onnx(model), None)
    got = (module or rocmc.load(rocmc.compile(graph, "cpu")))(*inputs.values())
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        assert g.shape == w.shape, f"shape {g.shape} vs {w.shape}"
        if exact or w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    return graph


def _imported(model_of):
    """A CpuBatch of the models model_of(*key) makes, imported: a parametrized test's models are the functions of
    one module (a compile a module, not a test). The models' graph inputs are placeholders of their shapes and
    dtypes (a graph input's values are not part of the model)."""
    return lambda keys: CpuBatch(lambda *key: rocmc.import_onnx(model_of(*key)), keys)


# ---- scatters ----------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_elements_reductions(rng, reduction):
    data, upd = rand(rng, (4, 6)), rand(rng, (4, 3))
    idx = rng.integers(-6, 6, size=(4, 3))
    m = _model(
        "ScatterElements",
        {"data": data, "idx": idx, "upd": upd},
        {"axis": 1, "reduction": reduction},
        shapes={"data": ("n", 6), "idx": ("n", 3), "upd": ("n", 3)},
    )
    _check(m, {"data": data, "idx": idx, "upd": upd})


@pytest.mark.parametrize("op, opset", [("ScatterElements", 18), ("Scatter", 10)])
def test_scatter_elements_overwrite(rng, op, opset):
    data, upd = rand(rng, (5, 3)), rand(rng, (2, 3))
    idx = np.stack([rng.permutation(5)[:2] for _ in range(3)], -1) - 5 * rng.integers(0, 2, (2, 3))
    if opset < 11:  # Scatter-9 takes no negative indices
        idx = idx % 5
    inputs = {"data": data, "idx": idx, "upd": upd}
    m = _model(op, inputs, {"axis": 0}, opset=opset)
    # onnx.reference has no Scatter: ScatterElements is its renamed successor
    _check(m, inputs, exact=True, reference=_model("ScatterElements", inputs, {"axis": 0}))


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])  # onnx.reference's "max" mis-indexes slices
def test_scatter_nd(rng, reduction):
    data, upd = rand(rng, (6, 4, 3)), rand(rng, (5, 3))
    if reduction == "none":
        flat = rng.permutation(24)[:5]
        idx = np.stack(np.unravel_index(flat, (6, 4)), -1)
    else:
        idx = np.stack([rng.integers(-6, 6, 5), rng.integers(0, 4, 5)], -1)
    m = _model(
        "ScatterND",
        {"data": data, "idx": idx, "upd": upd},
        {"reduction": reduction},
        shapes={"idx": ("m", 2), "upd": ("m", 3)},
    )
    _check(m, {"data": data, "idx": idx, "upd": upd})


# ---- Trilu -------------------------------------------------------------------------------------


def _trilu_model(upper, k):
    consts = {} if k is None else {"k": np.array(k, np.int64)}
    return _model(
        "Trilu", {"x": np.zeros((2, 5, 5), np.float32)}, {"upper": upper}, consts, shapes={"x": (2, "s", "s")}
    )


TRILU_BATCH = _imported(_trilu_model)([(upper, k) for k in (None, 0, 2, -1) for upper in (0, 1)])


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1])
def test_trilu_over_a_symbolic_sequence(rng, upper, k):
    """Exporters build causal masks with Trilu over the sequence length; k arrives as an initializer."""
    x = rand(rng, (2, 5, 5))
    graph = _check(_trilu_model(upper, k), {"x": x}, exact=True, batched=TRILU_BATCH(upper, k))
    assert ("triu" if upper else "tril") in str(graph)


def test_trilu_on_constants_is_folded():
    m = _model("Trilu", {}, {"upper": 0}, {"x": np.ones((4, 4), np.float32), "k": np.array(1, np.int64)})
    graph = rocmc.import_onnx(m)
    assert not [n for n in graph.nodes if n.op in ("tril", "triu")]
    np.testing.assert_array_equal(rocmc.load(rocmc.compile(graph, "cpu"))(), np.tril(np.ones((4, 4)), 1))


# ---- Einsum, Tile ------------------------------------------------------------------------------


EINSUMS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("...j,kj->...k", [(2, 3, 4), (6, 4)]),
]


def _einsum_model(i):
    equation, shapes = EINSUMS[i]
    return _model("Einsum", {f"x{j}": np.zeros(s, np.float32) for j, s in enumerate(shapes)}, {"equation": equation})


EINSUM_BATCH = _imported(_einsum_model)([(i,) for i in range(len(EINSUMS))])


@pytest.mark.parametrize("equation, shapes", EINSUMS)
def test_einsum(rng, equation, shapes):
    inputs = {f"x{i}": rand(rng, s) for i, s in enumerate(shapes)}
    i = EINSUMS.index((equation, shapes))
    _check(_einsum_model(i), inputs, batched=EINSUM_BATCH(i))


def test_einsum_diagonal_is_refused(rng):
    m = _model("Einsum", {"x": rand(rng, (3, 3))}, {"equation": "ii->i"})
    with pytest.raises(rocmc.ModelImportError, match="diagonals and traces are not supported"):
        rocmc.import_onnx(m)


def _tile_model(*repeats):
    return _model(
        "Tile",
        {"x": np.zeros((3, 2, 5), np.float32)},
        consts={"r": np.array(repeats, np.int64)},
        shapes={"x": ("n", 2, 5)},
    )


REPEATS = [[2, 1, 3], [1, 1, 1], [1, 4, 1]]
TILE_BATCH = _imported(_tile_model)(REPEATS)


@pytest.mark.parametrize("repeats", REPEATS)
def test_tile_with_a_symbolic_dim(rng, repeats):
    x = rand(rng, (3, 2, 5))
    _check(_tile_model(*repeats), {"x": x}, exact=True, batched=TILE_BATCH(*repeats))


# ---- ArgMax / ArgMin ---------------------------------------------------------------------------


def _arg_model(op, last):
    x = np.zeros((4, 7), np.float32)
    return _model(op, {"x": x}, {"axis": 1, "keepdims": 0, "select_last_index": last}, shapes={"x": ("n", 7)})


ARG_BATCH = _imported(_arg_model)([(op, last) for last in (0, 1) for op in ("ArgMax", "ArgMin")])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extremes(rng, op, last):
    x = np.round(rand(rng, (4, 7), low=-2, high=2))  # rounded: ties
    _check(_arg_model(op, last), {"x": x}, batched=ARG_BATCH(op, last))


# ---- OneHot, EyeLike, Hardmax --------------------------------------------------------------------


def _one_hot_model(axis, shapes):
    return _model(
        "OneHot",
        {"idx": np.zeros((3, 4), np.int64)},
        {"axis": axis},
        {"depth": np.array(5, np.int64), "values": np.array([-1.5, 2.0], np.float32)},
        shapes=shapes,
    )


ONE_HOT_BATCH = _imported(lambda axis: _one_hot_model(axis, {"idx": ("n", 4)}))([(-1,), (0,), (1,)])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(rng, axis):
    idx = rng.integers(-5, 5, size=(3, 4))
    _check(_one_hot_model(axis, {"idx": ("n", 4)}), {"idx": idx}, exact=True, batched=ONE_HOT_BATCH(axis))


def test_one_hot_out_of_range_is_all_off():
    """ONNX's text: an index outside [-depth, depth-1] gives a row of off values (onnx.reference wraps
    it modulo depth instead)."""
    idx = np.array([[0, -1, 5, -6], [7, 4, -5, 2], [1, 1, 1, 1]])
    got = rocmc.load(rocmc.compile(rocmc.import_onnx(_one_hot_model(-1, {})), "cpu"))(idx)
    want = np.where(np.arange(5) == np.where(idx < 0, idx + 5, idx)[..., None], 2.0, -1.5)
    np.testing.assert_array_equal(got, want)
    assert (got[0, 2] == -1.5).all() and (got[1, 0] == -1.5).all()


def _eye_like_model(k, symbolic):
    shapes = {"x": ("r", "c")} if symbolic else {}
    return _model("EyeLike", {"x": np.zeros((3, 5), np.float32)}, {"k": k, "dtype": TensorProto.INT32}, shapes=shapes)


EYE_LIKE_BATCH = _imported(_eye_like_model)([(k, symbolic) for k in (0, 1, -2) for symbolic in (False, True)])


@pytest.mark.parametrize("k", [0, 1, -2])
def test_eye_like_static_and_symbolic(rng, k):
    x = rand(rng, (3, 5))
    for symbolic in (False, True):
        _check(_eye_like_model(k, symbolic), {"x": x}, batched=EYE_LIKE_BATCH(k, symbolic))


def _hardmax_model(axis):
    return _model("Hardmax", {"x": np.zeros((2, 3, 4), np.float32)}, {"axis": axis}, opset=13)


HARDMAX_BATCH = _imported(_hardmax_model)([(-1,), (0,), (1,)])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_hardmax(rng, axis):
    x = np.round(rand(rng, (2, 3, 4), low=-2, high=2))  # rounded: ties, the first wins
    _check(_hardmax_model(axis), {"x": x}, exact=True, batched=HARDMAX_BATCH(axis))


@pytest.mark.parametrize("axis", [1, 2])
def test_hardmax_before_opset_13_sees_rows(rng, axis):
    """Hardmax-11 coerces the input to 2-d (dims before axis, the rest) and marks each row's first
    maximum (onnx.reference applies the opset-13 rule to every version)."""
    x = np.round(rand(rng, (2, 3, 4), low=-2, high=2))
    m = _model("Hardmax", {"x": x}, {"axis": axis}, opset=11)
    got = rocmc.load(rocmc.compile(rocmc.import_onnx(m), "cpu"))(x)
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
    want = np.zeros_like(rows)
    want[np.arange(len(rows)), np.argmax(rows, 1)] = 1
    np.testing.assert_array_equal(got, want.reshape(x.shape))


# ---- DepthToSpace, SpaceToDepth ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_with_symbolic_height(rng, mode):
    x = rand(rng, (2, 8, 3, 5))
    m = _model("DepthToSpace", {"x": x}, {"blocksize": 2, "mode": mode}, shapes={"x": ("b", 8, "h", 5)})
    _check(m, {"x": x}, exact=True)


def test_space_to_depth_with_symbolic_width(rng):
    x = rand(rng, (2, 3, 4, 6))
    m = _model("SpaceToDepth", {"x": x}, {"blocksize": 2}, shapes={"x": (2, 3, 4, "w")})
    _check(m, {"x": x}, exact=True)


def test_space_to_depth_refuses_sizes_that_dont_divide(rng):
    m = _model("SpaceToDepth", {"x": rand(rng, (1, 2, 5, 4))}, {"blocksize": 2})
    with pytest.raises(rocmc.ModelImportError, match="multiples of blocksize 2"):
        rocmc.import_onnx(m)
