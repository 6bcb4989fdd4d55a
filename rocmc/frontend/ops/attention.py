"""Scaled dot-product attention: softmax(q @ k^T * scale + mask) @ v, with GQA/MQA and causal masking.

q (b, hq, s, d), k (b, hkv, skv, d), v (b, hkv, skv, dv), hq % hkv == 0: query head h reads kv head
h // (hq / hkv). mask is additive (q's float dtype) or bool (true = keep), broadcastable to
(b, hq, s, skv). is_causal keeps key j for query i when j <= i + (skv - s) (bottom-right aligned, as
ONNX Attention documents). A query row whose keys are all masked has no defined result (the reference
gives NaN, as torch does). softmax in f32.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import GraphError
from ..graph import TensorType
from ..opdef import as_value, broadcast_shapes, builder, defop, graph_of, reference

__all__ = ["sdpa"]


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
    if not isinstance(is_causal, (bool, np.bool_)):
        raise GraphError(f"sdpa: is_causal={is_causal!r}, expected a bool")
    if scale is None:
        d = q.shape[-1] if q.rank else None
        if not isinstance(d, int) or d == 0:
            raise GraphError(f"sdpa: scale=None needs a static, non-zero head dim, 'q' is {q.type}; pass scale=")
        scale = 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise GraphError(f"sdpa: scale={scale!r}, expected a number")
    return g.apply("sdpa", operands, {"is_causal": bool(is_causal), "scale": float(scale)})[0]
