"""Index-driven ops (update_slice, narrow, argmax, topk, arange, cumsum) against the float64 reference
and explicit numpy: static and symbolic dims with several run-time sizes, odd sizes, clamped starts,
ties and NaNs, the MLIR each lowering emits, typed errors, GPU compiles and the ONNX mappings."""

import numpy as np
import pytest

import rocmc
from rocmc import ops

from helpers import TOL, CpuBatch, compile_gpu, rand


def same(got, want):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def calls(graph, *inputs_list, module=None):
    """Compile once for the CPU (or take `module`, the graph's compiled function: CpuBatch), call the module on
    each tuple of inputs, and compare every output with the float64 reference (exactly for ints and indices).
    Returns the results per call."""
    module = module or rocmc.load(rocmc.compile(graph, "cpu"))
    results = []
    for inputs in inputs_list:
        got = module(*inputs)
        # Copies: a bool or bf16 result's memory is reused by the module's next call.
        got = tuple(np.array(a) for a in (got if isinstance(got, tuple) else (got,)))
        want = rocmc.evaluate(graph, *inputs)
        want = want if isinstance(want, tuple) else (want,)
        for g, w, v in zip(got, want, graph.outputs):
            assert g.shape == w.shape, f"shape {g.shape} vs reference {w.shape}"
            if v.dtype.kind == "float":
                rtol, atol = TOL[v.dtype.name]
                np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol)
            else:
                same(g, w)
        results.append(got)
    return results


def ties(rng, shape, dtype):
    """Random values with many repeats (ties), of a rocmc dtype."""
    return rng.integers(-3, 4, size=shape).astype(rocmc.dtype(dtype).np)


# ---- update_slice ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,start_dtype", [("f32", "i32"), ("f16", "i64"), ("i64", "i64")])
def test_update_slice_dynamic_start_clamps(dtype, start_dtype, rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 9, 5), dtype)
    u = g.input("u", ("n", 3, 5), dtype)
    s = g.input("s", (), start_dtype)
    g.output(ops.update_slice(x, u, s, 1), ops.update_slice(x, u, -2, axis=-2), ops.update_slice(x, u, 7, 1))
    runs = []
    for n, start in [(1, 4), (3, 0), (4, 6), (2, 8), (5, -3), (3, 1000)]:
        a, b = rand(rng, (n, 9, 5), dtype), rand(rng, (n, 3, 5), dtype)
        runs.append((a, b, np.array(start, dtype=rocmc.dtype(start_dtype).np)))
    for (a, b, start), got in zip(runs, calls(g, *runs)):
        for out, st in zip(got, (int(start), -2, 7)):
            want = a.copy()
            at = min(max(st, 0), 9 - 3)  # XLA's clamp into [0, 9 - 3]
            want[:, at : at + 3] = b
            same(out, want)


def test_update_slice_symbolic_rows_prefill(rng):
    # A prefill writes "s" rows at a run-time position of a static cache.
    g = rocmc.Graph("t")
    cache = g.input("cache", (2, 17, 4), "f32")
    rows = g.input("rows", (2, "s", 4), "f32")
    pos = g.input("pos", (1,), "i64")
    g.output(ops.update_slice(cache, rows, pos, 1))
    runs = [
        (rand(rng, (2, 17, 4)), rand(rng, (2, s, 4)), np.array([p], np.int64))
        for s, p in [(5, 3), (17, 0), (1, 16), (6, 14), (3, -1)]
    ]
    for (c, r, p), (got,) in zip(runs, calls(g, *runs)):
        at = min(max(int(p[0]), 0), 17 - r.shape[1])
        want = c.copy()
        want[:, at : at + r.shape[1]] = r
        same(got, want)
    module = rocmc.load(rocmc.compile(g, "cpu"))
    too_many = (rand(rng, (2, 17, 4)), rand(rng, (2, 18, 4)), np.array([0], np.int64))
    with pytest.raises(rocmc.InputError, match=r"update_slice\(%0, %1, %2\).*more entries along axis 1"):
        module(*too_many)
    with pytest.raises(rocmc.InputError, match=r"update_slice\(%0, %1, %2\).*18 entries along axis 1"):
        rocmc.evaluate(g, *too_many)


