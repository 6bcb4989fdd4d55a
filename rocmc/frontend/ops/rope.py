"""Rotary position embedding (RoPE), candle's rope / rope_i / rope_thd and ONNX RotaryEmbedding, and
rope_store_kv: a decoder's RoPE of q and k fused with the store of k and v into a KV cache.

For a pair (x0, x1) at position p and pair index i: y0 = x0*cos[p,i] - x1*sin[p,i],
y1 = x0*sin[p,i] + x1*cos[p,i]. Pairs are (2i, 2i+1) when interleaved, else (i, i+r) with
r = rotary_dim/2; dims from rotary_dim on are copied unchanged. The tables are (T, r) with rows
0..t-1 used (T >= t), or (b, t, r) per batch; with position_ids (b, t) the rows are gathered from a
(max_pos, r) table (positions must be < max_pos). Computed in f32 whatever the storage type.
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphError, InputError
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, int_tuple, is_int, reference

__all__ = ["rope", "rope_store_kv"]

# layout -> (batch axis, time axis) of x; the head dim is always last.
LAYOUTS = {"bhsd": (0, 2), "bshd": (0, 1)}


def _rows_cover(rows, t) -> bool:
    """Whether a table with `rows` rows can serve `t` positions (unknowable for symbols: runtime's job)."""
    return not (isinstance(rows, int) and isinstance(t, int)) or rows >= t


def _batch_fits(tb, xb) -> bool:
    return tb == xb or tb == 1


@defop("rope", attrs=("interleaved", "layout", "rotary_dim"))
def _rope(node, types, attrs):
    x, cos, sin, pos = types
    desc = node.describe()
    if attrs["layout"] not in LAYOUTS:
        raise GraphError(f"{desc}: layout={attrs['layout']!r}, expected one of {', '.join(map(repr, LAYOUTS))}")
    if x.rank != 4 or x.dtype.kind != "float":
        raise GraphError(f"{desc}: 'x' is {x}, expected a rank-4 float tensor ({attrs['layout']})")
    d, rot = x.shape[3], attrs["rotary_dim"]
    if not isinstance(d, int) or d % 2:
        raise GraphError(f"{desc}: head dim of 'x' is {d}, expected a static even size")
    if not isinstance(rot, int) or isinstance(rot, bool) or rot % 2 or not 0 < rot <= d:
        raise GraphError(f"{desc}: rotary_dim={rot!r}, expected an even int in [2, {d}] (head dim {d})")
    if cos.shape != sin.shape or cos.dtype != sin.dtype or cos.dtype.kind != "float":
        raise GraphError(f"{desc}: 'cos' is {cos} and 'sin' is {sin}, expected float tables of one shape and dtype")
    bx, tx = (x.shape[a] for a in LAYOUTS[attrs["layout"]])
    r = rot // 2
    if cos.rank not in (2, 3) or cos.shape[-1] != r:
        raise GraphError(f"{desc}: 'cos' has shape {cos}, expected (T, {r}) or (b, t, {r}) for rotary_dim {rot}")
    if pos is not None:
        if pos.rank != 2 or pos.dtype.kind != "int":
            raise GraphError(f"{desc}: 'position_ids' is {pos}, expected an int32/int64 (b, t) tensor")
        if not _batch_fits(pos.shape[0], bx) or pos.shape[1] != tx:
            raise GraphError(f"{desc}: 'position_ids' has shape {pos}, expected ({bx}, {tx}) to match 'x'")
        if cos.rank != 2:
            raise GraphError(f"{desc}: with position_ids 'cos' must be a (max_pos, {r}) table, got {cos}")
    elif cos.rank == 2 and not _rows_cover(cos.shape[0], tx):
        raise GraphError(f"{desc}: 'cos' has {cos.shape[0]} rows, expected at least t = {tx}")
    elif cos.rank == 3 and not (_batch_fits(cos.shape[0], bx) and _rows_cover(cos.shape[1], tx)):
        raise GraphError(f"{desc}: 'cos' has shape {cos}, expected ({bx}, {tx}, {r}) to match 'x'")
    return x


def _tables(ins, t):
    """cos and sin as (b or 1, t, r) arrays for the positions of x."""
    _, cos, sin, pos = ins
    if pos is not None:
        return cos[pos], sin[pos]
    if cos.ndim == 2:
        return cos[None, :t], sin[None, :t]
    return cos[:, :t], sin[:, :t]


@reference("rope")
def _rope_ref(node, ins, attrs):
    x = ins[0]
    t_axis = LAYOUTS[attrs["layout"]][1]
    rot = attrs["rotary_dim"]
    c, s = _tables(ins, x.shape[t_axis])
    head_axis = 1 if attrs["layout"] == "bhsd" else 2
    c, s = np.expand_dims(c, head_axis), np.expand_dims(s, head_axis)
    return [_rotate(x, c, s, rot, attrs["interleaved"])]


@builder
def rope(x, cos, sin, interleaved=False, layout="bhsd", rotary_dim=None, position_ids=None):
    """Rotary position embedding of x (b, h, t, d) ("bhsd") or (b, t, h, d) ("bshd").

    cos/sin: (T, rotary_dim/2) tables (rows 0..t-1 used), (b, t, rotary_dim/2), or with position_ids
    (b, t) a (max_pos, rotary_dim/2) table the positions index. rotary_dim defaults to the head dim
    (0 also means all of it, as in ONNX); dims past it are copied unchanged.
    """
    g = graph_of("rope", x)
    x = as_value("rope", "x", x, g)
    operands = [
        x,
        as_value("rope", "cos", cos, g, x),
        as_value("rope", "sin", sin, g, x),
        None if position_ids is None else as_value("rope", "position_ids", position_ids, g),
    ]
    if not isinstance(interleaved, (bool, np.bool_)):
        raise GraphError(f"rope: interleaved={interleaved!r}, expected a bool")
    if rotary_dim in (None, 0):
        rotary_dim = x.shape[-1] if x.rank else None
    if isinstance(rotary_dim, np.integer):
        rotary_dim = int(rotary_dim)
    attrs = {"interleaved": bool(interleaved), "layout": layout, "rotary_dim": rotary_dim}
    return g.apply("rope", operands, attrs)[0]


# ---- rope_store_kv -----------------------------------------------------------------------------------------


@defop("rope_store_kv", attrs=("heads", "kv_heads", "entries", "interleaved", "rotary_dim"))
def _rope_store_kv(node, types, attrs):
    """qkv (b, t, heads + 2 kv_heads, d), cache (E, kv_heads, S, d), cos/sin (P, r), positions (b, t) int,
    slots (b,) int or None (row i is slot i) -> q rotated (b, t, heads, d) and the cache with every token's k
    (rotated) and v stored."""
    qkv, cache, cos, sin, pos, slots = types
    desc = node.describe()
    hq, hkv, entries, rot = attrs["heads"], attrs["kv_heads"], attrs["entries"], attrs["rotary_dim"]
    if not (is_int(hq) and is_int(hkv) and hq >= 1 and hkv >= 1 and hq % hkv == 0):
        raise GraphError(f"{desc}: heads={hq!r}, kv_heads={hkv!r}: expected ints >= 1, kv_heads dividing heads")
    if qkv.rank != 4 or qkv.dtype.kind != "float" or qkv.shape[2] != hq + 2 * hkv:
        raise GraphError(
            f"{desc}: 'qkv' is {qkv}, expected a float (b, t, {hq + 2 * hkv}, d) tensor: {hq} query heads, "
            f"then {hkv} key heads, then {hkv} value heads"
        )
    b, t, _, d = qkv.shape
    if not isinstance(d, int) or d % 2:
        raise GraphError(f"{desc}: head dim of 'qkv' is {d}, expected a static even size")
    if not is_int(rot) or rot % 2 or not 0 < rot <= d:
        raise GraphError(f"{desc}: rotary_dim={rot!r}, expected an even int in [2, {d}] (head dim {d})")
    if not isinstance(attrs["interleaved"], bool):
        raise GraphError(f"{desc}: interleaved={attrs['interleaved']!r}, expected a bool")
    if cache.rank != 4 or cache.dtype != qkv.dtype or cache.shape[1] != hkv or cache.shape[3] != d:
        raise GraphError(f"{desc}: 'cache' is {cache}, expected a {qkv.dtype} (entries, {hkv}, positions, {d}) tensor")
    if not all(isinstance(n, int) for n in cache.shape):
        raise GraphError(f"{desc}: 'cache' is {cache}, expected a static shape")
    n_entries = cache.shape[0]
    if not (
        isinstance(entries, tuple) and len(entries) == 2 and all(is_int(e) and 0 <= e < n_entries for e in entries)
    ):
        raise GraphError(
            f"{desc}: entries={entries!r}, expected (keys' first entry, values' first entry) in [0, {n_entries})"
        )
    r = rot // 2
    if cos.shape != sin.shape or cos.dtype != sin.dtype or cos.dtype.kind != "float" or cos.rank != 2:
        raise GraphError(f"{desc}: 'cos' is {cos} and 'sin' is {sin}, expected float (positions, {r}) tables alike")
    if cos.shape[1] != r:
        raise GraphError(f"{desc}: 'cos' has shape {cos}, expected (positions, {r}) for rotary_dim {rot}")
    if pos.rank != 2 or pos.dtype.kind != "int" or pos.shape[1] != t or not _batch_fits(pos.shape[0], b):
        raise GraphError(f"{desc}: 'positions' is {pos}, expected an int ({b}, {t}) tensor")
    if slots is not None and (slots.rank != 1 or slots.dtype.kind != "int" or not _batch_fits(slots.shape[0], b)):
        raise GraphError(f"{desc}: 'slots' is {slots}, expected an int ({b},) tensor")
    return [TensorType((b, t, hq, d), qkv.dtype), cache]


def _rotate(x, c, s, rot: int, interleaved: bool):
    """RoPE of x (..., d) with tables c, s broadcasting to (..., rot/2)."""
    xr = x[..., :rot]
    x0, x1 = (xr[..., 0::2], xr[..., 1::2]) if interleaved else (xr[..., : rot // 2], xr[..., rot // 2 :])
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    y = np.stack([y0, y1], -1).reshape(xr.shape) if interleaved else np.concatenate([y0, y1], -1)
    return np.concatenate([y, x[..., rot:]], -1)


@reference("rope_store_kv")
def _rope_store_kv_ref(node, ins, attrs):
    qkv, cache, cos, sin, pos, slots = ins
    hq, hkv, (k0, v0), rot = attrs["heads"], attrs["kv_heads"], attrs["entries"], attrs["rotary_dim"]
    b, t = qkv.shape[:2]
    n_entries, _, n_pos, _ = cache.shape
    pos = np.broadcast_to(np.clip(pos, 0, None), (b, t))
    rows = np.minimum(pos, cos.shape[0] - 1)
    c, s = cos[rows][:, :, None], sin[rows][:, :, None]  # (b, t, 1, r)
    rotated = _rotate(qkv[:, :, : hq + hkv], c, s, rot, attrs["interleaved"])
    at = np.minimum(pos, n_pos - 1)
    slot = np.arange(b) if slots is None else np.broadcast_to(np.clip(slots, 0, None), (b,))
    out = cache.copy()
    written = set()
    for i in range(b):
        for j in range(t):
            ek, ev = min(k0 + slot[i], n_entries - 1), min(v0 + slot[i], n_entries - 1)
            if (ek, at[i, j]) in written or (ev, at[i, j]) in written:
                raise InputError(f"{node.describe()}: two tokens store to entry {ek} or {ev} at position {at[i, j]}")
            written |= {(ek, at[i, j]), (ev, at[i, j])}
            out[ek, :, at[i, j]] = rotated[i, j, hq:]
            out[ev, :, at[i, j]] = qkv[i, j, hq + hkv :]
    return [rotated[:, :, :hq], out]


@builder
def rope_store_kv(
    qkv, cache, cos, sin, positions, slots=None, *, heads, kv_heads, entries, interleaved=False, rotary_dim=None
):
    """A decoder's attention inputs for one call: RoPE of the query and key heads of `qkv`, and the store of
    the keys (rotated) and values of every token into the KV cache. Returns (q, cache): the rotated query
    heads (b, t, heads, d) and the updated cache.

    qkv: (b, t, heads + 2 * kv_heads, d), the query heads, then the key heads, then the value heads (one
    projection's output, reshaped). cache: (E, kv_heads, S, d), entries of S positions per kv head. cos/sin:
    (P, rotary_dim/2) tables indexed by position (`rope`'s, any float dtype). positions: (b, t) each token's
    position; slots: (b,) each row's slot. Token (i, j) stores its keys at cache[entries[0] + slots[i], :,
    positions[i, j]] and its values at cache[entries[1] + slots[i], :, positions[i, j]]. Positions and
    entries past the ends are clamped to them (the caller keeps them in range; rocmc.llm checks it on the
    host); no two tokens may store to one place (`rocmc.evaluate` checks it; compiled code leaves it undefined).
    """
    g = graph_of("rope_store_kv", qkv, cache)
    x = as_value("rope_store_kv", "qkv", qkv, g)
    operands = [
        x,
        as_value("rope_store_kv", "cache", cache, g),
        as_value("rope_store_kv", "cos", cos, g, x),
        as_value("rope_store_kv", "sin", sin, g, x),
        as_value("rope_store_kv", "positions", positions, g),
        None if slots is None else as_value("rope_store_kv", "slots", slots, g),
    ]
    if not isinstance(interleaved, (bool, np.bool_)):
        raise GraphError(f"rope_store_kv: interleaved={interleaved!r}, expected a bool")
    if rotary_dim in (None, 0):
        rotary_dim = x.shape[-1] if x.rank else None
    attrs = {
        "heads": int(heads) if is_int(heads) else heads,
        "kv_heads": int(kv_heads) if is_int(kv_heads) else kv_heads,
        "entries": int_tuple(entries),
        "interleaved": bool(interleaved),
        "rotary_dim": int(rotary_dim) if is_int(rotary_dim) else rotary_dim,
    }
    return tuple(g.apply("rope_store_kv", operands, attrs))
