"""Layers: matrix products, convolution, pooling, normalization, attention and embedding.

`addmm(bias, x, permute(W, [1, 0]))` and `mm(x, permute(W, [1, 0]))`, what a decomposed nn.Linear is,
become `ops.linear(x, W, bias)`: the weight is read as stored (the GEMM libraries take it transposed).
"""

from __future__ import annotations

import math

from .importer import Missing, Node, Unsupported, _ops, converts


def _transposed_weight(n: Node, key: str):
    """W when operand `key` is permute(W, [1, 0]) of a 2-D tensor, else None."""
    fx = n.fx_arg(key)
    if (
        getattr(fx, "op", None) == "call_function"
        and str(fx.target) == "aten.permute.default"
        and list(fx.args[1]) in ([1, 0], [-1, -2], [1, -2], [-1, 0])
    ):
        w = n.imp.env.get(fx.args[0])
        return w if getattr(w, "rank", None) == 2 else None
    return None


@converts("aten.mm.default")
def _mm(n: Node):
    R = _ops()
    w = _transposed_weight(n, "mat2")
    if w is not None:
        return R.linear(n.value("self"), w)
    return R.matmul(n.value("self"), n.value("mat2"))


@converts("aten.bmm.default", "aten.matmul.default")
def _bmm(n: Node):
    R = _ops()
    a, b = n.value("self"), n.value("other" if "other" in n.a else "mat2")
    if a.rank == 1 or b.rank == 1:
        raise Unsupported("matmul of a 1-d operand")
    return R.matmul(a, b)


@converts("aten.addmm.default")
def _addmm(n: Node):
    R = _ops()
    alpha, beta = n.a.get("alpha", 1), n.a.get("beta", 1)
    bias, x = n.value("self"), n.value("mat1")
    w = _transposed_weight(n, "mat2")
    if w is not None and alpha == 1 and beta == 1 and bias.rank == 1:
        return R.linear(x, w, bias)
    y = R.matmul(x, n.value("mat2"))
    if alpha != 1:
        y = R.mul(y, float(alpha))
    return R.add(y, bias if beta == 1 else R.mul(bias, float(beta)))


@converts("aten.linear.default")
def _linear(n: Node):
    return _ops().linear(n.value("input"), n.value("weight"), n.value("bias") if n.a.get("bias") is not None else None)


# ---- convolution and pooling ---------------------------------------------------------------------------

_CONV = {1: "conv1d", 2: "conv2d", 3: "conv3d"}


@converts("aten.convolution.default")
def _convolution(n: Node):
    R = _ops()
    x, w = n.value("input"), n.value("weight")
    bias = n.value("bias") if n.a.get("bias") is not None else None
    nsp = x.rank - 2
    if nsp not in _CONV:
        raise Unsupported(f"convolution of rank {x.rank}: rocmc has 1-d, 2-d and 3-d convolutions")
    stride, padding, dilation = (n.int_list(k) for k in ("stride", "padding", "dilation"))
    groups = int(n.a["groups"])
    if n.a["transposed"]:
        fn = getattr(R, f"conv_transpose{nsp}d")
        return fn(
            x,
            w,
            bias,
            stride=stride,
            padding=padding,
            output_padding=n.int_list("output_padding"),
            groups=groups,
            dilation=dilation,
        )
    return getattr(R, _CONV[nsp])(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)


@converts("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default", "aten.max_pool2d.default")
def _max_pool(n: Node):
    R = _ops()
    x = n.value("self")
    nsp = x.rank - 2
    kernel = n.int_list("kernel_size")
    stride = n.int_list("stride") or kernel
    fn = R.max_pool2d if nsp == 2 else R.max_pool3d
    y = fn(
        x,
        kernel,
        stride=stride,
        padding=n.int_list("padding"),
        dilation=n.int_list("dilation"),
        ceil_mode=bool(n.a.get("ceil_mode", False)),
    )
    return [y, Missing("max_pool's indices are not computed")] if "with_indices" in n.name else y


