"""quantized_linear over float8 e4m3fn weights as float8 matrix products (implementation "fp8"): the default on AMD
GPUs whose matrix units take e4m3fnuz (gfx940-942, MI300), where IREE plans the contraction on their float8
instructions; on the CPU when asked for (`impl={"quantized_linear": "fp8"}`), which checks its arithmetic.

Unlike the dequantizing product (quant.py: weight-only, x as given), this quantizes x too, a row at a time:
s = max|x_row| / 240 (e4m3fnuz's largest value; 1 for a row of zeros), x_q = x / s rounded to e4m3fnuz. The
weights' bytes become e4m3fnuz by their bits: for every code but e4m3fn's negative zero (0x80, e4m3fnuz's NaN:
made +0) and its NaNs (S.1111.111: made e4m3fnuz's NaN) the same bits are worth half as much in e4m3fnuz (one
more in the exponent's bias), so the weight's scale doubles. y = s * 2 * scale[n] * sum_k x_q[k] w_q[n, k],
summed in f32 (+ bias), rounded to x's type. The activations' rounding to 3 mantissa bits is this
implementation's error beyond the weights' (a relative error of about 2^-5 a product).

One scale a weight row (per tensor or per channel: a group count of 1); block scales take the dequantizing
product.
"""

from __future__ import annotations

from ...frontend.graph import TensorType
from ...dtypes import f8e4m3fnuz
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering
from ..target import native_float8
from .linalg import _foldable, _folded, _mac, _padded
from .quant import lowered_with, permuted

FNUZ = f8e4m3fnuz.mlir
FNUZ_MAX = 240.0


def supports(node, target):
    if node.attrs.get("format", "uint") != "e4m3fn":
        return "the weights are not float8 e4m3fn"
    groups = node.inputs[2].shape[1]
    if groups != 1:
        return f"{groups} scales a weight row: the float8 product takes one (a block's would need its own sums)"
    if target.kind == "rocm" and "f8e4m3fnuz" not in native_float8(target):
        return f"{target.arch}'s matrix units take no e4m3fnuz"
    return None


def _row_scales(E: Emitter, x: T, lead: int) -> tuple[str, str]:
    """max |x| over each row's features, in f32 (lead dims), and its tensor type."""
    sizes = E.dims(x)[:lead]
    ty = tensor_type(x.shape[:lead], "f32")

    def body(E, a):
        v = E.op(f"math.absf {E.cast_scalar(a[0], x.mlir_elt, 'f32')} : f32")
        return [E.op(f"arith.maximumf {a[1]}, {v} : f32")]

    r = E.generic(
        [(x.name, x.mlir)],
        [(E.filled(sizes, "f32", 0.0), ty)],
        [affine_map(lead + 1, range(lead + 1)), affine_map(lead + 1, range(lead))],
        ["parallel"] * lead + ["reduction"],
        body,
    )[0]
    return r, ty


def _scale_of(E: Emitter, amax: str) -> str:
    """A row's scale from its max |x|: amax / 240, 1 for a row of zeros."""
    zero = E.op(f"arith.cmpf oeq, {amax}, {E.const(0.0, 'f32')} : f32")
    s = E.op(f"arith.divf {amax}, {E.const(FNUZ_MAX, 'f32')} : f32")
    return E.op(f"arith.select {zero}, {E.const(1.0, 'f32')}, {s} : f32")


def _quantized_rows(E: Emitter, x: T, lead: int, amax: tuple[str, str]) -> T:
    """x / its row's scale, rounded to e4m3fnuz."""
    sizes = E.dims(x)
    ty = tensor_type(x.shape, FNUZ)

    def body(E, a):
        v = E.op(f"arith.divf {E.cast_scalar(a[0], x.mlir_elt, 'f32')}, {_scale_of(E, a[1])} : f32")
        return [E.op(f"arith.truncf {v} : f32 to {FNUZ}")]

    r = E.generic(
        [(x.name, x.mlir), amax],
        [(E.empty(sizes, FNUZ), ty)],
        [
            affine_map(lead + 1, range(lead + 1)),
            affine_map(lead + 1, range(lead)),
            affine_map(lead + 1, range(lead + 1)),
        ],
        ["parallel"] * (lead + 1),
        body,
    )[0]
    return T(r, TensorType(x.shape, f8e4m3fnuz), FNUZ)


