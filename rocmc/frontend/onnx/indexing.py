"""ONNX indexing and layout ops: GatherElements, GatherND, ScatterElements, Scatter, ScatterND, Trilu,
Einsum, Tile, ArgMax, ArgMin, OneHot, EyeLike, DepthToSpace, SpaceToDepth, Hardmax, TopK, CumSum.

Each maps onto one rocmc op (take_along_axis, gather_nd, scatter_elements, scatter_nd, triu/tril,
argmax/argmin, topk, cumsum) or a short composition of them (einsum; Tile as unsqueeze + broadcast_to
+ reshape; OneHot and Hardmax as an equality with positions from arange; DepthToSpace/SpaceToDepth as
reshape + transpose + reshape). Counts that fix a shape (Tile's repeats, OneHot's depth, Trilu's k,
TopK's K) must be known at import.
"""

from __future__ import annotations

import numpy as np

from .importer import REFERENCE_FOLDS, converts, folds
from .values import Node, Unsupported, _axis, _ops, _rocmc_dtype
from ...dtypes import dtype as rocmc_dtype
from ..ops.shape import product


def _one_int(n: Node, i: int, what: str) -> int:
    """An input that must hold one integer known at import time (TopK's K, CumSum's axis)."""
    values = n.ints(i, what)
    if values is None or len(values) != 1:
        raise Unsupported(f"input {what!r} must hold one integer, got {values}")
    return values[0]


@converts("GatherElements")
def _gather_elements(n: Node):
    axis = _axis(n, n.attr("axis", 0), n.inputs[0].rank)
    return _ops().take_along_axis(n.value(0), n.value(1), axis=axis)


@converts("GatherND")
def _gather_nd(n: Node):
    return _ops().gather_nd(n.value(0), n.value(1), batch_dims=n.attr("batch_dims", 0))


def _reduction(n: Node) -> str:
    return n.attr("reduction", "none")


@converts("ScatterElements", "Scatter")
def _scatter_elements(n: Node):
    data = n.value(0)
    return _ops().scatter_elements(
        data, n.value(1), n.value(2), axis=_axis(n, n.attr("axis", 0), data.rank), reduction=_reduction(n)
    )


@converts("ScatterND")
def _scatter_nd(n: Node):
    return _ops().scatter_nd(n.value(0), n.value(1), n.value(2), reduction=_reduction(n))


@converts("Trilu")
def _trilu(n: Node):
    k = _one_int(n, 1, "k") if n.has(1) else 0
    keep = _ops().triu if n.attr("upper", 1) else _ops().tril
    return keep(n.value(0), k)


@folds("Trilu")
def _fold_trilu(n: Node):
    a = n.known(0, "input")
    k = n.ints(1, "k", [0])[0]
    return [np.triu(a, k) if n.attr("upper", 1) else np.tril(a, k)]


@converts("Einsum")
def _einsum(n: Node):
    return _ops().einsum(n.attr("equation"), *[n.value(i) for i in range(len(n.inputs))])


@converts("Tile")
def _tile(n: Node):
    """Each repeated dim d becomes (r, d) broadcast from (1, d), then merged into r*d."""
    if n.version < 6:
        raise Unsupported("Tile-1 (tiles and axis inputs) is not supported; opset >= 6 takes repeats")
    R, x = _ops(), n.value(0)
    repeats = n.ints(1, "repeats")
    if len(repeats) != x.rank or any(r < 0 for r in repeats):
        raise Unsupported(f"repeats {repeats} must hold {x.rank} counts >= 0, one per dim of the input")
    if all(r == 1 for r in repeats):
        return x
    split, wide, merged = [], [], []
    for d, r in zip(x.shape, repeats):
        split += [d] if r == 1 else [1, d]
        wide += [d] if r == 1 else [r, d]
        merged.append(d if r == 1 else product([r, d]).dim)
    return R.reshape(R.broadcast_to(R.reshape(x, split), tuple(wide)), merged)


def _arg_extreme(n: Node, op: str):
    x = n.value(0)
    return getattr(_ops(), op)(
        x,
        axis=_axis(n, n.attr("axis", 0), x.rank),
        keepdims=bool(n.attr("keepdims", 1)),
        last_index=bool(n.attr("select_last_index", 0)),
    )


converts("ArgMax")(lambda n: _arg_extreme(n, "argmax"))
converts("ArgMin")(lambda n: _arg_extreme(n, "argmin"))


def _positions(n: Node, size, axis: int, rank: int):
    """0..size-1 (i64) along `axis` of a rank-`rank` tensor whose other dims are 1."""
    R = _ops()
    if isinstance(size, str) and size not in n.imp.graph.symbols():
        raise Unsupported(f"the axis has size {size}, which is not an input's dim; its positions can't be built")
    shape = [1] * rank
    shape[axis] = size
    return R.reshape(R.arange(n.imp.graph, 0, size, dtype="i64"), shape)


@converts("OneHot")
def _one_hot(n: Node):
    """on where the (wrapped) index equals the position along `axis`, off elsewhere; an index outside
    [-depth, depth-1] matches nothing, so its row is all off, as ONNX says."""
    R, idx = _ops(), n.value(0)
    depth = _one_int(n, 1, "depth")
    if depth < 0:
        raise Unsupported(f"depth={depth}, expected >= 0")
    axis = _axis(n, n.attr("axis", -1), idx.rank + 1)
    if idx.dtype.kind != "int":  # ONNX casts other indices to int64 (truncating)
        idx = R.cast(idx, "i64")
    idx = R.where(R.less(idx, 0), R.add(idx, depth), idx)
    hot = R.equal(R.unsqueeze(R.cast(idx, "i64"), [axis]), _positions(n, depth, axis, idx.rank + 1))
    values = n.value(2)
    if values.shape != (2,):
        raise Unsupported(f"values is {values.type}, expected [off_value, on_value] (2 elements)")
    off, on = (R.reshape(R.slice(values, [i], [i + 1]), []) for i in (0, 1))
    return R.where(hot, on, off)


