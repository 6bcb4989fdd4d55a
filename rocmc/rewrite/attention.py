"""Attention spelled out -> sdpa.

  p = softmax(q @ k^T * scale + mask)      (scale on the scores, or q and k each pre-scaled; mask
                                            optional: additive, or where(keep, scores, -inf / finfo.min))
  p = where(isnan(p), 0, p)                (optional: the guard exporters add for fully masked rows)
  out = p @ v                              (softmax optionally between casts to f32 and back)
q, k and v may reach the matmuls through reshape/transpose/broadcast_to chains: k^T spelled as a
transpose or reshape-transpose-reshape, and GQA's repeat of the kv heads (unsqueeze, expand, reshape)
to the query's head count. These are proven to be sdpa's indexing (query head h reads kv head
h // (hq/hkv)) by following element strides through the chain (rocmc.rewrite.View), so sdpa reads the
kv tensors before the repeat. Batch and sequence dims may be symbolic (dynamic exports): the strides are
then products of the symbols and the proof holds for every size; head counts must be static. A constant
causal mask (bottom-right aligned) becomes is_causal; a mask computed at run time (transformers' padding
and causal mask) stays sdpa's mask.

The guard zeroes the rows whose keys are all masked (softmax of all -inf is NaN). sdpa leaves such rows
undefined, so where a mask may hold -inf in a whole row the rewrite keeps the guard's meaning: rows whose
mask is -inf everywhere are set to 0 after sdpa. A mask built by `where` from finite constants, no mask,
or a causal one with at least as many keys as queries masks no row fully, and needs nothing.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .. import ops
from .patterns import (
    Match,
    as_permutation,
    constant,
    layout_chain,
    only_broadcasts,
    pairs,
    pattern,
    producer,
    scalar,
    view_of,
)


def _scaled(v):
    """(u, factor, node) when v is u * c or u / c for a scalar constant c; (v, 1.0, None) otherwise."""
    n = producer(v, "mul", "div")
    if n is not None:
        for u, c in pairs(n) if n.op == "mul" else [n.inputs]:
            s = scalar(c)
            if s is not None and c.rank <= u.rank and s != 0 and math.isfinite(s):
                return u, (s if n.op == "mul" else 1.0 / s), n
    return v, 1.0, None


class _Source:
    """An sdpa operand read from an existing value: transpose(value, perm), with `nodes` the layout
    chain between it and the matmul."""

    def __init__(self, value, perm, nodes, distance):
        self.value, self.perm, self.nodes, self.distance = value, perm, nodes, distance

    def rank(self):
        return (self.perm != sorted(self.perm), -self.distance)

    def build(self, b):
        v = b.value(self.value)
        return v if self.perm == sorted(self.perm) else ops.permute(v, self.perm)


def _sources(operand, uses, heads: int, swap: bool) -> dict:
    """{kv heads: best _Source} such that operand (b, heads, X, Y) reads a tensor (b, hkv, n, e)
    with head h at h // (heads/hkv), (X, Y) = (e, n) if `swap` else (n, e)."""
    if operand.rank != 4:
        return {}
    b, _, x, y = operand.shape
    n, e = (y, x) if swap else (x, y)
    found = {}
    for distance, (src, chain) in enumerate(layout_chain(operand, uses)):
        view = view_of(src, chain)
        if view is None or src.rank != 4:
            continue
        for hkv in sorted({d for d in src.shape if isinstance(d, int) and d > 0 and heads % d == 0} | {heads}):
            g = heads // hkv
            split = view.reshape((b, hkv, g, x, y))
            strides = split.strides() if split is not None else None
            if strides is None or (g > 1 and strides[2] != 0):
                continue
            sb, sh, _, sx, sy = strides
            sizes = (b, hkv, n, e)
            perm = as_permutation(src, sizes, (sb, sh, *((sy, sx) if swap else (sx, sy))))
            if perm is None:
                continue
            cand = _Source(src, perm, chain, distance)
            if hkv not in found or cand.rank() < found[hkv].rank():
                found[hkv] = cand
    return found


def _causal(a: np.ndarray, s: int, skv: int, bool_mask: bool) -> bool:
    """Whether the constant mask a, broadcast to (.., s, skv), is sdpa's causal mask (keys j <= i + skv - s)."""
    if a.ndim < 2 or not isinstance(s, int) or not isinstance(skv, int) or skv < s:
        return False
    full = np.broadcast_to(a, (*a.shape[:-2], s, skv)).reshape(-1, s, skv)
    keep = np.arange(skv)[None, :] <= np.arange(s)[:, None] + (skv - s)
    if bool_mask:
        return bool(np.all(full == keep))
    low = np.finfo(a.dtype).min if a.dtype.kind == "f" else -np.inf
    return bool(np.all(np.where(keep, full == 0, full <= low)))


def _finite_where(m) -> bool:
    """Whether m = where(c, a, b) with finite scalar constants a and b (a mask that never holds -inf)."""
    w = producer(m, "where")
    if w is None:
        return False
    vals = [scalar(w.inputs[1]), scalar(w.inputs[2])]
    return all(v is not None and math.isfinite(v) for v in vals)


def _no_full_row(a: np.ndarray) -> bool:
    """Whether every row of the constant additive mask a keeps some key."""
    return bool(np.all(np.any(a != -np.inf, axis=-1)))


