"""Generated lowering of the index-driven ops: update_slice and narrow as tensor.insert_slice /
tensor.extract_slice at a run-time offset, argmax/argmin as two linalg reductions, triu/tril as a
generic comparing each entry's column - row with k, topk over packed keys
(iree_linalg_ext.topk on the CPU for small k, a parallel ranking on GPUs and for large k; a full
iree_linalg_ext.sort for i64), cumsum as iree_linalg_ext.scan, arange as a generic.

update_slice stays a tensor.insert_slice on purpose: that is the op IREE turns into an in-place copy
of the update's rows when x is a mutable global (a KV cache), where a generic would rewrite x whole.
"""

from __future__ import annotations

from ... import symbolic
from ...dtypes import acc_mlir, is_float_mlir
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering
from .conv import _pad, _split_channels, _typed
from .shape import _check_le, _check_not_empty, _gather_generic, _insert


def _ints(values) -> str:
    return ", ".join(map(str, values))


def _start(E: Emitter, node, ins, at: int, ctx):
    """The requested start: the int attribute, a size expression computed from the call's sizes (index
    arithmetic on the host side), or the one integer of operand `at` as an index."""
    if len(ins) <= at:
        start = node.attrs["start"]
        if isinstance(start, str):
            return symbolic.parse(start).compute(E.ix, ctx.symbols)
        return start
    s = ins[at]
    where = ", ".join(E.index(0) for _ in range(s.rank))
    v = E.op(f"tensor.extract {s.name}[{where}] : {s.mlir}")
    cast = "arith.index_castui" if s.type.dtype.unsigned else "arith.index_cast"
    return E.op(f"{cast} {v} : {s.mlir_elt} to index")


def _size(E: Emitter, size, ctx):
    """A size attribute (an int or an expression over the graph's symbols) as an int or index value."""
    return symbolic.parse(size).compute(E.ix, ctx.symbols) if isinstance(size, str) else size


def _clamped(E: Emitter, start, dim, length):
    """XLA's clamp of a window start into [0, dim - length] (folded when everything is static)."""
    return E.maxsi(E.minsi(start, E.subi(dim, length)), 0)


# ---- update_slice / narrow ---------------------------------------------------------------------


@lowering("update_slice")
def _lower_update_slice(E: Emitter, node, ins, ctx):
    x, upd, axis = ins[0], ins[1], node.attrs["axis"]
    n, u = E.dim(x, axis), E.dim(upd, axis)
    _check_le(E, node, u, n, f"'update' has more entries along axis {axis} than 'x'")
    offsets = [0] * x.rank
    offsets[axis] = _clamped(E, _start(E, node, ins, 2, ctx), n, u)
    return [T(_insert(E, upd, x.name, x.mlir, offsets), x.type, x.elt)]


@lowering("narrow")
def _lower_narrow(E: Emitter, node, ins, ctx):
    x, axis, length = ins[0], node.attrs["axis"], node.attrs["length"]
    out = node.outputs[0].type
    n = E.dim(x, axis)
    size = n if length == x.shape[axis] else _size(E, length, ctx)
    _check_le(E, node, size, n, f"length {length} is larger than dim {axis} of 'x'")
    offsets, sizes = [0] * x.rank, E.dims(x)
    offsets[axis], sizes[axis] = _clamped(E, _start(E, node, ins, 1, ctx), n, size), size
    r = E.op(
        f"tensor.extract_slice {x.name}[{_ints(offsets)}][{_ints(sizes)}][{_ints([1] * x.rank)}] : "
        f"{x.mlir} to {tensor_type(out.shape, x.mlir_elt)}"
    )
    return [T(r, out, x.elt)]


# ---- argmax ------------------------------------------------------------------------------------


