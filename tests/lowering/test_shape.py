"""Shape and data-movement ops against numpy (float64 references and explicit numpy expressions):
static and symbolic dims, odd sizes, f32/f16/bf16/i64/bool, the MLIR each lowering picks, errors."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.lowering.module import lower

from helpers import CpuBatch, check, compile_gpu, rand


def same(got, want):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# ---- reshape and its builders --------------------------------------------------------------


# A parametrized test's graphs are the functions of one module (helpers.CpuBatch): a compile a module, not a test.
# Keys in the order the tests run (the last parametrize decorator's values outermost).


def _reshape_graph(dtype):
    g = rocmc.Graph("t")
    x = g.input("x", ("b", "seq", 96), dtype)
    g.output(ops.reshape(x, ("b", "seq", 8, -1)))
    return g


RESHAPE_BATCH = CpuBatch(_reshape_graph, [(d,) for d in ("f32", "f16", "i64", "bool")])


@pytest.mark.parametrize("dtype", ["f32", "f16", "i64", "bool"])
def test_reshape_split_symbolic(dtype, rng):
    g, module = RESHAPE_BATCH(dtype)
    (y,) = g.outputs
    assert y.shape == ("b", "seq", 8, 12) and y.graph.nodes[-1].attrs["shape"] == ["b", "seq", 8, 12]
    a = rand(rng, (3, 5, 96), dtype)
    same(check(g, a, module=module)[0], a.reshape(3, 5, 8, 12))
    text = lower(g, "cpu").text
    assert "tensor.expand_shape" in text and "tensor.reshape" not in text


def test_flatten_then_unflatten_by_symbols(rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("b", "seq", 6, 5), "f32")
    f = ops.flatten(x, 0, 1)
    assert f.shape == ("(b*seq)", 6, 5)
    back = ops.reshape(f, ("b", "seq", 30))  # both symbols come back from the graph inputs
    g.output(f, back)
    a = rand(rng, (2, 7, 6, 5))
    got = check(g, a)
    same(got[1], a.reshape(2, 7, 30))
    text = lower(g, "cpu").text
    assert "tensor.collapse_shape" in text and "tensor.reshape" not in text


def test_reshape_static_regroup_and_scalar(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (6, 4, 1), "f16")
    s = g.input("s", (1, 1), "f32")
    g.output(ops.reshape(x, (3, 1, 8)), ops.reshape(ops.reshape(s, ()), (1, 1, 1)), ops.flatten(s))
    a, b = rand(rng, (6, 4, 1), "f16"), rand(rng, (1, 1))
    got = check(g, a, b)
    same(got[0], a.reshape(3, 1, 8))
    assert got[1].shape == (1, 1, 1) and got[2].shape == (1,)


def test_reshape_not_a_product_uses_a_shape_tensor(rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 3), "f32")
    y = ops.reshape(x, (-1, 2))  # 3n/2 rows: known only at run time
    assert y.shape == ("((n*3)/2)", 2) and y.graph.nodes[-1].attrs["shape"] == [-1, 2]
    g.output(y)
    a = rand(rng, (6, 3))
    same(check(g, a)[0], a.reshape(9, 2))
    assert "tensor.reshape" in lower(g, "cpu").text


def test_squeeze_unsqueeze(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (1, "n", 1, 3), "bf16")
    u = ops.unsqueeze(x, [0, -1])
    assert u.shape == (1, 1, "n", 1, 3, 1)
    g.output(ops.squeeze(x), ops.squeeze(x, 2), u)
    a = rand(rng, (1, 5, 1, 3), "bf16")
    got = check(g, a)
    assert got[0].shape == (5, 3) and got[1].shape == (1, 5, 3) and got[2].shape == (1, 1, 5, 1, 3, 1)


def test_reshape_errors():
    g = rocmc.Graph("t")
    x = g.input("x", (4, 6), "f32")
    s = g.input("s", ("n", 4), "f32")
    with pytest.raises(rocmc.GraphError, match=r"reshape\(%0\).*\[4,6\] \(24 elements\) to \[5,5\]"):
        ops.reshape(x, (5, 5))
    with pytest.raises(rocmc.GraphError, match="more than one -1"):
        ops.reshape(x, (-1, -1))
    with pytest.raises(rocmc.GraphError, match="cannot infer -1.*24 elements.*multiple of 5"):
        ops.reshape(x, (5, -1))
    with pytest.raises(rocmc.GraphError, match="'m' is not built from the symbols"):
        ops.reshape(s, ("m", 4))
    with pytest.raises(rocmc.GraphError, match=r"\(n\*4\) elements.*\(n\*8\) elements"):
        ops.reshape(s, ("n", 8))
    with pytest.raises(rocmc.GraphError, match="invalid"):
        ops.reshape(x, (-2, 12))


def test_squeeze_errors():
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 1, 3), "f32")
    with pytest.raises(rocmc.GraphError, match=r"squeeze\(%0\): cannot squeeze axis 0.*symbolic"):
        ops.squeeze(x, 0)
    with pytest.raises(rocmc.GraphError, match="axis 2.*not 1"):
        ops.squeeze(x, [1, 2])
    with pytest.raises(rocmc.GraphError, match="out of range"):
        ops.unsqueeze(x, 5)
    with pytest.raises(rocmc.GraphError, match="start_dim=2 comes after end_dim=1"):
        ops.flatten(x, 2, 1)


# ---- transpose -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16", "bool"])
def test_transpose_and_permute(dtype, rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("b", 3, "n", 5), dtype)
    t = ops.transpose(x, 1, -1)
    p = ops.permute(x, (2, 0, -1, 1))
    assert t.shape == ("b", 5, "n", 3) and p.graph.nodes[-1].attrs == {"perm": [2, 0, 3, 1]}
    g.output(t, p)
    a = rand(rng, (2, 3, 7, 5), dtype)
    got = check(g, a)
    same(got[0], a.swapaxes(1, 3))
    same(got[1], a.transpose(2, 0, 3, 1))


def test_transpose_errors():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3, 4), "f32")
    with pytest.raises(rocmc.GraphError, match=r"transpose\(%0\): perm=\[0, 0, 1\] is not a permutation"):
        ops.permute(x, (0, 0, 1))
    with pytest.raises(rocmc.GraphError, match="dims=\\[1, 0\\] has 2 entries, expected 3"):
        ops.permute(x, (1, 0))
    with pytest.raises(rocmc.GraphError, match="dim1=3 is out of range for rank 3; expected -3..2"):
        ops.transpose(x, 0, 3)


# ---- concat --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16", "i64"])
def test_concat_symbolic_along_and_across(dtype, rng):
    g = rocmc.Graph("t")
    a = g.input("a", ("b", "n", 3), dtype)
    b = g.input("b_", ("b", 2, 3), dtype)
    c = g.input("c", ("b", "m", 3), dtype)
    y = ops.concat([a, b, c], axis=-2)
    assert y.shape == ("b", "((n+m)+2)", 3)
    z = ops.concat([a, a], axis=2)
    g.output(y, z)
    x1, x2, x3 = rand(rng, (2, 5, 3), dtype), rand(rng, (2, 2, 3), dtype), rand(rng, (2, 1, 3), dtype)
    got = check(g, x1, x2, x3)
    same(got[0], np.concatenate([x1, x2, x3], axis=1))
    same(got[1], np.concatenate([x1, x1], axis=2))


def test_concat_bool_and_constant(rng):
    g = rocmc.Graph("t")
    a = g.input("a", (3, "n"), "bool")
    k = rand(rng, (3, 4), "bool")
    g.output(ops.concat([a, k], axis=1))
    x = rand(rng, (3, 5), "bool")
    same(check(g, x)[0], np.concatenate([x, k], axis=1))


def test_concat_errors():
    g = rocmc.Graph("t")
    a, b = g.input("a", ("n", 3), "f32"), g.input("b", ("m", 3), "f32")
    c, d = g.input("c", (2, 4), "f32"), g.input("d", (2, 3), "f16")
    with pytest.raises(rocmc.GraphError, match=r"concat\(%0, %1\): dim 0 of %1 is m but n in %0"):
        ops.concat([a, b], axis=1)
    with pytest.raises(rocmc.GraphError, match=r"dim 1 of %2 is 4 but 3"):
        ops.concat([a, c], axis=0)
    with pytest.raises(rocmc.GraphError, match="f32.*f16.*same dtype"):
        ops.concat([a, d], axis=0)
    with pytest.raises(rocmc.GraphError, match="axis=2 is out of range for rank 2"):
        ops.concat([a, b], axis=2)
    with pytest.raises(rocmc.GraphError, match="non-empty list"):
        ops.concat([], axis=0)


# ---- slice ---------------------------------------------------------------------------------

SLICES = [  # (shape as built, run shape, starts, ends, axes, steps, numpy index)
    ((9, 7), (9, 7), [1, -3], [8, 1000], [0, 1], None, np.s_[1:8, -3:]),
    (("n", 7), (11, 7), [2], [2**63 - 1], [0], [3], np.s_[2::3]),
    (("n", "m"), (6, 10), [-4, 1], [-1, -2], None, [1, 2], np.s_[-4:-1, 1:-2:2]),
    ((9, "m"), (9, 6), [7, -1], [-100, 0], [0, 1], [-3, -2], np.s_[7::-3, :0:-2]),
    (("n", 5), (4, 5), [100, -100], [200, 100], [0, 1], None, np.s_[100:200, :]),  # clamped: empty rows
    (("n", 5, 3), (8, 5, 3), [-1], [-(10**9)], [0], [-1], np.s_[::-1]),
]


def _slice_graph(case):
    shape, _, starts, ends, axes, steps, _ = SLICES[case]
    g = rocmc.Graph("t")
    x = g.input("x", shape, "f32")
    g.output(ops.slice(x, starts, ends, axes, steps))
    return g


SLICE_BATCH = CpuBatch(_slice_graph, [(case,) for case in range(len(SLICES))])


@pytest.mark.parametrize("case", range(len(SLICES)))
def test_slice(case, rng):
    _, run_shape, _, _, _, _, index = SLICES[case]
    g, module = SLICE_BATCH(case)
    a = rand(rng, run_shape)
    same(check(g, a, module=module)[0], a[index])


@pytest.mark.parametrize("dtype", ["f16", "i64", "bool"])
def test_slice_dtypes_static_shapes(dtype, rng):
    g = rocmc.Graph("t")
    x = g.input("x", (5, 9), dtype)
    y = ops.slice(x, [-2, 1], [-1000, 9], [0, 1], [-1, 2])
    assert y.shape == (4, 4)
    assert y.graph.nodes[-1].attrs == {"axes": [0, 1], "starts": [3, 1], "ends": [-6, 9], "steps": [-1, 2]}
    g.output(y)
    a = rand(rng, (5, 9), dtype)
    same(check(g, a)[0], a[3::-1, 1:9:2])


def test_slice_symbolic_result_sizes():
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 8), "f32")
    assert ops.slice(x, [1], [2**63 - 1], [0]).shape == ("(n-1)", 8)
    assert ops.slice(x, [0, 2], [4, -2], [0, 1]).shape[1] == 4


@pytest.mark.parametrize("dtype", ["f32", "f16", "i64"])
def test_slice_empty_result_static(dtype, rng):
    # A start clamped to the end of the axis gives a zero-size dim; nothing is read, so the
    # lowering makes an empty tensor instead of a slice whose offset sits at the edge.
    g = rocmc.Graph("t")
    x = g.input("x", (4, 8), dtype)
    y = ops.slice(x, [8], [100], [1], [1])
    back = ops.slice(x, [0], [3], [0], [-1])  # negative step, start already past end
    assert y.shape == (4, 0) and back.shape == (0, 8)
    g.output(y, back, ops.concat([x, y], axis=1), ops.concat([back, x, back], axis=0))
    a = rand(rng, (4, 8), dtype)
    got = check(g, a)
    same(got[0], a[:, 8:100])
    same(got[1], a[0:3:-1])
    same(got[2], a)
    same(got[3], a)
    assert "tensor.extract_slice" not in lower(g, "cpu").text


@pytest.mark.parametrize("n", [8, 11])
def test_slice_symbolic_empty_at_run_time(n, rng):
    # The same slice on a symbolic axis: empty when n == 8, three rows when n == 11.
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 5), "f32")
    y = ops.slice(x, [8], [100], [0], [1])
    g.output(y, ops.concat([y, x], axis=0), ops.slice(x, [-n - 5], [-n], [0], [-1]))
    a = rand(rng, (n, 5))
    got = check(g, a)
    same(got[0], a[8:100])
    same(got[1], np.concatenate([a[8:100], a]))
    assert got[2].shape == (0, 5)


def test_slice_empty_result_compiles_for_gpu():
    g = rocmc.Graph("t")
    x = g.input("x", (4, 8), "f16")
    s = g.input("s", ("b", 8), "f16")
    g.output(ops.concat([x, ops.slice(x, [8], [100], [1], [1])], axis=1), ops.slice(s, [8], [100], [0], [2]))
    compile_gpu(g)


def test_slice_errors():
    g = rocmc.Graph("t")
    x = g.input("x", (4, 5), "f32")
    with pytest.raises(rocmc.GraphError, match=r"slice\(%0\): step 0 on axis 1"):
        ops.slice(x, [0], [2], [1], [0])
    with pytest.raises(rocmc.GraphError, match="axes=2 is out of range"):
        ops.slice(x, [0], [2], [2])
    with pytest.raises(rocmc.GraphError, match="repeats an axis"):
        ops.slice(x, [0, 1], [2, 3], [1, -1])
    with pytest.raises(rocmc.GraphError, match="1, 2, 2 and 2 entries"):
        ops.slice(x, [0], [2, 3], [0, 1], [1, 1])


# ---- gather / embedding --------------------------------------------------------------------


GATHERS = [("f32", "i64", 1), ("f16", "i32", 0), ("i64", "i64", -1), ("bool", "i32", 2)]


def _gather_graph(dtype, idx_dtype, axis):
    g = rocmc.Graph("t")
    x = g.input("x", (5, "n", 3), dtype)
    i = g.input("i", ("k", 2), idx_dtype)
    g.output(ops.gather(x, i, axis))
    return g


GATHER_BATCH = CpuBatch(_gather_graph, GATHERS)


@pytest.mark.parametrize("dtype,idx_dtype,axis", GATHERS)
def test_gather(dtype, idx_dtype, axis, rng):
    g, module = GATHER_BATCH(dtype, idx_dtype, axis)
    a = rand(rng, (5, 6, 3), dtype)
    n = a.shape[axis]
    idx = rng.integers(-n, n, size=(4, 2)).astype(rocmc.dtype(idx_dtype).np)  # negative ones wrap
    same(check(g, a, idx, module=module)[0], np.take(a, idx, axis=axis))


def test_embedding_and_scalar_index(rng):
    g = rocmc.Graph("t")
    ids = g.input("ids", ("b", "seq"), "i64")
    j = g.input("j", (1,), "i32")
    w = rand(rng, (50, 17), "f32")
    e = ops.embedding(ids, w)
    assert e.shape == ("b", "seq", 17)
    g.output(e, ops.gather(e, ops.reshape(j, ()), axis=1))
    t = rng.integers(0, 50, size=(2, 9))
    got = check(g, t, np.array([-2], dtype=np.int32))
    same(got[0], w[t])
    same(got[1], w[t][:, -2])


def test_gather_errors():
    g = rocmc.Graph("t")
    x = g.input("x", (4, 5), "f32")
    f = g.input("f", (3,), "f32")
    with pytest.raises(rocmc.GraphError, match=r"gather\(%0, %1\): indices have dtype f32, expected an int"):
        ops.gather(x, f)
    with pytest.raises(rocmc.GraphError, match="axis=2 is out of range for rank 2"):
        ops.gather(x, np.array([0]), 2)


# ---- broadcast_to --------------------------------------------------------------------------


def test_broadcast_to_graph_symbols(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (1, 3), "f16")
    m = g.input("m", ("n", "k"), "bool")
    y = ops.broadcast_to(x, ("n", 4, 3))  # n comes from another input
    z = ops.broadcast_to(m, (2, "n", "k"))
    g.output(y, z)
    a, b = rand(rng, (1, 3), "f16"), rand(rng, (5, 7), "bool")
    got = check(g, a, b)
    same(got[0], np.broadcast_to(a, (5, 4, 3)))
    same(got[1], np.broadcast_to(b, (2, 5, 7)))


def test_broadcast_to_errors():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3), "f32")
    with pytest.raises(rocmc.GraphError, match=r"broadcast_to\(%0\).*do not broadcast"):
        ops.broadcast_to(x, (4, 3))
    with pytest.raises(rocmc.GraphError, match="target dim 'q' is neither"):
        ops.broadcast_to(x, ("q", 2, 3))
    with pytest.raises(rocmc.GraphError, match="at least rank 2"):
        ops.broadcast_to(x, (3,))


# ---- pad -----------------------------------------------------------------------------------


PAD_VALUES = [("f32", 1.5), ("bf16", -2.0), ("i32", 7), ("bool", 1)]


def _pad_constant_graph(dtype, value):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 3), dtype)
    g.output(ops.pad(x, [(1, 2), (0, 3)], value=value))
    return g


PAD_CONSTANT_BATCH = CpuBatch(_pad_constant_graph, PAD_VALUES)


@pytest.mark.parametrize("dtype,value", PAD_VALUES)
def test_pad_constant(dtype, value, rng):
    g, module = PAD_CONSTANT_BATCH(dtype, value)
    assert g.outputs[0].shape == ("(n+3)", 6)
    a = rand(rng, (4, 3), dtype)
    want = np.pad(a, [(1, 2), (0, 3)], constant_values=np.asarray(value).astype(a.dtype))
    same(check(g, a, module=module)[0], want)


def _pad_mode_graph(mode, dtype):
    g = rocmc.Graph("t")
    x = g.input("x", (2, "n", 5), dtype)
    g.output(ops.pad(x, [(0, 0), (2, 3), (4, 1)], mode=mode), ops.pad(x, 1, mode=mode))
    return g


PAD_MODE_BATCH = CpuBatch.grid(_pad_mode_graph, ["reflect", "edge"], ["f32", "f16"])


@PAD_MODE_BATCH.parametrize("mode,dtype")
def test_pad_reflect_edge(mode, dtype, rng):
    g, module = PAD_MODE_BATCH(mode, dtype)
    a = rand(rng, (2, 7, 5), dtype)
    got = check(g, a, module=module)
    same(got[0], np.pad(a, [(0, 0), (2, 3), (4, 1)], mode=mode))
    same(got[1], np.pad(a, 1, mode=mode))


def test_pad_errors():
    g = rocmc.Graph("t")
    x = g.input("x", (3, 4), "f32")
    with pytest.raises(
        rocmc.GraphError,
        match=r"pad\(%0\): mode='wrap' is not supported; expected one of "
        r"constant, reflect, edge",
    ):
        ops.pad(x, 1, mode="wrap")
    with pytest.raises(rocmc.GraphError, match=r"reflect padding \(3, 0\) of dim 0 exceeds size - 1 = 2"):
        ops.pad(x, [(3, 0), (0, 0)], mode="reflect")
    with pytest.raises(rocmc.GraphError, match="negative width"):
        ops.pad(x, [(1, -1), (0, 0)])
    with pytest.raises(rocmc.GraphError, match="expected an int or 2 \\(lo, hi\\) pairs"):
        ops.pad(x, [(1, 1), (0, 0), (2, 2)])


# ---- GPU targets (compile-only) -------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_gpu_targets_compile(dtype):
    g = rocmc.Graph("t")
    x = g.input("x", ("b", "seq", 64), dtype)
    i = g.input("i", ("k",), "i64")
    m = g.input("m", ("b", 1), "bool")
    heads = ops.transpose(ops.reshape(x, ("b", "seq", 4, 16)), 1, 2)
    g.output(
        ops.flatten(heads, 0, 1),
        ops.reshape(ops.flatten(x), (-1, 32)),
        ops.reshape(x, (-1, 48)),
        ops.concat([x, ops.slice(x, [-1], [-1000], [1], [-1])], axis=1),
        ops.gather(x, i, 1),
        ops.pad(x, [(0, 0), (1, 2), (3, 3)], mode="reflect"),
        ops.pad(x, 1, value=2.0),
        ops.broadcast_to(m, ("b", "seq")),
        ops.slice(x, [1], [1000], [2], [3]),
        ops.squeeze(ops.unsqueeze(x, [0, -1]), [0]),
    )
    compile_gpu(g)


def test_sizes_of_symbolic_dims(rng):
    """ops.sizes: a tensor of sizes spelled over the graph's symbols, computed from the call's shapes."""
    g = rocmc.Graph("sizes")
    x = g.input("x", ("b", "s", 3))
    n = ops.sizes(g, ["b", "(s+1)", "(b*s)", "((s+1)//2)", 7])
    g.output(n, ops.broadcast_to(ops.sum(x, axis=(0, 1, 2)), ["(s+1)", 2]))
    assert str(n.type) == "i64[5]"
    mod = rocmc.load(rocmc.compile(g))
    for b, s in ((2, 5), (1, 8)):
        a = rng.standard_normal((b, s, 3)).astype(np.float32)
        got, wide = mod(a)
        np.testing.assert_array_equal(got, [b, s + 1, b * s, (s + 1) // 2, 7])
        np.testing.assert_array_equal(rocmc.evaluate(g, a)[0], got)
        assert wide.shape == (s + 1, 2)
        # f32 summation: its error bound scales with the sum of magnitudes (a sum near 0 has no relative bound)
        bound = 1e-6 * np.abs(a).sum(dtype=np.float64)
        np.testing.assert_allclose(wide, np.full((s + 1, 2), a.sum(dtype=np.float64)), rtol=1e-5, atol=bound)
    with pytest.raises(rocmc.GraphError, match=r"sizes: dim 'kv' is neither an int nor a size over the symbols"):
        ops.sizes(g, ["kv"])
    with pytest.raises(rocmc.GraphError, match=r"sizes: dtype='f32', expected 'i32' or 'i64'"):
        ops.sizes(g, ["s"], dtype="f32")