def test_update_slice_into_big_tensor_is_an_insert_slice(rng):
    # A decode step's KV-cache write: one row into a 64 MiB f16 cache at a run-time position. The
    # lowering is a tensor.insert_slice (what IREE updates in place), never a generic over the cache.
    g = rocmc.Graph("t")
    cache = g.input("cache", (1, 8192, 4096), "f16")
    row = g.input("row", (1, 1, 4096), "f16")
    pos = g.input("pos", (), "i32")
    new = ops.update_slice(cache, row, pos, 1)
    g.output(ops.narrow(new, 1, pos, 1))
    art = rocmc.compile(g, "cpu")
    text = art.ir("input")
    assert "tensor.insert_slice" in text and "tensor.extract_slice" in text
    assert "linalg.generic" not in text
    c, r = rand(rng, (1, 8192, 4096), "f16"), rand(rng, (1, 1, 4096), "f16")
    got = rocmc.load(art)(c, r, np.array(5000, np.int32))
    same(got, r)


def test_update_slice_errors():
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 8), "f32")
    u = g.input("u", ("n", 3), "f32")
    h = g.input("h", ("n", 3), "f16")
    w = g.input("w", ("m", 3), "f32")
    big = g.input("big", ("n", 9), "f32")
    f = g.input("f", (), "f32")
    two = g.input("two", (2,), "i64")
    with pytest.raises(rocmc.GraphError, match=r"update_slice\(%0, %2\): 'update' is f16 but 'x' is f32"):
        ops.update_slice(x, h, 0, 1)
    with pytest.raises(rocmc.GraphError, match=r"update_slice\(%0, %3\): dim 0 of 'update' is m but n in 'x'"):
        ops.update_slice(x, w, 0, 1)
    with pytest.raises(rocmc.GraphError, match=r"'update' has 9 entries along axis 1, more than the 8 of 'x'"):
        ops.update_slice(x, big, 0, 1)
    with pytest.raises(rocmc.GraphError, match=r"update_slice\(%0, %1, %5\): 'start' is f32\[\], expected one integer"):
        ops.update_slice(x, u, f, 1)
    with pytest.raises(rocmc.GraphError, match=r"'start' is i64\[2\], expected one integer"):
        ops.update_slice(x, u, two, 1)
    with pytest.raises(rocmc.GraphError, match=r"update_slice\(%0, %1\): start=1.5, expected an int"):
        ops.update_slice(x, u, 1.5, 1)
    with pytest.raises(rocmc.GraphError, match=r"update_slice\(%0, %1\): axis=2 is out of range"):
        ops.update_slice(x, u, 0, 2)
    with pytest.raises(rocmc.GraphError, match=r"update_slice: .*expected arguments \(x, update, start, axis\)"):
        ops.update_slice(x, u, 0, 1, strides=2)


# ---- narrow ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "i64", "bool"])
def test_narrow_dynamic_start_clamps(dtype, rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 11), dtype)
    s = g.input("s", (1,), "i32")
    g.output(ops.narrow(x, 1, s, 4), ops.narrow(x, 0, 1, 1), ops.narrow(x, -1, 100, 11), ops.narrow(x, 1, s, 0))
    runs = [(rand(rng, (n, 11), dtype), np.array([st], np.int32)) for n, st in [(3, 2), (1, 7), (6, -5), (2, 9)]]
    for (a, st), got in zip(runs, calls(g, *runs)):
        at = min(max(int(st[0]), 0), 11 - 4)
        same(got[0], a[:, at : at + 4])
        same(got[1], a[1:2] if a.shape[0] > 1 else a[0:1])
        same(got[2], a)
        assert got[3].shape == (a.shape[0], 0)


def test_narrow_symbolic_length(rng):
    # The first kv rows of a static cache, kv being the length of another input.
    g = rocmc.Graph("t")
    cache = g.input("cache", (2, 13, 3), "f32")
    g.input("keys", ("kv",), "i64")
    start = g.input("start", (), "i64")
    y = ops.narrow(cache, 1, 0, "kv")
    z = ops.narrow(cache, 1, start, "kv")
    assert y.shape == (2, "kv", 3)
    g.output(y, z)
    runs = [
        (rand(rng, (2, 13, 3)), rand(rng, (kv,), "i64"), np.array(st, np.int64))
        for kv, st in [(1, 4), (13, 2), (7, 9), (5, -1)]
    ]
    for (c, k, st), got in zip(runs, calls(g, *runs)):
        kv = k.shape[0]
        at = min(max(int(st), 0), 13 - kv)
        same(got[0], c[:, :kv])
        same(got[1], c[:, at : at + kv])
    module = rocmc.load(rocmc.compile(g, "cpu"))
    too_long = (rand(rng, (2, 13, 3)), rand(rng, (14,), "i64"), np.array(0, np.int64))
    with pytest.raises(rocmc.InputError, match=r"narrow\(%0\): length kv is larger than dim 1"):
        module(*too_long)
    with pytest.raises(rocmc.InputError, match=r"narrow\(%0\): length kv = 14 is larger than dim 1"):
        rocmc.evaluate(g, *too_long)


