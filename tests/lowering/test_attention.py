"""sdpa against the float64 reference: GQA/MQA, causal (bottom-right aligned), bool and additive masks,
symbolic sequence lengths, dtypes, explicit scale, errors."""

import numpy as np
import pytest

import rocmc
from rocmc import ops

from helpers import TOL, CpuBatch, check, compile_gpu, rand


def _inputs(rng, q_shape, kv_shape, dv, dtype):
    v_shape = kv_shape[:3] + (dv,)
    return rand(rng, q_shape, dtype), rand(rng, kv_shape, dtype), rand(rng, v_shape, dtype)


def _graph(q_shape, kv_shape, dv, dtype="f32", mask=None, **kw):
    g = rocmc.Graph("t")
    q, k = g.input("q", q_shape, dtype), g.input("k", kv_shape, dtype)
    v = g.input("v", kv_shape[:3] + (dv,), dtype)
    m = g.input("mask", mask[0], mask[1]) if mask else None
    g.output(ops.sdpa(q, k, v, m, **kw))
    return g


def _bool_mask(rng, shape):
    keep = rng.random(shape) < 0.6
    keep[..., 0] = True  # every query row keeps a key (a fully masked row has no defined result)
    return keep


def _additive_mask(rng, shape, dtype):
    m = np.where(rng.random(shape) < 0.3, -np.inf, rng.uniform(-2.0, 1.0, shape))
    m[..., 0] = 0.5
    return m.astype(rocmc.dtype(dtype).np)


def test_sdpa_odd_sizes_and_value_dim(rng):
    g = _graph((2, 3, 5, 12), (2, 3, 7, 12), 9)
    check(g, *_inputs(rng, (2, 3, 5, 12), (2, 3, 7, 12), 9, "f32"))


# A parametrized test's graphs are the functions of one module (helpers.CpuBatch): a compile a module, not a test.
GROUPED_BATCH = CpuBatch(lambda hkv: _graph((2, 6, 4, 16), (2, hkv, 9, 16), 8), [(1,), (2,), (6,)])


@pytest.mark.parametrize("hkv", [1, 2, 6])
def test_sdpa_grouped_kv_heads(hkv, rng):
    # hq = 6: MQA (1 kv head), GQA (query head h reads kv head h // 3), plain MHA.
    g, module = GROUPED_BATCH(hkv)
    check(g, *_inputs(rng, (2, 6, 4, 16), (2, hkv, 9, 16), 8, "f32"), module=module)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_sdpa_symbolic_seq_causal_gqa(dtype, rng):
    g = _graph((1, 8, "s", 64), (1, 2, "s", 64), 64, dtype, is_causal=True)
    check(g, *_inputs(rng, (1, 8, 11, 64), (1, 2, 11, 64), 64, dtype))


def test_sdpa_causal_is_bottom_right_aligned(rng):
    # s = 3 queries over skv = 8 keys (a decode step with cache): query i sees keys j <= i + 5.
    q_shape, kv_shape = (2, 4, 3, 16), (2, 2, 8, 16)
    g = rocmc.Graph("t")
    q, k, v = g.input("q", q_shape), g.input("k", kv_shape), g.input("v", kv_shape)
    keep = g.input("keep", (3, 8), "bool")
    g.output(ops.sdpa(q, k, v, is_causal=True), ops.sdpa(q, k, v, keep))
    inputs = _inputs(rng, q_shape, kv_shape, 16, "f32")
    causal, masked = check(g, *inputs, np.tril(np.ones((3, 8), bool), k=5))
    np.testing.assert_allclose(causal, masked, rtol=1e-6, atol=1e-6)


BOOL_MASKS = [((2, 1, 1, 9), False), ((2, 1, 1, 9), True), ((6, 4, 9), True), ((2, 6, 4, 9), False)]
BOOL_MASK_BATCH = CpuBatch(
    lambda mask_shape, causal: _graph((2, 6, 4, 16), (2, 3, 9, 16), 8, mask=(mask_shape, "bool"), is_causal=causal),
    BOOL_MASKS,
)


