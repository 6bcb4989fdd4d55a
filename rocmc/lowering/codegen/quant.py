"""Generated lowering of quantized_linear: the weight dequantized by one elementwise linalg.generic, then
linear's contraction over it (after rms_norm's code with a norm; before the gate's or the residual's epilogue).

The dequantization iterates (n, group, byte in group[, nibble]) over the packed uint8 weight viewed as
(N, G, bytes a group): every indexing map is a projected permutation (no floordiv), so IREE's dispatch
formation sees a dequantization-like producer (an integer operand widened to the float result, all loops
parallel) and fuses it into the contraction's dispatch: the packed bytes are what the product reads, and no
dequantized weight is ever stored (tests/lowering/test_quantized_linear.py counts the dispatches). The
arithmetic is W = (q - zero) * scale in f32, rounded once to x's element type (f16/bf16 products then
accumulate in f32, as linear's do). A `perm` gathers x's features first (act-order).
"""

from __future__ import annotations

from ...frontend.graph import TensorType
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering
from ...dtypes import acc_mlir
from .linalg import _bias_init, _foldable, _folded, _mac, _padded
from .fused import epilogue, gate_halves
from .norm import rms_norm_of
from .shape import _clamp, _gather_generic


def permuted(E: Emitter, x: T, perm: T) -> T:
    """x[..., perm] (perm's entries clamped into range: a graph's perm is checked where it is made)."""
    sizes = E.dims(x)
    last = x.rank - 1
    cast = "arith.index_castui" if perm.type.dtype.unsigned else "arith.index_cast"

    def coords(E, at, scalars):
        i = _clamp(E, E.op(f"{cast} {scalars[0]} : {perm.mlir_elt} to index"), E.index(x.shape[-1] - 1))
        return at[:last] + [i]

    r = _gather_generic(E, sizes, x.mlir_elt, x, coords, [(perm.name, perm.mlir, affine_map(x.rank, [last]))])
    return T(r, x.type, x.elt)


def _e4m3fn(E: Emitter, byte: str) -> str:
    """The f32 value of a float8 e4m3fn byte (i8): (8 + m) * 2^(e - 10), or m * 2^-9 for e = 0, signed; NaN for
    S.1111.111 (no infinities)."""

    def i32(op, a, b):
        return E.op(f"arith.{op} {a}, {b} : i32")

    b = E.op(f"arith.extui {byte} : i8 to i32")
    c = {v: E.const(v, "i32") for v in (0, 1, 3, 7, 8, 15, 23, 117)}
    e, m = i32("andi", i32("shrui", b, c[3]), c[15]), i32("andi", b, c[7])
    sub = E.op(f"arith.cmpi eq, {e}, {c[0]} : i32")
    mant = E.op(f"arith.select {sub}, {m}, {i32('addi', m, c[8])} : i32")
    ex = E.op(f"arith.select {sub}, {c[1]}, {e} : i32")
    two = E.op(f"arith.bitcast {i32('shli', i32('addi', ex, c[117]), c[23])} : i32 to f32")  # 2^(ex - 10)
    mag = E.op(f"arith.mulf {E.op(f'arith.uitofp {mant} : i32 to f32')}, {two} : f32")
    neg = E.op(f"arith.cmpi ne, {i32('shrui', b, c[7])}, {c[0]} : i32")
    v = E.op(f"arith.select {neg}, {E.op(f'arith.negf {mag} : f32')}, {mag} : f32")
    top = E.op(f"arith.cmpi eq, {e}, {c[15]} : i32")
    nan = E.op(f"arith.andi {top}, {E.op(f'arith.cmpi eq, {m}, {c[7]} : i32')} : i1")
    return E.op(f"arith.select {nan}, {E.const(float('nan'), 'f32')}, {v} : f32")


