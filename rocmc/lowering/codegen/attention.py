"""Generated lowering of sdpa: IREE's fused iree_linalg_ext.attention.

Why the fused op and not matmul -> scale -> mask -> softmax -> matmul: it compiles for llvm-cpu,
gfx942 and sm_80 with every form sdpa takes (f32/f16/bf16, symbolic sequence lengths, GQA, a bool or
additive mask, dv != d), it matches the float64 reference within the dtype tolerances (scores and the
online softmax run in f32), and it never materialises the (s, skv) score matrix: IREE tiles it as
flash attention on GPUs. On llvm-cpu the decomposition is emitted instead (see below).

How sdpa maps onto it (loops d0..d6 = batch, kv head, group, query, head dim, key, value dim):
- GQA/MQA without copies: q (b, hq, s, d) is viewed as (b, hkv, g, s, d) (expand_shape, free) and
  k/v are indexed without the group loop, so query head h = kvh * g + j reads kv head kvh.
- Masks: one operand combines the user mask and causality. It is materialised by a linalg.generic
  over (batch?, kv head?, group?, s, skv), keeping the batch/head dims only when the user mask varies
  along them. Causality is built there rather than in the attention op's region, because
  iree_linalg_ext.index in that region fails to lower in 3.13 (it is rewritten to linalg.index in a
  smaller loop nest). A bool mask stays i1 (the op reads i1 as keep/drop); an additive one keeps q's
  dtype, causality selecting -inf.
- The scale is an f32 scalar, so 1/sqrt(d) is not rounded to f16/bf16.

On llvm-cpu the fused op is decomposed instead: IREE 3.13 tiles it there one query row at a time
(matrix-vector code, 30-60x slower than the decomposition at sequence 128-2048, BENCHMARKS.md), while
the two contractions of the decomposition get its matmul code generation. The (s, skv) scores are
materialised in f32; the masks are the same operand as above.

On GPUs with a symbolic key length the fused op gets no tensor cores from IREE 3.13 either: there the
module's @main decomposes (sequence lengths padded to a tile multiple, p stored in the storage type for
p.v) and @main_long keeps the fused op for calls whose scores would not fit (see lower_sdpa).
"""

from __future__ import annotations

from ..emitter import Emitter, T, affine_map, float_literal, tensor_type
from ..registry import lowering
from .index import _size
from .padding import multiple_for, pad_axes, slice_to
from .shape import _check_le, _clamp

B, H, G, M, K1, K2, N = range(7)
NLOOPS = 7


def _sizes(sizes) -> str:
    return ", ".join(str(s) for s in sizes)


def _shape(sizes) -> list:
    """Static shape of a tensor whose sizes are ints or SSA index names (unknown)."""
    return [s if isinstance(s, int) else "?" for s in sizes]


def _split_heads(E: Emitter, t: T, axis: int, heads, group) -> tuple[str, str]:
    """View dim `axis` (hq) of t as (hkv, g)."""
    sizes = [E.dim(t, i) for i in range(t.rank)]
    sizes[axis : axis + 1] = [heads, group]
    reassoc = [[i] for i in range(axis)] + [[axis, axis + 1]] + [[i + 1] for i in range(axis + 1, t.rank)]
    ty = tensor_type(_shape(sizes), t.mlir_elt)
    name = E.op(f"tensor.expand_shape {t.name} {reassoc} output_shape [{_sizes(sizes)}] : {t.mlir} into {ty}")
    return name, ty


class _Dims:
    """Loop sizes of the attention (int or SSA index) and the group count; `real_s`/`real_skv` are the
    sequence lengths before GPU padding (padding.py), which causality and masking are computed from."""

    def __init__(self, E: Emitter, q: T, k: T, real: tuple | None = None):
        self.b, self.s = E.dim(q, 0), E.dim(q, 2)
        self.hkv, self.skv = E.dim(k, 1), E.dim(k, 2)
        self.real_s, self.real_skv = real or (self.s, self.skv)
        self.keys_padded = self.real_skv != self.skv
        hq, hkv = q.shape[1], k.shape[1]
        # hq == hkv -> 1; hkv == 1 -> hq (maybe symbolic); else both static (the shape rule checked).
        self.g = 1 if hq == hkv else E.dim(q, 1) if hkv == 1 else hq // hkv
        self.size = {B: self.b, H: self.hkv, G: self.g, M: self.s, K2: self.skv}