def test_narrow_symbolic_dim_and_length(rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("t", 5), "f16")
    g.input("m", ("kv", 2), "bool")
    g.output(ops.narrow(x, 0, 2, "kv"), ops.narrow(x, 0, 1, "t"))
    runs = [(rand(rng, (t, 5), "f16"), rand(rng, (kv, 2), "bool")) for t, kv in [(9, 4), (3, 3), (7, 0)]]
    for (a, b), got in zip(runs, calls(g, *runs)):
        kv = b.shape[0]
        at = min(2, a.shape[0] - kv)
        same(got[0], a[at : at + kv])
        same(got[1], a)


def test_narrow_errors():
    g = rocmc.Graph("t")
    x = g.input("x", (4, "n"), "f32")
    s = g.input("s", (1, 1), "i64")
    with pytest.raises(rocmc.GraphError, match=r"narrow\(%0\): length=5 is larger than dim 0 of 'x'"):
        ops.narrow(x, 0, 0, 5)
    with pytest.raises(
        rocmc.GraphError, match=r"narrow\(%0\): length='kv' is not a size over the dims of the graph's inputs"
    ):
        ops.narrow(x, 1, 0, "kv")
    with pytest.raises(rocmc.GraphError, match=r"narrow\(%0\): length=-1, expected an int >= 0"):
        ops.narrow(x, 0, 0, -1)
    with pytest.raises(rocmc.GraphError, match=r"narrow\(%0\): length=2.0, expected an int or a size expression"):
        ops.narrow(x, 0, 0, 2.0)
    with pytest.raises(rocmc.GraphError, match=r"narrow\(%0, %1\): 'start' is i64\[1,1\], expected one integer"):
        ops.narrow(x, 0, s, 2)
    with pytest.raises(rocmc.GraphError, match=r"narrow\(%0\): axis=2 is out of range for rank 2; expected -2\.\.1"):
        ops.narrow(x, 2, 0, 1)
    with pytest.raises(rocmc.GraphError, match=r"narrow\(%0\): start='a' names a, not a dim of any graph input"):
        ops.narrow(x, 0, "a", 1)
    with pytest.raises(rocmc.GraphError, match=r"narrow\(%0\): start=1.5, expected an int, a size expression"):
        ops.narrow(x, 0, 1.5, 1)


# ---- argmax ------------------------------------------------------------------------------------


DTYPES = ["f32", "f16", "bf16", "i32", "i64"]
# A parametrized test's graphs are the functions of one module (helpers.CpuBatch): a compile a module, not a test.


def _argmax_graph(dtype):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 13), dtype)
    g.output(ops.argmax(x), ops.argmax(x, 0, keepdims=True), ops.argmax(x, axis=-1, keepdims=True))
    return g


ARGMAX_BATCH = CpuBatch(_argmax_graph, [(d,) for d in DTYPES])


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_ties_and_nans(dtype, rng):
    g, module = ARGMAX_BATCH(dtype)
    runs = []
    for n in (1, 6, 9):
        a = ties(rng, (n, 13), dtype)
        if rocmc.dtype(dtype).kind == "float":
            a[rng.random((n, 13)) < 0.1] = np.nan
            a[0, :] = -np.inf
        runs.append((a,))
    for (a,), got in zip(runs, calls(g, *runs, module=module)):
        assert got[0].dtype == np.int64
        same(got[0], np.argmax(a.astype(np.float64), axis=1))
        same(got[1], np.argmax(a.astype(np.float64), axis=0)[None])
        same(got[2], got[0][:, None])


def test_argmax_static_odd_shape(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (3, 1, 257), "f32")
    g.output(ops.argmax(x, 2), ops.argmax(x, 1))
    a = rand(rng, (3, 1, 257))
    a[1, 0, 100] = a[1, 0, 200] = 9.0  # a tie: the first position wins
    got = calls(g, (a,))[0]
    same(got[0], np.argmax(a, 2))
    assert got[0][1, 0] == 100
    same(got[1], np.zeros((3, 257), np.int64))


