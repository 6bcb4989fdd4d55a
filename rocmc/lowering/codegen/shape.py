"""Generated lowering of shape and data-movement ops: tensor dialect where it says what happens
(expand/collapse_shape, extract/insert_slice, pad), linalg.transpose, and linalg.generic with
tensor.extract for the gathers (gather, reflect/edge pad, negative-step slices).

Sizes are ints when static and `index` SSA values otherwise; the Emitter's index arithmetic folds the
former and emits arith for the latter, so one code path serves static and symbolic shapes.
"""

from __future__ import annotations

from ... import symbolic
from ...errors import LoweringError
from ...frontend.graph import TensorType
from ...frontend.ops.shape import product, size_of, slice_bounds
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering


def dim_value(E: Emitter, ctx, d, *sources: T):
    """Run-time size of graph dim `d`: an int, the same dim of a source tensor, or a product of
    symbols read from the function's arguments (every symbol comes from a graph input)."""
    if isinstance(d, int):
        return d
    for t in sources:
        if d in t.shape:
            return E.dim(t, t.shape.index(d))
    s = size_of(d)
    if s.atoms == (d,):
        for k, v in enumerate(ctx.graph.inputs):
            if d in v.shape:
                return E.dim(T(f"%arg{k}", v.type, v.dtype.abi_mlir), v.shape.index(d))
        if d not in ctx.symbols:  # a sum, a floor division, ...: computed from the symbols' sizes
            return symbolic.parse(d, LoweringError).compute(E.ix, ctx.symbols)
        raise LoweringError(f"size {d!r} is neither in an operand nor a graph input's symbol")
    return E.muli(E.product(dim_value(E, ctx, a, *sources) for a in s.atoms), s.coef)


@lowering("sizes")
def _lower_sizes(E: Emitter, node, ins, ctx):
    out = node.outputs[0].type
    elt = out.dtype.mlir
    values = [E.op(f"arith.index_cast {E.as_index(dim_value(E, ctx, d))} : index to {elt}") for d in node.attrs["dims"]]
    r = E.op(f"tensor.from_elements {', '.join(values)} : {tensor_type(out.shape, elt)}")
    return [T(r, out)]


def _out_sizes(E: Emitter, ctx, x: T, dims, total) -> list:
    """Values of `dims` whose element count is `total()`; one unknown is found by division."""
    vals = [d if isinstance(d, int) else E.dim(x, x.shape.index(d)) if d in x.shape else None for d in dims]
    unknown = [i for i, v in enumerate(vals) if v is None]
    if len(unknown) == 1:
        vals[unknown[0]] = E.divsi(total(), E.product(v for v in vals if v is not None))
    else:
        vals = [dim_value(E, ctx, d, x) if v is None else v for d, v in zip(dims, vals)]
    return vals


# ---- reshape -------------------------------------------------------------------------------


def reshape_groups(src, dst):
    """Pair consecutive dims of src and dst with equal products, [(src dims, dst dims)], or None
    when the reshape is not a sequence of merges and splits (then it takes tensor.reshape)."""
    if any(d == 0 for d in (*src, *dst)):
        return None
    n, m, i, j, groups = len(src), len(dst), 0, 0, []
    while i < n and j < m:
        gi, gj, pi, pj = [i], [j], size_of(src[i]), size_of(dst[j])
        i, j = i + 1, j + 1
        while pi != pj:
            grow_src = pj.divide(pi) is not None  # pj is a multiple of pi
            grow_dst = pi.divide(pj) is not None
            if not (grow_src or grow_dst):  # e.g. 6 vs 4: take one more dim on each side
                grow_src = grow_dst = True
            if (grow_src and i == n) or (grow_dst and j == m):
                return None
            if grow_src:
                gi.append(i)
                pi, i = pi * size_of(src[i]), i + 1
            if grow_dst:
                gj.append(j)
                pj, j = pj * size_of(dst[j]), j + 1
        groups.append((gi, gj))
    rest_i, rest_j = list(range(i, n)), list(range(j, m))
    if any(src[k] != 1 for k in rest_i) or any(dst[k] != 1 for k in rest_j):
        return None
    if groups:  # trailing size-1 dims join the last group
        groups[-1][0].extend(rest_i)
        groups[-1][1].extend(rest_j)
    return groups