# Padded keys (GPU targets, symbolic skv) always get a mask operand keeping j < skv, the real key
# length. Besides dropping the padding, this is what an IREE 3.13 GPU bug needs (seen on an H100 and an
# H200 with sm_80 code, 2026-11-26, before the padding; tests/gpu/test_gpu_llama.py): with a symbolic key length
# and no mask operand, the attention code lets the keys past skv in the partial last key tile count, so
# the output is NaN, or off by ~10x where the stray memory happens to be finite; any mask operand is
# correct. It costs an (s, skv) i1 tensor, as causal masking already does.


def _mask(E: Emitter, node, mask: T | None, dims: _Dims) -> tuple[str, str, list] | None:
    """The mask operand (name, type, loops it is indexed by), or None when there is nothing to mask.
    With keys padded it also keeps only keys j < skv (the real key length)."""
    causal = node.attrs["is_causal"]
    guard = dims.keys_padded
    if mask is None and not causal and not guard:
        return None
    lead = (1,) * (4 - mask.rank) + tuple(mask.shape) if mask is not None else (1, 1, 1, 1)
    varies_b, varies_h = lead[0] != 1, lead[1] != 1
    loops = [B] * varies_b + [H, G] * varies_h + [M, K2]
    sizes = [dims.size[l] for l in loops]
    rank = len(loops)
    ins, maps = [], []
    if mask is not None:
        names, ty = mask.name, mask.mlir
        if varies_h:
            names, ty = _split_heads(E, mask, mask.rank - 3, dims.hkv, dims.g)
        res = []
        for d, l in zip(mask.shape, [B, "hq", M, K2][4 - mask.rank :]):
            res += [loops.index(H), loops.index(G)] if l == "hq" and varies_h else ["0" if d == 1 else loops.index(l)]
        if not causal and not guard and res == list(range(rank)):
            return names, ty, loops  # already in the attention's index space: use it as it is
        ins.append((names, ty))
        maps.append(affine_map(rank, res))
        elt = mask.mlir_elt
    else:
        elt = "i1"
    out_ty = tensor_type(_shape(sizes), elt)
    maps.append(affine_map(rank, range(rank)))
    # Query i keeps key j when j <= i + (skv - s), i.e. j + s <= i + skv (no negative offsets).
    # (For a query row i < s, causality already implies j < skv; padded query rows are sliced off.)
    s_idx, skv_idx = (E.as_index(dims.real_s), E.as_index(dims.real_skv)) if causal or guard else (None, None)

    def body(E: Emitter, a):
        keep = a[0] if mask is not None else None
        j = E.op(f"linalg.index {loops.index(K2)} : index")
        if causal:
            i = E.op(f"linalg.index {loops.index(M)} : index")
            lhs, rhs = E.addi(j, s_idx), E.addi(i, skv_idx)
            ok = E.op(f"arith.cmpi sle, {lhs}, {rhs} : index")
        elif guard:
            ok = E.op(f"arith.cmpi ult, {j}, {skv_idx} : index")
        else:
            return [keep]
        if keep is None:
            return [ok]
        if elt == "i1":
            return [E.op(f"arith.andi {ok}, {keep} : i1")]
        ninf = E.op(f"arith.constant {float_literal(float('-inf'), elt)} : {elt}")
        return [E.op(f"arith.select {ok}, {keep}, {ninf} : {elt}")]

    out = E.generic(ins, [(E.empty(sizes, elt), out_ty)], maps, ["parallel"] * rank, body)[0]
    return out, out_ty, loops