@pytest.mark.parametrize("mask_shape,causal", BOOL_MASKS)
def test_sdpa_bool_mask(mask_shape, causal, rng):
    g, module = BOOL_MASK_BATCH(mask_shape, causal)
    check(g, *_inputs(rng, (2, 6, 4, 16), (2, 3, 9, 16), 8, "f32"), _bool_mask(rng, mask_shape), module=module)


ADDITIVE_MASKS = [((4, 9), False, "f32"), ((1, 6, 4, 9), True, "f16"), ((2, 6, 4, 9), True, "bf16")]
ADDITIVE_MASK_BATCH = CpuBatch(
    lambda mask_shape, causal, dtype: _graph(
        (2, 6, 4, 16), (2, 2, 9, 16), 8, dtype, mask=(mask_shape, dtype), is_causal=causal
    ),
    ADDITIVE_MASKS,
)


@pytest.mark.parametrize("mask_shape,causal,dtype", ADDITIVE_MASKS)
def test_sdpa_additive_mask(mask_shape, causal, dtype, rng):
    g, module = ADDITIVE_MASK_BATCH(mask_shape, causal, dtype)
    inputs = _inputs(rng, (2, 6, 4, 16), (2, 2, 9, 16), 8, dtype)
    check(g, *inputs, _additive_mask(rng, mask_shape, dtype), module=module)


def test_sdpa_symbolic_mask_and_explicit_scale(rng):
    g = _graph((2, 4, "s", 16), (2, 4, "kv", 16), 16, mask=(("s", "kv"), "f32"), scale=0.37)
    check(g, *_inputs(rng, (2, 4, 6, 16), (2, 4, 10, 16), 16, "f32"), _additive_mask(rng, (6, 10), "f32"))


def test_sdpa_scale_defaults_to_inverse_sqrt_head_dim():
    g = _graph((1, 2, 3, 48), (1, 2, 3, 48), 48)
    assert g.nodes[-1].attrs == {"is_causal": False, "scale": 1 / np.sqrt(48)}


def test_gpu_targets_compile():
    g = rocmc.Graph("t")
    q, k, v = (
        g.input("q", (1, 8, "s", 64), "f16"),
        g.input("k", (1, 2, "s", 64), "f16"),
        g.input("v", (1, 2, "s", 64), "f16"),
    )
    keep = g.input("keep", (1, 1, "s", "s"), "bool")
    bias = g.input("bias", (1, 8, "s", "s"), "f16")
    g.output(ops.sdpa(q, k, v, is_causal=True), ops.sdpa(q, k, v, keep), ops.sdpa(q, k, v, bias, is_causal=True))
    qf, kf = g.input("qf", (2, 4, 5, 32), "f32"), g.input("kf", (2, 4, 9, 32), "f32")
    g.output(ops.sdpa(qf, kf, kf, is_causal=True, scale=0.1))
    compile_gpu(g)


@pytest.mark.parametrize(
    "q_shape,kv_shape,mask,message",
    [
        ((1, 6, 4, 16), (1, 4, 4, 16), None, r"q has 6 heads and k/v have 4, expected hq to be a multiple of hkv"),
        ((1, "h", 4, 16), (1, 2, 4, 16), None, r"q has h heads and k/v have 2"),
        ((1, 4, 4, 16), (1, 4, 4, 8), None, r"head dims of q and k differ: 16 vs 8"),
        ((2, 4, 4, 16), (1, 4, 4, 16), None, r"batch sizes of q and k differ: 2 vs 1"),
        (
            (1, 4, 4, 16),
            (1, 4, 4, 16),
            ((4, 5), "bool"),
            r"'mask' has shape bool\[4,5\], expected a shape broadcastable "
            r"to \[1,4,4,4\]",
        ),
        ((1, 4, 4, 16), (1, 4, 4, 16), ((4, 4), "i32"), r"'mask' has dtype i32, expected bool \(true = keep\) or f32"),
        ((1, 4, 16), (1, 4, 16), None, r"'q' is f32\[1,4,16\], expected a rank-4 float tensor"),
    ],
)
def test_bad_inputs_are_graph_errors(q_shape, kv_shape, mask, message):
    with pytest.raises(rocmc.GraphError, match=r"sdpa\(%0, %1, %2, (%3|_)\): " + message):
        _graph(q_shape, kv_shape, kv_shape[-1], mask=mask)