@converts("EyeLike")
def _eye_like(n: Node):
    """Ones on the k-th diagonal of the input's (2-d) shape: a constant when the shape is static, else
    triu(tril(ones, k), k) over the input's symbolic dims."""
    x = n.inputs[0]
    if x.rank != 2:
        raise Unsupported(f"the input has rank {x.rank}; EyeLike takes a 2-d tensor")
    dtype = _rocmc_dtype(n.attr("dtype"), "attribute dtype") if n.attr("dtype") is not None else x.dtype_name()
    k = int(n.attr("k", 0))
    np_dtype = rocmc_dtype(dtype).np
    if all(isinstance(d, int) for d in x.shape):
        return np.eye(*x.shape, k=k, dtype=np_dtype)
    R = _ops()
    ones = R.broadcast_to(n.imp.graph.constant(None, np.ones((), np_dtype)), x.shape)
    return R.triu(R.tril(ones, k), k)


def _block(n: Node, x) -> int:
    b = int(n.attr("blocksize"))
    if b < 1:
        raise Unsupported(f"blocksize={b}, expected >= 1")
    if x.rank != 4:
        raise Unsupported(f"the input is {x.type}; expected rank 4 (N, C, H, W)")
    return b


@converts("DepthToSpace")
def _depth_to_space(n: Node):
    """(N, C, H, W) -> (N, C/b², H*b, W*b): the depth split into (b, b, C/b²) (DCR) or (C/b², b, b)
    (CRD), its block dims moved next to H and W, then merged with them."""
    R, x = _ops(), n.value(0)
    b = _block(n, x)
    N, C, H, W = x.shape
    if not isinstance(C, int) or C % (b * b):
        raise Unsupported(f"channels {C} must be a static multiple of blocksize² = {b * b}")
    c = C // (b * b)
    mode = n.attr("mode", "DCR")
    if mode == "DCR":
        y = R.permute(R.reshape(x, [N, b, b, c, H, W]), [0, 3, 4, 1, 5, 2])
    elif mode == "CRD":
        y = R.permute(R.reshape(x, [N, c, b, b, H, W]), [0, 1, 4, 2, 5, 3])
    else:
        raise Unsupported(f"mode={mode!r}, expected 'DCR' or 'CRD'")
    return R.reshape(y, [N, c, product([H, b]).dim, product([W, b]).dim])


@converts("SpaceToDepth")
def _space_to_depth(n: Node):
    """(N, C, H, W) -> (N, C*b², H/b, W/b): H and W split into (H/b, b) and (W/b, b), the block dims
    moved in front of C, then merged with it."""
    R, x = _ops(), n.value(0)
    b = _block(n, x)
    N, C, H, W = x.shape
    static = [d for d in (H, W) if isinstance(d, int)]
    if any(d % b for d in static):
        raise Unsupported(f"height and width ({H}, {W}) must be multiples of blocksize {b}")
    if len(static) == 0:
        raise Unsupported(f"height and width ({H}, {W}) are both symbolic; one of them must be static")
    # A symbolic H or W divided by b is the one size reshape infers (-1), checked when called.
    h = H // b if isinstance(H, int) else -1
    w = W // b if isinstance(W, int) else -1
    y = R.permute(R.reshape(x, [N, C, h, b, w, b]), [0, 3, 5, 1, 2, 4])
    return R.reshape(y, [N, product([C, b, b]).dim, y.shape[4], y.shape[5]])


@converts("Hardmax")
def _hardmax(n: Node):
    """1 at the first largest entry along the axis, 0 elsewhere. Before opset 13 the input is seen as
    2-d, (dims before axis, dims from axis on), and the largest of each row is taken."""
    R, x = _ops(), n.value(0)
    if n.version >= 13:
        axis = _axis(n, n.attr("axis", -1), x.rank)
        return _hardmax_along(n, x, axis)
    axis = _axis(n, n.attr("axis", 1), x.rank)
    rows = R.reshape(x, [product(x.shape[:axis]).dim, product(x.shape[axis:]).dim])
    return R.reshape(_hardmax_along(n, rows, 1), list(x.shape))


def _hardmax_along(n: Node, x, axis: int):
    R = _ops()
    top = R.argmax(x, axis=axis, keepdims=True)
    return R.cast(R.equal(_positions(n, x.shape[axis], axis, x.rank), top), x.dtype)


@converts("TopK")
def _topk(n: Node):
    x = n.value(0)
    k = _one_int(n, 1, "K") if n.version >= 10 else n.attr("k")
    values, indices = _ops().topk(
        x,
        k,
        axis=_axis(n, n.attr("axis", -1), x.rank),
        largest=bool(n.attr("largest", 1)),
        sorted=bool(n.attr("sorted", 1)),
    )
    return [values, indices]


@converts("CumSum")
def _cumsum(n: Node):
    x = n.value(0)
    return _ops().cumsum(
        x,
        _axis(n, _one_int(n, 1, "axis"), x.rank),
        exclusive=bool(n.attr("exclusive", 0)),
        reverse=bool(n.attr("reverse", 0)),
    )


REFERENCE_FOLDS.update(
    (
        "ScatterElements",
        "Scatter",
        "ScatterND",
        "Trilu",
        "Einsum",
        "Tile",
        "ArgMax",
        "ArgMin",
        "OneHot",
        "EyeLike",
        "DepthToSpace",
        "SpaceToDepth",
        "Hardmax",
    )
)