@converts("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(n: Node):
    R = _ops()
    if n.a.get("divisor_override") is not None:
        raise Unsupported("divisor_override is not supported")
    x = n.value("self")
    kernel = n.int_list("kernel_size")
    fn = R.avg_pool2d if x.rank == 4 else R.avg_pool3d
    return fn(
        x,
        kernel,
        stride=n.int_list("stride") or kernel,
        padding=n.int_list("padding"),
        ceil_mode=bool(n.a.get("ceil_mode", False)),
        count_include_pad=bool(n.a.get("count_include_pad", True)),
    )


@converts("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool(n: Node):
    """Windows of equal size: the output divides the input (a mean when the output is 1x1)."""
    R = _ops()
    x = n.value("self")
    out = n.int_list("output_size")
    if out == [1, 1]:
        return R.mean(x, axis=(x.rank - 2, x.rank - 1), keepdims=True)
    size = x.shape[-2:]
    if not all(isinstance(s, int) and s % o == 0 for s, o in zip(size, out)):
        raise Unsupported(f"adaptive pooling of {list(size)} to {out}: only sizes that divide")
    kernel = [s // o for s, o in zip(size, out)]
    return R.avg_pool2d(x, kernel, stride=kernel)


# ---- normalization ------------------------------------------------------------------------------------


@converts("aten.native_layer_norm.default")
def _layer_norm(n: Node):
    x = n.value("input")
    axis = x.rank - len(n.a["normalized_shape"])
    w = n.value("weight") if n.a.get("weight") is not None else None
    b = n.value("bias") if n.a.get("bias") is not None else None
    y = _ops().layer_norm(x, w, b, eps=float(n.a["eps"]), axis=axis)
    saved = Missing("native_layer_norm's mean and rstd outputs (training) are not computed")
    return [y, saved, saved]


@converts("aten.rms_norm.default", "aten._fused_rms_norm.default")
def _rms_norm(n: Node):
    x = n.value("input")
    axis = x.rank - len(n.a["normalized_shape"])
    eps = n.a.get("eps")
    if eps is None:  # torch's default: the dtype's machine epsilon
        import torch

        eps = torch.finfo(n.fx_arg("input").meta["val"].dtype).eps
    w = n.value("weight") if n.a.get("weight") is not None else None
    y = _ops().rms_norm(x, w, eps=float(eps), axis=axis)
    return [y, Missing("rms_norm's rstd output is not computed")] if "fused" in n.name else y


@converts("aten.native_group_norm.default")
def _group_norm(n: Node):
    x = n.value("input")
    w = n.value("weight") if n.a.get("weight") is not None else None
    b = n.value("bias") if n.a.get("bias") is not None else None
    y = _ops().group_norm(x, int(n.a["group"]), w, b, eps=float(n.a["eps"]))
    saved = Missing("native_group_norm's mean and rstd outputs (training) are not computed")
    return [y, saved, saved]


@converts("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(n: Node):
    x = n.value("input")
    w = n.value("weight") if n.a.get("weight") is not None else None
    b = n.value("bias") if n.a.get("bias") is not None else None
    y = _ops().batch_norm(x, n.value("running_mean"), n.value("running_var"), w, b, eps=float(n.a["eps"]))
    saved = Missing("batch norm's saved statistics (training) are not computed")
    return [y, saved, saved]


# ---- attention ---------------------------------------------------------------------------------------


@converts("aten.scaled_dot_product_attention.default")
def _sdpa(n: Node):
    """torch's is_causal keeps key j for query i when j <= i (top-left aligned); rocmc's aligns to the
    bottom right. They agree when query and key lengths are equal; otherwise the mask is spelled out."""
    R = _ops()
    q, k, v = n.value("query"), n.value("key"), n.value("value")
    if n.a.get("dropout_p", 0.0):
        raise Unsupported(f"dropout_p={n.a['dropout_p']} (random) is not supported")
    mask = n.a.get("attn_mask")
    mask = None if mask is None else n.value("attn_mask")
    if q.rank != 4:
        if q.rank != 3:
            raise Unsupported(
                f"query of rank {q.rank}: rocmc's sdpa takes (batch, heads, seq, dim) or (heads, seq, dim)"
            )
        q, k, v = (R.unsqueeze(t, [0]) for t in (q, k, v))
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv and not n.a.get("enable_gqa", False):
        raise Unsupported(f"query has {hq} heads and key {hkv} without enable_gqa")
    if mask is not None and mask.dtype.is_float and mask.dtype != q.dtype:
        mask = R.cast(mask, q.dtype)
    causal = bool(n.a.get("is_causal", False))
    if causal and q.shape[2] != k.shape[2]:
        s, skv = q.shape[2], k.shape[2]
        rows = R.unsqueeze(R.arange(n.graph, 0, s, 1, dtype="i64"), [1])
        cols = R.unsqueeze(R.arange(n.graph, 0, skv, 1, dtype="i64"), [0])
        mask, causal = R.less_equal(cols, rows), False
    scale = n.a.get("scale")
    if scale is None:
        d = q.shape[-1]
        if not isinstance(d, int):
            raise Unsupported(f"scale=None with the symbolic head dim {d}")
        scale = 1.0 / math.sqrt(d)
    y = R.sdpa(q, k, v, mask=mask, is_causal=causal, scale=float(scale))
    if mask is not None:
        y = _zero_unattended(R, y, mask)
    return y if n.a["query"].rank == 4 else R.squeeze(y, [0])


def _zero_unattended(R, y, mask):
    """torch gives 0 for a query whose keys are all masked out; rocmc's sdpa leaves such a row
    undefined (NaN), which a later layer would spread to every row through its values."""
    import numpy as np

    if mask.dtype.kind == "bool":  # counted by a product with ones: IREE 3.13's CPU code for a max over
        keys = mask.shape[-1]  # a gathered dynamic bool mask needs an unbounded stack
        ones = R.broadcast_to(y.graph.constant(None, np.ones((1, 1), np.float32)), (keys, 1))
        attends = R.greater(R.matmul(R.cast(mask, "f32"), ones), np.float32(0))
    else:
        attends = R.greater(R.max(mask, axis=mask.rank - 1, keepdims=True), np.asarray(-np.inf, mask.dtype.np))
    return R.where(attends, y, np.asarray(0, y.dtype.np))


@converts("aten.embedding.default")
def _embedding(n: Node):
    return _ops().embedding(n.value("indices"), n.value("weight"))