def test_argmax_errors(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (4, 0), "f32")
    b = g.input("b", (4,), "bool")
    e = g.input("e", ("n", 3), "f32")
    with pytest.raises(rocmc.GraphError, match=r"argmax\(%0\): axis 1 of 'x' \(f32\[4,0\]\) is empty"):
        ops.argmax(x)
    with pytest.raises(rocmc.GraphError, match=r"argmax\(%1\): 'x' has dtype bool, expected a float or int"):
        ops.argmax(b)
    with pytest.raises(rocmc.GraphError, match=r"argmax\(%0\): axis=2 is out of range for rank 2; expected -2\.\.1"):
        ops.argmax(x, 2)
    with pytest.raises(rocmc.GraphError, match=r"argmax\(%2\): keepdims=1, expected a bool"):
        ops.argmax(e, 0, keepdims=1)
    g = rocmc.Graph("t")
    g.output(ops.argmax(g.input("e", ("n", 3), "f32"), 0))
    empty = np.zeros((0, 3), np.float32)
    with pytest.raises(rocmc.InputError, match=r"argmax\(%0\): axis 0 of 'x' is empty in this call"):
        rocmc.load(rocmc.compile(g, "cpu"))(empty)
    with pytest.raises(rocmc.InputError, match=r"argmax\(%0\): axis 0 of 'x' is empty in this call"):
        rocmc.evaluate(g, empty)


# ---- topk --------------------------------------------------------------------------------------


def np_topk(a, k, axis, largest):
    """topk by a stable numpy sort: NaN the largest, lower position first among equal values."""
    b = np.moveaxis(a.astype(np.float64), axis, -1)
    nan = np.isnan(b)
    key = np.where(nan, np.inf, b)
    order = np.argsort(-key if largest else key, axis=-1, kind="stable")
    if largest:  # NaN before +inf: stable-sort the NaN flags again, descending
        order = np.take_along_axis(order, np.argsort(~np.take_along_axis(nan, order, -1), -1, kind="stable"), -1)
    else:
        order = np.take_along_axis(order, np.argsort(np.take_along_axis(nan, order, -1), -1, kind="stable"), -1)
    idx = np.moveaxis(order[..., :k], -1, axis)
    return np.take_along_axis(a, idx, axis), idx


def _topk_graph(dtype):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 17), dtype)
    big_v, big_i = ops.topk(x, 5)
    small_v, small_i = ops.topk(x, 17, axis=1, largest=False, sorted=False)
    col_v, col_i = ops.topk(x, 1, axis=0)
    g.output(big_v, big_i, small_v, small_i, col_v, col_i)
    return g


TOPK_BATCH = CpuBatch(_topk_graph, [(d,) for d in DTYPES])


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_ties_nans_both_directions(dtype, rng):
    g, module = TOPK_BATCH(dtype)
    big_v, big_i, _, _, _, col_i = g.outputs
    assert big_v.shape == ("n", 5) and big_i.dtype == rocmc.i64 and col_i.shape == (1, 17)
    runs = []
    for n in (1, 4, 7):
        a = ties(rng, (n, 17), dtype)
        if rocmc.dtype(dtype).kind == "float":
            a[rng.random((n, 17)) < 0.1] = np.nan
            a[rng.random((n, 17)) < 0.1] = -np.inf
            a[rng.random((n, 17)) < 0.1] = -0.0
        elif dtype == "i64":
            a[0, :3] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, 2**60 + 1]
        runs.append((a,))
    for (a,), got in zip(runs, calls(g, *runs, module=module)):
        for (v, i), (k, axis, largest) in zip(zip(got[::2], got[1::2]), [(5, 1, True), (17, 1, False), (1, 0, True)]):
            want_v, want_i = np_topk(a, k, axis, largest)
            same(i, want_i)
            same(v.astype(np.float64), want_v.astype(np.float64))
            same(np.signbit(v.astype(np.float64)), np.signbit(want_v.astype(np.float64)))  # -0.0 stays -0.0


def test_topk_k_is_the_whole_vocab(rng):
    # k = the whole axis of a 32000-entry vocabulary: a full descending order (the ranking form).
    g = rocmc.Graph("t")
    x = g.input("x", (1, 32000), "f32")
    g.output(*ops.topk(x, 32000))
    a = rand(rng, (1, 32000))
    for value in (0.5, np.nan, -np.inf, -0.0, 0.0):  # ties, broken by position
        a[0, rng.integers(0, 32000, 300)] = value
    v, i = rocmc.load(rocmc.compile(g, "cpu"))(a)
    want_v, want_i = np_topk(a, 32000, 1, True)
    same(i, want_i)
    same(v, want_v)
    same(np.signbit(v), np.signbit(want_v))


