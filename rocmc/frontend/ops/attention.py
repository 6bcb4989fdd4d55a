"""Scaled dot-product attention: softmax(q @ k^T * scale + mask) @ v, with GQA/MQA and causal masking.

q (b, hq, s, d), k (b, hkv, skv, d), v (b, hkv, skv, dv), hq % hkv == 0: query head h reads kv head
h // (hq / hkv). mask is additive (q's float dtype) or bool (true = keep), broadcastable to
(b, hq, s, skv). is_causal keeps key j for query i when j <= i + (skv - s) (bottom-right aligned, as
ONNX Attention documents). A query row whose keys are all masked has no defined result (the reference
gives NaN, as torch does). softmax in f32.

sdpa_cached is sdpa with the keys and values read from a KV cache as stored: entries (E, hkv, S, d) of which
batch row i reads keys from entry entries[0] + i and values from entry entries[1] + i (a decoder's slots), or
from entries[0] + slots[i] and entries[1] + slots[i] with `slots` (b,) given (rows that live in any slot, as a
prefill's), at the first `positions` of the S positions (all by default).
"""

from __future__ import annotations

import math

import numpy as np

from ... import symbolic
from ...errors import GraphError, InputError
from ..graph import TensorType
from ..opdef import as_value, broadcast_shapes, builder, defop, graph_of, int_tuple, is_int, reference
from ..reference import symbol_sizes

__all__ = ["sdpa", "sdpa_cached"]


def head_groups(desc: str, hq, hkv):
    """How many query heads share one kv head (int, or the symbol hq when hkv is 1)."""
    if hq == hkv:
        return 1
    if hkv == 1:
        return hq
    if isinstance(hq, int) and isinstance(hkv, int) and hq % hkv == 0:
        return hq // hkv
    raise GraphError(
        f"{desc}: q has {hq} heads and k/v have {hkv}, expected hq to be a multiple of hkv "
        f"(symbolic head counts must be equal or hkv must be 1)"
    )


def _broadcasts_to(shape, full) -> bool:
    try:
        return broadcast_shapes("sdpa", shape, full) == full
    except GraphError:
        return False


def _same(desc: str, what: str, a, b) -> None:
    if a != b:
        raise GraphError(f"{desc}: {what} differ: {a} vs {b}")


@defop("sdpa", attrs=("is_causal", "scale"))
def _sdpa(node, types, attrs):
    q, k, v, mask = types
    desc = node.describe()
    for t, arg in ((q, "q"), (k, "k"), (v, "v")):
        if t.rank != 4 or t.dtype.kind != "float":
            raise GraphError(f"{desc}: {arg!r} is {t}, expected a rank-4 float tensor (batch, heads, seq, dim)")
        if t.dtype != q.dtype:
            raise GraphError(f"{desc}: {arg!r} has dtype {t.dtype} but 'q' has {q.dtype}; expected the same dtype")
    b, hq, s, d = q.shape
    _same(desc, "batch sizes of q and k", b, k.shape[0])
    _same(desc, "batch sizes of q and v", b, v.shape[0])
    _same(desc, "head counts of k and v", k.shape[1], v.shape[1])
    _same(desc, "sequence lengths of k and v", k.shape[2], v.shape[2])
    _same(desc, "head dims of q and k", d, k.shape[3])
    head_groups(desc, hq, k.shape[1])
    if mask is not None:
        if mask.dtype.kind != "bool" and mask.dtype != q.dtype:
            raise GraphError(
                f"{desc}: 'mask' has dtype {mask.dtype}, expected bool (true = keep) or {q.dtype} (additive)"
            )
        full = (b, hq, s, k.shape[2])
        if mask.rank > 4 or not _broadcasts_to(mask.shape, full):
            raise GraphError(
                f"{desc}: 'mask' has shape {mask}, expected a shape broadcastable to [{','.join(map(str, full))}]"
            )
    return TensorType((b, hq, s, v.shape[3]), q.dtype)


