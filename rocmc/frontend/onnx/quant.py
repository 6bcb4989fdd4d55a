"""ONNX's quantization operators as rocmc ops: QuantizeLinear, DequantizeLinear (per tensor, per axis and blocked
scales and zero points), DynamicQuantizeLinear, MatMulInteger and QLinearMatMul, computed as ONNX's reference
does (onnx.reference: x / scale in x's type, rounded half to even, the zero point added, saturated to the
integer type; products of integers in int32; QLinearMatMul's rescale in float64).

rocmc quantizes to the integer types of its dtype table (int4, uint4, int8, uint8, int16, uint16; int32 dequantizes)
and to its float8 types (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz: x / scale converted with saturation unless saturate=0, as
onnx.reference does). 4-bit values known at import time (initializers and constants: the weights of a model quantized
to 4 bits, such as ONNX Runtime's quantize_static with QInt4 / QUInt4 weights) are widened to int8 / uint8, which
holds them exactly, and dequantized as those; elsewhere (graph inputs and outputs, QuantizeLinear to 4 bits, Cast)
they are rocmc's i4 / u4 (two a byte at the module's boundary). The 2-bit, float8e8m0 and float4 types are
reported. ConvInteger and QLinearConv convolve the zero-point-shifted integers in float64, where every sum of
int8/uint8 products is exact, and take the int32 result from it.

ONNX Runtime's com.microsoft MatMulNBits (what its MatMulNBitsQuantizer writes: 4- or 8-bit weights in blocks
along K, the form of ONNX Runtime's int4 LLMs) is rocmc's quantized_linear: its weight blobs are quantized_linear's
packed rows as they are (the first value of a byte in the low nibble), its blocks quantized_linear's groups, its
packed zero points (2^(bits - 1) when absent) unpacked at import. Where K is no multiple of block_size, the last
block's padding multiplies zeros appended to A.
"""

from __future__ import annotations

import math

import numpy as np

from ..graph import Value
from ..ops.quant import unpack
from .importer import contrib, converts
from .nn import numpy_matmul
from .spatial import conv_nd
from .values import Node, Tensor, Unsupported, _axis, _ops, _rocmc_dtype

RANGES = {"u8": (0, 255), "i8": (-128, 127), "u16": (0, 65535), "i16": (-32768, 32767), "i4": (-8, 7), "u4": (0, 15)}
FLOAT8 = ("f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz")


def _along(R, n: Node, i: int, what: str, x: Value, axis_attr: str = "axis") -> Value | None:
    """Input i (a scale or a zero point) made to broadcast against x: a scalar (or one element) as it is; a 1-D
    tensor along `axis` (per axis); with block_size, x's rank with ceil(size / block_size) along `axis`, each
    entry repeated block_size times (the last block cut to x's size)."""
    v = n.value(i)
    if v is None:
        return None
    block = int(n.attr("block_size", 0) or 0)
    if v.rank == 0 or (v.rank == 1 and v.shape[0] == 1 and not block):
        return R.reshape(v, ()) if v.rank else v
    axis = _axis(n, n.attr(axis_attr, 1), x.rank)
    size = x.shape[axis]
    if not isinstance(size, int):
        raise Unsupported(f"x {x.type}: a per-axis or blocked {what} needs x's axis {axis} static")
    if not block:
        if v.rank != 1 or v.shape[0] != size:
            raise Unsupported(f"{what} is {v.type}: expected a scalar or {size} values along axis {axis} of x {x.type}")
        return R.reshape(v, [1] * axis + [size] + [1] * (x.rank - axis - 1))
    blocks = math.ceil(size / block)
    want = list(x.shape[:axis]) + [blocks] + list(x.shape[axis + 1 :])
    if list(v.shape) != want:
        raise Unsupported(
            f"{what} is {v.type}: expected shape {want} for blocks of {block} along axis {axis} of x {x.type}"
        )
    grown = R.broadcast_to(R.unsqueeze(v, axis + 1), want[: axis + 1] + [block] + want[axis + 1 :])
    v = R.reshape(grown, want[:axis] + [blocks * block] + want[axis + 1 :])
    return v if blocks * block == size else R.narrow(v, axis, 0, size)


