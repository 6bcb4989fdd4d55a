"""Generated lowering of rope: one elementwise linalg.generic over x viewed as pairs.

The rotated part of the head dim is reshaped (tensor.expand_shape, free) so a pair becomes its own
axis: (..., r, 2) when interleaved, (..., 2, r) half-split. Both members of a pair are then plain
affine reads (that axis pinned to 0 and 1), the table index is the pair loop, and the generic stays a
pure elementwise op that IREE vectorises and fuses, with no gathers on x. Only position_ids need a
gather (tensor.extract from the table). With rotary_dim < d the rotated slice is written back into x
(tensor.insert_slice), which leaves the tail dims unchanged.
"""

from __future__ import annotations

from ... import dtypes as dt
from ...frontend.graph import TensorType
from ...frontend.ops.rope import LAYOUTS
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering
from .gathers import _pick, _tuples, scatter_op
from .shape import _clamp

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
        y0, y1 = _rotate_pair(E, x0, x1, c, s)
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


def _rotate_pair(E: Emitter, x0: str, x1: str, c: str, s: str) -> tuple[str, str]:
    """The rotated pair (f32): y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c."""
    y0 = E.op(f"arith.subf {E.op(f'arith.mulf {x0}, {c} : f32')}, {E.op(f'arith.mulf {x1}, {s} : f32')} : f32")
    y1 = E.op(f"arith.addf {E.op(f'arith.mulf {x0}, {s} : f32')}, {E.op(f'arith.mulf {x1}, {c} : f32')} : f32")
    return y0, y1


def _gather(E: Emitter, p, pos_elt: str, p_loop: int, cos: T, sin: T, unsigned: bool = False):
    """cos[p, i] and sin[p, i] in f32, for position p and the pair loop's index i."""
    row = E.op(f"arith.{'index_castui' if unsigned else 'index_cast'} {p} : {pos_elt} to index")
    col = E.op(f"linalg.index {p_loop} : index")
    return [
        E.cast_scalar(E.op(f"tensor.extract {t.name}[{row}, {col}] : {t.mlir}"), t.mlir_elt, F32) for t in (cos, sin)
    ]


# ---- rope_store_kv -----------------------------------------------------------------------------------------


def _slice_heads(E: Emitter, x: T, first: int, n: int) -> T:
    """x[:, :, first:first + n, :] of a (b, t, heads, d) tensor."""
    b, t, _, d = E.dims(x)
    ty = x.type.with_shape((x.shape[0], x.shape[1], n, x.shape[3]))
    r = E.op(
        f"tensor.extract_slice {x.name}[0, 0, {first}, 0] [{_sizes([b, t, n, d])}] [1, 1, 1, 1] "
        f": {x.mlir} to {tensor_type(ty.shape, x.mlir_elt)}"
    )
    return T(r, ty, x.elt)


def _position(E: Emitter, v: str, elt: str, hi) -> str:
    """A position or slot read as an index, clamped to [0, hi]."""
    return _clamp(E, E.op(f"arith.index_cast {v} : {elt} to index"), E.as_index(hi))