@lowering("argmax", "argmin")
def _lower_arg_extreme(E: Emitter, node, ins, ctx):
    """Two plain reductions: the extreme value (NaN if any entry is NaN), then the lowest (or, with
    last_index, the highest) position holding it. One reduction carrying (value, position) pairs made
    IREE's GPU code keep a whole row in shared memory (128 KB for a 32000-entry vocabulary, over
    gfx942's 64 KB)."""
    x, axis, keep = ins[0], node.attrs["axis"], node.attrs["keepdims"]
    largest, last = node.op == "argmax", node.attrs.get("last_index", False)
    out = node.outputs[0].type
    _check_not_empty(E, node, E.dim(x, axis), [], f"axis {axis} of 'x' is empty in this call (nothing to select)")
    storage = x.mlir_elt
    acc = acc_mlir(storage)
    is_float, signed = is_float_mlir(acc), node.inputs[0].dtype.signed
    dims = E.dims(x)
    sizes = [1 if i == axis else d for i, d in enumerate(dims)] if keep else dims[:axis] + dims[axis + 1 :]
    out_map = affine_map(
        x.rank, ["0" if i == axis else i for i in range(x.rank)] if keep else [i for i in range(x.rank) if i != axis]
    )
    iterators = ["reduction" if i == axis else "parallel" for i in range(x.rank)]
    max_ty = tensor_type(out.shape, acc)

    def value(E, a):
        """The entry as compared: floats in `acc`; signed integers with the sign bit flipped, so that
        unsigned order is signed order (see _NO_POSITION for why unsigned)."""
        v = E.cast_scalar(a, storage, acc)
        if is_float or not signed:
            return v
        return E.op(f"arith.xori {v}, {E.const(-(1 << (int(acc[1:]) - 1)), acc)} : {acc}")

    pick = ("maximumf" if is_float else "maxui") if largest else ("minimumf" if is_float else "minui")
    start = (float("-inf") if largest else float("inf")) if is_float else (0 if largest else -1)

    def extreme(E, a):
        return [E.op(f"arith.{pick} {value(E, a[0])}, {a[1]} : {acc}")]

    m = E.generic(
        [(x.name, x.mlir)],
        [(E.filled(sizes, acc, start), max_ty)],
        [affine_map(x.rank, range(x.rank)), out_map],
        iterators,
        extreme,
    )[0]
    # The first position: the least of the matching ones (others count as _NO_POSITION); the last:
    # the greatest (others count as 0, which only position 0 itself can win with).
    none, choose = (0, "maxui") if last else (_NO_POSITION, "minui")

    def position(E, a):
        v = value(E, a[0])
        if is_float:
            same = E.op(f"arith.cmpf oeq, {v}, {a[1]} : {acc}")
            both_nan = E.op(
                f"arith.andi {E.op(f'arith.cmpf uno, {v}, {v} : {acc}')}, "
                f"{E.op(f'arith.cmpf uno, {a[1]}, {a[1]} : {acc}')} : i1"
            )
            same = E.op(f"arith.ori {same}, {both_nan} : i1")
        else:
            same = E.op(f"arith.cmpi eq, {v}, {a[1]} : {acc}")
        j = E.op(f"arith.index_cast {E.op(f'linalg.index {axis} : index')} : index to i32")
        cand = E.op(f"arith.select {same}, {j}, {E.const(none, 'i32')} : i32")
        return [E.op(f"arith.{choose} {cand}, {a[2]} : i32")]

    at = E.filled(sizes, "i32", none)
    r = E.generic(
        [(x.name, x.mlir), (m, max_ty)],
        [(at, tensor_type(out.shape, "i32"))],
        [affine_map(x.rank, range(x.rank)), out_map, out_map],
        iterators,
        position,
    )[0]
    return [E.convert(T(r, out, "i32"), "i64")]


# Positions are reduced as i32 (then widened): IREE's GPU code fails to distribute an i64 min-reduction
# over a 32000-entry row ("failed to distribute", cuda:sm_80). Integer reductions are unsigned: on an
# H200 (sm_80 code) a signed i32 min-reduction came back -1 and a signed max-reduction of negative
# entries 0, as if each started from its unsigned identity. An axis has fewer entries than this.
_NO_POSITION = (1 << 31) - 1


# ---- topk --------------------------------------------------------------------------------------
#
# iree_linalg_ext.topk compares values only, and fills its result with a value that real entries
# can equal; so it runs on one distinct i64 key per entry, whose descending order is topk's:
#   bits 63..32  the value's order bits (complemented for smallest), -0.0 as 0.0, every NaN as one
#                NaN above +inf
#   bits 31..1   0x7FFFFFFF - position: equal values put the lower position first
#   bit 0        the sign of a zero, so -0.0 comes back as -0.0 (never decides the order)
# The values are decoded from the chosen keys, the positions are topk's own index result: both
# results are used, which keeps IREE from holding an unused one in a stack buffer.

