"""Reference provider: numpy implementations of the extern ABI for local CPU devices.

This is how CI runs the import path end to end without a GPU: the compiled module calls the same
`miopen.<op>` and `hipblaslt.matmul` imports it calls on a GPU, and these functions compute them in float64 (rounded once
to the storage type), with the ABI's conventions (symmetric padding, (outer, axis, inner) softmax
views, flattened activations, empty tensors for absent operands).
"""
from __future__ import annotations

import numpy as np

from ...externs import CONV_ACTIVATIONS, EPILOGUES, gate_blocks
from ...symbolic import INT, conv_size, conv_transpose_size
from .base import Provider
from .miopen import MIOPEN

# The reference computes recurrences in MIOpen's packed gate order (LSTM i, f, o, g; GRU z, r, n),
# so the repacking every library provider must do is exercised on the CPU too.
LIBRARY_GATES = MIOPEN.gate_order


def _conv_nd(x, w, b, stride, pad, dil, groups):
    """Cross-correlation of x (N, C, *S) with w (F, C/groups, *K), symmetric padding."""
    nsp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    n, c = x.shape[:2]
    f, kernel = w.shape[0], w.shape[2:]
    out = [conv_size(INT, x.shape[2 + i], kernel[i], stride[i], pad[i], pad[i], dil[i]) for i in range(nsp)]
    xg = xp.reshape(n, groups, c // groups, *xp.shape[2:])
    wg = w.reshape(groups, f // groups, c // groups, *kernel)
    y = np.zeros((n, groups, f // groups, *out))
    for offs in np.ndindex(*kernel):
        idx = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(offs, dil, stride, out))
        y += np.einsum("ngc...,gfc->ngf...", xg[(slice(None),) * 3 + idx], wg[(slice(None),) * 3 + offs])
    y = y.reshape(n, f, *out)
    return y if b.size == 0 else y + b.reshape(f, *[1] * nsp)


def _fused_conv2d(t, a):
    """activation(conv2d(x, w, b) + residual); an empty residual is none."""
    x, w, b, r = t
    y = _conv_nd(x, w, b, *_conv_args(a, 2, False))
    y = y + r if r.size else y
    return np.maximum(y, 0.0) if CONV_ACTIVATIONS[a["activation"]] == "relu" else y


def _conv_transpose_nd(x, w, b, stride, pad, out_pad, dil, groups):
    """The adjoint of _conv_nd (backward data): w is (C_in, F/groups, *K)."""
    nsp = x.ndim - 2
    n, c, *size = x.shape
    fg, kernel = w.shape[1], w.shape[2:]
    out = [conv_transpose_size(INT, size[i], kernel[i], stride[i], pad[i], pad[i], dil[i], out_pad[i])
           for i in range(nsp)]
    full = [max(o + p, (s - 1) * st + d * (k - 1) + 1)
            for o, p, s, st, d, k in zip(out, pad, size, stride, dil, kernel)]
    y = np.zeros((n, groups, fg, *full))
    xg = x.reshape(n, groups, c // groups, *size)
    wg = w.reshape(groups, c // groups, fg, *kernel)
    for offs in np.ndindex(*kernel):
        idx = tuple(slice(k * d, k * d + st * (s - 1) + 1, st) for k, d, st, s in zip(offs, dil, stride, size))
        y[(slice(None),) * 3 + idx] += np.einsum("ngc...,gcf->ngf...", xg, wg[(slice(None),) * 3 + offs])
    y = y[(slice(None),) * 3 + tuple(slice(p, p + o) for p, o in zip(pad, out))].reshape(n, groups * fg, *out)
    return y if b.size == 0 else y + b.reshape(-1, *[1] * nsp)


def _conv_args(a, nsp, transpose):
    axes = ["_h", "_w"] if nsp == 2 else [""]
    keys = ["stride", "pad"] + (["output_padding"] if transpose else []) + ["dilation"]
    return [[a[k + s] for s in axes] for k in keys] + [a["groups"]]


def _pool(x, a, reduce):
    """Max or average over kh x kw windows; padded cells are -inf for max and excluded or counted for
    average according to count_include_pad."""
    n, c, h, w = x.shape
    kh, kw, sh, sw, ph, pw = (a[k] for k in ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w"))
    oh, ow = conv_size(INT, h, kh, sh, ph, ph, 1), conv_size(INT, w, kw, sw, pw, pw, 1)
    fill = -np.inf if reduce == "max" else 0.0
    xp = np.pad(x, [(0, 0), (0, 0), (ph, ph), (pw, pw)], constant_values=fill)
    inside = np.pad(np.ones((h, w)), [(ph, ph), (pw, pw)])
    acc = np.full((n, c, oh, ow), fill)
    count = np.zeros((oh, ow))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
            acc = np.maximum(acc, win) if reduce == "max" else acc + win
            count += inside[i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
    if reduce == "max":
        return acc
    return acc / (kh * kw if a["count_include_pad"] else count)


def _softmax(x, log):
    s = x - x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(s).sum(axis=1, keepdims=True))
    return s - lse if log else np.exp(s - lse)


def _batch_norm(x, mean, var, weight, bias, a):
    col = lambda v, fill: (v if v.size else np.full(x.shape[1], fill)).reshape(1, -1, 1)  # noqa: E731
    return (x - col(mean, 0.0)) / np.sqrt(col(var, 1.0) + a["eps"]) * col(weight, 1.0) + col(bias, 0.0)


def _lrn(x, a):
    """Cross-channel LRN, torch's formula: x / (k + alpha/size * sum of squares in the window)^beta."""
    size, c = a["size"], x.shape[1]
    sq = np.pad(x * x, [(0, 0), (size // 2, (size - 1) // 2), (0, 0)])
    window = sum(sq[:, i:i + c] for i in range(size))
    return x / (a["k"] + a["alpha"] / size * window) ** a["beta"]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _by_gate(op, v, order):
    """Torch-packed rows (or entries) of `v` -> {gate letter: block}, via the library's packing."""
    blocks = np.split(v, len(order)) if v.size else [0.0] * len(order)
    repacked = [blocks[b] for b in gate_blocks(op, order)]
    return dict(zip(order, repacked))


def _lstm_cell(gx, gh, h, c):
    pre = {k: gx[k] + gh[k] for k in gx}
    c = _sigmoid(pre["f"]) * c + _sigmoid(pre["i"]) * np.tanh(pre["g"])
    return _sigmoid(pre["o"]) * np.tanh(c), c


def _gru_cell(gx, gh, h, c):
    r, z = _sigmoid(gx["r"] + gh["r"]), _sigmoid(gx["z"] + gh["z"])
    n = np.tanh(gx["n"] + r * gh["n"])
    return (1.0 - z) * n + z * h, c


_CELLS = {"lstm": _lstm_cell, "gru": _gru_cell}


def _rnn(op, t):
    """The ABI's packed result: y's rows, then h_n (and c_n) along the time dim."""
    x, w_ih, w_hh, b_ih, b_hh, h0, *c0 = t
    order = LIBRARY_GATES[op]
    seq, batch, _ = x.shape
    hidden = w_hh.shape[1]
    wi, wh, bi, bh = (_by_gate(op, v, order) for v in (w_ih, w_hh, b_ih, b_hh))
    h = h0[0] if h0.size else np.zeros((batch, hidden))
    c = c0[0][0] if c0 and c0[0].size else np.zeros((batch, hidden))
    rows = []
    for step in range(seq):
        gx = {k: x[step] @ wi[k].T + bi[k] for k in order}
        gh = {k: h @ wh[k].T + bh[k] for k in order}
        h, c = _CELLS[op](gx, gh, h, c)
        rows.append(h)
    states = [h, c][:2 if op == "lstm" else 1]
    return np.stack(rows + states)


def _sdpa(q, k, v, scale):
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.matmul(p / p.sum(axis=-1, keepdims=True), v)


def _gemm(a, b, bias, attrs):
    """The GEMM ABI: alpha * op(a) @ op(b) over a (possibly broadcast) batch, + bias over columns, epilogue."""
    a = np.swapaxes(a, 1, 2) if attrs["transpose_a"] else a
    b = np.swapaxes(b, 1, 2) if attrs["transpose_b"] else b
    d = attrs["alpha"] * np.matmul(a, b)
    if bias.size:
        d = d + bias
    epilogue = EPILOGUES[attrs["epilogue"]]
    if epilogue == "relu":
        return np.maximum(d, 0.0)
    if epilogue == "gelu_tanh":
        return 0.5 * d * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (d + 0.044715 * d ** 3)))
    return d


OPS = {
    "conv1d": lambda t, a: _conv_nd(*t, *_conv_args(a, 1, False)),
    "conv2d": lambda t, a: _conv_nd(*t, *_conv_args(a, 2, False)),
    "fused_conv2d": _fused_conv2d,
    "conv_transpose1d": lambda t, a: _conv_transpose_nd(*t, *_conv_args(a, 1, True)),
    "conv_transpose2d": lambda t, a: _conv_transpose_nd(*t, *_conv_args(a, 2, True)),
    "max_pool2d": lambda t, a: _pool(t[0], a, "max"),
    "avg_pool2d": lambda t, a: _pool(t[0], a, "avg"),
    "softmax": lambda t, a: _softmax(t[0], False),
    "log_softmax": lambda t, a: _softmax(t[0], True),
    "relu": lambda t, a: np.maximum(t[0], 0.0),
    "sigmoid": lambda t, a: _sigmoid(t[0]),
    "tanh": lambda t, a: np.tanh(t[0]),
    "elu": lambda t, a: np.where(t[0] > 0, t[0], a["alpha"] * np.expm1(np.minimum(t[0], 0.0))),
    "leaky_relu": lambda t, a: np.where(t[0] >= 0, t[0], a["negative_slope"] * t[0]),
    "clipped_relu": lambda t, a: np.clip(t[0], 0.0, a["ceiling"]),
    "batch_norm": lambda t, a: _batch_norm(*t, a),
    "lrn": lambda t, a: _lrn(t[0], a),
    "lstm": lambda t, a: _rnn("lstm", t),
    "gru": lambda t, a: _rnn("gru", t),
    "sdpa": lambda t, a: _sdpa(*t, a["scale"]),
    "matmul": lambda t, a: _gemm(*t, a),
}


class ReferenceProvider(Provider):
    library = "the numpy reference provider"

    def run(self, op, tensors, attrs):
        from iree import runtime as rt
        x = tensors[0]
        y = OPS[op]([rt.DeviceArray(self.device, t).to_host().astype(np.float64) for t in tensors], attrs)
        arr = np.ascontiguousarray(y.astype(storage_dtype(x.element_type)))
        raw = arr if arr.dtype in (np.float32, np.float16) else arr.view(np.uint16)   # bf16 travels as raw bits
        return self.device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=self.device,
            buffer=raw, element_type=x.element_type)


def storage_dtype(element_type):
    """numpy storage type of a HAL element type (bf16 through ml_dtypes)."""
    from iree import runtime as rt
    if int(element_type) == int(rt.HalElementType.BFLOAT_16):
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return {int(rt.HalElementType.FLOAT_32): np.dtype(np.float32),
            int(rt.HalElementType.FLOAT_16): np.dtype(np.float16)}[int(element_type)]