def dequantized(E: Emitter, w: T, scales: T, zeros: T | None, bits: int, like: T, format: str = "uint") -> T:
    """W (N, G, K / G) in `like`'s element type (x's) from the packed (N, K * bits / 8) weight and its (N, G)
    scales and zeros (None: 0): the 4-bit bytes bitcast to i4 (IREE stores i4 two a byte, the even element in
    the low nibble: the packed layout as it is), viewed by group, widened (e4m3fn: decoded) and scaled in f32,
    rounded once."""
    n, groups, k, elt = w.shape[0], scales.shape[1], like.shape[-1], like.mlir_elt
    ielt = f"i{bits}"
    q = w.name
    if bits == 4:
        q = E.op(f"flow.tensor.bitcast {q} : {w.mlir} -> {tensor_type([n, k], ielt)}", "bc")
    gs = k // groups
    view = tensor_type([n, groups, gs], ielt)
    q = E.op(f"tensor.expand_shape {q} [[0], [1, 2]] output_shape [{n}, {groups}, {gs}] : "
             f"{tensor_type([n, k], ielt)} into {view}")  # fmt: skip
    out_ty = tensor_type([n, groups, gs], elt)
    s_elt = scales.mlir_elt

    def body(E, a):
        if format == "e4m3fn":
            v = _e4m3fn(E, a[0])
        else:
            v = E.op(f"arith.uitofp {E.op(f'arith.extui {a[0]} : {ielt} to i32')} : i32 to f32")
        if zeros is not None:
            v = E.op(f"arith.subf {v}, {E.cast_scalar(a[2], s_elt, 'f32')} : f32")
        return [E.cast_scalar(E.op(f"arith.mulf {v}, {E.cast_scalar(a[1], s_elt, 'f32')} : f32"), "f32", elt)]

    group = affine_map(3, [0, 1])
    operands = [(q, view), (scales.name, scales.mlir)] + ([(zeros.name, zeros.mlir)] if zeros is not None else [])
    r = E.generic(
        operands,
        [(E.empty([n, groups, gs], elt), out_ty)],
        [affine_map(3, [0, 1, 2])] + [group] * (len(operands) - 1) + [affine_map(3, [0, 1, 2])],
        ["parallel"] * 3,
        body,
    )[0]
    return T(r, TensorType((n, groups, gs), like.type.dtype), like.elt)


def lowered_with(contract):
    """quantized_linear's lowering around `contract` (product's signature): rms_norm's code (with `norm`), the
    product, then the gate's or the residual's elementwise epilogue (IREE fuses it into the product's dispatch),
    as the separate ops compute them."""

    def lower(E: Emitter, node, ins, ctx):
        x, w, scales, zeros, bias, perm, residual, norm = ins
        out = node.outputs[0].type
        if norm is not None:
            x = rms_norm_of(E, x, norm, node.attrs["eps"], x.rank - 1)
        gate = node.attrs.get("gate", "none")
        joined = TensorType(out.shape[:-1] + (w.shape[0],), out.dtype)
        y = contract(E, node, x, w, scales, zeros, bias, perm, joined, ctx)
        if gate != "none":
            return [gate_halves(E, y, gate, out)]
        return [y if residual is None else epilogue(E, y, residual, "none", out)]

    return lower


def product(E: Emitter, node, x: T, w: T, scales: T, zeros: T, bias, perm, out: TensorType, ctx) -> T:
    """x[..., perm] @ W^T + bias, rounded to x's type. The contraction reads x by group, (..., G, K / G),
    against the dequantized (N, G, K / G) weight, both groups and their features reduced: the weight's
    producer then has the contraction's own loops over it, which IREE fuses (as its dequantized-GEMV tests are
    written); rows symbolic on a GPU padded as linear's, a batch of sequences folded into one row dim as
    linear's."""
    if x.rank >= 2 and _foldable(x, x.rank - 1, ctx):
        fold = lambda x2, out2: product(E, node, x2, w, scales, zeros, bias, perm, out2, ctx)  # noqa: E731
        return _folded(E, x, x.rank - 1, out, fold)
    if perm is not None:
        x = permuted(E, x, perm)
    weight = dequantized(E, w, scales, zeros, node.attrs["bits"], x, node.attrs.get("format", "uint"))
    lead = x.rank - 1
    rows = next((i for i in reversed(range(lead)) if not isinstance(x.shape[i], int)), None)
    x, _, out_c, finish = _padded(E, ctx, x, w, rows, None, (None, None), out, (rows, None))
    n, groups, gs = weight.shape
    sizes = [E.dim(x, i) for i in range(lead)]
    view = TensorType(tuple(x.shape[:lead]) + (groups, gs), x.type.dtype)
    reassoc = [[i] for i in range(lead)] + [[lead, lead + 1]]
    xg = E.op(
        f"tensor.expand_shape {x.name} {reassoc} output_shape [{', '.join(map(str, sizes + [groups, gs]))}] : "
        f"{x.mlir} into {tensor_type(view.shape, x.mlir_elt)}"
    )
    xg = T(xg, view, x.elt)
    storage = x.mlir_elt
    acc = acc_mlir(storage)
    loops = lead + 3  # rows..., n, g, j
    ty = tensor_type(out_c.shape, acc)
    init = _bias_init(E, bias, sizes + [n], ty, acc) if bias is not None else E.filled(sizes + [n], acc, 0)
    r = E.generic(
        [(xg.name, xg.mlir), (weight.name, weight.mlir)],
        [(init, ty)],
        [
            affine_map(loops, list(range(lead)) + [lead + 1, lead + 2]),
            affine_map(loops, [lead, lead + 1, lead + 2]),
            affine_map(loops, range(lead + 1)),
        ],
        ["parallel"] * (lead + 1) + ["reduction"] * 2,
        _mac(storage, acc),
    )[0]
    return E.convert(finish(T(r, out_c, acc)), storage)


lowering("quantized_linear")(lowered_with(product))
