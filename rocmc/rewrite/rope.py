"""Rotary position embedding spelled out -> rope.

  half-split:  x * cos + cat(-x[..., r:], x[..., :r]) * sin            (transformers' rotate_half)
  interleaved: x * cos + flatten(stack(-x[..., 1::2], x[..., 0::2])) * sin   (GPT-J's rotate_every_two)
  partial:     cat(rope(x[..., :rot]), x[..., rot:])                   (rotary_dim = rot)
x is (b, h, t, d) or (b, t, h, d); cos/sin broadcast onto it with t positions ((t, d), (1|b, 1, t, d),
(1|b, t, 1, d)). rope's tables hold each angle once, so the full-width tables must repeat it as rope
pairs the dims: cos[..., :r] == cos[..., r:] (half-split) or cos[..., 0::2] == cos[..., 1::2]
(interleaved). That is proven from a constant's values, or, for the half-split form, from the table
being an elementwise function of cat(f, f). The rewrite reads rope's tables as slices of the given ones.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from .patterns import LAYOUT_OPS, Match, constant, pairs, pattern, producer, scalar

# Ops through which a table that repeats its halves still does.
_ELEMENTWISE = ("cos", "sin", "cast", "neg")


def _last_slice(v, start: int, step: int, count: int):
    """(x, node) when v = x[..., start : start + step*count : step] along the last axis."""
    n = producer(v, "slice")
    if n is None:
        return None, None
    x = n.inputs[0]
    a = n.attrs
    if a["axes"] != [x.rank - 1] or a["starts"] != [start] or a["steps"] != [step] or v.shape[-1] != count:
        return None, None
    return x, n


def _negated(v):
    """(u, node) when v is -u or u * -1."""
    n = producer(v, "neg")
    if n is not None:
        return n.inputs[0], n
    n = producer(v, "mul")
    for u, c in pairs(n) if n is not None else ():
        if scalar(c) == -1.0 and c.rank <= u.rank:
            return u, n
    return None, None


def _rotate_half(v):
    """(x, nodes) when v = cat(-x[..., r:], x[..., :r]) along the last axis, r = d/2."""
    cat = producer(v, "concat")
    if cat is None or len(cat.inputs) != 2 or cat.attrs["axis"] != v.rank - 1 or v.shape[-1] % 2:
        return None, None
    r = v.shape[-1] // 2
    hi, neg = _negated(cat.inputs[0])
    x1, s1 = _last_slice(hi, r, 1, r)
    x0, s0 = _last_slice(cat.inputs[1], 0, 1, r)
    if x1 is None or x1 is not x0 or x0.shape != v.shape:
        return None, None
    return x0, [cat, neg, s1, s0]


def _rotate_interleaved(v):
    """(x, nodes) when v = reshape(cat(-x[..., 1::2][..., None], x[..., 0::2][..., None], axis=-1), x.shape)."""
    outer = producer(v, "reshape")
    cat = producer(outer.inputs[0], "concat") if outer is not None else None
    if cat is None or len(cat.inputs) != 2 or v.shape[-1] % 2:
        return None, None
    r = v.shape[-1] // 2
    if cat.attrs["axis"] != v.rank or tuple(cat.outputs[0].shape) != (*v.shape[:-1], r, 2):
        return None, None
    ua, ub = (producer(u, "reshape") for u in cat.inputs)
    if ua is None or ub is None:
        return None, None
    odd, neg = _negated(ua.inputs[0])
    x1, s1 = _last_slice(odd, 1, 2, r)
    x0, s0 = _last_slice(ub.inputs[0], 0, 2, r)
    if x1 is None or x1 is not x0 or x0.shape != v.shape:
        return None, None
    return x0, [outer, cat, ua, ub, neg, s1, s0]


def _repeats(v, interleaved: bool) -> bool:
    """Whether the table v holds each angle twice, as rope pairs the dims."""
    a = constant(v)
    if a is not None:
        r = a.shape[-1] // 2
        halves = (a[..., 0::2], a[..., 1::2]) if interleaved else (a[..., :r], a[..., r:])
        return bool(np.array_equal(halves[0], halves[1]))
    if interleaved:
        return False
    n = v.producer
    while n is not None and (
        n.op in _ELEMENTWISE
        or (n.op == "mul" and scalar(n.inputs[1]) is not None)
        or (n.op in LAYOUT_OPS and n.inputs[0].shape[-1] == v.shape[-1] and n.op != "transpose")
    ):
        n = n.inputs[0].producer
    return (
        n is not None
        and n.op == "concat"
        and n.attrs["axis"] == n.outputs[0].rank - 1
        and len(n.inputs) == 2
        and n.inputs[0] is n.inputs[1]
    )


def _layout(x, table):
    """(layout, table shape for rope) when table broadcasts onto x (b, h, t, d) or (b, t, h, d) with one
    row per position, else (None, None)."""
    if table.rank > 4 or x.rank != 4 or table.shape[-1] != x.shape[-1]:
        return None, None
    cb, c1, c2, _ = (1,) * (4 - table.rank) + tuple(table.shape)
    b = x.shape[0]
    if cb not in (1, b):
        return None, None
    r = x.shape[-1] // 2
    for layout, (heads, time) in (("bhsd", (c1, c2)), ("bshd", (c2, c1))):
        t = x.shape[2] if layout == "bhsd" else x.shape[1]
        if heads == 1 and time == t:
            return layout, ([cb, t, r] if cb != 1 else [t, r])
    return None, None


def _rope_core(add):
    """(x, cos, sin, interleaved, layout, table shape, nodes) of x * cos + rotate(x) * sin."""
    for p, q in pairs(add):
        mp, mq = producer(p, "mul"), producer(q, "mul")
        if mp is None or mq is None:
            continue
        for x, cos in pairs(mp):
            for rx, sin in pairs(mq):
                for rotate, interleaved in ((_rotate_half, False), (_rotate_interleaved, True)):
                    rx_of, rot_nodes = rotate(rx)
                    if rx_of is not x or cos.shape != sin.shape or cos.dtype != x.dtype:
                        continue
                    layout, shape = _layout(x, cos)
                    if layout is None or add.outputs[0].shape != x.shape:
                        continue
                    if _repeats(cos, interleaved) and _repeats(sin, interleaved):
                        return x, cos, sin, interleaved, layout, shape, [add, mp, mq, *rot_nodes]
    return None


def _table(b, v, interleaved: bool, shape: list):
    """rope's (t, r) or (b, t, r) table from a full-width one: its first half or its even dims."""

    def make():
        d = v.shape[-1]
        half = ops.slice(
            b.value(v), [0], [d if interleaved else d // 2], axes=[v.rank - 1], steps=[2 if interleaved else 1]
        )
        return half if list(half.shape) == shape else ops.reshape(half, shape)

    return b.shared(("rope-table", v.id, interleaved), make)


def _build(x, cos, sin, interleaved, layout, shape, rotary_dim):
    def build(b):
        return ops.rope(
            b.value(x),
            _table(b, cos, interleaved, shape),
            _table(b, sin, interleaved, shape),
            interleaved=interleaved,
            layout=layout,
            rotary_dim=rotary_dim,
        )

    return build


@pattern("rope", "add")
def _full(node, uses):
    found = _rope_core(node)
    if found is None:
        return None
    x, cos, sin, interleaved, layout, shape, nodes = found
    if not isinstance(x.shape[-1], int):
        return None
    return Match("rope", nodes, [x, cos, sin], _build(x, cos, sin, interleaved, layout, shape, x.shape[-1]))


@pattern("rope", "concat")
def _partial(node, uses):
    """cat(rope(x[..., :rot]), x[..., rot:]) along the last axis."""
    if len(node.inputs) != 2 or node.attrs["axis"] != node.outputs[0].rank - 1:
        return None
    head, tail = node.inputs
    add = producer(head, "add")
    found = _rope_core(add) if add is not None else None
    if found is None:
        return None
    xr, cos, sin, interleaved, layout, shape, nodes = found
    rot = xr.shape[-1]
    x, s_rot = _last_slice(xr, 0, 1, rot)
    x_pass, s_pass = _last_slice(tail, rot, 1, tail.shape[-1]) if x is not None else (None, None)
    if x_pass is not x or x.shape != node.outputs[0].shape:
        return None
    return Match(
        "rope", [node, *nodes, s_rot, s_pass], [x, cos, sin], _build(x, cos, sin, interleaved, layout, shape, rot)
    )