def _reshape_by_groups(E: Emitter, ctx, x: T, out: TensorType, groups) -> T:
    elt = x.mlir_elt
    cur, src_groups, dst_groups = x, [g[0] for g in groups], [g[1] for g in groups]
    if len(src_groups) != x.rank or any(len(g) != 1 for g in src_groups):
        mid = [product(x.shape[k] for k in g).dim for g in src_groups]
        r = E.op(f"tensor.collapse_shape {x.name} {src_groups} : {x.mlir} into {tensor_type(mid, elt)}")
        cur = T(r, TensorType(tuple(mid), x.type.dtype), x.elt)
    if len(dst_groups) != out.rank or any(len(g) != 1 for g in dst_groups):
        sizes = []
        for gi, gj in groups:
            sizes += _out_sizes(E, ctx, x, [out.shape[k] for k in gj], lambda gi=gi: E.product(E.dim(x, k) for k in gi))
        r = E.op(
            f"tensor.expand_shape {cur.name} {dst_groups} output_shape [{', '.join(map(str, sizes))}] : "
            f"{cur.mlir} into {tensor_type(out.shape, elt)}"
        )
        cur = T(r, out, x.elt)
    return T(cur.name, out, x.elt)


def _reshape_any(E: Emitter, ctx, x: T, out: TensorType) -> T:
    sizes = _out_sizes(E, ctx, x, out.shape, lambda: E.product(E.dims(x)))
    shape = E.op(f"tensor.from_elements {', '.join(E.as_index(s) for s in sizes)} : tensor<{out.rank}xindex>")
    r = E.op(
        f"tensor.reshape {x.name}({shape}) : ({x.mlir}, tensor<{out.rank}xindex>) -> "
        f"{tensor_type(out.shape, x.mlir_elt)}"
    )
    return T(r, out, x.elt)


@lowering("reshape")
def _lower_reshape(E: Emitter, node, ins, ctx):
    x, out = ins[0], node.outputs[0].type
    groups = reshape_groups(x.shape, out.shape)
    if groups is None:
        return [_reshape_any(E, ctx, x, out)]
    if not groups and x.rank == out.rank == 0:
        return [x]
    if not groups:  # rank 0 <-> all-ones: an empty reassociation
        if x.rank:
            r = E.op(f"tensor.collapse_shape {x.name} [] : {x.mlir} into {tensor_type((), x.mlir_elt)}")
        else:
            r = E.op(
                f"tensor.expand_shape {x.name} [] output_shape [{', '.join(map(str, out.shape))}] : "
                f"{x.mlir} into {tensor_type(out.shape, x.mlir_elt)}"
            )
        return [T(r, out, x.elt)]
    return [_reshape_by_groups(E, ctx, x, out, groups)]


# ---- transpose -----------------------------------------------------------------------------

# IREE 3.13 GPU workaround (seen on an H100 and an H200 with sm_80 code, 2026-11-26; tests/gpu/test_gpu_llama.py
# shows it, turning this off): with static shapes IREE folds a transpose of a matmul result into the
# contraction, which then writes the transposed result directly. That contraction keeps its operands in
# their old order, so its first input carries the result's column loop: ins(x: (n, k), w: (k, m)) ->
# out (m, n). Its CUDA code is wrong: permute(x @ w, (0, 2, 1)) with x (1, 2048, 1024) f16 and w
# (1024, 256) (a 256x2048x1024 "matmul_like" dispatch) has relative error 1.0, and the llama block,
# whose v projection is transposed into head-major order this way, 0.1. The same contraction with its
# inputs in (m, k), (k, n) roles (matmul's transpose flags) is right, as are symbolic sizes and the CPU.
# So on GPUs the transposed result of a static matmul/linear (through reshapes) goes through
# util.optimization_barrier: the contraction keeps its natural layout and the transpose stays a separate
# copy (or folds into its consumer). Not for symbolic shapes: IREE cannot resolve tensor.dim through the
# barrier ("dynamic dimensions must have been resolved prior to leaving the flow dialect").
PIN_CONTRACTION_TRANSPOSES = True
_CONTRACTIONS, _VIEWS = ("matmul", "linear"), ("reshape",)


