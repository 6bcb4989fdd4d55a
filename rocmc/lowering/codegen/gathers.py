"""Generated lowering of the gathers and scatters.

take_along_axis and gather_nd: a linalg.generic over the result reading x with tensor.extract at indices
wrapped (negative) and clamped, as `gather` does.

scatter_elements and scatter_nd: iree_linalg_ext.scatter, whose region combines an update with the
value in place. Its indices are first rewritten by a generic (in a dispatch region of its own, see
_tuples) into full, wrapped and clamped index tuples (i64), since the op leaves out-of-range indices
undefined. The scatter is marked
unique_indices(false): IREE then applies the updates of one index tuple in order instead of
distributing them over threads, which makes duplicates deterministic (the last "none" update wins),
at the price of running the index tuples serially (each tuple's slice is still parallel). A scatter_nd
whose caller promises unique tuples (unique_indices=True) is marked so and runs them in parallel
(H100, a decode step's KV write of 32 tuples x 128 elements: 54 us serial).
"""

from __future__ import annotations

from ... import dtypes as dt
from ...frontend.graph import TensorType
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering
from .shape import _check_le, _check_not_empty, _clamp, _gather_generic


def _index(E: Emitter, scalar: str, elt: str, n, unsigned: bool = False) -> str:
    """An index read from the indices tensor: negative counts from the end once, then clamped to [0, n-1]."""
    n = E.as_index(n)
    if unsigned:
        i = E.op(f"arith.index_castui {scalar} : {elt} to index")
    else:
        i = E.op(f"arith.index_cast {scalar} : {elt} to index")
        neg = E.op(f"arith.cmpi slt, {i}, {E.index(0)} : index")
        i = E.op(f"arith.select {neg}, {E.addi(i, n)}, {i} : index")
    return _clamp(E, i, E.subi(n, 1))


@lowering("take_along_axis")
def _lower_take_along_axis(E: Emitter, node, ins, ctx):
    x, idx = ins
    axis, out = node.attrs["axis"], node.outputs[0].type
    n = E.dim(x, axis)

    def coords(E, at, scalars):
        return at[:axis] + [_index(E, scalars[0], idx.mlir_elt, n)] + at[axis + 1 :]

    r = _gather_generic(
        E, E.dims(idx), x.mlir_elt, x, coords, [(idx.name, idx.mlir, affine_map(out.rank, range(out.rank)))]
    )
    return [T(r, out, x.elt)]


@lowering("gather_nd")
def _lower_gather_nd(E: Emitter, node, ins, ctx):
    x, idx = ins
    b, out = node.attrs["batch_dims"], node.outputs[0].type
    k = idx.shape[-1]
    lead = idx.rank - 1  # result dims from the index tuples
    sizes = E.dims(idx)[:-1] + E.dims(x)[b + k :]
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


# ---- scatters ----------------------------------------------------------------------------------


def _combine(E: Emitter, reduction: str, new: str, old: str, elt: str, unsigned: bool) -> str:
    """The scatter region's result: the update `new` combined with the value `old` in place."""
    if reduction == "none":
        return new
    acc = dt.acc_mlir(elt)
    a, b = E.cast_scalar(new, elt, acc), E.cast_scalar(old, elt, acc)
    if dt.is_float_mlir(acc):
        op = {"add": "addf", "mul": "mulf", "max": "maximumf", "min": "minimumf"}[reduction]
    else:
        op = {
            "add": "addi",
            "mul": "muli",
            "max": "maxui" if unsigned else "maxsi",
            "min": "minui" if unsigned else "minsi",
        }[reduction]
    return E.cast_scalar(E.op(f"arith.{op} {a}, {b} : {acc}"), acc, elt)


def _scatter(E: Emitter, node, data: T, tuples: T, upd: T) -> T:
    """A scatter node's iree_linalg_ext.scatter (see scatter_op)."""
    reduction, unique = node.attrs["reduction"], bool(node.attrs.get("unique_indices"))
    return scatter_op(E, data, tuples, upd, reduction, unique, node.inputs[0].dtype.unsigned)


def scatter_op(
    E: Emitter, data: T, tuples: T, upd: T, reduction: str = "none", unique: bool = False, unsigned: bool = False
) -> T:
    """iree_linalg_ext.scatter of `upd` (batch dims, then the slice) into `data` at the index tuples
    `tuples` (batch dims, then the tuple length k, which maps to data's first k dims), combined by `reduction`;
    `unique`: the caller promises no two tuples are equal (applied in parallel)."""
    k, elt = tuples.shape[-1], data.mlir_elt
    r = E.fresh("sc")
    with E.region(
        f"{r} = iree_linalg_ext.scatter dimension_map = {list(range(k))} "
        f"unique_indices({'true' if unique else 'false'}) "
        f"ins({upd.name}, {tuples.name} : {upd.mlir}, {tuples.mlir}) outs({data.name} : {data.mlir})",
        f"-> {data.mlir}",
        [elt, elt],
    ) as (a, b):
        E.emit(f"iree_linalg_ext.yield {_combine(E, reduction, a, b, elt, unsigned)} : {elt}")
    return T(r, data.type, data.elt)


