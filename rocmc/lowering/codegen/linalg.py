"""Generated lowering of matmul and linear: one contraction linalg.generic each.

A generic with explicit indexing maps covers every case without reshapes: 1-D operands (the dim is
simply absent from the loop nest), broadcast batch dims (a size-1 dim indexes with the constant 0),
transpose flags (swapped map results) and linear's W^T. IREE recognises these generics as
contractions and tiles them like named matmuls. f16/bf16 accumulate into an f32 `outs` tensor and
are rounded once at the end: with f16 `outs`, a K=4096 matmul loses ~1e-2 relative accuracy.
"""

from __future__ import annotations

from ...dtypes import acc_mlir
from ...frontend.graph import TensorType
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering
from .padding import multiple_for, pad_axes, slice_to


def _mac(storage: str, acc: str):
    """Body of a multiply-accumulate generic: acc + a * b in the accumulator type."""

    def body(E: Emitter, args):
        a, b = (E.cast_scalar(v, storage, acc) for v in args[:2])
        c = args[2]
        return [E.add(c, E.mul(a, b, acc), acc)]

    return body


def _operand_map(t: T, out_shape, nloops: int, batch: int, tail) -> str:
    """Indexing map of an operand: its leading (batch) dims right-aligned onto loops [0, batch) and
    broadcast where they are 1 and the result's are not, then the loops of its trailing dims."""
    lead = t.shape[: t.rank - len(tail)]
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


def _contract(E: Emitter, a: T, b: T, maps, nloops: int, init: tuple, out_type, finish=lambda r: r) -> T:
    storage = a.mlir_elt
    acc = acc_mlir(storage)
    name, ty = init
    iters = ["parallel"] * (nloops - 1) + ["reduction"]
    r = E.generic(
        [(a.name, a.mlir), (b.name, b.mlir)],
        [(name, ty)],
        maps + [affine_map(nloops, range(nloops - 1))],
        iters,
        _mac(storage, acc),
    )
    return E.convert(finish(T(r[0], out_type, acc)), storage)


def _padded(E: Emitter, ctx, x: T, w: T, x_rows, w_cols, k_axes, out: TensorType, out_axes, x_transposed: bool = False):
    """The contraction's symbolic M (axis x_rows of x), N (axis w_cols of w) and a K symbolic in both
    operands (k_axes) zero-padded to the target's tile multiple (padding.py). Returns the
    operands, the type of the result to compute and a function slicing that result back to `out`;
    out_axes = the result axes of M and N (None where absent).

    On the CPU only M of an x in row order is padded: that is what data tiling needs, and IREE 3.13's
    data tiling fails with a padded K or N (the module then falls back to no data tiling) and runs out
    of memory compiling a padded transposed x (over 14 GB for a 2-D f16 matmul)."""
    keep = (x, w, out, lambda r: r)
    m = multiple_for(ctx.target)
    if ctx.target.kind == "cpu":
        if x_transposed:
            return keep
        w_cols, k_axes = None, (None, None)
    xk, wk = k_axes
    pad_k = xk is not None and not isinstance(x.shape[xk], int) and not isinstance(w.shape[wk], int)
    px = pad_axes(E, x, [a for a in (x_rows,) if a is not None] + [xk] * pad_k, m)
    pw = pad_axes(E, w, [a for a in (w_cols,) if a is not None] + [wk] * pad_k, m)
    if px is x and pw is w:
        return keep
    shape, real = list(out.shape), [None] * out.rank
    for o, (t, pt, a) in zip(out_axes, ((x, px, x_rows), (w, pw, w_cols))):
        if o is not None and a is not None and pt is not t:
            shape[o] = pt.shape[a]
            real[o] = E.dim(t, a)
    return px, pw, out.with_shape(shape), lambda r: slice_to(E, r, out, real)