_POS_MAX = (1 << 31) - 1


_SIGN32 = -(1 << 31)


def _order_bits(E: Emitter, v: str, dtype) -> tuple[str, str | None]:
    """(i32 whose signed order is the value order, i1 'v is -0.0' or None). Integers of up to 32
    bits: narrower ones extended by their signedness, u32 with its top bit flipped."""
    elt = dtype.mlir
    if dtype.kind == "int":
        if dtype.bits < 32:
            return E.cast_scalar(v, elt, "i32", unsigned_src=dtype.unsigned), None
        return (E.op(f"arith.xori {v}, {E.const(_SIGN32, 'i32')} : i32") if dtype.unsigned else v), None
    if elt != "f32":
        v = E.cast_scalar(v, elt, "f32")
    zero = E.const(0.0, "f32")
    is_zero = E.op(f"arith.cmpf oeq, {v}, {zero} : f32")
    neg = E.op(f"arith.cmpi slt, {E.op(f'arith.bitcast {v} : f32 to i32')}, {E.const(0, 'i32')} : i32")
    neg_zero = E.op(f"arith.andi {is_zero}, {neg} : i1")
    v = E.op(f"arith.select {is_zero}, {zero}, {v} : f32")
    nan = E.op(f"arith.cmpf uno, {v}, {v} : f32")
    v = E.op(f"arith.select {nan}, {E.const(float('nan'), 'f32')}, {v} : f32")
    return _flip_negative(E, E.op(f"arith.bitcast {v} : f32 to i32")), neg_zero


def _flip_negative(E: Emitter, bits: str) -> str:
    """Float bits <-> order bits (its own inverse): negative floats get their magnitude bits flipped."""
    neg = E.op(f"arith.cmpi slt, {bits}, {E.const(0, 'i32')} : i32")
    flipped = E.op(f"arith.xori {bits}, {E.const(0x7FFFFFFF, 'i32')} : i32")
    return E.op(f"arith.select {neg}, {flipped}, {bits} : i32")


def _topk_keys(E: Emitter, x: T, axis: int, largest: bool) -> T:
    def key(E, a):
        o, neg_zero = _order_bits(E, a[0], x.type.dtype)
        if not largest:
            o = E.op(f"arith.xori {o}, {E.const(-1, 'i32')} : i32")
        high = E.op(f"arith.shli {E.op(f'arith.extsi {o} : i32 to i64')}, {E.const(32, 'i64')} : i64")
        j = E.op(f"arith.index_cast {E.op(f'linalg.index {axis} : index')} : index to i64")
        rest = E.sub(E.const(_POS_MAX, "i64"), j, "i64")
        low = E.op(f"arith.shli {rest}, {E.const(1, 'i64')} : i64")
        if neg_zero is not None:
            low = E.op(f"arith.ori {low}, {E.op(f'arith.extui {neg_zero} : i1 to i64')} : i64")
        return [E.op(f"arith.ori {high}, {low} : i64")]

    sizes = E.dims(x)
    ident = affine_map(x.rank, range(x.rank))
    ty = tensor_type(x.shape, "i64")
    dyn = [d for d in sizes if not isinstance(d, int)]
    # Its own dispatch: fused into topk's, the whole key row would go to a stack buffer. A dispatch region, not an
    # optimization barrier: IREE resolves a barrier's value on the host (a queue submission and a wait on it
    # before the rest), which kept a stream-ordered `sample` from returning before the work before it was done.
    r = E.fresh("keys")
    with E.region(f"{r} = flow.dispatch.region -> ({ty}{'{' + ', '.join(dyn) + '}' if dyn else ''})"):
        init = E.empty(sizes, "i64")
        inner = E.generic([(x.name, x.mlir)], [(init, ty)], [ident, ident], ["parallel"] * x.rank, key)[0]
        E.emit(f"flow.return {inner} : {ty}")
    return T(r, x.type, "i64")