@reference("sdpa")
def _sdpa_ref(node, ins, attrs):
    q, k, v, mask = ins
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * attrs["scale"]
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == np.bool_ else scores + mask
    if attrs["is_causal"]:
        s, skv = q.shape[2], k.shape[2]
        keep = np.arange(skv)[None, :] <= np.arange(s)[:, None] + (skv - s)
        scores = np.where(keep, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return [np.matmul(p / p.sum(-1, keepdims=True), v)]


@builder
def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    """Scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention semantics, with
    grouped kv heads and bottom-right aligned causal masking); scale defaults to 1/sqrt(head dim)."""
    g = graph_of("sdpa", q)
    q = as_value("sdpa", "q", q, g)
    operands = [
        q,
        as_value("sdpa", "k", k, g, q),
        as_value("sdpa", "v", v, g, q),
        None if mask is None else as_value("sdpa", "mask", mask, g, q),
    ]
    return g.apply("sdpa", operands, _attrs("sdpa", q, is_causal, scale))[0]


def _attrs(op: str, q, is_causal, scale) -> dict:
    """is_causal and scale checked; scale=None: 1/sqrt(head dim)."""
    if not isinstance(is_causal, (bool, np.bool_)):
        raise GraphError(f"{op}: is_causal={is_causal!r}, expected a bool")
    if scale is None:
        d = q.shape[-1] if q.rank else None
        if not isinstance(d, int) or d == 0:
            raise GraphError(f"{op}: scale=None needs a static, non-zero head dim, 'q' is {q.type}; pass scale=")
        scale = 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise GraphError(f"{op}: scale={scale!r}, expected a number")
    return {"is_causal": bool(is_causal), "scale": float(scale)}


@defop("sdpa_cached", attrs=("entries", "is_causal", "scale", "positions"))
def _sdpa_cached(node, types, attrs):
    q, cache, mask, slots = (list(types) + [None])[:4]
    desc = node.describe()
    b = q.shape[0] if q.rank == 4 else None
    if cache.rank != 4 or not all(isinstance(n, int) for n in cache.shape) or b is None:
        raise GraphError(f"{desc}: 'q' is {q} and 'cache' is {cache}, expected a rank-4 'q' and a static cache")
    if not isinstance(b, int) and slots is None:
        raise GraphError(f"{desc}: 'q' is {q}: a symbolic batch needs 'slots' (the entries its rows read)")
    entries = attrs["entries"]
    n = cache.shape[0]
    # With slots a row's entry is entries[i] + its slot, checked when the module is called.
    last = n - 1 if slots is not None else n - b
    if not (isinstance(entries, tuple) and len(entries) == 2 and all(is_int(e) and 0 <= e <= last for e in entries)):
        raise GraphError(f"{desc}: entries={entries!r}, expected (keys' first, values' first) entries in [0, {last}]")
    if slots is not None and (slots.dtype.name not in ("i32", "i64") or slots.shape != (b,)):
        raise GraphError(f"{desc}: 'slots' is {slots}, expected i32 or i64 of shape [{b}] (a slot for each batch row)")
    positions = attrs.get("positions")
    if positions is None:
        positions = cache.shape[2]
    elif isinstance(positions, str):
        symbols = node.inputs[0].graph.symbols()
        if not symbolic.parse(positions).symbols() <= set(symbols):
            raise GraphError(
                f"{desc}: positions={positions!r} is not a size over the dims of the graph's inputs "
                f"(symbols: {', '.join(symbols) or 'none'})"
            )
    elif not is_int(positions) or not 0 < positions <= cache.shape[2]:
        raise GraphError(f"{desc}: positions={positions!r}, expected an int in [1, {cache.shape[2]}] or a size")
    block = TensorType((b,) + (cache.shape[1], positions, cache.shape[3]), cache.dtype)
    return _sdpa(node, [q, block, block, mask], attrs)


@reference("sdpa_cached")
def _sdpa_cached_ref(node, ins, attrs):
    q, cache, mask, slots = (list(ins) + [None])[:4]
    b, (k0, v0) = q.shape[0], attrs["entries"]
    positions = attrs.get("positions")
    if positions is None:
        positions = cache.shape[2]
    elif isinstance(positions, str):
        positions = symbolic.parse(positions).evaluate(symbol_sizes())
    if positions > cache.shape[2]:
        raise InputError(f"{node.describe()}: positions {positions} past the cache's {cache.shape[2]}")
    rows = np.arange(b) if slots is None else slots.astype(np.int64)
    for first in (k0, v0):
        if rows.min() + first < 0 or rows.max() + first >= cache.shape[0]:
            raise InputError(f"{node.describe()}: slots {rows.tolist()} reach entries outside [0, {cache.shape[0]})")
    k, v = cache[k0 + rows, :, :positions], cache[v0 + rows, :, :positions]
    return _sdpa_ref(node, [q, k, v, mask], attrs)


@builder
def sdpa_cached(q, cache, entries, mask=None, is_causal=False, scale=None, slots=None, positions=None):
    """sdpa(q, cache[k0 : k0 + b], cache[v0 : v0 + b], mask, is_causal, scale) with (k0, v0) = entries and b the
    batch of q (b, hq, s, d): attention to the keys and values of a KV cache (E, hkv, S, d) as stored, each batch
    row reading its own entries. A kernel reads the cache in place where a slice of it would be a copy.

    slots: (b,) i32/i64, batch row i reads entries k0 + slots[i] and v0 + slots[i] instead. positions: attend to
    the first `positions` of each entry's S positions (an int, or a size over the graph's symbols such as a
    mask's "kv"); all S by default."""
    g = graph_of("sdpa_cached", q, cache)
    qv = as_value("sdpa_cached", "q", q, g)
    operands = [
        qv,
        as_value("sdpa_cached", "cache", cache, g),
        None if mask is None else as_value("sdpa_cached", "mask", mask, g, qv),
    ]
    if slots is not None:
        operands.append(as_value("sdpa_cached", "slots", slots, g))
    attrs = {"entries": int_tuple(entries)} | _attrs("sdpa_cached", qv, is_causal, scale)
    if positions is not None:
        if not (is_int(positions) or isinstance(positions, str)):
            raise GraphError(f"sdpa_cached: positions={positions!r}, expected an int or a size expression")
        attrs["positions"] = int(positions) if is_int(positions) else positions
    return g.apply("sdpa_cached", operands, attrs)[0]