def test_dtype_mismatch_and_scale_errors():
    g = rocmc.Graph("t")
    q, k = g.input("q", (1, 2, 3, 8), "f16"), g.input("k", (1, 2, 3, 8), "f32")
    with pytest.raises(rocmc.GraphError, match=r"'k' has dtype f32 but 'q' has f16"):
        ops.sdpa(q, k, k)
    qs = g.input("qs", (1, 2, 3, "d"), "f32")
    with pytest.raises(rocmc.GraphError, match=r"scale=None needs a static, non-zero head dim"):
        ops.sdpa(qs, qs, qs)
    with pytest.raises(rocmc.GraphError, match=r"is_causal='yes', expected a bool"):
        ops.sdpa(k, k, k, is_causal="yes")


# ---- sdpa_cached: the keys and values of a KV cache's entries, as stored -----------------------------------


def _cached_graph(b=2, hq=4, hkv=2, sq=1, d=16, n=6, S=9, entries=(1, 4), dtype="f32", mask=True, **kw):
    g = rocmc.Graph("c")
    q = g.input("q", (b, hq, sq, d), dtype)
    cache = g.input("cache", (n, hkv, S, d), dtype)
    m = g.input("mask", (b, 1, sq, S), "bool") if mask else None
    g.output(ops.sdpa_cached(q, cache, entries, mask=m, **kw))
    return g


CACHED_BATCH = CpuBatch(
    lambda dtype, causal: _cached_graph(sq=2, dtype=dtype, is_causal=causal),
    [(dtype, causal) for causal in (False, True) for dtype in ("f32", "f16")],
)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_cached_matches_sdpa_of_the_blocks(dtype, causal, rng):
    g, module = CACHED_BATCH(dtype, causal)
    q, cache = rand(rng, (2, 4, 2, 16), dtype), rand(rng, (6, 2, 9, 16), dtype)
    mask = _bool_mask(rng, (2, 1, 2, 9))
    (got,) = check(g, q, cache, mask, module=module)
    want = rocmc.evaluate(
        _graph((2, 4, 2, 16), (2, 2, 9, 16), 16, "f64", ((2, 1, 2, 9), "bool"), is_causal=causal),
        *(a.astype(np.float64) for a in (q, cache[1:3], cache[4:6])),
        mask,
    )
    np.testing.assert_allclose(rocmc.evaluate(g, q, cache, mask), want, rtol=1e-12)


def test_decode_attention_kernel_is_chosen_and_reads_the_cache_in_place():
    g = _cached_graph(b=16, hq=32, hkv=8, d=64, S=40, entries=(0, 16), n=32, dtype="f16")  # 128 workgroups
    # 4 query rows a workgroup: the rows entry; head dim 64 is 1 element a lane of a wave of 64, 2 of 32.
    for target, symbol in (("gfx942", "attention_decode_rows_f16_e1"), ("cuda:sm_80", "attention_decode_rows_f16_e2")):
        art = rocmc.compile(g, target)
        assert [k["symbol"] for k in art.metadata["kernels"]] == [symbol]
        assert art.call_structure()["main"].copies == 0
    # Fewer workgroups: IREE's attention by default, the kernel when asked for by name: the positions split over
    # 8 workgroups a (row, kv head), then their partial results combined.
    few = _cached_graph(b=3, hq=8, hkv=2, d=64, S=40, entries=(0, 3), dtype="f16")
    art = rocmc.compile(few, "cuda:sm_80")
    assert not art.metadata["kernels"] and "3 x 2 workgroups (batch x kv heads): fewer than 128" in art.summary()
    art = rocmc.compile(few, "cuda:sm_80", impl={"sdpa_cached": "kernel"})
    assert [k["symbol"] for k in art.metadata["kernels"]] == ["attention_split_rows_f16_e2", "attention_combine_f16"]
    names = [x["name"] for x in art.dispatches()]
    assert names[-2:] == ["attention_split_rows_f16_e2", "attention_combine_f16"]  # after the bool mask's widening
    assert art.call_structure()["main"].copies == 0
    mha = _cached_graph(b=1, hq=4, hkv=4, d=128, S=40, entries=(0, 1), dtype="bf16")
    art = rocmc.compile(mha, "gfx942", impl={"sdpa_cached": "kernel"})
    assert [k["symbol"] for k in art.metadata["kernels"]] == ["attention_split_bf16_e2", "attention_combine_bf16"]
    compile_gpu(_graph((2, 4, 1, 64), (2, 2, 33, 64), 64, "f16", ((2, 1, 1, 33), "bool")), impl={"sdpa": "kernel"})