def _decode_value(E: Emitter, key: str, dtype, largest: bool) -> str:
    """The entry a key was made from (NaN payloads aside)."""
    elt = dtype.mlir
    high = E.op(f"arith.shrsi {key}, {E.const(32, 'i64')} : i64")
    o = E.op(f"arith.trunci {high} : i64 to i32")
    if not largest:
        o = E.op(f"arith.xori {o}, {E.const(-1, 'i32')} : i32")
    if dtype.kind == "int":
        if dtype.bits < 32:
            return E.op(f"arith.trunci {o} : i32 to {elt}")
        return E.op(f"arith.xori {o}, {E.const(_SIGN32, 'i32')} : i32") if dtype.unsigned else o
    v = E.op(f"arith.bitcast {_flip_negative(E, o)} : i32 to f32")
    neg_zero = E.op(f"arith.trunci {key} : i64 to i1")
    v = E.op(f"arith.select {neg_zero}, {E.const(-0.0, 'f32')}, {v} : f32")
    return E.cast_scalar(v, "f32", elt)


def _topk_select(E: Emitter, keys: T, sizes, shape, axis: int) -> tuple[str, str]:
    """The largest keys along `axis` in descending order, and their positions (i32)."""
    best = E.filled(sizes, "i64", -(1 << 63))  # below every key: keys have a non-zero position part
    slots = E.filled(sizes, "i32", 0)
    ty_k, ty_i = tensor_type(shape, "i64"), tensor_type(shape, "i32")
    r = E.fresh("topk")
    with E.region(
        f"{r}:2 = iree_linalg_ext.topk dimension({axis}) ins({keys.name} : {keys.mlir}) "
        f"outs({best}, {slots} : {ty_k}, {ty_i})",
        f"-> {ty_k}, {ty_i}",
        ["i64", "i64"],
    ) as (a, b):
        gt = E.op(f"arith.cmpi sgt, {a}, {b} : i64")
        E.emit(f"iree_linalg_ext.yield {gt} : i1")
    return f"{r}#0", f"{r}#1"


def _sorts_before(E: Emitter, a: str, b: str, dtype, largest: bool) -> str:
    """i1: value a comes strictly before value b in topk order (NaN the largest, -0.0 equal to 0.0)."""
    elt = dtype.mlir
    if dtype.kind == "int":
        pred = ("ugt" if largest else "ult") if dtype.unsigned else ("sgt" if largest else "slt")
        return E.op(f"arith.cmpi {pred}, {a}, {b} : {elt}")
    by_value = E.op(f"arith.cmpf {'ogt' if largest else 'olt'}, {a}, {b} : {elt}")
    nan_a, nan_b = (E.op(f"arith.cmpf uno, {v}, {v} : {elt}") for v in (a, b))
    # largest: a NaN precedes every number; smallest: every number precedes a NaN
    first, second = (nan_a, nan_b) if largest else (nan_b, nan_a)
    true = E.const(True, "i1")
    by_nan = E.op(f"arith.andi {first}, {E.op(f'arith.xori {second}, {true} : i1')} : i1")
    return E.op(f"arith.ori {by_value}, {by_nan} : i1")


def _sorts_equal(E: Emitter, a: str, b: str, dtype) -> str:
    elt = dtype.mlir
    if dtype.kind == "int":
        return E.op(f"arith.cmpi eq, {a}, {b} : {elt}")
    both_nan = E.op(
        f"arith.andi {E.op(f'arith.cmpf uno, {a}, {a} : {elt}')}, {E.op(f'arith.cmpf uno, {b}, {b} : {elt}')} : i1"
    )
    return E.op(f"arith.ori {E.op(f'arith.cmpf oeq, {a}, {b} : {elt}')}, {both_nan} : i1")