@lowering("rope_store_kv")
def lower_rope_store_kv(E: Emitter, node, ins, ctx):
    """RoPE of the query and key heads (one generic: a pair's partner and the table entries read with
    tensor.extract), then one unique-tuple scatter each for the keys and the values."""
    qkv, cache, cos, sin, pos, slots = ins
    a = node.attrs
    hq, hkv, (k0, v0), rot = a["heads"], a["kv_heads"], a["entries"], a["rotary_dim"]
    r, d = rot // 2, qkv.shape[3]
    b, t = E.dims(qkv)[:2]
    storage, tab = qkv.mlir_elt, cos.mlir_elt
    table_rows = E.dim(cos, 0)
    lead = _slice_heads(E, qkv, 0, hq + hkv)
    lead_b = lambda n: "0" if pos.shape[0] == 1 and qkv.shape[0] != 1 else n  # noqa: E731

    def rotate(E: Emitter, args):
        x, p = args[0], args[1]
        i, j, h, k = (E.op(f"linalg.index {n} : index") for n in range(4))
        row = _position(E, p, pos.mlir_elt, E.subi(table_rows, 1))
        rotated = E.op(f"arith.cmpi ult, {k}, {E.index(rot)} : index")
        if a["interleaved"]:
            one = E.index(1)
            partner = E.op(f"arith.xori {k}, {one} : index")
            m = E.op(f"arith.shrui {k}, {one} : index")
            first = E.op(f"arith.cmpi eq, {E.op(f'arith.andi {k}, {one} : index')}, {E.index(0)} : index")
        else:
            first = E.op(f"arith.cmpi ult, {k}, {E.index(r)} : index")
            m = E.op(f"arith.select {first}, {k}, {E.subi(k, r)} : index")
            partner = E.op(f"arith.select {first}, {E.addi(k, r)}, {E.subi(k, r)} : index")
        # Past rotary_dim: the element itself (its partner and table column unused, kept in range).
        partner = E.op(f"arith.select {rotated}, {partner}, {k} : index")
        m = E.op(f"arith.select {rotated}, {m}, {E.index(0)} : index")
        other = E.op(f"tensor.extract {qkv.name}[{i}, {j}, {h}, {partner}] : {qkv.mlir}")
        c, s = (E.cast_scalar(E.op(f"tensor.extract {tb.name}[{row}, {m}] : {tb.mlir}"), tab, F32) for tb in (cos, sin))
        own, partner_value = E.cast_scalar(x, storage, F32), E.cast_scalar(other, storage, F32)
        # The pair (x0, x1): the element is x0 when it is its pair's first member, else x1.
        x0 = E.op(f"arith.select {first}, {own}, {partner_value} : f32")
        x1 = E.op(f"arith.select {first}, {partner_value}, {own} : f32")
        y0, y1 = _rotate_pair(E, x0, x1, c, s)
        y = E.cast_scalar(E.op(f"arith.select {first}, {y0}, {y1} : f32"), F32, storage)
        return [E.op(f"arith.select {rotated}, {y}, {x} : {storage}")]

    out_ty = tensor_type(lead.shape, storage)
    y = E.generic(
        [(lead.name, lead.mlir), (pos.name, pos.mlir)],
        [(E.empty([b, t, hq + hkv, d], storage), out_ty)],
        [affine_map(4, range(4)), affine_map(4, [lead_b(0), 1]), affine_map(4, range(4))],
        ["parallel"] * 4,
        rotate,
    )[0]
    rotated = T(y, lead.type, lead.elt)
    q = _slice_heads(E, rotated, 0, hq)
    for base, new in ((k0, _slice_heads(E, rotated, hq, hkv)), (v0, _slice_heads(E, qkv, hq + hkv, hkv))):
        cache = _store(E, node, cache, new, pos, slots, base)
    return [q, cache]


def _store(E: Emitter, node, cache: T, new: T, pos: T, slots: T | None, base: int) -> T:
    """cache[base + slots[i], h, positions[i, j]] = new[i, j, h] for every token (i, j) and kv head h (slots
    None: slot i)."""
    n_entries, _, n_pos, d = cache.shape
    b, t, hkv, _ = E.dims(new)
    one_row = lambda x: "0" if x.shape[0] == 1 and new.shape[0] != 1 else 0  # noqa: E731

    def coord(E: Emitter, at, j, scalars):
        slot = at[0] if slots is None else _position(E, scalars[1], slots.mlir_elt, n_entries - 1 - base)
        entry = E.minsi(E.addi(slot, base), n_entries - 1)
        return _pick(E, j, [entry, at[2], _position(E, scalars[0], pos.mlir_elt, n_pos - 1)], E.index(0))

    ins = [(pos.name, pos.mlir, affine_map(4, [one_row(pos), 1]))]
    if slots is not None:
        ins.append((slots.name, slots.mlir, affine_map(4, [one_row(slots)])))
    tuples = _tuples(E, [b, t, hkv], new.shape[:3], 3, ins, coord)
    # The tokens' (b, t, kv head) flattened: tuples (n, 3), updates (n, d).
    n = E.product([b, t, hkv])
    flat = n if isinstance(n, int) else "?"
    idx_t = T("", TensorType((flat, 3), dt.i64), "i64")
    upd_t = T("", new.type.with_shape((flat, d)), new.elt)
    idx_t.name = E.op(f"tensor.collapse_shape {tuples.name} [[0, 1, 2], [3]] : {tuples.mlir} into {idx_t.mlir}")
    upd_t.name = E.op(f"tensor.collapse_shape {new.name} [[0, 1, 2], [3]] : {new.mlir} into {upd_t.mlir}")
    return scatter_op(E, cache, idx_t, upd_t, unique=True)