@lowering("matmul")
def lower_matmul(E: Emitter, node, ins, ctx):
    """a @ b (either transposed); a batch of sequences against one matrix (a's leading dims, b 2-D) is one GEMM
    over their rows (_folded)."""
    a, b = ins
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    out = node.outputs[0].type
    if a.rank >= 2 and b.rank == 2 and not ta and _foldable(a, a.rank - 1, ctx):
        return [_folded(E, a, a.rank - 1, out, lambda a2, out2: _matmul(E, ctx, a2, b, ta, tb, out2))]
    return [_matmul(E, ctx, a, b, ta, tb, out)]


def _matmul(E: Emitter, ctx, a: T, b: T, ta: bool, tb: bool, out: TensorType) -> T:
    has_m, has_n = a.rank >= 2, b.rank >= 2
    batch = out.rank - has_m - has_n
    m, n, k = batch, batch + has_m, batch + has_m + has_n
    a_rows = (a.rank - 1 if ta else a.rank - 2) if has_m else None
    b_cols = (b.rank - 2 if tb else b.rank - 1) if has_n else None
    a_k = (a.rank - 2 if ta else a.rank - 1) if has_m else 0
    b_k = (b.rank - 1 if tb else b.rank - 2) if has_n else 0
    a, b, out_c, finish = _padded(
        E, ctx, a, b, a_rows, b_cols, (a_k, b_k), out, (m if has_m else None, n if has_n else None), x_transposed=ta
    )
    nloops = k + 1
    a_tail = ((k, m) if ta else (m, k)) if has_m else (k,)
    b_tail = ((n, k) if tb else (k, n)) if has_n else (k,)
    maps = [_operand_map(a, out.shape, nloops, batch, a_tail), _operand_map(b, out.shape, nloops, batch, b_tail)]
    sizes = _batch_sizes(E, out.shape, batch, [(a, a.rank - 2), (b, b.rank - 2)])
    if has_m:
        sizes.append(E.dim(a, a_rows))
    if has_n:
        sizes.append(E.dim(b, b_cols))
    acc = acc_mlir(a.mlir_elt)
    init = (E.filled(sizes, acc, 0), tensor_type(out_c.shape, acc))
    return _contract(E, a, b, maps, nloops, init, out_c, finish)


def _foldable(x: T, lead: int, ctx) -> bool:
    """Whether x's `lead` leading dims (the rows of a contraction against a weight without them) are computed
    through _folded: two or more not of static size 1 (a batch of sequences), or on a GPU one symbolic row dim
    alone (2-D). Measured on an H200 (an lm_head, 1024 x 4096 @ 4096 x 32000, f16; BENCHMARKS.md): a batch of
    sequences left as a loop over a broadcast weight, or a 2-D GEMM of symbolic rows, IREE 3.13's sm_80 code
    ran at 205 ms without matrix-unit tiles; the same rows as (1, rows, k) at 29 ms, with them."""
    rows = [d for d in x.shape[:lead] if d != 1]
    return len(rows) > 1 or (ctx.target.kind != "cpu" and lead == 1 and not isinstance(x.shape[0], int))