def _topk_wide(E: Emitter, x: T, axis: int, sizes, largest: bool, shape) -> tuple[str, str]:
    """64-bit values (i64, u64, f64), whose key cannot also hold a position: each entry's rank (how
    many entries come before it, with the order and the tie on positions spelled out) by one
    reduction, then slot r takes the value and position of rank r. Quadratic work per row, as the
    rank path of the keyed form; no iree_linalg_ext.sort, which permutes its operands in place (IREE
    3.13 sorted the caller's tensor for every later user of it)."""
    rank, dims, dtype = x.rank, E.dims(x), x.type.dtype
    own = affine_map(rank + 1, range(rank))
    other = affine_map(rank + 1, [rank if d == axis else d for d in range(rank)])
    iters = ["parallel"] * rank + ["reduction"]

    def count(E, a):
        i, j = (E.op(f"linalg.index {d} : index") for d in (rank, axis))
        tie = E.op(f"arith.andi {_sorts_equal(E, a[1], a[0], dtype)}, {E.op(f'arith.cmpi ult, {i}, {j} : index')} : i1")
        first = E.op(f"arith.ori {_sorts_before(E, a[1], a[0], dtype, largest)}, {tie} : i1")
        return [E.add(a[2], E.op(f"arith.extui {first} : i1 to i64"), "i64")]

    ranks = E.generic(
        [(x.name, x.mlir), (x.name, x.mlir)],
        [(E.filled(dims, "i64", 0), tensor_type(x.shape, "i64"))],
        [own, other, own],
        iters,
        count,
    )[0]

    def pick(elt, value):
        """Slot r of the result: `value` (of the entry, at its position) where the entry's rank is r.
        Values and positions are picked by two single-result reductions (one with both results
        failed to bufferize on the GPU targets)."""

        def body(E, a):
            slot = E.op(f"arith.index_cast {E.op(f'linalg.index {axis} : index')} : index to i64")
            hit = E.op(f"arith.cmpi eq, {a[0]}, {slot} : i64")
            return [E.op(f"arith.select {hit}, {value(E, a[1])}, {a[2]} : {elt}")]

        return E.generic(
            [(ranks, tensor_type(x.shape, "i64")), (x.name, x.mlir)],
            [(E.filled(sizes, elt, 0), tensor_type(shape, elt))],
            [other, other, own],
            iters,
            body,
        )[0]

    def at(E, _):
        return E.op(f"arith.index_cast {E.op(f'linalg.index {rank} : index')} : index to i64")

    return pick(x.mlir_elt, lambda E, v: v), pick("i64", at)


def _position(E: Emitter, key: str) -> str:
    """The position (i64) a key was made at."""
    part = E.op(f"arith.shrui {key}, {E.const(1, 'i64')} : i64")
    part = E.op(f"arith.andi {part}, {E.const(_POS_MAX, 'i64')} : i64")
    return E.sub(E.const(_POS_MAX, "i64"), part, "i64")


def _topk_by_rank(E: Emitter, keys: T, axis: int, sizes, shape) -> str:
    """The k largest keys in descending order without iree_linalg_ext.topk, whose GPU code runs each
    row serially (65 s for k = 32000 of 32000 entries on an H200) and misordered a small f16 case
    (k = 17 of 17, smallest, with NaNs): every key's rank
    (how many keys are larger: keys are distinct) by one parallel reduction, then slot r takes the
    key of rank r. Quadratic work per row, spread over the whole GPU."""
    rank, dims = keys.rank, E.dims(keys)
    own = affine_map(rank + 1, range(rank))
    other = affine_map(rank + 1, [rank if d == axis else d for d in range(rank)])
    ranks = E.filled(dims, "i64", 0)
    iters = ["parallel"] * rank + ["reduction"]

    def count(E, a):
        gt = E.op(f"arith.cmpi sgt, {a[1]}, {a[0]} : i64")
        return [E.add(a[2], E.op(f"arith.extui {gt} : i1 to i64"), "i64")]

    r = E.generic(
        [(keys.name, keys.mlir), (keys.name, keys.mlir)],
        [(ranks, tensor_type(keys.shape, "i64"))],
        [own, other, own],
        iters,
        count,
    )[0]

    def pick(E, a):
        zero = E.const(0, "i64")
        slot = E.op(f"arith.index_cast {E.op(f'linalg.index {axis} : index')} : index to i64")
        hit = E.op(f"arith.cmpi eq, {a[0]}, {slot} : i64")
        return [E.op(f"arith.ori {a[2]}, {E.op(f'arith.select {hit}, {a[1]}, {zero} : i64')} : i64")]

    out = E.filled(sizes, "i64", 0)
    return E.generic(
        [(r, tensor_type(keys.shape, "i64")), (keys.name, keys.mlir)],
        [(out, tensor_type(shape, "i64"))],
        [other, other, own],
        iters,
        pick,
    )[0]


# From this k on, the CPU ranks too: its iree_linalg_ext.topk is k steps per entry of a row, serially
# (2 s for k = 32000 of 32000 entries), while the ranking is vectorized across the row.
RANK_FROM_K = 1024

