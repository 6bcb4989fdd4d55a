"""Generated lowering of rope: one elementwise linalg.generic over x viewed as pairs.

The rotated part of the head dim is reshaped (tensor.expand_shape, free) so a pair becomes its own
axis: (..., r, 2) when interleaved, (..., 2, r) half-split. Both members of a pair are then plain
affine reads (that axis pinned to 0 and 1), the table index is the pair loop, and the generic stays a
pure elementwise op that IREE vectorises and fuses, with no gathers on x. Only position_ids need a
gather (tensor.extract from the table). With rotary_dim < d the rotated slice is written back into x
(tensor.insert_slice), which leaves the tail dims unchanged.
"""

from __future__ import annotations

from ...frontend.ops.rope import LAYOUTS
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering

F32 = "f32"


def _sizes(sizes) -> str:
    return ", ".join(str(s) for s in sizes)


def _slice(E: Emitter, t: T, sizes, elt: str) -> str:
    """The leading block t[0:sizes[0], 0:sizes[1], ...]."""
    zeros, ones = ", ".join("0" for _ in sizes), ", ".join("1" for _ in sizes)
    ty = tensor_type([s if isinstance(s, int) else "?" for s in sizes], elt)
    return E.op(f"tensor.extract_slice {t.name}[{zeros}] [{_sizes(sizes)}] [{ones}] : {t.mlir} to {ty}")


def _table_operand(E: Emitter, table: T, x: T, b_axis: int, t_axis: int, nloops: int, t_loop: int, p_loop: int):
    """A cos/sin table as a generic input: cut to the t rows x uses (so loop bounds stay x's) and
    indexed by (batch, time, pair) loops; a batch of 1 broadcasts."""
    t_size = E.dim(x, t_axis)
    rows_axis = table.rank - 2
    sizes = [E.dim(table, i) for i in range(table.rank)]
    sizes[rows_axis] = t_size
    name = table.name if table.shape[rows_axis] == x.shape[t_axis] else _slice(E, table, sizes, table.mlir_elt)
    shape = list(table.shape)
    shape[rows_axis] = x.shape[t_axis]
    ty = tensor_type(shape, table.mlir_elt)
    res = [t_loop, p_loop]
    if table.rank == 3:
        res.insert(0, "0" if table.shape[0] == 1 and x.shape[b_axis] != 1 else b_axis)
    return (name, ty), affine_map(nloops, res)


@lowering("rope")
def lower_rope(E: Emitter, node, ins, ctx):
    x, cos, sin, pos = ins
    interleaved, rot = node.attrs["interleaved"], node.attrs["rotary_dim"]
    b_axis, t_axis = LAYOUTS[node.attrs["layout"]]
    storage = x.mlir_elt
    d, r = x.shape[3], rot // 2
    lead = [E.dim(x, i) for i in range(3)]
    part = x.name if rot == d else _slice(E, x, lead + [rot], storage)
    part_ty = tensor_type(list(x.shape[:3]) + [rot], storage)

    # Pair view: loops (d0, d1, d2, pair index, member) or (d0, d1, d2, member, pair index).
    pair_shape = [r, 2] if interleaved else [2, r]
    p_loop, c_loop = (3, 4) if interleaved else (4, 3)
    view_ty = tensor_type(list(x.shape[:3]) + pair_shape, storage)
    view = E.op(
        f"tensor.expand_shape {part} [[0], [1], [2], [3, 4]] output_shape [{_sizes(lead + pair_shape)}] "
        f": {part_ty} into {view_ty}"
    )

    def member(c):
        res = [0, 1, 2, 3, 4]
        res[c_loop] = str(c)
        return affine_map(5, res)

    inputs = [(view, view_ty), (view, view_ty)]
    maps = [member(0), member(1)]
    if pos is None:
        for table in (cos, sin):
            operand, m = _table_operand(E, table, x, b_axis, t_axis, 5, t_axis, p_loop)
            inputs.append(operand)
            maps.append(m)
    else:
        inputs.append((pos.name, pos.mlir))
        maps.append(affine_map(5, ["0" if pos.shape[0] == 1 and x.shape[b_axis] != 1 else b_axis, t_axis]))
    maps.append(affine_map(5, range(5)))
    out = E.empty(lead + pair_shape, storage)

    def body(E: Emitter, a):
        x0, x1 = (E.cast_scalar(v, storage, F32) for v in a[:2])
        if pos is None:
            c, s = (E.cast_scalar(v, cos.mlir_elt, F32) for v in a[2:4])
        else:
            c, s = _gather(E, a[2], pos.mlir_elt, p_loop, cos, sin, pos.type.dtype.unsigned)
        y0 = E.op(f"arith.subf {E.op(f'arith.mulf {x0}, {c} : f32')}, {E.op(f'arith.mulf {x1}, {s} : f32')} : f32")
        y1 = E.op(f"arith.addf {E.op(f'arith.mulf {x0}, {s} : f32')}, {E.op(f'arith.mulf {x1}, {c} : f32')} : f32")
        first = E.op(f"arith.cmpi eq, {E.op(f'linalg.index {c_loop} : index')}, {E.index(0)} : index")
        return [E.cast_scalar(E.op(f"arith.select {first}, {y0}, {y1} : f32"), F32, storage)]

    y = E.generic(inputs, [(out, view_ty)], maps, ["parallel"] * 5, body)[0]
    rotated = E.op(f"tensor.collapse_shape {y} [[0], [1], [2], [3, 4]] : {view_ty} into {part_ty}")
    if rot == d:
        return [T(rotated, x.type)]
    zeros, ones = "0, 0, 0, 0", "1, 1, 1, 1"
    merged = E.op(
        f"tensor.insert_slice {rotated} into {x.name}[{zeros}] [{_sizes(lead + [rot])}] [{ones}] "
        f": {part_ty} into {x.mlir}"
    )
    return [T(merged, x.type)]


def _gather(E: Emitter, p, pos_elt: str, p_loop: int, cos: T, sin: T, unsigned: bool = False):
    """cos[p, i] and sin[p, i] in f32, for position p and the pair loop's index i."""
    row = E.op(f"arith.{'index_castui' if unsigned else 'index_cast'} {p} : {pos_elt} to index")
    col = E.op(f"linalg.index {p_loop} : index")
    return [
        E.cast_scalar(E.op(f"tensor.extract {t.name}[{row}, {col}] : {t.mlir}"), t.mlir_elt, F32) for t in (cos, sin)
    ]