def _mask(z, scores_dtype):
    """Readings of z as (scores, mask value or None, mask kind, nodes): kind 'add' (z = scores + mask),
    'keep' (z = where(mask, scores, -inf)), 'min' (z = where(mask, scores, finfo.min)), or no mask."""
    out = [(z, None, None, [])]
    add = producer(z, "add")
    for sc, m in pairs(add) if add is not None else ():
        if m.rank <= 4 and m.dtype == scores_dtype and only_broadcasts(m, sc):
            out.append((sc, m, "add", [add]))
    w = producer(z, "where")
    if (
        w is not None
        and w.inputs[0].rank <= 4
        and only_broadcasts(w.inputs[0], w.inputs[1])
        and w.inputs[1].shape == z.shape
    ):
        fill = scalar(w.inputs[2])
        if fill == -math.inf:
            out.append((w.inputs[1], w.inputs[0], "keep", [w]))
        elif fill is not None and fill == float(ml_dtypes.finfo(z.dtype.np).min):
            out.append((w.inputs[1], w.inputs[0], "min", [w]))
    return out


def _softmax(p):
    """(z, nodes) when p is softmax(z) over the last axis, optionally between casts to f32 and back."""
    out_cast = producer(p, "cast")
    sm = producer(out_cast.inputs[0] if out_cast else p, "softmax")
    if sm is None or sm.attrs["axis"] != p.rank - 1:
        return None, None
    z = sm.inputs[0]
    nodes = [sm]
    if out_cast is not None:
        in_cast = producer(z, "cast")
        if in_cast is None or in_cast.inputs[0].dtype != p.dtype or z.dtype.name != "f32":
            return None, None
        z = in_cast.inputs[0]
        nodes += [out_cast, in_cast]
    return z, nodes


def _guarded(p):
    """(softmax result, nodes, guarded) reading p = where(isnan(s), 0, s) or p = s."""
    w = producer(p, "where")
    if w is not None:
        isnan = producer(w.inputs[0], "isnan")
        if (
            isnan is not None
            and isnan.inputs[0] is w.inputs[2]
            and scalar(w.inputs[1]) == 0.0
            and only_broadcasts(w.inputs[1], p)
        ):
            return w.inputs[2], [w, isnan], True
    return p, [], False


@pattern("sdpa", "matmul")
def _sdpa(node, uses):
    if node.attrs["transpose_a"]:
        return None
    p, v_op = node.inputs
    s_value, guard_nodes, guarded = _guarded(p)
    z, sm_nodes = _softmax(s_value)
    if z is None or p.rank != 4:
        return None
    for scored, mask, kind, mask_nodes in _mask(z, p.dtype):
        qk_value, sc, sc_node = _scaled(scored)
        qk = producer(qk_value, "matmul")
        if qk is None or qk.attrs["transpose_a"] or qk_value.shape != p.shape:
            continue
        m = _assemble(node, uses, qk, v_op, sc, mask, kind, guarded)
        if m is not None:
            m.nodes += [*guard_nodes, *sm_nodes, *mask_nodes, *([sc_node] if sc_node else [])]
            return m
    return None


def _assemble(node, uses, qk, v_op, sc, mask, kind, guarded):
    """The match once scores, mask and softmax are read: q, k and v sources, scale, causality, guard."""
    q_op, k_op = qk.inputs
    q_value, qa, qn = _scaled(q_op)
    k_value, kb, kn = _scaled(k_op)
    b, hq, s, skv = qk.outputs[0].shape
    if q_value.shape != q_op.shape or k_value.shape != k_op.shape or not isinstance(hq, int):
        return None
    qs = _sources(q_value, uses, hq, swap=False).get(hq)
    ks = _sources(k_value, uses, hq, swap=not qk.attrs["transpose_b"])
    vs = _sources(v_op, uses, hq, swap=node.attrs["transpose_b"])
    common = sorted(set(ks) & set(vs))
    if qs is None or not common:
        return None
    ks, vs = ks[common[0]], vs[common[0]]
    is_causal, needs_guard = False, guarded and mask is not None
    a = constant(mask)
    if a is not None and _causal(a, s, skv, kind in ("keep", "min")):
        mask, kind, is_causal, needs_guard = None, None, True, False
    elif a is not None and kind == "add":
        needs_guard = guarded and not _no_full_row(a)
    elif kind == "min" or (kind == "add" and _finite_where(mask)):
        needs_guard = False
    scale = qa * kb * sc
    nodes = [node, qk, *(n for n in (qn, kn) if n), *qs.nodes, *ks.nodes, *vs.nodes]
    return Match(
        "sdpa",
        nodes,
        [qs.value, ks.value, vs.value, mask],
        _builder(qs, ks, vs, mask, kind, is_causal, scale, needs_guard),
    )


def _builder(qs, ks, vs, mask, kind, is_causal, scale, needs_guard):
    def build(b):
        q = qs.build(b)
        dtype = q.dtype.np
        m = None if mask is None else b.value(mask)
        if kind == "min":
            m = ops.where(
                m, b.constant(np.asarray(0, dtype)), b.constant(np.asarray(ml_dtypes.finfo(dtype).min, dtype))
            )
        out = ops.sdpa(q, ks.build(b), vs.build(b), mask=m, is_causal=is_causal, scale=scale)
        if needs_guard:
            # Rows whose mask keeps no key are 0, as the guard made them.
            scores = ops.cast(m, q.dtype) if kind == "keep" else m
            floor = b.constant(np.asarray(0.0 if kind == "keep" else -np.inf, dtype))
            keep = ops.greater(ops.amax(scores, axis=-1, keepdims=True), floor)
            out = ops.where(keep, out, b.constant(np.asarray(0, dtype)))
        return out

    return build