def _saturate(R, q: Value, dtype: str) -> Value:
    lo, hi = RANGES[dtype]
    return R.cast(R.minimum(R.maximum(q, float(lo)), float(hi)), dtype)


def _quant_type(n: Node, i: int, attr: str, default: str) -> str:
    """The integer type of a quantized value: input i's (a zero point) if given, else attribute `attr`'s."""
    if n.has(i):
        t = n.inputs[i].dtype_name()
    elif n.attr(attr):
        t = _rocmc_dtype(n.attr(attr), f"attribute {attr}")
    else:
        t = default
    if t not in RANGES and t not in FLOAT8:
        raise Unsupported(f"quantized type {t}: rocmc quantizes to {', '.join((*RANGES, *FLOAT8))}")
    return t


@converts("QuantizeLinear")
def _quantize_linear(n: Node):
    R = _ops()
    x = n.value(0)
    out = _quant_type(n, 2, "output_dtype", "u8")
    if n.attr("precision"):
        x = R.cast(x, _rocmc_dtype(n.attr("precision"), "attribute precision"))
    scale = _along(R, n, 1, "y_scale", x)
    q = R.div(x, R.cast(scale, x.dtype.name) if scale.dtype != x.dtype else scale)  # in x's type, as ONNX
    if out in FLOAT8:  # x / scale converted, saturating unless saturate=0; the zero point (0 for these) not added
        return R.cast(q, out, saturate=bool(n.attr("saturate", 1)))
    wide = "f64" if x.dtype.name == "f64" else "f32"  # integers of 16 bits and their sums, exactly
    q = R.round(R.cast(q, wide))
    zero = _along(R, n, 2, "y_zero_point", x)
    if zero is not None:
        q = R.add(q, R.cast(zero, wide))
    return _saturate(R, q, out)


# 4-bit types DequantizeLinear takes as known arrays (numpy's names of ml_dtypes' types) -> the 8-bit type that holds
# their values
NARROW = {"int4": "int8", "uint4": "uint8"}


def _widen_known(n: Node) -> None:
    """DequantizeLinear's x and x_zero_point, when x is a known int4 / uint4 array, as int8 / uint8 arrays of the
    same values (the zero point's type checked against x's first: widening must not hide a mismatch)."""
    kinds = [n.inputs[i].known.dtype.name if n.has(i) and n.inputs[i].known is not None else None for i in (0, 2)]
    if kinds[0] not in NARROW or (n.has(2) and kinds[1] is None):  # a computed x or zero point: rocmc's i4 / u4
        return
    if n.has(2) and kinds[0] != kinds[1]:
        x_type = kinds[0] or n.inputs[0].dtype_name()
        raise Unsupported(f"x_zero_point is {kinds[1] or n.inputs[2].dtype_name()}, x {x_type}: expected one type")
    for i in (0, 2):
        t = n.inputs[i] if n.has(i) else None
        if t is not None and t.known is not None and t.known.dtype.name in NARROW:
            n.inputs[i] = Tensor(known=t.known.astype(NARROW[t.known.dtype.name]), name=t.name)


@converts("DequantizeLinear")
def _dequantize_linear(n: Node):
    R = _ops()
    _widen_known(n)
    x = n.value(0)
    if x.dtype.name not in (*RANGES, "i32", *FLOAT8):
        raise Unsupported(f"x is {x.type}: rocmc dequantizes {', '.join(RANGES)}, i32 and {', '.join(FLOAT8)}")
    scale = _along(R, n, 1, "x_scale", x)
    out = _rocmc_dtype(n.attr("output_dtype"), "attribute output_dtype") if n.attr("output_dtype") else None
    y = R.cast(x, "f32")
    zero = _along(R, n, 2, "x_zero_point", x)
    if zero is not None:
        if zero.dtype != x.dtype:
            raise Unsupported(f"x_zero_point is {zero.dtype}, x {x.dtype}: expected one type")
        y = R.sub(y, R.cast(zero, "f32"))
    y = R.mul(y, R.cast(scale, "f32"))
    return R.cast(y, out or scale.dtype.name)