def _pick(E: Emitter, j: str, values: list, default: str) -> str:
    """values[j] for a run-time position j (an index), as a chain of selects; `default` where a value is None."""
    out = default
    for i, v in enumerate(values):
        if v is not None:
            at = E.op(f"arith.cmpi eq, {j}, {E.index(i)} : index")
            out = E.op(f"arith.select {at}, {E.as_index(v)}, {out} : index")
    return out


def _tuples(E: Emitter, batch: list, batch_dims: tuple, k: int, ins, body) -> T:
    """An i64 tensor of index tuples (batch..., k) whose element (p..., j) is body(E, p, j, in scalars)."""
    rank = len(batch) + 1
    ty = TensorType(tuple(batch_dims) + (k,), dt.i64)

    def cast(E, args):
        at = [E.op(f"linalg.index {i} : index") for i in range(rank)]
        return [E.op(f"arith.index_cast {body(E, at[:-1], at[-1], args[: len(ins)])} : index to i64")]

    maps = [m for _, _, m in ins] + [affine_map(rank, range(rank))]
    mlir = tensor_type(ty.shape, "i64")
    dynamic = [s for s in batch if not isinstance(s, int)]
    dims = f"{{{', '.join(dynamic)}}}" if dynamic else ""
    # The tuples get a dispatch of their own. Fused into the scatter's (IREE's choice otherwise), the
    # producer of the whole index tensor goes to GPU shared memory, since a non-unique scatter is not
    # tiled along the tuples: with a symbolic tuple count IREE 3.13 asked for 2**57 bytes of it
    # (gfx942 and sm_80), and a static count fails once the tuples exceed 64 KB.
    r = E.fresh("tuples")
    with E.region(f"{r} = flow.dispatch.region -> ({mlir}{dims})"):
        inner = E.generic(
            [(n, t) for n, t, _ in ins], [(E.empty(batch + [k], "i64"), mlir)], maps, ["parallel"] * rank, cast
        )[0]
        E.emit(f"flow.return {inner} : {mlir}")
    return T(r, ty, "i64")


@lowering("scatter_elements")
def _lower_scatter_elements(E: Emitter, node, ins, ctx):
    data, idx, upd = ins
    axis, rank = node.attrs["axis"], data.rank
    dims, sizes = E.dims(data), E.dims(idx)
    if 0 in idx.shape:
        return [data]
    for i in range(rank):
        if i != axis:
            _check_le(E, node, sizes[i], dims[i], f"dim {i} of 'indices' is larger than that of 'data'")
    _check_not_empty(E, node, dims[axis], sizes, f"scatters into axis {axis} of 'data', which is empty in this call")
    unsigned = node.inputs[1].dtype.unsigned

    def coord(E, at, j, scalars):
        return _pick(
            E,
            j,
            [None if i == axis else at[i] for i in range(rank)],
            _index(E, scalars[0], idx.mlir_elt, dims[axis], unsigned),
        )

    tuples = _tuples(E, sizes, idx.shape, rank, [(idx.name, idx.mlir, affine_map(rank + 1, range(rank)))], coord)
    return [_scatter(E, node, data, tuples, upd)]


@lowering("scatter_nd")
def _lower_scatter_nd(E: Emitter, node, ins, ctx):
    data, idx, upd = ins
    k, dims, sizes = idx.shape[-1], E.dims(data), E.dims(idx)
    if 0 in idx.shape[:-1]:
        return [data]
    for j in range(k):
        _check_not_empty(E, node, dims[j], sizes[:-1], f"scatters into dim {j} of 'data', which is empty in this call")
    if idx.rank == 1:  # iree_linalg_ext.scatter needs a batch dim: one tuple is a batch of one
        idx, upd = _lead_one(E, idx), _lead_one(E, upd)
        sizes = [1] + sizes
    unsigned = node.inputs[1].dtype.unsigned

    def coord(E, at, j, scalars):
        return _index(E, scalars[0], idx.mlir_elt, _pick(E, j, dims[:k], E.index(1)), unsigned)

    tuples = _tuples(
        E, sizes[:-1], idx.shape[:-1], k, [(idx.name, idx.mlir, affine_map(idx.rank, range(idx.rank)))], coord
    )
    return [_scatter(E, node, data, tuples, upd)]


def _lead_one(E: Emitter, t: T) -> T:
    """t with a leading dim of size 1."""
    ty = t.type.with_shape((1,) + tuple(t.shape))
    groups = [[0, 1]] + [[i + 1] for i in range(1, t.rank)] if t.rank else []
    sizes = [1] + E.dims(t)
    r = E.op(
        f"tensor.expand_shape {t.name} {groups} output_shape [{', '.join(map(str, sizes))}] : "
        f"{t.mlir} into {tensor_type(ty.shape, t.mlir_elt)}"
    )
    return T(r, ty, t.elt)
