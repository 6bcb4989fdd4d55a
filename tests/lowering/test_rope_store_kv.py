"""rope_store_kv (a decoder's RoPE of q and k fused with the store of k and v into a KV cache) against the
float64 reference and the plain ops it replaces: half-split and interleaved pairs, partial rotation, GQA,
slots given or implied, positions shared by the rows, symbolic token counts, tables of another dtype,
clamping, the cache updated in place as a state, the hand-written kernel chosen on GPU targets, errors."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.errors import GraphError, InputError

from helpers import TOL, CpuBatch, compile_gpu, rand

HQ, HKV, D, E, S = 4, 2, 10, 6, 12


def _tables(rng, rows, r, dtype="f32"):
    angles = rng.uniform(0.0, 2 * np.pi, size=(rows, r))
    return np.cos(angles).astype(rocmc.dtype(dtype).np), np.sin(angles).astype(rocmc.dtype(dtype).np)


def _graph(b=2, t="t", dtype="f32", hq=HQ, hkv=HKV, d=D, slots=True, pos_rows=None, table_dtype=None, **kw):
    g = rocmc.Graph("s")
    qkv = g.input("qkv", (b, t, hq + 2 * hkv, d), dtype)
    cache = g.input("cache", (E, hkv, S, d), dtype)
    r = kw.get("rotary_dim", d) // 2
    cos, sin = (g.input(n, (S + 3, r), table_dtype or dtype) for n in ("cos", "sin"))
    pos = g.input("pos", (pos_rows or b, t), "i64")
    sl = g.input("slots", (b,), "i32") if slots else None
    q, new = ops.rope_store_kv(qkv, cache, cos, sin, pos, sl, heads=hq, kv_heads=hkv, **kw)
    g.output(q, new)
    return g


def _feeds(rng, g, positions, slots=None, dtype="f32", table_dtype=None):
    qkv, cache, cos = g.inputs[0], g.inputs[1], g.inputs[2]
    out = [rand(rng, (qkv.shape[0], positions.shape[1]) + tuple(qkv.shape[2:]), dtype), rand(rng, cache.shape, dtype)]
    out += list(_tables(rng, S + 3, cos.shape[1], table_dtype or dtype)) + [positions.astype(np.int64)]
    if slots is not None:
        out.append(np.asarray(slots, np.int32))
    return out


# The graphs the tests below check on the CPU, as the functions of one module (helpers.CpuBatch): a compile for all
# of them, not one a test. A key is _graph's keywords, as sorted pairs, in the order the tests run.
CHECKED = [
    *(tuple(sorted(dict(interleaved=i, rotary_dim=r, entries=(1, 3)).items())) for r in (D, 6) for i in (False, True)),
    *(
        tuple(sorted(dict(b=1, dtype=dtype, table_dtype=table_dtype, entries=(0, 3)).items()))
        for dtype, table_dtype in (("f16", "f16"), ("bf16", "f32"), ("f16", "bf16"))
    ),
    tuple(sorted(dict(b=2, t=1, entries=(0, 3)).items())),
]
BATCH = CpuBatch(lambda *kw: _graph(**dict(kw)), CHECKED)


def _batched(**kw):
    """(graph, its compiled function) of _graph(**kw) from BATCH."""
    return BATCH(*sorted(kw.items()))


def _check(g, feeds, dtype="f32", target="cpu", module=None):
    """Compile for `target` (or take `module`, the graph's compiled function), run and compare with the reference."""
    got = (module or rocmc.load(rocmc.compile(g, target)))(*feeds)
    want = rocmc.evaluate(g, *feeds)
    rtol, atol = TOL[dtype]
    for x, w in zip(got, want):
        np.testing.assert_allclose(x.astype(np.float64), w, rtol=rtol, atol=atol)
    return got, want


def _plain(qkv, cache, cos, sin, pos, slots, entries, interleaved=False, rotary_dim=D):
    """The same with rocmc's separate ops: rope of q and k, then one scatter_nd each for k and v."""
    g = rocmc.Graph("plain")
    hq, hkv = HQ, HKV
    x, c = g.input("qkv", qkv.shape, "f32"), g.input("cache", cache.shape, "f32")
    cs, sn = g.input("cos", cos.shape, "f32"), g.input("sin", sin.shape, "f32")
    p = g.input("pos", pos.shape, "i64")
    b, t = qkv.shape[:2]
    kw = dict(layout="bshd", position_ids=p, interleaved=interleaved, rotary_dim=rotary_dim)
    q = ops.rope(ops.narrow(x, 2, 0, hq), cs, sn, **kw)
    k = ops.rope(ops.narrow(x, 2, hq, hkv), cs, sn, **kw)
    v = ops.narrow(x, 2, hq + hkv, hkv)
    for base, new in zip(entries, (k, v)):
        tuples = np.array(
            [[base + slots[i], h, pos[i, j]] for i in range(b) for j in range(t) for h in range(hkv)], np.int64
        )
        c = ops.scatter_nd(c, tuples, ops.reshape(new, (b * t * hkv, D)))
    g.output(q, c)
    return rocmc.evaluate(g, qkv, cache, cos, sin, pos)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [D, 6])