@converts("DynamicQuantizeLinear")
def _dynamic_quantize_linear(n: Node):
    """uint8 over x's range with 0 in it: scale (max - min) / 255 (1 / 255 for a range of 0), zero point
    round(clip(-min / scale, 0, 255)); the three outputs y, y_scale, y_zero_point."""
    R = _ops()
    x = n.value(0)
    xf = R.cast(x, "f32")
    every = tuple(range(x.rank))
    hi = R.maximum(R.max(xf, axis=every, keepdims=False), 0.0) if x.rank else R.maximum(xf, 0.0)
    lo = R.minimum(R.min(xf, axis=every, keepdims=False), 0.0) if x.rank else R.minimum(xf, 0.0)
    span = R.sub(hi, lo)
    scale = R.div(R.where(R.equal(span, 0.0), R.add(R.mul(span, 0.0), 1.0), span), 255.0)
    zero = R.round(R.minimum(R.maximum(R.neg(R.div(lo, scale)), 0.0), 255.0))
    y = _saturate(R, R.add(R.round(R.div(xf, scale)), zero), "u8")
    return [y, R.cast(scale, x.dtype.name), R.cast(zero, "u8")]


def _minus_zero(R, v: Value, zero: Value | None, per_row: bool) -> Value:
    """v in int32 minus its zero point (a scalar; per_row: one a row of a matrix, (M,); else one a column)."""
    v = R.cast(v, "i32")
    if zero is None:
        return v
    z = R.cast(zero, "i32")
    if z.rank == 1 and z.shape[0] != 1 and per_row:
        z = R.unsqueeze(z, -1)
    elif z.rank == 1 and z.shape[0] == 1:
        z = R.reshape(z, ())
    return R.sub(v, z)


@converts("MatMulInteger")
def _matmul_integer(n: Node):
    R = _ops()
    a = _minus_zero(R, n.value(0), n.value(2), per_row=True)
    b = _minus_zero(R, n.value(1), n.value(3), per_row=False)
    return numpy_matmul(R, a, b)


@converts("QLinearMatMul")
def _qlinear_matmul(n: Node):
    R = _ops()
    a = _minus_zero(R, n.value(0), n.value(2), per_row=True)
    b = _minus_zero(R, n.value(3), n.value(5), per_row=False)
    c = numpy_matmul(R, a, b)
    a_scale, b_scale = n.value(1), n.value(4)
    if a_scale.rank == 1 and a_scale.shape[0] != 1:
        a_scale = R.unsqueeze(a_scale, -1)  # per row of a
    return _requantize(R, n, R.cast(c, "f64"), a_scale, b_scale)


def _requantize(R, n: Node, c: Value, a_scale: Value, b_scale: Value) -> Value:
    """The QLinear ops' result: c (float64, the integer product) times a_scale * b_scale / y_scale (computed in
    the scales' type, as ONNX's reference), plus y_zero_point, rounded and saturated to its type (a's without
    one). y_scale and y_zero_point are inputs 6 and 7 of both ops."""
    mult = R.div(R.mul(a_scale, b_scale), n.value(6))
    d = R.mul(c, R.cast(mult, "f64"))
    out = n.inputs[7].dtype_name() if n.has(7) else n.inputs[0].dtype_name()
    if out not in RANGES:
        raise Unsupported(f"quantized type {out}: rocmc quantizes to {', '.join(RANGES)}")
    if n.has(7):
        d = R.add(d, R.cast(n.value(7), "f64"))
    return _saturate(R, R.round(d), out)


def _shifted_conv(R, n: Node, x: int, x_zero: int, w: int, w_zero: int, bias: int | None) -> Value:
    """conv(x - x_zero, w - w_zero) (+ bias, int32) with n's window attributes, exactly: in float64 (w_zero a
    scalar or one an output channel)."""
    xs = R.cast(_minus_zero(R, n.value(x), n.value(x_zero), per_row=False), "f64")
    wv, wz = n.value(w), n.value(w_zero)
    if wz is not None and wz.rank == 1 and wz.shape[0] != 1:
        wz = R.reshape(wz, [wz.shape[0]] + [1] * (wv.rank - 1))  # one an output channel
    ws = R.cast(_minus_zero(R, wv, wz, per_row=False), "f64")
    b = n.value(bias) if bias is not None else None
    return conv_nd(n, xs, ws, None if b is None else R.cast(b, "f64"))