def _decomposed(E: Emitter, node, q: T, k: T, v: T, mask: T | None, dims: _Dims, p_elt: str = "f32") -> list[T]:
    """scores = scale * q.k^T (f32) -> mask -> softmax over keys (f32) -> p.v, rounded once."""
    elt = q.mlir_elt
    qv, qv_ty = _split_heads(E, q, 1, dims.hkv, dims.g)
    size = {**dims.size, N: E.dim(v, 3)}
    rows, scores = [B, H, G, M], [B, H, G, M, K2]

    def f32(x):
        return E.cast_scalar(x, elt, "f32")

    def tensor(loops, value=None, e="f32"):
        sizes = [size[l] for l in loops]
        init = E.empty(sizes, e) if value is None else E.filled(sizes, e, value)
        return init, tensor_type(_shape(sizes), e)

    def amap(loops, of):
        return affine_map(len(loops), [loops.index(l) for l in of])

    def run(loops, ins, out, reduce_last, body):
        iters = ["parallel"] * (len(loops) - reduce_last) + ["reduction"] * reduce_last
        maps = [amap(loops, of) for _, _, of in ins] + [amap(loops, out[2])]
        return E.generic([(n, t) for n, t, _ in ins], [out[:2]], maps, iters, body)[0]

    def mac(E, a):
        p = E.op(f"arith.mulf {f32(a[0])}, {f32(a[1])} : f32")
        return [E.op(f"arith.addf {a[2]}, {p} : f32")]

    qk = run(
        scores + [K1],
        [(qv, qv_ty, rows + [K1]), (k.name, k.mlir, [B, H, K2, K1])],
        (*tensor(scores, 0.0), scores),
        1,
        mac,
    )
    m = _mask(E, node, mask, dims)
    ins = [(qk, tensor_type(_shape([size[l] for l in scores]), "f32"), scores)] + ([m] if m else [])
    scores_ty = ins[0][1]

    def masked(E, a):
        x = E.op(f"arith.mulf {a[0]}, {E.const(node.attrs['scale'], 'f32')} : f32")
        if m is None:
            return [x]
        if m[1].endswith("xi1>"):
            return [E.op(f"arith.select {a[1]}, {x}, {E.const(float('-inf'), 'f32')} : f32")]
        return [E.op(f"arith.addf {x}, {E.cast_scalar(a[1], elt, 'f32')} : f32")]

    t = run(scores, ins, (*tensor(scores), scores), 0, masked)
    row_ty = tensor_type(_shape([size[l] for l in rows]), "f32")
    mx = run(
        scores,
        [(t, scores_ty, scores)],
        (*tensor(rows, float("-inf")), rows),
        1,
        lambda E, a: [E.op(f"arith.maximumf {a[0]}, {a[1]} : f32")],
    )
    # p_elt: the type the probabilities are stored in for p.v (the storage type on GPUs, as flash
    # attention does, so p.v is a tensor-core contraction; sums and products stay in f32).
    e = run(
        scores,
        [(t, scores_ty, scores), (mx, row_ty, rows)],
        (*tensor(scores, e=p_elt), scores),
        0,
        lambda E, a: [E.cast_scalar(E.op(f"math.exp {E.op(f'arith.subf {a[0]}, {a[1]} : f32')} : f32"), "f32", p_elt)],
    )
    p_ty = tensor_type(_shape([size[l] for l in scores]), p_elt)
    total = run(
        scores,
        [(e, p_ty, scores)],
        (*tensor(rows, 0.0), rows),
        1,
        lambda E, a: [E.op(f"arith.addf {E.cast_scalar(a[0], p_elt, 'f32')}, {a[1]} : f32")],
    )
    outs = rows + [N]

    def pv_mac(E, a):
        p = E.op(f"arith.mulf {E.cast_scalar(a[0], p_elt, 'f32')}, {f32(a[1])} : f32")
        return [E.op(f"arith.addf {a[2]}, {p} : f32")]

    pv = run(outs + [K2], [(e, p_ty, scores), (v.name, v.mlir, [B, H, K2, N])], (*tensor(outs, 0.0), outs), 1, pv_mac)
    out_ty = tensor_type(_shape([size[l] for l in outs]), elt)
    y = run(
        outs,
        [(pv, tensor_type(_shape([size[l] for l in outs]), "f32"), outs), (total, row_ty, rows)],
        (*tensor(outs, e=elt), outs),
        0,
        lambda E, a: [E.cast_scalar(E.op(f"arith.divf {a[0]}, {a[1]} : f32"), "f32", elt)],
    )
    return [_heads_merged(E, node, y, out_ty, elt, q, dims)]