@pytest.mark.parametrize(
    "length,k,dtype", [(32000, 64, "f32"), (4093, 17, "f16"), (2048, 1, "bf16"), (40000, 64, "f32")]
)
def test_topk_of_a_long_row_ranked_in_chunks(length, k, dtype, rng, monkeypatch):
    """A long last axis ranked in chunks (the GPU form, forced here on the CPU): each chunk's k largest, then the
    k largest of the candidates; the last chunk padded with the smallest key (4093: 8 chunks of 512, 3 pads).
    Symbolic rows; ties broken by position, NaN the largest, -0.0 kept; rows of only negative values (padding
    must never outrank them). 32000 entries, k 64: 63 chunks, whose 4032 candidates are ranked in 8 chunks again.
    """
    from rocmc.lowering.codegen import index

    monkeypatch.setattr(index, "RANK_FROM_K", 0)  # the ranking form on the CPU too
    assert index._chunks(length, k) is not None
    g = rocmc.Graph("t")
    x = g.input("x", ("n", length), dtype)
    g.output(*ops.topk(x, k))
    art = rocmc.compile(g, "cpu")
    levels, n = 0, length
    while index._chunks(n, k):
        levels, n = levels + 1, index._chunks(n, k)[0] * k
    text = art.ir("input")
    assert "iree_linalg_ext.topk" not in text and text.count("tensor.expand_shape") == levels
    assert levels == {32000: 2, 4093: 1, 2048: 1, 40000: 2}[length]
    module = rocmc.load(art)
    for n in (1, 3):
        a = rand(rng, (n, length), dtype)
        a[0, rng.integers(0, length, 40)] = a[0, 7]  # ties
        if n > 1:
            a[1] = -np.abs(a[1]) - 1  # every value negative
            a[2, rng.integers(0, length, 5)] = np.nan
            a[2, rng.integers(0, length, 5)] = -0.0
        v, i = module(a)
        want_v, want_i = np_topk(a, k, 1, True)
        same(i, want_i)
        same(np.asarray(v).astype(np.float64), want_v.astype(np.float64))
        same(np.signbit(np.asarray(v).astype(np.float64)), np.signbit(want_v.astype(np.float64)))


def test_topk_rows_chunked_only_where_the_candidates_are_real():
    from rocmc.lowering.codegen.index import _chunks

    assert _chunks(32000, 64) == (63, 508)
    assert _chunks(2047, 4) is None and _chunks("v", 4) is None  # short, symbolic
    assert _chunks(32000, 129) is None  # k past a quarter of a chunk
    assert _chunks(151936, 64) == (297, 512)
    # every case: the padded last chunk keeps at least k real entries
    for length in range(2048, 2048 + 4096, 37):
        for k in (1, 64, 128):
            got = _chunks(length, k)
            if got:
                n, c = got
                assert n * c >= length and c - (n * c - length) >= k


def test_topk_static_odd_and_k_zero(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (3, 5, 2), "f16")
    g.output(*ops.topk(x, 3, axis=1, largest=False), *ops.topk(x, 0, axis=1))
    a = rand(rng, (3, 5, 2), "f16")
    got = calls(g, (a,))[0]
    want_v, want_i = np_topk(a, 3, 1, False)
    same(got[1], want_i)
    same(got[0], want_v)
    assert got[2].shape == (3, 0, 2) and got[3].shape == (3, 0, 2)


def test_topk_k_larger_than_symbolic_axis(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (2, "v"), "f32")
    g.output(*ops.topk(x, 4))
    module = rocmc.load(rocmc.compile(g, "cpu"))
    a = rand(rng, (2, 4))
    same(module(a)[1], np.argsort(-a, axis=1, kind="stable"))
    with pytest.raises(rocmc.InputError, match=r"topk\(%0\): k=4 is larger than dim 1"):
        module(rand(rng, (2, 3)))
    with pytest.raises(rocmc.InputError, match=r"topk\(%0\): k=4 is larger than dim 1 of 'x', which is 3"):
        rocmc.evaluate(g, rand(rng, (2, 3)))


def test_topk_errors():
    g = rocmc.Graph("t")
    x = g.input("x", (4, 6), "f32")
    b = g.input("b", (4,), "bool")
    k = g.input("k", (), "i64")
    with pytest.raises(rocmc.GraphError, match=r"topk\(%0\): k=7 is larger than dim 1 of 'x' \(f32\[4,6\]\)"):
        ops.topk(x, 7)
    with pytest.raises(rocmc.GraphError, match=r"topk\(%0\): k=-1, expected an int >= 0"):
        ops.topk(x, -1)
    with pytest.raises(rocmc.GraphError, match=r"topk\(%0\): k=%2:i64\[\], expected a static int"):
        ops.topk(x, k)
    with pytest.raises(rocmc.GraphError, match=r"topk\(%1\): 'x' has dtype bool"):
        ops.topk(b, 1)
    with pytest.raises(rocmc.GraphError, match=r"topk\(%0\): largest='yes', expected a bool"):
        ops.topk(x, 1, largest="yes")
    with pytest.raises(rocmc.GraphError, match=r"topk\(%0\): axis=-3 is out of range for rank 2; expected -2\.\.1"):
        ops.topk(x, 1, axis=-3)


# ---- arange ------------------------------------------------------------------------------------