@converts("ConvInteger")
def _conv_integer(n: Node):
    R = _ops()
    return R.cast(_shifted_conv(R, n, 0, 2, 1, 3, None), "i32")


@converts("QLinearConv")
def _qlinear_conv(n: Node):
    R = _ops()
    c = _shifted_conv(R, n, 0, 2, 3, 5, 8 if n.has(8) else None)
    w_scale = n.value(4)
    if w_scale.rank == 1 and w_scale.shape[0] != 1:
        w_scale = R.reshape(w_scale, [1, w_scale.shape[0]] + [1] * (c.rank - 2))  # one an output channel
    return _requantize(R, n, c, n.value(1), w_scale)


@contrib("com.microsoft", "MatMulNBits", ("K", "N", "bits", "block_size", "accuracy_level"))
def _matmul_nbits(n: Node):
    """A (..., K) @ dequantized(B)^T (+ bias): B (N, blocks, block_size * bits / 8) bytes, scales (N * blocks) or
    (N, blocks), zero points packed like B's values a row (bytes, padded to whole bytes) or in the scales' type,
    g_idx (only the plain k // block_size), bias (N). accuracy_level (ONNX Runtime's license to compute in lower
    precision) is not taken: rocmc computes the product as defined."""
    R = _ops()
    k, rows, bits, block = (int(n.attr(a, d)) for a, d in (("K", 0), ("N", 0), ("bits", 4), ("block_size", 0)))
    if bits not in (4, 8):
        raise Unsupported(f"bits={bits}: rocmc's quantized_linear takes 4 or 8")
    if block < 1 or block * bits % 8:
        raise Unsupported(f"block_size={block}: expected a positive number of whole bytes of {bits}-bit values")
    blocks, blob = -(-k // block), block * bits // 8  # a last block past K holds padding
    b = n.known(1, "B")
    if b.dtype != np.uint8 or b.shape != (rows, blocks, blob):
        raise Unsupported(
            f"B is {b.dtype}{list(b.shape)}: expected uint8 [{rows}, {blocks}, {blob}] (N, K blocks, blob)"
        )
    scales = n.known(2, "scales")
    if scales.size != rows * blocks or scales.dtype.kind != "f":
        raise Unsupported(
            f"scales are {scales.dtype}{list(scales.shape)}: expected {rows * blocks} floats (N x blocks)"
        )
    scales = scales.reshape(rows, blocks)
    if not n.has(3):
        zeros = np.full((rows, blocks), 1 << (bits - 1), scales.dtype)
    else:
        z = n.known(3, "zero_points")
        per_row = -(-blocks * bits // 8)
        if z.dtype == np.uint8 and z.size == rows * per_row:  # packed as quantized_linear's weights are
            zeros = unpack(z.reshape(rows, per_row), bits)[:, :blocks].astype(scales.dtype)
        elif z.dtype == scales.dtype and z.size == rows * blocks:
            zeros = z.reshape(rows, blocks)
        else:
            raise Unsupported(
                f"zero_points are {z.dtype}{list(z.shape)}: expected uint8 [{rows * per_row}] (packed a row) or "
                f"{scales.dtype} [{rows * blocks}]"
            )
    if n.has(4):
        g_idx = n.known(4, "g_idx")
        if not np.array_equal(np.asarray(g_idx).reshape(-1), np.arange(k) // block):
            raise Unsupported("g_idx other than k // block_size (act-order): not supported")
    const = lambda arr, name: n.imp.value(Tensor(known=np.ascontiguousarray(arr), name=name))  # noqa: E731
    w = const(b.reshape(rows, blocks * blob), f"{n.inputs[1].name}_packed")
    s = const(scales, f"{n.inputs[2].name}_scales")
    z = const(zeros, f"{n.inputs[1].name}_zeros")
    x = n.value(0)
    if blocks * block > k:  # the padding of the last block meets zeros appended to A: the product is over K alone
        if x.rank < 1 or x.shape[-1] != k:
            raise Unsupported(f"A is {list(x.shape)}: expected (..., K={k}) with K known")
        x = R.pad(x, [(0, 0)] * (x.rank - 1) + [(0, blocks * block - k)])
    return R.quantized_linear(x, w, s, z, n.value(5) if n.has(5) else None, bits=bits)