def _transposes_contraction(node, ctx) -> bool:
    """Whether this transpose's static input is a matmul/linear result (through reshapes) on a GPU."""
    if not PIN_CONTRACTION_TRANSPOSES or ctx.target.kind == "cpu":
        return False
    v = node.inputs[0]
    while v.producer is not None and v.producer.op in _VIEWS:
        v = v.producer.inputs[0]
    return (
        v.producer is not None
        and v.producer.op in _CONTRACTIONS
        and all(isinstance(d, int) for d in node.inputs[0].shape)
    )


@lowering("transpose")
def _lower_transpose(E: Emitter, node, ins, ctx):
    x, perm, out = ins[0], node.attrs["perm"], node.outputs[0].type
    if perm == sorted(perm):
        return [x]
    if _transposes_contraction(node, ctx):
        x = T(E.op(f"util.optimization_barrier {x.name} : {x.mlir}"), x.type, x.elt)
    init = E.empty([E.dim(x, p) for p in perm], x.mlir_elt)
    ty = tensor_type(out.shape, x.mlir_elt)
    r = E.op(f"linalg.transpose ins({x.name} : {x.mlir}) outs({init} : {ty}) permutation = {perm}")
    return [T(r, out, x.elt)]


# ---- concat --------------------------------------------------------------------------------


def _insert(E: Emitter, src: T, dest: str, dest_ty: str, offsets) -> str:
    sizes = E.dims(src)
    strides = [1] * src.rank
    return E.op(
        f"tensor.insert_slice {src.name} into {dest}[{', '.join(map(str, offsets))}]"
        f"[{', '.join(map(str, sizes))}][{', '.join(map(str, strides))}] : {src.mlir} into {dest_ty}"
    )


@lowering("concat")
def _lower_concat(E: Emitter, node, ins, ctx):
    axis, out = node.attrs["axis"], node.outputs[0].type
    elt = ins[0].mlir_elt
    sizes = E.dims(ins[0])
    sizes[axis] = 0
    for t in ins:
        sizes[axis] = E.addi(sizes[axis], E.dim(t, axis))
    ty = tensor_type(out.shape, elt)
    dest, offset = E.empty(sizes, elt), 0
    for t in ins:
        if 0 in t.shape:
            continue  # adds nothing, and its offset may sit at the edge (invalid in MLIR)
        offsets = [0] * out.rank
        offsets[axis] = offset
        dest = _insert(E, t, dest, ty, offsets)
        offset = E.addi(offset, E.dim(t, axis))
    return [T(dest, out, ins[0].elt)]


# ---- gathers (linalg.generic over the result, reading the source with tensor.extract) ----------


def _gather_generic(E: Emitter, sizes, elt: str, src: T, coords, ins=()) -> str:
    """A result of `sizes` whose element at (i0, i1, ...) is src[coords(E, indices, in scalars)]."""
    rank = len(sizes)
    init = E.empty(sizes, elt)
    ty = tensor_type(sizes, elt)

    def body(E, args):
        idx = [E.op(f"linalg.index {i} : index") for i in range(rank)]
        where = coords(E, idx, args[: len(ins)])
        return [E.op(f"tensor.extract {src.name}[{', '.join(where)}] : {src.mlir}")]

    maps = [m for _, _, m in ins] + [affine_map(rank, range(rank))]
    return E.generic([(n, t) for n, t, _ in ins], [(init, ty)], maps, ["parallel"] * rank, body)[0]


