"""scatter_elements (ONNX ScatterElements, torch scatter/scatter_reduce), scatter_nd (ONNX ScatterND),
triu/tril, argmin and argmax's last_index, and einsum: compiled for the CPU and compared with numpy."""

from __future__ import annotations

import numpy as np
import pytest

import rocmc
from rocmc import ops
from helpers import CpuBatch, check, compile_gpu, rand, run

REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _distinct_along(rng, shape, axis: int, n: int) -> np.ndarray:
    """Indices into an axis of size n, distinct along `axis` (no two updates meet), half of them
    spelled negatively."""
    moved = list(shape)
    moved[axis], moved[-1] = moved[-1], moved[axis]
    rows = np.stack([rng.permutation(n)[: shape[axis]] for _ in range(int(np.prod(moved[:-1])))])
    idx = np.swapaxes(rows.reshape(moved), axis, -1)
    return idx - n * rng.integers(0, 2, size=idx.shape)


def _numpy_scatter_elements(data, idx, upd, axis, reduction):
    """ONNX's loop, written out: every update in row-major order."""
    out = data.astype(np.float64).copy()
    n = data.shape[axis]
    for p in np.ndindex(*idx.shape):
        at = list(p)
        at[axis] = idx[p] + n if idx[p] < 0 else idx[p]
        at = tuple(at)
        out[at] = upd[p] if reduction == "none" else REDUCE[reduction](out[at], upd[p])
    return out


REDUCTIONS = ["none", "add", "mul", "max", "min"]


def _scatter_elements_graph(reduction):
    g = rocmc.Graph("s")
    data = g.input("data", ("n", 7, 5), "f32")
    idx = g.input("idx", ("n", 3, 5), "i64")
    upd = g.input("upd", ("n", 3, 5), "f32")
    g.output(ops.scatter_elements(data, idx, upd, axis=1, reduction=reduction))
    return g