def test_arange_static(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (3,), "f32")
    start = int(rng.integers(-5, 5))
    outs = [
        ops.arange(g, start, 17),
        ops.arange(g, 10, -7, -3, dtype="i32"),
        ops.arange(g, 0.5, 3.2, 0.25, "f32"),
        ops.arange(g, -1, 2, 0.5, dtype="f16"),
        ops.arange(g, 4, 4),
        ops.arange(g, np.int64(2), 9, 3, "bf16"),
    ]
    assert outs[0].shape == (17 - start,) and outs[1].shape == (6,) and outs[4].shape == (0,)
    g.output(x, *outs)
    got = calls(g, (rand(rng, (3,)),))[0]
    same(got[1], np.arange(start, 17))
    assert got[2].dtype == np.int32
    same(got[2], np.arange(10, -7, -3))
    np.testing.assert_allclose(got[3], np.arange(0.5, 3.2, 0.25), rtol=1e-6)
    same(got[4].astype(np.float64), np.arange(-1, 2, 0.5))
    same(got[6].astype(np.float64), [2, 5, 8])


def test_arange_up_to_a_symbol(rng):
    # Positions 0..s-1 (and 3..s-1) of a call, s being the sequence length of an input.
    g = rocmc.Graph("t")
    x = g.input("x", ("b", "s", 4), "f32")
    pos = ops.arange(g, 0, "s")
    late = ops.arange(g, 3, "s", dtype="i32")
    assert pos.shape == ("s",) and late.shape == ("(s-3)",)
    g.output(pos, late, ops.gather(x, pos, 1))
    runs = [(rand(rng, (2, s, 4)),) for s in (3, 8, 1 + int(rng.integers(4, 20)))]
    for (a,), got in zip(runs, calls(g, *runs)):
        same(got[0], np.arange(a.shape[1]))
        same(got[1], np.arange(3, a.shape[1]))
        same(got[2], a)
    with pytest.raises(
        rocmc.InputError, match=r"arange\(\): needs s-3 >= 0, but s-3 = -1 with input .x. dim 1 \(.s.\) = 2"
    ):
        rocmc.evaluate(g, rand(rng, (2, 2, 4)))


def test_arange_errors():
    g = rocmc.Graph("t")
    g.input("x", ("s",), "f32")
    with pytest.raises(rocmc.GraphError, match=r"arange\(\): delta=0; expected a non-zero step"):
        ops.arange(g, 0, 5, 0)
    with pytest.raises(rocmc.GraphError, match=r"arange\(\): start=0.5 is not an integer but dtype is i64"):
        ops.arange(g, 0.5, 5)
    with pytest.raises(rocmc.GraphError, match=r"arange: limit='n' is not a size over the dims of graph 't'"):
        ops.arange(g, 0, "n")
    with pytest.raises(rocmc.GraphError, match=r"arange\(\): a symbolic limit \('s'\) needs an int start and delta=1"):
        ops.arange(g, 0, "s", 2)
    with pytest.raises(rocmc.GraphError, match=r"arange\(\): dtype='bool', expected one of"):
        ops.arange(g, 0, 3, dtype="bool")
    with pytest.raises(rocmc.GraphError, match=r"arange: graph=5, expected the rocmc.Graph"):
        ops.arange(5, 0, 3)
    with pytest.raises(rocmc.GraphError, match=r"arange\(\): limit=inf, expected a finite number"):
        ops.arange(g, 0.0, float("inf"), dtype="f32")


# ---- cumsum ------------------------------------------------------------------------------------


CUMSUM_FORMS = [(axis, ex, rev) for axis in (0, -1) for ex in (False, True) for rev in (False, True)]


def _cumsum_graph(dtype):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 9), dtype)
    g.output(*[ops.cumsum(x, axis, exclusive=ex, reverse=rev) for axis, ex, rev in CUMSUM_FORMS])
    return g


CUMSUM_BATCH = CpuBatch(_cumsum_graph, [(d,) for d in DTYPES])


@pytest.mark.parametrize("dtype", DTYPES)
def test_cumsum_all_forms(dtype, rng):
    g, module = CUMSUM_BATCH(dtype)
    forms = CUMSUM_FORMS
    runs = [(rand(rng, (n, 9), dtype),) for n in (1, 5, 8)]
    for (a,), got in zip(runs, calls(g, *runs, module=module)):
        w = a.astype(np.float64)
        for out, (axis, ex, rev) in zip(got, forms):
            v = np.flip(w, axis) if rev else w
            s = np.cumsum(v, axis=axis) - (v if ex else 0)
            want = np.flip(s, axis) if rev else s
            rtol, atol = TOL.get(dtype, (0, 0))
            np.testing.assert_allclose(out.astype(np.float64), want, rtol=rtol, atol=atol)


