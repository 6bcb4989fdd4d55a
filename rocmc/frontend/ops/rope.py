"""Rotary position embedding (RoPE), candle's rope / rope_i / rope_thd and ONNX RotaryEmbedding.

For a pair (x0, x1) at position p and pair index i: y0 = x0*cos[p,i] - x1*sin[p,i],
y1 = x0*sin[p,i] + x1*cos[p,i]. Pairs are (2i, 2i+1) when interleaved, else (i, i+r) with
r = rotary_dim/2; dims from rotary_dim on are copied unchanged. The tables are (T, r) with rows
0..t-1 used (T >= t), or (b, t, r) per batch; with position_ids (b, t) the rows are gathered from a
(max_pos, r) table (positions must be < max_pos). Computed in f32 whatever the storage type.
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ..opdef import as_value, builder, defop, graph_of, reference

__all__ = ["rope"]

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
    xr = x[..., :rot]
    if attrs["interleaved"]:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
    else:
        x0, x1 = xr[..., : rot // 2], xr[..., rot // 2 :]
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    y = np.stack([y0, y1], -1).reshape(xr.shape) if attrs["interleaved"] else np.concatenate([y0, y1], -1)
    return [np.concatenate([y, x[..., rot:]], -1)]


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
