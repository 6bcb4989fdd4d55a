"""ONNX layers: reductions (ReduceSum ... ReduceLogSumExp), Softmax/LogSoftmax, normalization
(LayerNormalization with its optional statistics, RMSNormalization, BatchNormalization, LRN), MatMul,
Gemm, and opset 23's Attention and RotaryEmbedding.

Gemm in the x @ W^T + bias form is rocmc's linear op (with its library paths); Attention is the
fused sdpa unless softcap or the qk_matmul_output output asks for the steps spelled out.
"""

from __future__ import annotations

import math

import numpy as np

from ..graph import Value
from .importer import converts
from .values import Node, Tensor, Unsupported, _axes, _axis, _check_folded, _ops, _static


# ---- reductions -----------------------------------------------------------------------------

_REDUCE = {
    "ReduceSum": "sum",
    "ReduceMean": "mean",
    "ReduceProd": "prod",
    "ReduceMax": "max",
    "ReduceMin": "min",
    "ReduceL1": "norm1",
    "ReduceL2": "norm2",
}
_REDUCE_AXES_AS_INPUT = {"ReduceSum": 13}  # others moved axes to an input in opset 18


def _reduce_axes(n: Node, rank: int):
    """The axes to reduce, or [] for none (noop_with_empty_axes)."""
    since = _REDUCE_AXES_AS_INPUT.get(n.proto.op_type, 18)
    axes = n.ints(1, "axes") if n.version >= since else n.attr("axes")
    if not axes:
        return [] if n.attr("noop_with_empty_axes", 0) else list(range(rank))
    return _axes(n, axes, rank)


def _reduce(R, fn: str, x: Value, axes, keep: bool) -> Value:
    if x.dtype.kind == "bool" and fn in ("max", "min"):  # any / all, through int32
        return R.cast(getattr(R, fn)(R.cast(x, "i32"), axis=tuple(axes), keepdims=keep), "bool")
    return getattr(R, fn)(x, axis=tuple(axes), keepdims=keep)


