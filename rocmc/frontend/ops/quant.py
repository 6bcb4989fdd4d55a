"""Quantized weights: a linear layer whose weight is stored as 4- or 8-bit integers with a scale and a zero point
per group of input features, or as float8 values with a scale (the weight-only quantization of GPTQ, AWQ and fp8
checkpoints, in one layout of rocmc's own; rocmc.llm.quant converts theirs at load).

quantized_linear(x, weight, scales, zeros, bias, perm, bits) computes

    y = x[..., perm] @ W^T + bias,   W[n, k] = (q[n, k] - zeros[n, k // gs]) * scales[n, k // gs]

where q[n, k] is the unsigned `bits`-bit integer k of row n of `weight` (uint8 (N, K * bits / 8): 8-bit values a
byte each, 4-bit values two a byte, k even in the low nibble), scales and zeros are (N, G) floats and
gs = K / G the group size (G = 1: one group a row). zeros may be absent (0). With format="e4m3fn" (bits 8) each
byte is a float8 e4m3fn value (1 sign bit, 4 exponent bits of bias 7, 3 mantissa bits; no infinities, NaN
S.1111.111): the fp8 weights of Hugging Face's `fp8` and compressed-tensors' float checkpoints. `perm`
(optional, int (K,)) orders x's features first, which turns GPTQ's act-order (`desc_act`, whose groups are
scattered over the input features by `g_idx`) into contiguous groups of a permuted weight. The weight is what
streams from memory: a lowering dequantizes it on its way into the product, never to a tensor of its own.

Like linear's fused forms (rocmc.frontend.ops.fused), it takes a decoder layer's neighbours of the product, so
one kernel can do them on the way: `norm` (with `eps`) makes x rms_norm(x, norm, eps) first (rms_norm_linear's
prologue); `gate` "silu" / "gelu_tanh" reads the weight as the gate's rows then the up's and gives
act(gate) * up (gated_linear's epilogue); `residual` is added to the result (fused_linear's). Each is
computed as the separate ops would.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import u8
from ...errors import GraphError
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, reference, require_dtype
from ..registry import OPS
from .fused import GATE_ACTIVATIONS, NORM_GATES, activate
from .norm import _check_eps, _eps_attr

__all__ = ["quantized_linear"]

BITS = (4, 8)
FORMATS = ("uint", "e4m3fn")  # what a weight's bytes hold: unsigned integers, or float8 e4m3fn values (8 bits)


def unpack(weight: np.ndarray, bits: int) -> np.ndarray:
    """q (N, K) of a packed (N, K * bits / 8) uint8 weight (see the module docstring)."""
    w = np.asarray(weight, np.uint8)
    if bits == 8:
        return w.copy()
    q = np.empty(w.shape[:-1] + (w.shape[-1] * 2,), np.uint8)
    q[..., 0::2], q[..., 1::2] = w & 0xF, w >> 4
    return q


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """The packed uint8 weight of q (N, K) values in [0, 2**bits); unpack's inverse."""
    q = np.asarray(q)
    if q.size and (q.min() < 0 or q.max() >= 1 << bits):
        raise GraphError(f"quantized values must lie in [0, {1 << bits}) for {bits} bits")
    q = q.astype(np.uint8)
    if bits == 8:
        return np.ascontiguousarray(q)
    if q.shape[-1] % 2:
        raise GraphError(f"4-bit rows of {q.shape[-1]} values do not fill whole bytes: expected an even count")
    return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4))