@pytest.mark.parametrize(
    "shape,dv,why",
    [
        ((1, 4, 1, 48), 48, "head dim 48"),  # not a multiple of a wave's lanes
        ((1, 4, 1, 64), 32, "v's head dim 32"),
    ],
)
def test_decode_attention_kernel_states_why_it_passes_over(shape, dv, why):
    g = _graph(shape, (1, 1, 20, shape[3]), dv, "f16")
    art = rocmc.compile(g, "cuda:sm_80", impl={"sdpa": "kernel"})
    assert why in art.summary() and not art.metadata["kernels"]


def test_rows_the_decode_kernel_cannot_hold_are_the_prefill_kernels():
    g = _graph((1, 64, 1, 64), (1, 1, 20, 64), 64, "f16")  # 64 query heads a kv head
    assert [k["symbol"] for k in rocmc.compile(g, "cuda:sm_80").metadata["kernels"]] == ["attention_prefill_f16_d64"]
    art = rocmc.compile(_graph((1, 64, 1, 64), (1, 1, 20, 64), 64, "f32"), "cuda:sm_80", impl={"sdpa": "kernel"})
    assert "q is f32; the prefill kernel takes f16, bf16 (decode kernel: 64 query heads a kv head" in art.summary()


# ---- sdpa_cached with slots and positions: a prefill's row in its own slot, its first kv positions -------------


def _prefill_graph(dtype="f16", hq=8, hkv=2, d=64, n=5, S=40, slots="i64", mask=True, positions="kv", b=1, mb=1):
    g = rocmc.Graph("p")
    q = g.input("q", (b, hq, "s", d), dtype)
    cache = g.input("cache", (n, hkv, S, d), dtype)
    m = g.input("mask", (mb, 1, "s", positions), "bool") if mask else None
    sl = g.input("slot", (b,), slots) if slots else None
    g.output(ops.sdpa_cached(q, cache, (0, 2), mask=m, slots=sl, positions=positions))
    return g