def _heads_merged(E: Emitter, node, y: str, y_ty: str, elt: str, q: T, dims: _Dims) -> T:
    """(b, hkv, g, s, dv) -> the node's (b, hq, s, dv); padded query rows (GPU) sliced off."""
    out = node.outputs[0].type
    padded = out.with_shape((*out.shape[:2], q.shape[2], out.shape[3]))
    y = E.op(f"tensor.collapse_shape {y} [[0], [1, 2], [3], [4]] : {y_ty} into {tensor_type(padded.shape, elt)}")
    return slice_to(E, T(y, padded), out, [None, None, dims.real_s, None])


def _pad_sequences(E: Emitter, q: T, k: T, v: T, mask: T | None, multiple: int):
    """Symbolic s and skv zero-padded to a tile multiple (padding.py: without it IREE 3.13 gives the
    attention a lane-wise strategy with no MMA on GPUs). Padded keys are masked out by the guard in
    _mask; a user mask is padded with 'drop' (false / -inf) and padded query rows are sliced off."""
    real = (E.dim(q, 2), E.dim(k, 2))
    q, k, v = (pad_axes(E, t, [2], multiple) for t in (q, k, v))
    if mask is not None:
        axes = [a for a in (mask.rank - 2, mask.rank - 1) if a >= 0 and not isinstance(mask.shape[a], int)]
        drop = False if mask.mlir_elt == "i1" else float("-inf")
        mask = pad_axes(E, mask, axes, multiple, value=drop)
    return q, k, v, mask, real


@lowering("sdpa", impl="decomposed", default_on=())
def lower_sdpa_decomposed(E: Emitter, node, ins, ctx):
    """sdpa as two contractions and a softmax on every target (on the CPU, what "generated" emits).
    On GPUs: IREE 3.13 gives the fused attention a tensor-core (MMA) strategy only when the key length
    is static; a symbolic one, even padded and hinted, gets lane-wise code. The decomposition's
    contractions, padded, get MMA tiles, at the price of materialising the (s, skv) scores."""
    q, k, v, mask = ins
    if ctx.target.kind == "cpu":
        return _decomposed(E, node, q, k, v, mask, _Dims(E, q, k))
    q, k, v, mask, real = _pad_sequences(E, q, k, v, mask, multiple_for(ctx.target))
    return _decomposed(E, node, q, k, v, mask, _Dims(E, q, k, real), p_elt=q.mlir_elt)


# GPU sdpa with a symbolic key length: IREE 3.13 gives the fused attention tensor cores (MMA) only for
# a static key length; a symbolic one, even padded and hinted, gets lane-wise code (llama block h1024,
# seq 2048, H200: 12.8 ms fused vs 2.9 ms decomposed, BENCHMARKS.md). The decomposition materialises
# the (s, skv) scores, so the module gets two functions: @main with the decomposition, and @main_long
# with the fused op (slow, but no quadratic memory), which the runtime calls when b * hq * s * skv
# exceeds this many scores (1 GiB of f32): the function's long form (LowerContext.long_form). (A run-time
# scf.if between the two in one function would be simpler, but inside its regions IREE 3.13 gives the
# decomposition's contractions no MMA either.)
DECOMPOSE_UP_TO_SCORES = 1 << 28


# IREE 3.13's data tiling (the CPU's tuning flags) fails on the decomposed attention's contractions when the keys
# are a symbolic-length part of a longer tensor (a KV cache's first `positions`, a narrow or slice): "large vector
# sizes", "exceeded stack allocation" or a delinearize_index error, whichever the shapes give. Such a module is
# compiled without the flags at once (LowerContext.avoid_tuning), not after a failed attempt.
_SLICED_KEYS = "attention over a symbolic-length part of a longer key tensor (IREE 3.13 fails to data-tile it)"
_SLICES = ("narrow", "slice")