@converts(*_REDUCE, "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
def _reduction(n: Node):
    R = _ops()
    x = n.value(0)
    axes = _reduce_axes(n, x.rank)
    keep = bool(n.attr("keepdims", 1))
    op = n.proto.op_type
    if not axes:  # noop_with_empty_axes: ONNX returns the input unchanged
        return [n.inputs[0]]
    if op in _REDUCE:
        return _reduce(R, _REDUCE[op], x, axes, keep)
    if op == "ReduceSumSquare":
        return _reduce(R, "sum", R.mul(x, x), axes, keep)
    if op == "ReduceLogSum":
        return R.log(_reduce(R, "sum", x, axes, keep))
    m = _reduce(R, "max", x, axes, True)  # log-sum-exp shifted by the max, so exp never overflows
    s = R.log(_reduce(R, "sum", R.exp(R.sub(x, m)), axes, keep))
    return R.add(s, m if keep else _reduce(R, "max", x, axes, False))


# ---- softmax, normalization -----------------------------------------------------------------


@converts("Softmax", "LogSoftmax")
def _softmax(n: Node):
    R = _ops()
    fn = R.softmax if n.proto.op_type == "Softmax" else R.log_softmax
    x = n.value(0)
    if n.version >= 13:
        return fn(x, axis=_axis(n, n.attr("axis", -1), x.rank))
    # Before opset 13 the input is viewed as 2D [prod(dims[:axis]), prod(dims[axis:])].
    axis = _axis(n, n.attr("axis", 1), x.rank)
    if axis == x.rank - 1:
        return fn(x, axis=axis)
    shape = _static(x.shape, f"{n.proto.op_type}-{n.version} with axis={axis}")
    flat = R.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
    return R.reshape(fn(flat, axis=1), shape)


@converts("LayerNormalization")
def _layer_norm(n: Node):
    R = _ops()
    x = n.value(0)
    axis, eps = _axis(n, n.attr("axis", -1), x.rank), float(n.attr("epsilon", 1e-5))
    y = R.layer_norm(x, n.value(1), n.value(2), eps=eps, axis=axis)
    if not (n.wants_output(1) or n.wants_output(2)):
        return y
    # The optional Mean and InvStdDev outputs, in the stash type (float32), over axes[axis:].
    if n.attr("stash_type", 1) != 1:
        raise Unsupported(f"stash_type={n.attr('stash_type')} (only 1, float32, is supported)")
    xf = x if x.dtype.name == "f32" else R.cast(x, "f32")
    axes = tuple(range(axis, x.rank))
    mean = R.mean(xf, axis=axes, keepdims=True)
    centered = R.sub(xf, mean)
    inv_std = R.rsqrt(R.add(R.mean(R.mul(centered, centered), axis=axes, keepdims=True), eps))
    return [y, mean, inv_std]


@converts("RMSNormalization")
def _rms_norm(n: Node):
    x = n.value(0)
    return _ops().rms_norm(x, n.value(1), eps=float(n.attr("epsilon", 1e-5)), axis=_axis(n, n.attr("axis", -1), x.rank))


@converts("BatchNormalization")
def _batch_norm(n: Node):
    if n.attr("training_mode", 0):
        raise Unsupported("training_mode=1 is not supported (inference only)")
    if n.version < 9 and not n.attr("spatial", 1):
        raise Unsupported("spatial=0 is not supported")
    n.reject_outputs(1, "running statistics outputs exist only in training mode")
    return _ops().batch_norm(
        n.value(0), n.value(3), n.value(4), n.value(1), n.value(2), eps=float(n.attr("epsilon", 1e-5))
    )


@converts("LRN")
def _lrn(n: Node):
    return _ops().local_response_norm(
        n.value(0),
        size=int(n.attr("size")),
        alpha=float(n.attr("alpha", 1e-4)),
        beta=float(n.attr("beta", 0.75)),
        k=float(n.attr("bias", 1.0)),
    )


# ---- matmul ---------------------------------------------------------------------------------


@converts("MatMul")
def _matmul(n: Node):
    return numpy_matmul(_ops(), n.value(0), n.value(1))


def numpy_matmul(R, a: Value, b: Value) -> Value:
    """numpy's matmul (ONNX's MatMul, MatMulInteger): 1-D operands promoted, then their dim dropped."""
    a1, b1 = a.rank == 1, b.rank == 1  # numpy's matmul promotes 1-D operands, then drops the dim
    if a1:
        a = R.unsqueeze(a, 0)
    if b1:
        b = R.unsqueeze(b, 1)
    y = R.matmul(a, b)
    if b1:
        y = R.squeeze(y, -1)
    if a1:
        y = R.squeeze(y, -1 if b1 else -2) if y.rank else y
    return y


@converts("Gemm")
def _gemm(n: Node):
    R = _ops()
    a, b, c = n.value(0), n.value(1), n.value(2)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    ta, tb = bool(n.attr("transA", 0)), bool(n.attr("transB", 0))
    if tb and not ta and alpha == 1.0 and (c is None or (beta == 1.0 and c.rank == 1)):
        return R.linear(a, b, c)  # x @ W^T + bias: the linear layer form, with its library paths
    y = R.matmul(a, b, transpose_a=ta, transpose_b=tb)
    if alpha != 1.0:
        y = R.mul(y, alpha)
    if c is not None:
        y = R.add(y, c if beta == 1.0 else R.mul(c, beta))
    return y


# ---- attention and rotary embedding (opset 23) ------------------------------------------------


def _to_heads(R, x: Value, heads: int) -> Value:
    """[B, S, heads*D] -> [B, heads, S, D]."""
    return R.permute(R.reshape(x, (x.shape[0], x.shape[1], heads, -1)), (0, 2, 1, 3))


@converts("Attention")
def _attention(n: Node):
    R = _ops()
    q, k, v, mask = n.value(0), n.value(1), n.value(2), n.value(3)
    past_k, past_v = n.value(4), n.value(5)
    three_d = q.rank == 3
    if three_d:
        qh, kvh = n.attr("q_num_heads"), n.attr("kv_num_heads")
        if not qh or not kvh:
            raise Unsupported("3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = _to_heads(R, q, qh), _to_heads(R, k, kvh), _to_heads(R, v, kvh)
    new_kv = k.shape[2]
    past = 0 if past_k is None else past_k.shape[2]
    if past_k is not None:
        k = R.concat([past_k, k], axis=2)
        v = R.concat([past_v, v], axis=2)
    if mask is not None:
        mask = _pad_mask(R, q, mask, k.shape[2])
    causal = bool(n.attr("is_causal", 0))
    softcap, scale = float(n.attr("softcap", 0.0)), n.attr("scale")
    scale = None if scale is None else float(scale)
    if causal and (new_kv != q.shape[2] or softcap or n.wants_output(3)):
        # ONNX keeps key j for query i when j <= i + past_length; rocmc's is_causal aligns to the
        # bottom right (j <= i + kv_length - q_length). They differ here, so spell the mask out.
        s, total, past = _static((q.shape[2], k.shape[2], past), "is_causal with query and new key lengths that differ")
        _check_folded((s, total), bool, "the is_causal mask")
        keep = n.imp.value(Tensor(known=np.tril(np.ones((s, total), dtype=bool), k=past), name="causal_keep"))
        mask, causal = _and_keep(R, q, mask, keep), False
    if softcap or n.wants_output(3):
        y, qk = _attention_steps(R, n, q, k, v, mask, scale, softcap)
    else:
        if mask is not None and mask.dtype.is_float and mask.dtype != q.dtype:
            mask = R.cast(mask, q.dtype)
        y, qk = R.sdpa(q, k, v, mask=mask, is_causal=causal, scale=scale), None
    if three_d:
        y = R.reshape(R.permute(y, (0, 2, 1, 3)), (y.shape[0], y.shape[2], -1))
    return [y, k if n.wants_output(1) else None, v if n.wants_output(2) else None, qk]


def _pad_mask(R, q: Value, mask: Value, total) -> Value:
    """ONNX lets the mask cover fewer keys than there are; the rest are masked out."""
    short = total - mask.shape[-1] if isinstance(total, int) and isinstance(mask.shape[-1], int) else 0
    if short <= 0:
        return mask
    widths = [(0, 0)] * (mask.rank - 1) + [(0, short)]
    return R.pad(mask, widths, value=0 if mask.dtype.kind == "bool" else float("-inf"))


def _attention_steps(R, n: Node, q: Value, k: Value, v: Value, mask, scale, softcap: float):
    """Attention spelled out, for what the fused op has no room for: softcap and the qk_matmul_output
    output (mode 0/1: Q.K^T after softcap, 2: plus the mask, 3: after softmax), as ONNX defines them."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:  # grouped-query: repeat each KV head hq/hkv times ([h0, h0, h1, h1, ...])
        rep = _static((hq, hkv), "grouped-query Attention with softcap or qk_matmul_output")
        rep = rep[0] // rep[1]

        def repeat(t):
            b, h, sk, d = t.shape
            return R.reshape(R.broadcast_to(R.unsqueeze(t, 2), (b, h, rep, sk, d)), (b, h * rep, sk, d))

        k, v = repeat(k), repeat(v)
    if scale is None:
        scale = 1.0 / math.sqrt(_static(q.shape[3:], "Attention's head size")[0])
    root = math.sqrt(scale)  # ONNX scales Q and K by sqrt(scale) each
    qk = R.matmul(R.mul(q, root), R.mul(k, root), transpose_b=True)
    if softcap:
        qk = R.mul(R.tanh(R.div(qk, softcap)), softcap)
    scores = qk
    if mask is not None:
        bias = (
            mask
            if mask.dtype.is_float
            else R.where(mask, np.asarray(0.0, dtype=q.dtype.np), np.asarray(-np.inf, dtype=q.dtype.np))
        )
        scores = R.add(qk, R.cast(bias, q.dtype) if bias.dtype != q.dtype else bias)
    probs = R.softmax(scores, axis=3)
    mode = int(n.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise Unsupported(f"qk_matmul_output_mode={mode}")
    return R.matmul(probs, v), {0: qk, 1: qk, 2: scores, 3: probs}[mode]


def _and_keep(R, q: Value, mask: Value | None, keep: Value) -> Value:
    """Combine an attention mask (boolean keep-mask or additive) with a boolean keep-mask."""
    if mask is None:
        return keep
    if mask.dtype.kind == "bool":
        return R.logical_and(mask, keep)
    return R.where(keep, R.cast(mask, q.dtype), np.asarray(-np.inf, dtype=q.dtype.np))


@converts("RotaryEmbedding")
def _rotary_embedding(n: Node):
    R = _ops()
    x, cos, sin, pos = n.value(0), n.value(1), n.value(2), n.value(3)
    interleaved = bool(n.attr("interleaved", 0))
    rot = int(n.attr("rotary_embedding_dim", 0)) or None
    if x.rank == 4:  # [B, H, S, D]
        return R.rope(x, cos, sin, interleaved=interleaved, layout="bhsd", rotary_dim=rot, position_ids=pos)
    heads = n.attr("num_heads")
    if x.rank != 3 or not heads:
        raise Unsupported("3-D input needs num_heads (4-D input is [batch, heads, seq, head_size])")
    b, s, hidden = x.shape
    if not isinstance(hidden, int) or hidden % heads:
        raise Unsupported(f"hidden size {hidden} is not a static multiple of num_heads={heads}")
    y = R.rope(
        R.reshape(x, (b, s, heads, hidden // heads)),
        cos,
        sin,
        interleaved=interleaved,
        layout="bshd",
        rotary_dim=rot,
        position_ids=pos,
    )
    return R.reshape(y, (b, s, hidden))