def _clamp(E: Emitter, i: str, hi: str) -> str:
    """Clamp an index to [0, hi] inside a body (guards reads against out-of-range indices)."""
    return E.minsi(E.maxsi(i, 0), hi)


def _check_le(E: Emitter, node, small, big, what: str) -> None:
    """Fail the call unless run-time size `small` <= `big` (static cases are GraphErrors)."""
    if isinstance(small, int) and isinstance(big, int) or small == big:
        return
    ok = E.op(f"arith.cmpi sle, {E.as_index(small)}, {E.as_index(big)} : index", "ok")
    E.check(ok, f"{node.describe()}: {what}")


def _check_not_empty(E: Emitter, node, n, count: list, what: str) -> None:
    """Fail the call when an axis read or written (size n) is empty but there are indices (sizes
    `count`): there is nothing to clamp them to. A static empty axis with indices is a GraphError, a
    static 0 in `count` means no indices."""
    if isinstance(n, int) and n or 0 in count:
        return
    ok = E.op(f"arith.cmpi ne, {E.as_index(n)}, {E.index(0)} : index", "ok")
    for c in count:
        if not isinstance(c, int):
            none = E.op(f"arith.cmpi eq, {c}, {E.index(0)} : index")
            ok = E.op(f"arith.ori {ok}, {none} : i1")
    E.check(ok, f"{node.describe()}: {what}")


@lowering("gather")
def _lower_gather(E: Emitter, node, ins, ctx):
    x, idx = ins
    axis, out = node.attrs["axis"], node.outputs[0].type
    n = E.as_index(E.dim(x, axis))
    sizes = E.dims(x)[:axis] + E.dims(idx) + E.dims(x)[axis + 1 :]
    ielt = idx.mlir_elt
    cast = "arith.index_castui" if idx.type.dtype.unsigned else "arith.index_cast"  # u8 200 is 200, not -56
    _check_not_empty(
        E, node, E.dim(x, axis), E.dims(idx), f"gathers from axis {axis} of x, which is empty in this call"
    )

    def coords(E, at, scalars):
        i = E.op(f"{cast} {scalars[0]} : {ielt} to index")
        neg = E.op(f"arith.cmpi slt, {i}, {E.index(0)} : index")
        wrapped = E.addi(i, n)
        i = E.op(f"arith.select {neg}, {wrapped}, {i} : index")
        i = _clamp(E, i, E.subi(n, 1))
        return at[:axis] + [i] + at[axis + idx.rank :]

    idx_map = affine_map(out.rank, range(axis, axis + idx.rank))
    r = _gather_generic(E, sizes, x.mlir_elt, x, coords, [(idx.name, idx.mlir, idx_map)])
    return [T(r, out, x.elt)]


# ---- slice ---------------------------------------------------------------------------------


@lowering("slice")
def _lower_slice(E: Emitter, node, ins, ctx):
    x, out, a = ins[0], node.outputs[0].type, node.attrs
    offsets, sizes, strides = [0] * x.rank, E.dims(x), [1] * x.rank
    for axis, s, e, st in zip(a["axes"], a["starts"], a["ends"], a["steps"]):
        offsets[axis], sizes[axis] = slice_bounds(E.dim(x, axis), s, e, st, E.ix)
        strides[axis] = st
    if 0 in out.shape:
        # Nothing to read; an extract_slice here would carry an offset at the edge (start clamped
        # to the dim), which MLIR's verifier rejects as out of bounds.
        return [T(E.empty(sizes, x.mlir_elt), out, x.elt)]
    if all(st > 0 for st in strides):
        r = E.op(
            f"tensor.extract_slice {x.name}[{', '.join(map(str, offsets))}][{', '.join(map(str, sizes))}]"
            f"[{', '.join(map(str, strides))}] : {x.mlir} to {tensor_type(sizes, x.mlir_elt)}"
        )
        return [T(r, out, x.elt)]
    # Negative steps read x directly at first + step*i: an extract_slice followed by a reversing
    # gather is a pair IREE's CPU backend fails to fuse when another dim is dynamic.
    firsts = [E.as_index(f) if f else None for f in offsets]
    steps = [E.index(st) if st != 1 else None for st in strides]

    def coords(E, at, _):
        out_ = []
        for i, f, st in zip(at, firsts, steps):
            j = E.muli(i, st) if st else i
            out_.append(E.addi(f, j) if f else j)
        return out_

    return [T(_gather_generic(E, sizes, x.mlir_elt, x, coords), out, x.elt)]