# A parametrization's graphs as the functions of one module (helpers.CpuBatch): one compile, not one a test.
SCATTER_ELEMENTS_BATCH = CpuBatch(_scatter_elements_graph, [(r,) for r in REDUCTIONS])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_elements_matches_numpy(rng, reduction):
    g, module = SCATTER_ELEMENTS_BATCH(reduction)
    for n in (1, 3):
        d, u = rand(rng, (n, 7, 5)), rand(rng, (n, 3, 5))
        # "none" only with distinct places: ONNX leaves the order of duplicates open
        i = _distinct_along(rng, (n, 3, 5), 1, 7) if reduction == "none" else rng.integers(-7, 7, size=(n, 3, 5))
        got = check(g, d, i, u, module=module)[0]
        np.testing.assert_allclose(got, _numpy_scatter_elements(d, i, u, 1, reduction), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements_odd_sizes_and_smaller_indices(rng, axis):
    """indices smaller than data in every dim, i32 indices, integer data."""
    g = rocmc.Graph("s")
    data = g.input("data", (5, "m"), "i32")
    idx = g.input("idx", (3, 2), "i32")
    upd = g.input("upd", (3, 2), "i32")
    g.output(ops.scatter_elements(data, idx, upd, axis=axis, reduction="add"))
    d, u = rand(rng, (5, 9), "i32"), rand(rng, (3, 2), "i32")
    n = 5 if axis == 0 else 9
    i = rng.integers(-n, n, size=(3, 2)).astype(np.int32)
    got = check(g, d, i, u)[0]
    np.testing.assert_array_equal(got, _numpy_scatter_elements(d, i, u, axis % 2, "add").astype(np.int32))


def test_scatter_elements_like_torch_scatter_reduce(rng):
    torch = pytest.importorskip("torch")
    g = rocmc.Graph("s")
    data = g.input("data", (4, 6), "f32")
    idx = g.input("idx", (4, 9), "i64")
    upd = g.input("upd", (4, 9), "f32")
    g.output(
        ops.scatter_elements(data, idx, upd, axis=1, reduction="max"),
        ops.scatter_elements(data, idx, upd, axis=1, reduction="add"),
    )
    d, i, u = rand(rng, (4, 6)), rng.integers(0, 6, size=(4, 9)), rand(rng, (4, 9))
    got = run(g, d, i, u)
    td, ti, tu = (torch.from_numpy(a) for a in (d, i, u))
    np.testing.assert_allclose(got[0], td.scatter_reduce(1, ti, tu, "amax").numpy(), rtol=1e-6)
    np.testing.assert_allclose(got[1], td.scatter_add(1, ti, tu).numpy(), rtol=2e-5, atol=2e-5)


def test_duplicates_apply_in_order(rng):
    """Several updates of one place: deterministic, the last "none" update wins (CPU and reference)."""
    g = rocmc.Graph("s")
    data = g.input("data", (6,), "f32")
    idx = g.input("idx", (5,), "i64")
    upd = g.input("upd", (5,), "f32")
    g.output(ops.scatter_elements(data, idx, upd), ops.scatter_nd(data, ops.unsqueeze(idx, [1]), upd))
    d, u = rand(rng, (6,)), rand(rng, (5,))
    i = np.array([2, -4, 5, 2, 2])
    want = d.copy()
    want[[2, 5]] = u[[4, 2]]
    for got in check(g, d, i, u):
        np.testing.assert_array_equal(got, want)


def test_out_of_range_indices_clamp_to_the_edge(rng):
    g = rocmc.Graph("s")
    data = g.input("data", (3, 4), "f32")
    idx = g.input("idx", (3, 1), "i64")
    upd = g.input("upd", (3, 1), "f32")
    g.output(ops.scatter_elements(data, idx, upd, axis=1))
    d, u = rand(rng, (3, 4)), rand(rng, (3, 1))
    got = check(g, d, np.array([[9], [-9], [1]]), u)[0]
    want = d.copy()
    want[0, 3], want[1, 0], want[2, 1] = u[:, 0]
    np.testing.assert_array_equal(got, want)


def _numpy_scatter_nd(data, idx, upd, reduction):
    out = data.astype(np.float64).copy()
    k = idx.shape[-1]
    for p in np.ndindex(*idx.shape[:-1]):
        at = tuple(int(i + n if i < 0 else i) for i, n in zip(idx[p], data.shape[:k]))
        out[at] = upd[p] if reduction == "none" else REDUCE[reduction](out[at], upd[p])
    return out


def _scatter_nd_graph(reduction):
    g = rocmc.Graph("nd")
    data = g.input("data", (5, "s", 3), "f32")
    idx = g.input("idx", ("m", 2, 2), "i64")
    upd = g.input("upd", ("m", 2, 3), "f32")
    g.output(ops.scatter_nd(data, idx, upd, reduction=reduction))
    return g


SCATTER_ND_BATCH = CpuBatch(_scatter_nd_graph, [(r,) for r in REDUCTIONS])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd_matches_numpy(rng, reduction):
    g, module = SCATTER_ND_BATCH(reduction)
    s, m = 7, 3
    d, u = rand(rng, (5, s, 3)), rand(rng, (m, 2, 3))
    if reduction == "none":  # distinct tuples
        flat = rng.permutation(5 * s)[: m * 2]
        i = np.stack(np.unravel_index(flat, (5, s)), -1).reshape(m, 2, 2) - [5, 0] * rng.integers(0, 2, (m, 2, 1))
    else:
        i = np.stack([rng.integers(-5, 5, (m, 2)), rng.integers(-s, s, (m, 2))], -1)
    got = check(g, d, i, u, module=module)[0]
    np.testing.assert_allclose(got, _numpy_scatter_nd(d, i, u, reduction), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd_with_unique_indices(rng, reduction):
    """unique_indices=True (updates written in parallel) gives the same result; evaluate refuses tuples that
    meet, and the flag is marked on the compiled scatter for every target."""
    g = rocmc.Graph("nd")
    data = g.input("data", (6, "s", 5), "f32")
    idx = g.input("idx", ("m", 2), "i64")
    upd = g.input("upd", ("m", 5), "f32")
    g.output(ops.scatter_nd(data, idx, upd, reduction=reduction, unique_indices=True))
    s, m = 9, 17
    flat = rng.permutation(6 * s)[:m]
    i = np.stack(np.unravel_index(flat, (6, s)), -1)
    d, u = rand(rng, (6, s, 5)), rand(rng, (m, 5))
    got = check(g, d, i, u)[0]
    np.testing.assert_allclose(got, _numpy_scatter_nd(d, i, u, reduction), rtol=2e-5, atol=2e-5)
    i[3] = i[11]
    with pytest.raises(rocmc.InputError, match="unique_indices=True but two index tuples"):
        rocmc.evaluate(g, d, i, u)
    for target in ("cpu", "cuda:sm_80"):
        assert "unique_indices(true)" in rocmc.compile(g, target).ir("input")
    with pytest.raises(rocmc.GraphError, match="unique_indices='yes'"):
        ops.scatter_nd(data, idx, upd, unique_indices="yes")


def test_scatter_nd_whole_tuples_and_one_tuple(rng):
    """k equal to data's rank (scalar slices), and indices of rank 1 (one tuple, no batch)."""
    g = rocmc.Graph("nd")
    data = g.input("data", (4, 3), "f16")
    full = g.input("full", (5, 2), "i32")
    upd = g.input("upd", (5,), "f16")
    one = g.input("one", (1,), "i64")
    row = g.input("row", (3,), "f16")
    g.output(ops.scatter_nd(data, full, upd, reduction="add"), ops.scatter_nd(data, one, row))
    d, u, r = rand(rng, (4, 3), "f16"), rand(rng, (5,), "f16"), rand(rng, (3,), "f16")
    f = np.stack([rng.integers(0, 4, 5), rng.integers(0, 3, 5)], -1).astype(np.int32)
    got = check(g, d, f, u, np.array([-2]), r)
    np.testing.assert_allclose(got[0], _numpy_scatter_nd(d, f, u, "add"), rtol=4e-3, atol=4e-3)
    want = d.copy()
    want[2] = r
    np.testing.assert_array_equal(got[1], want)


def test_scatter_onto_bool_and_a_symbolic_count(rng):
    g = rocmc.Graph("b")
    data = g.input("data", ("n", 4), "bool")
    idx = g.input("idx", ("n", 1), "i64")
    upd = g.input("upd", ("n", 1), "bool")
    g.output(ops.scatter_elements(data, idx, upd, axis=1))
    d, u = rand(rng, (6, 4), "bool"), rand(rng, (6, 1), "bool")
    i = rng.integers(0, 4, (6, 1))
    got = check(g, d, i, u)[0]
    want = d.copy()
    want[np.arange(6), i[:, 0]] = u[:, 0]
    np.testing.assert_array_equal(got, want)


def test_scatter_checks_sizes_at_call(rng):
    g = rocmc.Graph("c")
    data = g.input("data", ("n", 4), "f32")
    idx = g.input("idx", ("m", 2), "i64")
    upd = g.input("upd", ("m", 2), "f32")
    g.output(ops.scatter_elements(data, idx, upd, axis=1))
    module = rocmc.load(rocmc.compile(g, "cpu"))
    bad = (rand(rng, (2, 4)), np.zeros((3, 2), np.int64), rand(rng, (3, 2)))
    with pytest.raises(rocmc.InputError, match="larger than"):
        module(*bad)
    with pytest.raises(rocmc.InputError, match="larger than"):
        rocmc.evaluate(g, *bad)


def test_scatter_errors():
    g = rocmc.Graph("e")
    data = g.input("data", (4, 5), "f32")
    idx = g.input("idx", (4, 2), "i64")
    with pytest.raises(rocmc.GraphError, match="reduction='sum'"):
        ops.scatter_elements(data, idx, g.input("u", (4, 2)), axis=1, reduction="sum")
    with pytest.raises(rocmc.GraphError, match="same shape"):
        ops.scatter_elements(data, idx, g.input("u2", (4, 3)), axis=1)
    with pytest.raises(rocmc.GraphError, match="same dtype"):
        ops.scatter_elements(data, idx, g.input("u3", (4, 2), "f16"), axis=1)
    with pytest.raises(rocmc.GraphError, match="int tensor"):
        ops.scatter_elements(data, g.input("fi", (4, 2)), g.input("u4", (4, 2)))
    with pytest.raises(rocmc.GraphError, match="larger than 5"):
        ops.scatter_elements(data, g.input("big", (4, 7), "i64"), g.input("u5", (4, 7)), axis=0)
    with pytest.raises(rocmc.GraphError, match=r"expected shape \[4\]"):
        ops.scatter_nd(data, idx, g.input("u6", (4, 5)))
    with pytest.raises(rocmc.GraphError, match="needs a float or int"):
        b = g.input("b", (4, 5), "bool")
        ops.scatter_elements(b, idx, g.input("u7", (4, 2), "bool"), reduction="add")


def test_scatters_compile_for_gpus():
    g = rocmc.Graph("gpu")
    data = g.input("data", ("n", 6, 8), "f16")
    g.output(
        ops.scatter_elements(
            data, g.input("i", ("n", 2, 8), "i64"), g.input("u", ("n", 2, 8), "f16"), axis=1, reduction="add"
        ),
        ops.scatter_nd(data, g.input("j", ("m", 2), "i32"), g.input("v", ("m", 8), "f16"), reduction="max"),
    )
    compile_gpu(g)


# ---- triu / tril -------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 1, -2, 9])
def test_triu_tril_over_a_symbolic_sequence(rng, k):
    g = rocmc.Graph("t")
    x = g.input("x", (2, "s", "s"), "f32")
    b = g.input("b", ("s", 3), "bool")
    g.output(ops.triu(x, k), ops.tril(x, k), ops.tril(b, k))
    for s in (1, 5):
        xx, bb = rand(rng, (2, s, s)), rand(rng, (s, 3), "bool")
        got = check(g, xx, bb)
        np.testing.assert_array_equal(got[0], np.triu(xx, k))
        np.testing.assert_array_equal(got[1], np.tril(xx, k))
        np.testing.assert_array_equal(got[2], np.tril(bb, k))


def test_causal_mask_graph_reads_as_tril():
    g = rocmc.Graph("m")
    x = g.input("x", ("s", "s"), "f32")
    g.output(ops.tril(x))
    assert "tril(%0) {k=0}" in str(g)
    with pytest.raises(rocmc.GraphError, match="rank >= 2"):
        ops.triu(g.input("v", (4,), "f32"))
    compile_gpu(g)


# ---- argmin / last_index -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16", "i32", "i64"])
def test_argmin_and_last_index(rng, dtype):
    g = rocmc.Graph("a")
    x = g.input("x", ("n", 9), dtype)
    g.output(
        ops.argmin(x, 1),
        ops.argmin(x, 0, keepdims=True),
        ops.argmin(x, 1, last_index=True),
        ops.argmax(x, 1, last_index=True),
    )
    v = rand(rng, (5, 9), dtype, -2, 2)  # small range: many ties
    if dtype.startswith("i"):
        v[0, 0] = np.iinfo(v.dtype).min
        v[1, 3] = np.iinfo(v.dtype).max
    else:
        v = np.round(v)
        v[2, [1, 6]] = np.nan
    got = check(g, v)
    flip = v[:, ::-1]
    np.testing.assert_array_equal(got[0], np.argmin(v, 1))
    np.testing.assert_array_equal(got[1], np.argmin(v, 0)[None])
    np.testing.assert_array_equal(got[2], 8 - np.argmin(flip, 1))
    np.testing.assert_array_equal(got[3], 8 - np.argmax(flip, 1))


# ---- einsum ------------------------------------------------------------------------------------

EQUATIONS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("i,i->", [(5,), (5,)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ji", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("abc,cd->", [(2, 3, 4), (4, 5)]),
    ("ab,ab->ba", [(2, 3), (2, 3)]),
    ("...i->...", [(2, 3, 4)]),
    ("ijk,jil->kl", [(3, 2, 4), (2, 3, 5)]),
]


def _einsum_graph(equation, shapes):
    g = rocmc.Graph("e")
    xs = [g.input(f"x{i}", s, "f32") for i, s in enumerate(shapes)]
    g.output(ops.einsum(equation, *xs))
    return g


# The equations' graphs as the functions of one module (helpers.CpuBatch): one compile, not one a test.
EINSUM_BATCH = CpuBatch(_einsum_graph, [(e, tuple(s)) for e, s in EQUATIONS])


@pytest.mark.parametrize("equation, shapes", EQUATIONS)
def test_einsum_matches_numpy(rng, equation, shapes):
    g, module = EINSUM_BATCH(equation, tuple(shapes))
    arrays = [rand(rng, s) for s in shapes]
    got = check(g, *arrays, module=module)[0]
    np.testing.assert_allclose(got, np.einsum(equation, *[a.astype(np.float64) for a in arrays]), rtol=2e-5, atol=2e-5)


def test_einsum_symbolic_attention_scores(rng):
    g = rocmc.Graph("e")
    q = g.input("q", ("b", "s", 8), "f32")
    k = g.input("k", ("b", "t", 8), "f32")
    g.output(ops.einsum("bsd,btd->bts", q, k))
    assert "matmul(%0, %1) {transpose_a=False, transpose_b=True}" in str(g)
    qq, kk = rand(rng, (2, 5, 8)), rand(rng, (2, 3, 8))
    got = check(g, qq, kk)[0]
    np.testing.assert_allclose(got, np.einsum("bsd,btd->bts", qq, kk), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "equation, shapes, match",
    [
        ("ii->i", [(3, 3)], "diagonals and traces"),
        ("ij,jk->iz", [(2, 3), (3, 4)], "in no operand"),
        ("ij,jk->ik", [(2, 3), (4, 4)], "size 3 in one operand and 4"),
        ("ij", [(2, 3), (3,)], "2 were given"),
        ("ijk", [(2, 3)], "rank 2"),
    ],
)
def test_einsum_errors(equation, shapes, match):
    g = rocmc.Graph("e")
    xs = [g.input(f"x{i}", s, "f32") for i, s in enumerate(shapes)]
    with pytest.raises(rocmc.GraphError, match=match):
        ops.einsum(equation, *xs)