# Ranking a long row whole is quadratic: an LLM's `sample` (k 64 of a 32000-token vocabulary) took ~0.4 ms a row
# on an H200, 13 ms a step at 32 rows. A row of at least CHUNK_FROM entries is ranked in chunks of about TOPK_CHUNK
# (the same count each, the last padded with the smallest key): each chunk's k largest, then the k largest of the
# chunks' candidates (in chunks again while they are many), about V * TOPK_CHUNK + (V k / TOPK_CHUNK)^2
# comparisons instead of V^2 (32000, k 64: 3.3e7 instead of 1.0e9).
TOPK_CHUNK = 512
CHUNK_FROM = 4 * TOPK_CHUNK


def _chunks(length, k: int) -> tuple[int, int] | None:
    """(chunks, entries a chunk) for a row of `length` entries ranked in chunks, or None where it is not: a symbolic
    or short row, or one whose padded last chunk would hold fewer than k real entries (its candidates must be
    real keys: an unfilled slot would be a zero key, which outranks every negative value)."""
    if not isinstance(length, int) or length < CHUNK_FROM or k > TOPK_CHUNK // 4:
        return None
    n = -(-length // TOPK_CHUNK)
    c = -(-length // n)
    return (n, c) if c - (n * c - length) >= k else None


def _topk_last(E: Emitter, keys: T, k: int, sizes, shape) -> str:
    """_topk_by_rank's result (the k largest keys along the last axis, descending), a long row ranked in chunks
    (_chunks), and the chunks' candidates so again while they are many (a 128256-token vocabulary: 251 chunks,
    then 32, then 4, then 256 candidates ranked whole)."""
    last = keys.rank - 1
    chunks = _chunks(keys.shape[last], k)
    if chunks is None:
        return _topk_by_rank(E, keys, last, sizes, shape)
    n, c = chunks
    padded = _pad(E, keys, [0] * keys.rank, [0] * last + [n * c - keys.shape[last]], -(1 << 63))
    split = _split_channels(E, padded, last, n)  # (..., n, c)
    firsts = _topk_by_rank(E, split, last + 1, E.dims(split)[:-1] + [k], [*split.shape[:-1], k])
    cands = _split_channels(E, _typed(firsts, [*split.shape[:-1], k], keys), last, n, "collapse")  # (..., n k)
    return _topk_last(E, cands, k, sizes, shape)


def _topk_outs(E: Emitter, sizes, elt: str, shape) -> list:
    return [(E.empty(sizes, elt), tensor_type(shape, elt)), (E.empty(sizes, "i64"), tensor_type(shape, "i64"))]


@lowering("topk")
def _lower_topk(E: Emitter, node, ins, ctx):
    x, a = ins[0], node.attrs
    axis, k = a["axis"], a["k"]
    values_t, indices_t = (v.type for v in node.outputs)
    sizes = E.dims(x)
    sizes[axis] = k
    if k == 0:
        return [T(E.empty(sizes, x.mlir_elt), values_t, x.elt), T(E.empty(sizes, "i64"), indices_t)]
    _check_le(E, node, k, E.dim(x, axis), f"k={k} is larger than dim {axis} of 'x'")
    if x.type.dtype.bits == 64:
        v, i = _topk_wide(E, x, axis, sizes, a["largest"], values_t.shape)
        return [T(v, values_t), T(i, indices_t)]
    keys = _topk_keys(E, x, axis, a["largest"])
    elt, ident = x.mlir_elt, affine_map(x.rank, range(x.rank))
    dtype = x.type.dtype
    if ctx.target.is_gpu or k > RANK_FROM_K:
        if axis == x.rank - 1:
            top = _topk_last(E, keys, k, sizes, values_t.shape)
        else:
            top = _topk_by_rank(E, keys, axis, sizes, values_t.shape)
        ins_ = [(top, tensor_type(values_t.shape, "i64"))]

        def decode(E, args):
            return [_decode_value(E, args[0], dtype, a["largest"]), _position(E, args[0])]

        v, i = E.generic(ins_, _topk_outs(E, sizes, elt, values_t.shape), [ident] * 3, ["parallel"] * x.rank, decode)
        return [T(v, values_t, x.elt), T(i, indices_t)]
    top, slots = _topk_select(E, keys, sizes, values_t.shape, axis)

    def decode(E, args):
        return [_decode_value(E, args[0], dtype, a["largest"]), E.op(f"arith.extui {args[1]} : i32 to i64")]

    ins_ = [(top, tensor_type(values_t.shape, "i64")), (slots, tensor_type(values_t.shape, "i32"))]
    v, i = E.generic(ins_, _topk_outs(E, sizes, elt, values_t.shape), [ident] * 4, ["parallel"] * x.rank, decode)
    return [T(v, values_t, x.elt), T(i, indices_t)]


# ---- cumsum ------------------------------------------------------------------------------------


def _flip(E: Emitter, t: T, axis: int) -> T:
    """t reversed along `axis`."""
    top = E.as_index(E.subi(E.dim(t, axis), 1))

    def coords(E, at, _):
        return at[:axis] + [E.subi(top, at[axis])] + at[axis + 1 :]

    return T(_gather_generic(E, E.dims(t), t.mlir_elt, t, coords), t.type, t.elt)


def _scan(E: Emitter, t: T, axis: int, inclusive: bool) -> T:
    """Running sums of t along `axis` (iree_linalg_ext.scan), in t's element type."""
    elt = t.mlir_elt
    sizes = E.dims(t)
    rest = sizes[:axis] + sizes[axis + 1 :]
    total = E.filled(rest, elt, 0)
    ty, ty_total = tensor_type(t.shape, elt), tensor_type(t.shape[:axis] + t.shape[axis + 1 :], elt)
    r = E.fresh("scan")
    head = (
        f"{r}:2 = iree_linalg_ext.scan dimension({axis}) inclusive({'true' if inclusive else 'false'}) "
        f"ins({t.name} : {ty}) outs({E.empty(sizes, elt)}, {total} : {ty}, {ty_total})"
    )
    with E.region(head, f"-> {ty}, {ty_total}", [elt, elt]) as (a, b):
        E.emit(f"iree_linalg_ext.yield {E.add(a, b, elt)} : {elt}")
    return T(f"{r}#0", t.type, elt)


@lowering("cumsum")
def _lower_cumsum(E: Emitter, node, ins, ctx):
    x, a = ins[0], node.attrs
    axis, storage = a["axis"], ins[0].mlir_elt
    if 0 in x.shape:
        return [x]
    t = E.convert(x, acc_mlir(storage))
    if a["reverse"]:
        t = _flip(E, t, axis)
    t = _scan(E, t, axis, not a["exclusive"])
    if a["reverse"]:
        t = _flip(E, t, axis)
    return [E.convert(t, storage)]


# ---- arange ------------------------------------------------------------------------------------


@lowering("arange")
def _lower_arange(E: Emitter, node, ins, ctx):
    a, out = node.attrs, node.outputs[0].type
    start, limit, delta = a["start"], a["limit"], a["delta"]
    size = E.subi(_size(E, limit, ctx), start) if isinstance(limit, str) else out.shape[0]
    elt = out.dtype.mlir
    calc = "i64" if out.dtype.kind == "int" else "f64" if elt == "f64" else "f32"

    def body(E, _):
        i = E.op(f"arith.index_cast {E.op('linalg.index 0 : index')} : index to i64")
        if calc == "i64":
            step = E.mul(i, E.const(delta, calc), calc)
        else:
            step = E.mul(E.op(f"arith.sitofp {i} : i64 to {calc}"), E.const(delta, calc), calc)
        v = E.add(E.const(start, calc), step, calc)
        return [E.cast_scalar(v, calc, elt)]

    r = E.generic([], [(E.empty([size], elt), tensor_type(out.shape, elt))], [affine_map(1, [0])], ["parallel"], body)
    return [T(r[0], out)]


# ---- triu / tril -------------------------------------------------------------------------------


@lowering("triu", "tril")
def _lower_triangle(E: Emitter, node, ins, ctx):
    x, k, rank = ins[0], node.attrs["k"], ins[0].rank
    keep_if = "sge" if node.op == "triu" else "sle"  # column - row against k

    def body(E, a):
        row, col = (E.op(f"linalg.index {i} : index") for i in (rank - 2, rank - 1))
        diff = E.subi(col, row)
        keep = E.op(f"arith.cmpi {keep_if}, {diff}, {E.index(k)} : index")
        return E.op(f"arith.select {keep}, {a[0]}, {E.const(0, x.mlir_elt)} : {x.mlir_elt}")

    return [E.map([x], x.type, body, out_elt=x.elt)]
