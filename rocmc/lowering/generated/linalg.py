"""Generated lowering of matmul and linear: one contraction linalg.generic each.

A generic with explicit indexing maps covers every case without reshapes: 1-D operands (the dim is
simply absent from the loop nest), broadcast batch dims (a size-1 dim indexes with the constant 0),
transpose flags (swapped map results) and linear's W^T. IREE recognises these generics as
contractions and tiles them like named matmuls. f16/bf16 accumulate into an f32 `outs` tensor and
are rounded once at the end: with f16 `outs`, a K=4096 matmul loses ~1e-2 relative accuracy.
"""
from __future__ import annotations

from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering
from .elementwise import compute_elt


def _is_float(elt: str) -> bool:
    return elt in ("f16", "bf16", "f32", "f64")


def _mac(storage: str, acc: str):
    """Body of a multiply-accumulate generic: acc + a * b in the accumulator type."""
    f = _is_float(acc)

    def body(E: Emitter, args):
        a, b = (E.cast_scalar(v, storage, acc) for v in args[:2])
        c = args[2]
        p = E.op(f"{'arith.mulf' if f else 'arith.muli'} {a}, {b} : {acc}")
        return [E.op(f"{'arith.addf' if f else 'arith.addi'} {c}, {p} : {acc}")]
    return body


def _operand_map(t: T, out_shape, nloops: int, batch: int, tail) -> str:
    """Indexing map of an operand: its leading (batch) dims right-aligned onto loops [0, batch) and
    broadcast where they are 1 and the result's are not, then the loops of its trailing dims."""
    lead = t.shape[:t.rank - len(tail)]
    res = []
    for j, d in enumerate(lead):
        loop = batch - len(lead) + j
        res.append("0" if d == 1 and out_shape[loop] != 1 else loop)
    return affine_map(nloops, res + list(tail))


def _batch_sizes(E: Emitter, out_shape, batch: int, operands) -> list:
    """Sizes of the batch loops: static ints, or tensor.dim of an operand that has the dim unbroadcast."""
    sizes = []
    for i in range(batch):
        d = out_shape[i]
        if isinstance(d, int):
            sizes.append(d)
            continue
        t, lead = next((t, n) for t, n in operands if n - batch + i >= 0 and t.shape[n - batch + i] == d)
        sizes.append(E.dim(t, lead - batch + i))
    return sizes


def _contract(E: Emitter, a: T, b: T, maps, nloops: int, init: tuple, out_type) -> T:
    storage = a.mlir_elt
    acc = compute_elt(storage)
    name, ty = init
    iters = ["parallel"] * (nloops - 1) + ["reduction"]
    r = E.generic([(a.name, a.mlir), (b.name, b.mlir)], [(name, ty)], maps + [affine_map(nloops, range(nloops - 1))],
                  iters, _mac(storage, acc))
    return E.convert(T(r[0], out_type, acc), storage)


@lowering("matmul")
def lower_matmul(E: Emitter, node, ins, ctx):
    a, b = ins
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    out = node.outputs[0].type
    has_m, has_n = a.rank >= 2, b.rank >= 2
    batch = out.rank - has_m - has_n
    m, n, k = batch, batch + has_m, batch + has_m + has_n
    nloops = k + 1
    a_tail = ((k, m) if ta else (m, k)) if has_m else (k,)
    b_tail = ((n, k) if tb else (k, n)) if has_n else (k,)
    maps = [_operand_map(a, out.shape, nloops, batch, a_tail), _operand_map(b, out.shape, nloops, batch, b_tail)]
    sizes = _batch_sizes(E, out.shape, batch, [(a, a.rank - 2), (b, b.rank - 2)])
    if has_m:
        sizes.append(E.dim(a, a.rank - 1 if ta else a.rank - 2))
    if has_n:
        sizes.append(E.dim(b, b.rank - 2 if tb else b.rank - 1))
    acc = compute_elt(a.mlir_elt)
    init = (E.filled(sizes, acc, 0), tensor_type(out.shape, acc))
    return [_contract(E, a, b, maps, nloops, init, out)]


@lowering("linear")
def lower_linear(E: Emitter, node, ins, ctx):
    x, w, bias = ins
    out = node.outputs[0].type
    lead = x.rank - 1
    n, k = lead, lead + 1
    nloops = k + 1
    maps = [affine_map(nloops, list(range(lead)) + [k]), affine_map(nloops, [n, k])]
    sizes = [E.dim(x, i) for i in range(lead)] + [E.dim(w, 0)]
    acc = compute_elt(x.mlir_elt)
    ty = tensor_type(out.shape, acc)
    init = _bias_init(E, bias, sizes, ty, acc) if bias is not None else E.filled(sizes, acc, 0)
    return [_contract(E, x, w, maps, nloops, (init, ty), out)]


def _bias_init(E: Emitter, bias: T, sizes, ty: str, acc: str) -> str:
    """The accumulator starts as the bias broadcast over the rows, so the add costs no extra pass."""
    rank = len(sizes)
    empty = E.empty(sizes, acc)
    src = bias.mlir_elt
    r = E.generic([(bias.name, bias.mlir)], [(empty, ty)], [affine_map(rank, [rank - 1]), affine_map(rank, range(rank))],
                  ["parallel"] * rank, lambda E, a: [E.cast_scalar(a[0], src, acc)])
    return r[0]