@lowering("sdpa")
def lower_sdpa(E: Emitter, node, ins, ctx):
    q, k, v, mask = ins
    if ctx.target.kind == "cpu":  # (padded here, some masked forms take IREE 3.13 minutes to compile)
        keys = node.inputs[1]
        if not isinstance(keys.shape[2], int) and keys.producer is not None and keys.producer.op in _SLICES:
            ctx.avoid_tuning(_SLICED_KEYS)
        return _decomposed(E, node, q, k, v, mask, _Dims(E, q, k))
    q, k, v, mask, real = _pad_sequences(E, q, k, v, mask, multiple_for(ctx.target))
    dims = _Dims(E, q, k, real)
    if isinstance(node.inputs[1].shape[2], int) or ctx.long_form(score_term(node), DECOMPOSE_UP_TO_SCORES):
        return [_fused(E, node, q, k, v, mask, dims)]
    return _decomposed(E, node, q, k, v, mask, dims, p_elt=q.mlir_elt)


@lowering("sdpa_cached")
def lower_sdpa_cached(E: Emitter, node, ins, ctx):
    """sdpa of the cache's key and value blocks (slices of it: IREE reads them in place inside its dispatch). With
    slots, each batch row's block is its own slice (at its slot's entry), stacked; with positions, their first
    positions."""
    q, cache, mask = ins[:3]
    slots = ins[3] if len(ins) > 3 else None
    b, positions = q.shape[0], node.attrs.get("positions", cache.shape[2])
    if ctx.target.kind == "cpu" and not isinstance(positions, int):
        ctx.avoid_tuning(_SLICED_KEYS)
    block = node.outputs[0].type.with_shape((b, cache.shape[1], positions, cache.shape[3]))
    length = _size(E, positions, ctx)
    _check_le(E, node, length, cache.shape[2], "positions past the cache's")
    sizes = lambda rows: ", ".join(str(n) for n in (rows, cache.shape[1], length, cache.shape[3]))  # noqa: E731
    ty = T("", block, cache.elt)
    blocks = []
    for first in node.attrs["entries"]:
        if slots is None:
            r = E.op(
                f"tensor.extract_slice {cache.name}[{first}, 0, 0, 0] [{sizes(b)}] [1, 1, 1, 1] : "
                f"{cache.mlir} to {ty.mlir}"
            )
        elif not isinstance(b, int):
            r = _gather_rows(E, cache, slots, first, E.dim(q, 0), length, ty)
        else:
            row_ty = T("", block.with_shape((1,) + tuple(block.shape[1:])), cache.elt)
            r = E.op(f"tensor.empty({'' if isinstance(length, int) else length}) : {ty.mlir}")
            for i in range(b):
                v = E.op(f"tensor.extract {slots.name}[{E.index(i)}] : {slots.mlir}")
                entry = E.addi(E.op(f"arith.index_cast {v} : {slots.mlir_elt} to index"), first)
                _check_le(E, node, entry, cache.shape[0] - 1, "a slot's entry past the cache's")
                row = E.op(
                    f"tensor.extract_slice {cache.name}[{entry}, 0, 0, 0] [{sizes(1)}] [1, 1, 1, 1] : "
                    f"{cache.mlir} to {row_ty.mlir}"
                )
                r = E.op(
                    f"tensor.insert_slice {row} into {r}[{i}, 0, 0, 0] [{sizes(1)}] [1, 1, 1, 1] : "
                    f"{row_ty.mlir} into {ty.mlir}"
                )
        blocks.append(T(r, block, cache.elt))
    if slots is not None and not isinstance(b, int):
        _check_entries(E, node, slots, node.attrs["entries"], cache.shape[0])
    return lower_sdpa(E, node, [q, *blocks, mask], ctx)


def _gather_rows(E: Emitter, cache: T, slots: T, first: int, b, length, ty: T) -> str:
    """The blocks of a symbolic number of rows, row i's at entry first + slots[i]: one generic reading the cache
    with tensor.extract (its entry clamped into the cache; _check_entries fails the call first)."""
    last = cache.shape[0] - 1

    def body(E: Emitter, args):
        i = (E.op(f"linalg.index {n} : index") for n in range(1, 4))
        slot = E.op(f"arith.index_cast {args[0]} : {slots.mlir_elt} to index")
        entry = _clamp(E, E.addi(slot, first), last)
        return [E.op(f"tensor.extract {cache.name}[{entry}, {', '.join(i)}] : {cache.mlir}")]

    init = E.empty([b, cache.shape[1], length, cache.shape[3]], cache.mlir_elt)
    maps = [affine_map(4, [0]), affine_map(4, range(4))]
    return E.generic([(slots.name, slots.mlir)], [(init, ty.mlir)], maps, ["parallel"] * 4, body)[0]