def test_attention_over_part_of_the_cache_compiles_once_without_the_cpu_tuning_flags(monkeypatch):
    """IREE 3.13 fails to data-tile the attention over a symbolic-length part of a cache: the lowering says so and
    the module is compiled once, without the flags (not after a failed attempt); attention over whole tensors
    keeps them."""
    import rocmc.lowering as lowering

    calls = []
    compile_bytecode = lowering.compile_bytecode

    def counted(bytecode, target, flags=(), dump_dir=None):
        calls.append(list(flags))
        return compile_bytecode(bytecode, target, flags, dump_dir)

    monkeypatch.setattr(lowering, "compile_bytecode", counted)
    art = rocmc.compile(_prefill_graph("f32", b=2), "cpu", cache=False)
    assert len(calls) == 1 and "--iree-opt-data-tiling" not in calls[0]
    assert "symbolic-length part of a longer key tensor" in art.metadata["compile_note"]
    calls.clear()
    art = rocmc.compile(
        _graph((2, 4, "s", 16), (2, 2, "kv", 16), 16, mask=((2, 1, "s", "kv"), "bool")), "cpu", cache=False
    )
    assert len(calls) == 1 and "--iree-opt-data-tiling" in calls[0] and "compile_note" not in art.metadata


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_sdpa_cached_reads_each_rows_slot_at_its_first_positions(dtype, rng):
    g = _prefill_graph(dtype, b=2)
    s, kv = 7, 19
    q, cache = rand(rng, (2, 8, s, 64), dtype), rand(rng, (5, 2, 40, 64), dtype)
    mask = (np.arange(kv)[None, :] <= np.arange(s)[:, None] + kv - s)[None, None]
    slot = np.array([2, 0])
    check(g, q, cache, mask, slot)
    # The reference is sdpa of the rows' entries (keys at 0 + slot, values at 2 + slot), first kv positions.
    want = rocmc.evaluate(
        _graph((2, 8, s, 64), (2, 2, kv, 64), 64, "f64", ((1, 1, s, kv), "bool")),
        q.astype(np.float64),
        cache[slot, :, :kv].astype(np.float64),
        cache[slot + 2, :, :kv].astype(np.float64),
        mask,
    )
    np.testing.assert_allclose(rocmc.evaluate(g, q, cache, mask, slot), want, rtol=1e-12)
    with pytest.raises(rocmc.InputError, match=r"slots \[3, 0\] reach entries outside \[0, 5\)"):
        rocmc.evaluate(g, q, cache, mask, np.array([3, 0]))


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_sdpa_cached_symbolic_rows_each_read_their_slot(dtype, rng):
    """A symbolic number of rows (several prompts' prefill in one call), each with its own slot and mask,
    against float64; a slot past the cache fails the call."""
    g = _prefill_graph(dtype, b="rows", mb="rows")
    mod = rocmc.load(rocmc.compile(g, "cpu"))
    for rows, s, kv in ((3, 7, 19), (1, 5, 5), (2, 1, 33)):
        q, cache = rand(rng, (rows, 8, s, 64), dtype), rand(rng, (5, 2, 40, 64), dtype)
        mask = np.arange(kv)[None, None, None, :] <= rng.integers(0, kv, size=(rows, 1, s, 1))
        slot = rng.permutation(3)[:rows]
        want = rocmc.evaluate(g, q, cache, mask, slot)
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(mod(q, cache, mask, slot).astype(np.float64), want, rtol=rtol, atol=atol)
    with pytest.raises(rocmc.InputError, match="a slot's entry past the cache's"):
        mod(q, cache, mask, np.array([3, 0]))
    with pytest.raises(rocmc.InputError, match="a slot's entry past the cache's"):
        mod(q, cache, mask, np.array([0, -1]))
    with pytest.raises(rocmc.GraphError, match="a symbolic batch needs 'slots'"):
        _prefill_graph(dtype, b="rows", mb="rows", slots=None)


def test_prefill_attention_kernel_is_chosen_and_reads_the_cache_in_place():
    g = _prefill_graph()
    art = rocmc.compile(g, "cuda:sm_80")
    assert [k["symbol"] for k in art.metadata["kernels"]] == ["attention_prefill_f16_d64"]
    assert art.call_structure()["main"].copies == 0
    # ROCm: IREE's attention unless asked for (the kernel's AMD code has not run on an AMD GPU).
    art = rocmc.compile(g, "gfx942")
    assert not art.metadata["kernels"] and "its AMD code has not run on an AMD GPU" in art.summary()
    art = rocmc.compile(g, "gfx942", impl={"sdpa_cached": "kernel"})
    assert [k["symbol"] for k in art.metadata["kernels"]] == ["attention_prefill_f16_d64"]
    for graph, target, why in [
        (_prefill_graph(d=96), "cuda:sm_80", "head dim 96: the prefill kernel is built for 64, 128, 256"),
        (_prefill_graph("f32"), "cuda:sm_80", "q is f32; the prefill kernel takes f16, bf16"),
        (_prefill_graph(), "gfx1100", "gfx1100: the kernel uses the MFMA instructions"),
    ]:
        art = rocmc.compile(graph, target, impl={"sdpa_cached": "kernel"})
        assert not art.metadata["kernels"] and why in art.summary(), art.summary()


def test_sdpa_cached_bad_slots_and_positions_are_graph_errors():
    with pytest.raises(rocmc.GraphError, match=r"'slots' is f32\[1\], expected i32 or i64 of shape \[1\]"):
        _prefill_graph(slots="f32")
    with pytest.raises(rocmc.GraphError, match=r"positions=50, expected an int in \[1, 40\]"):
        _prefill_graph(positions=50, mask=False)
    with pytest.raises(rocmc.GraphError, match=r"positions='zz' is not a size over the dims"):
        _prefill_graph(positions="zz", mask=False)


def test_sdpa_cached_bad_entries_are_graph_errors():
    with pytest.raises(rocmc.GraphError, match=r"entries=\(5, 0\), expected .* in \[0, 4\]"):
        _cached_graph(entries=(5, 0))