def test_matches_rope_and_scatter(interleaved, rotary_dim, rng):
    pos = np.array([[0, 5, 7], [3, 4, 11]])
    g, module = _batched(interleaved=interleaved, rotary_dim=rotary_dim, entries=(1, 3))
    feeds = _feeds(rng, g, pos, slots=[0, 2])
    got, want = _check(g, feeds, module=module)
    for w, p in zip(want, _plain(*feeds[:5], [0, 2], (1, 3), interleaved, rotary_dim)):
        np.testing.assert_allclose(w, p, rtol=1e-12, atol=1e-12)
    # Only the stored places changed: entries 1 + slot (keys) and 3 + slot (values) at each row's positions.
    changed = np.argwhere(np.any(got[1] != feeds[1], axis=(1, 3)))
    assert {(e, p) for e, p in changed} == {(1, 0), (1, 5), (1, 7), (3, 0), (3, 5), (3, 7)} | {
        (3, 3),
        (3, 4),
        (3, 11),
        (5, 3),
        (5, 4),
        (5, 11),
    }


def test_slots_implied_and_shared_positions(rng):
    # No slots: row i is slot i. Positions (1, t) shared by both rows.
    g = _graph(slots=False, pos_rows=1, entries=(0, 2))
    _check(g, _feeds(rng, g, np.array([[2, 9]])))


@pytest.mark.parametrize("dtype,table_dtype", [("f16", "f16"), ("bf16", "f32"), ("f16", "bf16")])
def test_half_types_with_tables_of_any_dtype(dtype, table_dtype, rng):
    g, module = _batched(b=1, dtype=dtype, table_dtype=table_dtype, entries=(0, 3))
    pos = np.arange(4, 9)[None]
    _check(g, _feeds(rng, g, pos, slots=[2], dtype=dtype, table_dtype=table_dtype), dtype, module=module)


def test_positions_and_slots_past_the_ends_are_clamped(rng):
    g, module = _batched(b=2, t=1, entries=(0, 3))
    feeds = _feeds(rng, g, np.array([[40], [-3]]), slots=[-1, 1])
    got, _ = _check(g, feeds, module=module)
    # Row 0 stores at slot 0, position 11 (the last); row 1 at slot 1, position 0.
    changed = np.argwhere(np.any(got[1] != feeds[1], axis=(1, 3)))
    assert {(e, p) for e, p in changed} == {(0, S - 1), (3, S - 1), (1, 0), (4, 0)}


def test_state_updated_in_place_across_calls(rng):
    """As the KV cache of a module: two calls store at different positions and both persist."""
    g = rocmc.Graph("step")
    qkv = g.input("qkv", (1, 1, HQ + 2 * HKV, D), "f32")
    cache = g.state("kv", (2, HKV, S, D), "f32")
    cos, sin = g.input("cos", (S, D // 2), "f32"), g.input("sin", (S, D // 2), "f32")
    pos = g.input("pos", (1, 1), "i64")
    q, new = ops.rope_store_kv(qkv, cache, cos, sin, pos, heads=HQ, kv_heads=HKV, entries=(0, 1))
    g.assign("kv", new)
    g.output(q, new)
    m = rocmc.load(rocmc.compile(g, "cpu"))
    state = {"kv": np.zeros((2, HKV, S, D), np.float32)}
    cs = _tables(rng, S, D // 2)
    for p in (3, 8):
        x = rand(rng, (1, 1, HQ + 2 * HKV, D))
        feeds = [x, *cs, np.array([[p]])]
        want, state = rocmc.evaluate(g, *feeds, state=state)
        for got, w in zip(m(*feeds), want):
            np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-5)
    assert np.count_nonzero(np.any(want[1] != 0, axis=(1, 3))) == 4  # both calls' keys and values


def test_gpu_targets_use_the_kernel():
    g = _graph(dtype="f16", d=64, entries=(0, 3))
    compile_gpu(g)
    for target in ("gfx942", "cuda:sm_80"):
        art = rocmc.compile(g, target)
        assert [k["symbol"] for k in art.metadata["kernels"]] == ["rope_store_kv_half_f16"]
        assert art.call_structure()["main"].dispatches >= 1


def test_evaluate_refuses_two_tokens_storing_to_one_place(rng):
    g = _graph(b=2, t=1, entries=(0, 3))
    with pytest.raises(InputError, match="two tokens store"):
        rocmc.evaluate(g, *_feeds(rng, g, np.array([[4], [4]]), slots=[1, 1]))


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(heads=4, kv_heads=3), "kv_heads dividing heads"),
        (dict(heads=2, kv_heads=2), "expected a float"),
        (dict(entries=(0, 6)), "entries="),
        (dict(entries=(0,)), "entries="),
        (dict(rotary_dim=5), "rotary_dim=5"),
    ],
)
def test_bad_arguments_are_graph_errors(kw, match):
    args = dict(heads=HQ, kv_heads=HKV, entries=(0, 3)) | kw
    g = rocmc.Graph("s")
    qkv = g.input("qkv", (2, 3, HQ + 2 * HKV, D), "f32")
    cache = g.input("cache", (E, HKV, S, D), "f32")
    cos, sin = g.input("cos", (S, D // 2), "f32"), g.input("sin", (S, D // 2), "f32")
    pos = g.input("pos", (2, 3), "i64")
    with pytest.raises(GraphError, match=match):
        ops.rope_store_kv(qkv, cache, cos, sin, pos, **args)


def test_cache_of_another_dtype_is_a_graph_error():
    g = rocmc.Graph("s")
    qkv = g.input("qkv", (1, 1, HQ + 2 * HKV, D), "f16")
    cache = g.input("cache", (E, HKV, S, D), "f32")
    cos, sin = g.input("cos", (S, D // 2), "f32"), g.input("sin", (S, D // 2), "f32")
    with pytest.raises(GraphError, match="'cache' is"):
        ops.rope_store_kv(qkv, cache, cos, sin, g.input("p", (1, 1), "i64"), heads=HQ, kv_heads=HKV, entries=(0, 1))