def test_cumsum_f16_accumulates_in_f32(rng):
    # 4097 ones: an f16 running sum stalls at 2048; an f32 one reaches 4097 (rounded once to f16).
    g = rocmc.Graph("t")
    x = g.input("x", (4097,), "f16")
    g.output(ops.cumsum(x, 0))
    got = calls(g, (np.ones(4097, np.float16),))[0][0]
    assert got[-1] == np.float16(4097) and got[3000] == np.float16(3001)


def test_cumsum_errors():
    g = rocmc.Graph("t")
    x = g.input("x", (3, 4), "f32")
    b = g.input("b", (3,), "bool")
    with pytest.raises(rocmc.GraphError, match=r"cumsum\(%1\): 'x' has dtype bool, expected a float or int"):
        ops.cumsum(b, 0)
    with pytest.raises(rocmc.GraphError, match=r"cumsum\(%0\): axis=2 is out of range for rank 2; expected -2\.\.1"):
        ops.cumsum(x, 2)
    with pytest.raises(rocmc.GraphError, match=r"cumsum\(%0\): reverse=1, expected a bool"):
        ops.cumsum(x, 0, reverse=1)


# ---- GPU targets (compile-only) ----------------------------------------------------------------


@pytest.mark.parametrize("target", ["gfx942", "cuda:sm_80"])
def test_gpu_targets_compile(target):
    g = rocmc.Graph("t")
    x = g.input("x", ("b", "s", 64), "f16")
    cache = g.input("cache", ("b", 128, 64), "f16")
    pos = g.input("pos", (1,), "i64")
    logits = g.input("logits", ("b", 32000), "f32")
    vocab = g.input("vocab", ("b", 128256), "f32")  # Llama 3's: ranked in chunks three times over
    ids = g.input("ids", ("b", 9), "i64")
    new = ops.update_slice(cache, x, pos, 1)
    g.output(
        new,
        ops.narrow(new, 1, 0, "s"),
        ops.argmax(logits),
        *ops.topk(logits, 40),
        *ops.topk(vocab, 64),
        *ops.topk(ops.narrow(logits, 1, 0, 1000), 1000, largest=False),
        *ops.topk(ids, 3),
        ops.cumsum(x, 1, reverse=True),
        ops.cumsum(ids, 1, exclusive=True),
        ops.arange(g, 0, "s"),
    )
    compile_gpu(g, targets=(target,))


# ---- ONNX --------------------------------------------------------------------------------------

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _ort(model, feeds: dict):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _compare_onnx(model, *feeds_list):
    """Import, compile once, and compare each call with onnxruntime (exactly for ints)."""
    g = rocmc.import_onnx(model)
    module = rocmc.load(rocmc.compile(g, "cpu"))
    for feeds in feeds_list:
        got = module(*feeds.values())
        got = got if isinstance(got, tuple) else (got,)
        for a, b in zip(got, _ort(model, feeds)):
            assert a.shape == b.shape and a.dtype == b.dtype
            if b.dtype.kind == "f":
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
            else:
                same(a, b)
    return g


def test_onnx_argmax_matches_onnxruntime(rng):
    nodes = [
        helper.make_node("ArgMax", ["x"], ["a"], axis=1, keepdims=0),
        helper.make_node("ArgMax", ["x"], ["b"]),
    ]  # axis 0, keepdims 1
    m = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, ["n", 7])],
        [_info("a", TensorProto.INT64, ["n"]), _info("b", TensorProto.INT64, [1, 7])],
    )
    g = _compare_onnx(m, *({"x": ties(rng, (n, 7), "f32")} for n in (3, 5)))
    assert [n.op for n in g.nodes] == ["argmax", "argmax"]


def test_onnx_topk_matches_onnxruntime(rng):
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=0, largest=0),
        helper.make_node("TopK", ["x", "k2"], ["v2", "i2"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([2], np.int64), "k"),
        numpy_helper.from_array(np.array([6], np.int64), "k2"),
    ]
    m = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, [5, "c"])],
        [
            _info("v", TensorProto.FLOAT, [2, "c"]),
            _info("i", TensorProto.INT64, [2, "c"]),
            _info("v2", TensorProto.FLOAT, [5, 6]),
            _info("i2", TensorProto.INT64, [5, 6]),
        ],
        inits,
    )
    _compare_onnx(m, *({"x": ties(rng, (5, c), "f32")} for c in (6, 11)))


