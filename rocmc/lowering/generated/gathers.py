"""Generated lowering of take_along_axis and gather_nd: a linalg.generic over the result reading x with
tensor.extract at indices wrapped (negative) and clamped, as `gather` does."""
from __future__ import annotations

from ..emitter import Emitter, T, affine_map
from ..registry import lowering
from .shape import _clamp, _gather_generic


def _index(E: Emitter, scalar: str, elt: str, n) -> str:
    """An index read from the indices tensor: negative counts from the end once, then clamped to [0, n-1]."""
    n = E.as_index(n)
    i = E.op(f"arith.index_cast {scalar} : {elt} to index")
    neg = E.op(f"arith.cmpi slt, {i}, {E.index(0)} : index")
    i = E.op(f"arith.select {neg}, {E.op(f'arith.addi {i}, {n} : index')}, {i} : index")
    return _clamp(E, i, E.op(f"arith.subi {n}, {E.index(1)} : index"))


@lowering("take_along_axis")
def _lower_take_along_axis(E: Emitter, node, ins, ctx):
    x, idx = ins
    axis, out = node.attrs["axis"], node.outputs[0].type
    n = E.dim(x, axis)

    def coords(E, at, scalars):
        return at[:axis] + [_index(E, scalars[0], idx.mlir_elt, n)] + at[axis + 1:]
    r = _gather_generic(E, E.dims(idx), x.mlir_elt, x, coords,
                        [(idx.name, idx.mlir, affine_map(out.rank, range(out.rank)))])
    return [T(r, out, x.elt)]


@lowering("gather_nd")
def _lower_gather_nd(E: Emitter, node, ins, ctx):
    x, idx = ins
    b, out = node.attrs["batch_dims"], node.outputs[0].type
    k = idx.shape[-1]
    lead = idx.rank - 1                       # result dims from the index tuples
    sizes = E.dims(idx)[:-1] + E.dims(x)[b + k:]
    dims = [E.dim(x, b + j) for j in range(k)]

    def coords(E, at, _):
        where = []
        for j in range(k):
            c = E.index(j)
            pos = ", ".join(at[:lead] + [c])
            v = E.op(f"tensor.extract {idx.name}[{pos}] : {idx.mlir}")
            where.append(_index(E, v, idx.mlir_elt, dims[j]))
        return at[:b] + where + at[lead:]
    r = _gather_generic(E, sizes, x.mlir_elt, x, coords)
    return [T(r, out, x.elt)]