def _folded(E: Emitter, x: T, lead: int, out: TensorType, contract) -> T:
    """contract(x2, out2) over x's `lead` leading dims as one row dim behind a unit batch dim: x2 (1, rows, ...),
    out2 the result's type (1, rows, ...); its result back in `out`'s shape."""
    sizes = E.dims(x)[:lead]
    rows = E.product(sizes)
    flat = rows if isinstance(rows, int) else "?"

    def view(t: T, shape: tuple, sizes: list, to_unit: bool) -> str:
        """t (its `lead` row dims, then the rest) as (1, rows, rest) (to_unit), or back."""
        tail = [E.dim(t, i) for i in range((2 if not to_unit else lead), t.rank)]
        flat_ty = tensor_type((flat,) + tuple(t.shape[(lead if to_unit else 2) :]), t.mlir_elt)
        name = t.name
        if to_unit:
            if lead > 1:
                name = E.op(f"tensor.collapse_shape {name} {_row_groups(lead, t.rank)} : {t.mlir} into {flat_ty}")
            out_sizes = [1, rows] + tail
            src, dst = (flat_ty if lead > 1 else t.mlir), tensor_type(shape, t.mlir_elt)
            return E.op(
                f"tensor.expand_shape {name} {_row_groups(2, len(shape))} output_shape "
                f"[{', '.join(map(str, out_sizes))}] : {src} into {dst}"
            )
        name = E.op(f"tensor.collapse_shape {name} {_row_groups(2, t.rank)} : {t.mlir} into {flat_ty}")
        if lead == 1:
            return name
        dst = tensor_type(shape, t.mlir_elt)
        return E.op(
            f"tensor.expand_shape {name} {_row_groups(lead, len(shape))} output_shape "
            f"[{', '.join(map(str, sizes + tail))}] : {flat_ty} into {dst}"
        )

    x_shape = (1, flat) + tuple(x.shape[lead:])
    x2 = T("", x.type.with_shape(x_shape), x.elt)
    x2.name = view(x, x_shape, sizes, True)
    if not isinstance(rows, int):
        E.set_dim(x2, 1, rows)
    y = contract(x2, out.with_shape((1, flat) + tuple(out.shape[lead:])))
    res = T("", out, y.elt)
    res.name = view(y, out.shape, sizes, False)
    return res


def _row_groups(lead: int, rank: int) -> str:
    """The reassociation of a rank-`rank` tensor's `lead` leading dims as one dim, the others each their own."""
    return "[" + ", ".join([str(list(range(lead)))] + [f"[{i}]" for i in range(lead, rank)]) + "]"


@lowering("linear")
def lower_linear(E: Emitter, node, ins, ctx, out: TensorType | None = None):
    """x @ w^T + bias; `out`: the result's type when it is not the node's (gated_linear's joined product). A
    batch of sequences (two or more row dims) is one GEMM over their rows (_folded)."""
    x, w, bias = ins
    out = node.outputs[0].type if out is None else out
    if x.rank >= 2 and _foldable(x, x.rank - 1, ctx):
        return [_folded(E, x, x.rank - 1, out, lambda x2, out2: _linear(E, ctx, x2, w, bias, out2))]
    return [_linear(E, ctx, x, w, bias, out)]


def _linear(E: Emitter, ctx, x: T, w: T, bias: T | None, out: TensorType) -> T:
    lead = x.rank - 1
    rows = next((i for i in reversed(range(lead)) if not isinstance(x.shape[i], int)), None)
    x, w, out_c, finish = _padded(E, ctx, x, w, rows, 0, (lead, 1), out, (rows, lead))
    n, k = lead, lead + 1
    nloops = k + 1
    maps = [affine_map(nloops, list(range(lead)) + [k]), affine_map(nloops, [n, k])]
    sizes = [E.dim(x, i) for i in range(lead)] + [E.dim(w, 0)]
    acc = acc_mlir(x.mlir_elt)
    ty = tensor_type(out_c.shape, acc)
    if bias is not None and not isinstance(w.shape[0], int) and w.shape[0] != out.shape[-1]:
        bias = pad_axes(E, bias, [0], multiple_for(ctx.target))
    init = _bias_init(E, bias, sizes, ty, acc) if bias is not None else E.filled(sizes, acc, 0)
    return _contract(E, x, w, maps, nloops, (init, ty), out_c, finish)


def _bias_init(E: Emitter, bias: T, sizes, ty: str, acc: str) -> str:
    """The accumulator starts as the bias broadcast over the rows, so the add costs no extra pass."""
    rank = len(sizes)
    empty = E.empty(sizes, acc)
    src = bias.mlir_elt
    r = E.generic(
        [(bias.name, bias.mlir)],
        [(empty, ty)],
        [affine_map(rank, [rank - 1]), affine_map(rank, range(rank))],
        ["parallel"] * rank,
        lambda E, a: [E.cast_scalar(a[0], src, acc)],
    )
    return r[0]