def _check_entries(E: Emitter, node, slots: T, entries, n: int) -> None:
    """Fail the call when a row's slot reaches an entry outside the cache's n (a symbolic number of rows). The
    slots' smallest and largest values come to the host once a function (`_slot_range`), not once a layer: each
    such read is a host wait inside the call."""
    low, high = E.memo(("slot range", slots.name), lambda: _slot_range(E, slots))
    ok_low = E.op(f"arith.cmpi sge, {low}, {E.const(-min(entries), 'i64')} : i64")
    ok_high = E.op(f"arith.cmpi sle, {high}, {E.const(n - 1 - max(entries), 'i64')} : i64")
    E.check(E.op(f"arith.andi {ok_low}, {ok_high} : i1"), f"{node.describe()}: a slot's entry past the cache's")


def _slot_range(E: Emitter, slots: T) -> tuple[str, str]:
    """The smallest and largest slot (i64 scalars on the host; 0 and -1 for no rows): one reduction."""
    i64 = "tensor<i64>"

    def body(E: Emitter, args):
        v = E.op(f"arith.extsi {args[0]} : {slots.mlir_elt} to i64") if slots.mlir_elt != "i64" else args[0]
        return [E.op(f"arith.minsi {args[1]}, {v} : i64"), E.op(f"arith.maxsi {args[2]}, {v} : i64")]

    def filled(v: int) -> str:
        return E.op(
            f"linalg.fill ins({E.const(v, 'i64')} : i64) outs({E.op(f'tensor.empty() : {i64}')} : {i64}) -> {i64}"
        )

    low, high = E.generic(
        [(slots.name, slots.mlir)],
        [(filled(2**63 - 1), i64), (filled(-(2**63)), i64)],
        [affine_map(1, [0]), affine_map(1, []), affine_map(1, [])],
        ["reduction"],
        body,
    )
    return tuple(E.op(f"tensor.extract {t}[] : {i64}") for t in (low, high))


def score_term(node) -> list:
    """The sizes whose product is an sdpa's score count: b * hq * s * skv."""
    qs, ks = node.inputs[0].shape, node.inputs[1].shape
    return [qs[0], qs[1], qs[2], ks[2]]


def _fused(E: Emitter, node, q: T, k: T, v: T, mask: T | None, dims: _Dims) -> T:
    """iree_linalg_ext.attention (GPU targets)."""
    elt = q.mlir_elt
    qv, qv_ty = _split_heads(E, q, 1, dims.hkv, dims.g)
    scale = E.const(node.attrs["scale"], "f32")
    operands = [(qv, qv_ty), (k.name, k.mlir), (v.name, v.mlir), (scale, "f32")]
    maps = [
        affine_map(NLOOPS, [B, H, G, M, K1]),
        affine_map(NLOOPS, [B, H, K2, K1]),
        affine_map(NLOOPS, [B, H, K2, N]),
        affine_map(NLOOPS, []),
    ]
    m = _mask(E, node, mask, dims)
    if m is not None:
        operands.append(m[:2])
        maps.append(affine_map(NLOOPS, m[2]))
    maps.append(affine_map(NLOOPS, [B, H, G, M, N]))
    out_sizes = [dims.b, dims.hkv, dims.g, dims.s, E.dim(v, 3)]
    out_ty = tensor_type(_shape(out_sizes), elt)
    init = E.empty(out_sizes, elt)
    r = E.fresh("att")
    with E.region(
        f"{r} = iree_linalg_ext.attention <{{indexing_maps = [{', '.join(maps)}]}}> "
        f"ins({', '.join(n for n, _ in operands)} : {', '.join(t for _, t in operands)}) "
        f"outs({init} : {out_ty})",
        f"-> {out_ty}",
        ["f32"],
        "score",
    ) as (score,):
        E.emit(f"iree_linalg_ext.yield {score} : f32")
    return _heads_merged(E, node, r, out_ty, elt, q, dims)