# ---- broadcast_to --------------------------------------------------------------------------


@lowering("broadcast_to")
def _lower_broadcast_to(E: Emitter, node, ins, ctx):
    x, out = ins[0], node.outputs[0].type
    off = out.rank - x.rank
    sizes = [
        E.dim(x, i - off) if i >= off and x.shape[i - off] == d else dim_value(E, ctx, d, x)
        for i, d in enumerate(out.shape)
    ]
    elt = x.mlir_elt
    init = E.empty(sizes, elt)
    src_map = affine_map(
        out.rank, ["0" if d == 1 and out.shape[off + j] != 1 else off + j for j, d in enumerate(x.shape)]
    )
    r = E.generic(
        [(x.name, x.mlir)],
        [(init, tensor_type(out.shape, elt))],
        [src_map, affine_map(out.rank, range(out.rank))],
        ["parallel"] * out.rank,
        lambda E, args: [args[0]],
    )
    return [T(r[0], out, x.elt)]


# ---- pad -----------------------------------------------------------------------------------


def _pad_constant(E: Emitter, x: T, out: TensorType, pairs, value) -> str:
    elt = x.mlir_elt
    c = E.const(value, elt)
    lo = ", ".join(str(p[0]) for p in pairs)
    hi = ", ".join(str(p[1]) for p in pairs)
    r = E.fresh("p")
    with E.region(
        f"{r} = tensor.pad {x.name} low[{lo}] high[{hi}]",
        f": {x.mlir} to {tensor_type(out.shape, elt)}",
        ["index"] * x.rank,
        "pi",
    ):
        E.emit(f"tensor.yield {c} : {elt}")
    return r


def _edge(E, j, top):
    return _clamp(E, j, top)


def _reflect(E, j, top):
    """numpy 'reflect' (the edge is not repeated): -j below 0, 2*top - j past the end."""
    j = E.maxsi(j, E.subi(0, j))
    j = E.minsi(j, E.subi(E.addi(top, top), j))
    return _clamp(E, j, top)


PAD_INDEX = {"edge": _edge, "reflect": _reflect}


@lowering("pad")
def _lower_pad(E: Emitter, node, ins, ctx):
    x, out, a = ins[0], node.outputs[0].type, node.attrs
    pairs = a["pad_width"]
    if a["mode"] == "constant":
        return [T(_pad_constant(E, x, out, pairs, a["value"]), out, x.elt)]
    dims = E.dims(x)
    sizes = [E.addi(d, lo + hi) for d, (lo, hi) in zip(dims, pairs)]
    tops = [E.as_index(E.subi(d, 1)) if lo or hi else None for d, (lo, hi) in zip(dims, pairs)]
    los = [E.index(lo) if lo else None for lo, _ in pairs]
    fold = PAD_INDEX[a["mode"]]

    def coords(E, at, _):
        out_ = []
        for i, top, lo in zip(at, tops, los):
            if top is None:
                out_.append(i)
                continue
            j = E.subi(i, lo) if lo else i
            out_.append(fold(E, j, top))
        return out_

    return [T(_gather_generic(E, sizes, x.mlir_elt, x, coords), out, x.elt)]