def test_onnx_topk_k_must_be_known():
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="pick")
    m = _model(
        [node],
        [_info("x", TensorProto.FLOAT, [4, 6]), _info("k", TensorProto.INT64, [1])],
        [_info("v", TensorProto.FLOAT, None), _info("i", TensorProto.INT64, None)],
    )
    with pytest.raises(rocmc.ModelImportError, match=r"TopK 'pick': input 'K' \(k\) must be known at import time"):
        rocmc.import_onnx(m)


def test_onnx_cumsum_matches_onnxruntime(rng):
    nodes = [
        helper.make_node("CumSum", ["x", "ax"], ["y"], exclusive=1, reverse=1),
        helper.make_node("CumSum", ["x", "ax0"], ["z"]),
    ]
    inits = [numpy_helper.from_array(np.array(-1, np.int32), "ax"), numpy_helper.from_array(np.array([0]), "ax0")]
    m = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, ["n", 5])],
        [_info("y", TensorProto.FLOAT, ["n", 5]), _info("z", TensorProto.FLOAT, ["n", 5])],
        inits,
    )
    _compare_onnx(m, *({"x": rand(rng, (n, 5))} for n in (1, 4)))


def test_onnx_range_up_to_a_symbolic_dim(rng):
    # Position ids: Range(0, Shape(x)[1], 1) with a symbolic sequence length.
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
        helper.make_node("Range", ["zero", "s", "step"], ["pos"]),
        helper.make_node("Gather", ["x", "pos"], ["y"], axis=1),
    ]
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "step"),
    ]
    m = _model(
        nodes,
        [_info("x", TensorProto.FLOAT, [2, "seq"])],
        [_info("pos", TensorProto.INT64, ["seq"]), _info("y", TensorProto.FLOAT, [2, "seq"])],
        inits,
    )
    g = _compare_onnx(m, *({"x": rand(rng, (2, s))} for s in (1, 6)))
    assert any(n.op == "arange" for n in g.nodes)


def test_onnx_symbolic_range_with_a_step(rng):
    """Range(1, seq, 2): ceil((seq-1)/2) positions, computed from the call's shapes; a symbolic step is
    an import error naming the node."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
        helper.make_node("Range", ["one", "s", "two"], ["pos"], name="positions"),
    ]
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(2, np.int64), "two"),
    ]
    m = _model(nodes, [_info("x", TensorProto.FLOAT, [2, "seq"])], [_info("pos", TensorProto.INT64, None)], inits)
    mod = rocmc.load(rocmc.compile(rocmc.import_onnx(m), "cpu"))
    for seq in (2, 7, 8):
        np.testing.assert_array_equal(mod(rng.standard_normal((2, seq)).astype(np.float32)), np.arange(1, seq, 2))
    nodes[-1] = helper.make_node("Range", ["one", "two", "s"], ["pos"], name="positions")
    m = _model(nodes, [_info("x", TensorProto.FLOAT, [2, "seq"])], [_info("pos", TensorProto.INT64, None)], inits)
    with pytest.raises(rocmc.ModelImportError, match=r"Range 'positions': .*needs scalars and a positive integer step"):
        rocmc.import_onnx(m)


def test_onnx_argmax_select_last_index():
    node = helper.make_node("ArgMax", ["x"], ["a"], axis=1, select_last_index=1, name="last")
    m = _model([node], [_info("x", TensorProto.FLOAT, [3, 4])], [_info("a", TensorProto.INT64, None)])
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [5, 1, 0, 5]], np.float32)
    got = rocmc.load(rocmc.compile(rocmc.import_onnx(m), "cpu"))(x)
    np.testing.assert_array_equal(got, [[2], [3], [3]])


def test_start_as_a_size_expression(rng):
    """A start spelled over the graph's symbols ("kv-1") is computed from the call's shapes."""
    g = rocmc.Graph("expr")
    cache = g.input("cache", (3, 16, 4), "f32")
    row = g.input("row", (3, 1, 4), "f32")
    g.input("mask", (1, "kv"), "bool")
    new = ops.update_slice(cache, row, "kv-1", 1)
    g.output(new, ops.narrow(new, 1, "kv-2", 2))
    m = rocmc.load(rocmc.compile(g, "cpu"))
    for kv in (1, 5, 16, 40):
        feeds = [
            rng.standard_normal((3, 16, 4)).astype(np.float32),
            rng.standard_normal((3, 1, 4)).astype(np.float32),
            np.ones((1, kv), bool),
        ]
        for got, want in zip(m(*feeds), rocmc.evaluate(g, *feeds)):
            np.testing.assert_array_equal(got, want.astype(np.float32))
    with pytest.raises(rocmc.GraphError, match="not a dim"):
        ops.update_slice(cache, row, "t-1", 1)
    with pytest.raises(rocmc.GraphError):
        ops.update_slice(cache, row, "kv-", 1)
