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
from .linalg import _bias_init, _mac, _padded
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


def dequantized(E: Emitter, w: T, scales: T, zeros: T, bits: int, like: T) -> T:
    """W (N, G, K / G) in `like`'s element type (x's) from the packed (N, K * bits / 8) weight and its (N, G)
    scales and zeros: the 4-bit bytes bitcast to i4 (IREE stores i4 two a byte, the even element in the low
    nibble: the packed layout as it is), viewed by group, widened and scaled in f32, rounded once."""
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
        v = E.op(f"arith.uitofp {E.op(f'arith.extui {a[0]} : {ielt} to i32')} : i32 to f32")
        z, sc = E.cast_scalar(a[2], s_elt, "f32"), E.cast_scalar(a[1], s_elt, "f32")
        return [E.cast_scalar(E.op(f"arith.mulf {E.op(f'arith.subf {v}, {z} : f32')}, {sc} : f32"), "f32", elt)]

    group = affine_map(3, [0, 1])
    r = E.generic(
        [(q, view), (scales.name, scales.mlir), (zeros.name, zeros.mlir)],
        [(E.empty([n, groups, gs], elt), out_ty)],
        [affine_map(3, [0, 1, 2]), group, group, affine_map(3, [0, 1, 2])],
        ["parallel"] * 3,
        body,
    )[0]
    return T(r, TensorType((n, groups, gs), like.type.dtype), like.elt)


@lowering("quantized_linear")
def _lower_quantized_linear(E: Emitter, node, ins, ctx):
    """rms_norm's code (with `norm`), the product, then the gate's or the residual's elementwise epilogue (IREE
    fuses it into the product's dispatch), as the separate ops compute them."""
    x, w, scales, zeros, bias, perm, residual, norm = ins
    out = node.outputs[0].type
    if norm is not None:
        x = rms_norm_of(E, x, norm, node.attrs["eps"], x.rank - 1)
    gate = node.attrs.get("gate", "none")
    joined = TensorType(out.shape[:-1] + (w.shape[0],), out.dtype)
    y = product(E, node, x, w, scales, zeros, bias, perm, joined, ctx)
    if gate != "none":
        return [gate_halves(E, y, gate, out)]
    return [y if residual is None else epilogue(E, y, residual, "none", out)]


def product(E: Emitter, node, x: T, w: T, scales: T, zeros: T, bias, perm, out: TensorType, ctx) -> T:
    """x[..., perm] @ W^T + bias, rounded to x's type. The contraction reads x by group, (..., G, K / G),
    against the dequantized (N, G, K / G) weight, both groups and their features reduced: the weight's
    producer then has the contraction's own loops over it, which IREE fuses (as its dequantized-GEMV tests are
    written); rows symbolic on a GPU padded as linear's."""
    if perm is not None:
        x = permuted(E, x, perm)
    weight = dequantized(E, w, scales, zeros, node.attrs["bits"], x)
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