def _fnuz_weights(E: Emitter, w: T) -> T:
    """The e4m3fn bytes (N, K) as e4m3fnuz of half their value: 0x80 (-0) made +0, NaNs made 0x80 (NaN)."""
    ty = tensor_type(w.shape, FNUZ)

    def body(E, a):
        b = a[0]
        c = {v: E.const(v, "i8") for v in (0, -128, 127)}
        nan = E.op(f"arith.cmpi eq, {E.op(f'arith.andi {b}, {c[127]} : i8')}, {c[127]} : i8")
        minus0 = E.op(f"arith.cmpi eq, {b}, {c[-128]} : i8")
        b = E.op(f"arith.select {minus0}, {c[0]}, {b} : i8")
        b = E.op(f"arith.select {nan}, {c[-128]}, {b} : i8")
        return [E.op(f"arith.bitcast {b} : i8 to {FNUZ}")]

    r = E.generic(
        [(w.name, w.mlir)],
        [(E.empty(list(w.shape), FNUZ), ty)],
        [affine_map(2, [0, 1])] * 2,
        ["parallel"] * 2,
        body,
    )[0]
    return T(r, TensorType(w.shape, f8e4m3fnuz), FNUZ)


def fp8_product(E: Emitter, node, x: T, w: T, scales: T, zeros, bias, perm, out: TensorType, ctx) -> T:
    """x[..., perm] @ W^T + bias through e4m3fnuz products (the module docstring); rows folded and padded on a GPU
    as the dequantizing product's."""
    if x.rank >= 2 and _foldable(x, x.rank - 1, ctx):
        fold = lambda x2, out2: fp8_product(E, node, x2, w, scales, zeros, bias, perm, out2, ctx)  # noqa: E731
        return _folded(E, x, x.rank - 1, out, fold)
    if perm is not None:
        x = permuted(E, x, perm)
    lead, n = x.rank - 1, w.shape[0]
    amax = _row_scales(E, x, lead)
    xq, wq = _quantized_rows(E, x, lead, amax), _fnuz_weights(E, w)
    rows = next((i for i in reversed(range(lead)) if not isinstance(x.shape[i], int)), None)
    xq, _, out_c, finish = _padded(E, ctx, xq, wq, rows, None, (None, None), out, (rows, None))
    sizes = [E.dim(xq, i) for i in range(lead)]
    loops = lead + 2  # rows..., n, k
    ty = tensor_type(out_c.shape, "f32")
    r = E.generic(
        [(xq.name, xq.mlir), (wq.name, wq.mlir)],
        [(E.filled(sizes + [n], "f32", 0.0), ty)],
        [
            affine_map(loops, list(range(lead)) + [lead + 1]),
            affine_map(loops, [lead, lead + 1]),
            affine_map(loops, range(lead + 1)),
        ],
        ["parallel"] * (lead + 1) + ["reduction"],
        _mac(FNUZ, "f32"),
    )[0]
    acc = finish(T(r, out_c, "f32"))
    # y = s_row * (2 * scale[n]) * acc (+ bias), rounded to x's type
    storage = x.type.dtype.mlir if x.elt is None else x.elt
    out_sizes = [E.dim(acc, i) for i in range(acc.rank)]
    out_ty = tensor_type(out.shape, storage)
    ins = [(acc.name, acc.mlir), amax, (scales.name, scales.mlir)]
    maps = [affine_map(lead + 1, range(lead + 1)), affine_map(lead + 1, range(lead)), affine_map(lead + 1, [lead, "0"])]
    if bias is not None:
        ins.append((bias.name, bias.mlir))
        maps.append(affine_map(lead + 1, [lead]))

    def body(E, a):
        sw = E.op(f"arith.mulf {E.cast_scalar(a[2], scales.mlir_elt, 'f32')}, {E.const(2.0, 'f32')} : f32")
        v = E.op(f"arith.mulf {E.op(f'arith.mulf {a[0]}, {_scale_of(E, a[1])} : f32')}, {sw} : f32")
        if bias is not None:
            v = E.op(f"arith.addf {v}, {E.cast_scalar(a[3], bias.mlir_elt, 'f32')} : f32")
        return [E.cast_scalar(v, "f32", storage)]

    y = E.generic(
        ins, [(E.empty(out_sizes, storage), out_ty)], maps + [affine_map(lead + 1, range(lead + 1))],
        ["parallel"] * (lead + 1), body,
    )[0]  # fmt: skip
    return T(y, out, None if storage == out.dtype.mlir else storage)


lowering("quantized_linear", impl="fp8", kinds=("cpu", "rocm"), default_on=("rocm",), priority=20, supports=supports)(
    lowered_with(fp8_product)
)