def values(weight, bits: int, format: str = "uint") -> np.ndarray:
    """q (N, K) in float64 of a packed weight: its integers, or (e4m3fn) its float8 values."""
    if format == "e4m3fn":
        import ml_dtypes

        return np.asarray(weight, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return unpack(weight, bits).astype(np.float64)


def dequantize(weight, scales, zeros, bits: int, format: str = "uint") -> np.ndarray:
    """W (N, K) in float64 of the packed weight and its (N, G) scales and zeros (None: 0)."""
    q = values(weight, bits, format)
    gs = q.shape[-1] // scales.shape[-1]
    s = np.repeat(np.asarray(scales, np.float64), gs, axis=-1)
    if zeros is None:
        return q * s
    z = np.repeat(np.asarray(zeros, np.float64), gs, axis=-1)
    return (q - z) * s


@defop("quantized_linear", attrs=("bits", "eps", "gate", "format"))
def _quantized_linear_infer(node, types, attrs):
    x, w, scales, zeros, bias, perm, residual, norm = types
    desc, bits, gate = node.describe(), attrs.get("bits"), attrs.get("gate", "none")
    if bits not in BITS:
        raise GraphError(f"{desc}: attribute bits={bits!r}, expected 4 or 8")
    fmt = attrs.get("format", "uint")
    if fmt not in FORMATS or (fmt == "e4m3fn" and bits != 8):
        raise GraphError(f"{desc}: attribute format={fmt!r} with bits={bits}: expected 'uint', or 'e4m3fn' of 8 bits")
    require_dtype(desc, "x", x)
    if x.rank < 1 or not isinstance(x.shape[-1], int):
        raise GraphError(f"{desc}: 'x' is {x}, expected (..., in_features) with a static in_features")
    k = x.shape[-1]
    if w.dtype != u8 or w.rank != 2 or not all(isinstance(d, int) for d in w.shape):
        raise GraphError(f"{desc}: 'weight' is {w}, expected a static u8 (out_features, in_features * bits / 8)")
    n = w.shape[0]
    if w.shape[1] * 8 != k * bits:
        raise GraphError(
            f"{desc}: 'weight' is {w}: {k} input features of {bits} bits pack into {k * bits / 8:g} bytes a row, "
            f"not {w.shape[1]}"
        )
    require_dtype(desc, "scales", scales)
    if scales.rank != 2 or scales.shape[0] != n or not isinstance(scales.shape[1], int):
        raise GraphError(f"{desc}: 'scales' is {scales}, expected ({n}, groups)")
    groups = scales.shape[1]
    if groups < 1 or k % groups or (k // groups * bits) % 8:
        raise GraphError(
            f"{desc}: {groups} groups of {k} input features: expected a group count dividing {k} into groups "
            f"of whole bytes of {bits}-bit values"
        )
    if zeros is not None and zeros != scales:
        raise GraphError(f"{desc}: 'zeros' is {zeros}, expected the scales' type {scales}")
    if bias is not None and (bias.shape != (n,) or bias.dtype != x.dtype):
        raise GraphError(f"{desc}: 'bias' is {bias}, expected [{n}] {x.dtype}")
    if perm is not None and (perm.dtype.kind != "int" or perm.shape != (k,)):
        raise GraphError(f"{desc}: 'perm' is {perm}, expected an integer [{k}] (an order of x's features)")
    if gate not in NORM_GATES:
        names = ", ".join(map(repr, NORM_GATES))
        raise GraphError(f"{desc}: attribute gate={gate!r}, expected one of {names}")
    if gate != "none" and n % 2:
        raise GraphError(
            f"{desc}: 'weight' has {n} rows, expected an even count with a gate (the gate's, then the up's)"
        )
    out = TensorType(x.shape[:-1] + (n // 2 if gate != "none" else n,), x.dtype)
    if norm is not None:
        _check_eps(node, attrs)
        if norm.shape != (k,) or norm.dtype != x.dtype:
            raise GraphError(f"{desc}: 'norm' is {norm}, expected [{k}] {x.dtype} (RMSNorm's weight over x's features)")
    if residual is not None:
        if gate != "none":
            raise GraphError(f"{desc}: 'residual' with gate={gate!r}: expected one or the other")
        if residual != out:
            raise GraphError(f"{desc}: 'residual' is {residual}, expected the result's type {out}")
    return out


@reference("quantized_linear")
def _quantized_linear_ref(node, ins, attrs):
    x, w, scales, zeros, bias, perm, residual, norm = ins
    if norm is not None:
        x = OPS["rms_norm"].reference(node, [x, norm], {"eps": attrs["eps"], "axis": x.ndim - 1})[0]
    if perm is not None:
        x = x[..., np.asarray(perm, np.int64)]
    y = x @ dequantize(w, scales, zeros, attrs["bits"], attrs.get("format", "uint")).T
    y = y if bias is None else y + bias
    gate = attrs.get("gate", "none")
    if gate != "none":
        n = y.shape[-1] // 2
        y = activate(node, y[..., :n], GATE_ACTIVATIONS, gate) * y[..., n:]
    return [y if residual is None else y + residual]


@builder
def quantized_linear(
    x,
    weight,
    scales,
    zeros=None,
    bias=None,
    perm=None,
    *,
    bits=4,
    norm=None,
    eps=1e-6,
    gate="none",
    residual=None,
    format="uint",
):
    """x[..., perm] @ W^T + bias with W dequantized from the packed `weight` group by group (see this module's
    docstring for the layout; rocmc.frontend.ops.quant.pack makes it from integer values). `norm` (K,):
    rms_norm(x, norm, eps) first; `gate` "silu" / "gelu_tanh": act(gate) * up of the joined rows; `residual`
    (the result's shape): added last; `format` "e4m3fn": the weight's bytes are float8 values (bits 8);
    zeros None: 0."""
    g = graph_of("quantized_linear", x)
    x = as_value("quantized_linear", "x", x, g)
    operands = [x, as_value("quantized_linear", "weight", weight, g)]
    operands.append(as_value("quantized_linear", "scales", scales, g, x))
    operands.append(None if zeros is None else as_value("quantized_linear", "zeros", zeros, g, x))
    operands.append(None if bias is None else as_value("quantized_linear", "bias", bias, g, x))
    operands.append(None if perm is None else as_value("quantized_linear", "perm", perm, g))
    operands += [None if v is None else as_value("quantized_linear", name, v, g, x)
                 for name, v in (("residual", residual), ("norm", norm))]  # fmt: skip
    attrs = {"bits": bits, "gate": gate, "format": format}
    if norm is not None:
        attrs["eps"] = _eps_attr("quantized_linear", eps)
    return g.apply("quantized_linear", operands, attrs)[0]
