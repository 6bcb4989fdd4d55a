"""Gathers by per-element indices: take_along_axis (numpy's; ONNX GatherElements) and gather_nd (ONNX
GatherND, index tuples). Indices follow `gather`'s rule: negative ones count from the end once, then
everything is clamped into range, so the compiled module never reads out of bounds and `rocmc.evaluate`
gives the same result."""
from __future__ import annotations

import numpy as np

from ...errors import GraphError, InputError
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, normalize_axis, reference
from .shape import gather_indices

__all__ = ["take_along_axis", "gather_nd"]


def _int_indices(desc: str, t: TensorType) -> None:
    if t.dtype.kind != "int":
        raise GraphError(f"{desc}: 'indices' has dtype {t.dtype}, expected an int tensor (i32 or i64)")


@defop("take_along_axis", attrs=("axis",))
def _take_along_axis(node, types, attrs):
    x, idx = types
    desc, axis = node.describe(), attrs["axis"]
    _int_indices(desc, idx)
    if idx.rank != x.rank:
        raise GraphError(f"{desc}: 'indices' has rank {idx.rank} ({idx}) but 'x' has rank {x.rank} ({x}); "
                         f"expected the same rank")
    for i, (a, b) in enumerate(zip(x.shape, idx.shape)):
        if i != axis and isinstance(a, int) and isinstance(b, int) and b > a:
            raise GraphError(f"{desc}: dim {i} of 'indices' is {b}, larger than {a} in 'x' ({idx} vs {x})")
    if x.shape[axis] == 0 and 0 not in idx.shape:
        raise GraphError(f"{desc}: takes from axis {axis} of {x}, which is empty; nothing to read")
    return x.with_shape(idx.shape)


@reference("take_along_axis")
def _take_along_axis_ref(node, ins, attrs):
    x, idx = ins
    axis = attrs["axis"]
    n = x.shape[axis]
    if n == 0 and idx.size:
        raise InputError(f"{node.describe()}: takes from axis {axis} of a {x.shape} array, which is empty")
    for i, (a, b) in enumerate(zip(x.shape, idx.shape)):
        if i != axis and b > a:
            raise InputError(f"{node.describe()}: dim {i} of 'indices' is {b}, larger than {a} in 'x'")
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = gather_indices(idx, n)
    return [x[tuple(grid)]]


@builder
def take_along_axis(x, indices, axis):
    """numpy.take_along_axis (ONNX GatherElements): out[..., i, ...] = x[..., indices[..., i, ...], ...]
    along `axis`; `indices` has x's rank, and no other dim larger than x's."""
    g = graph_of("take_along_axis", x, indices)
    xv = as_value("take_along_axis", "x", x, g)
    iv = as_value("take_along_axis", "indices", indices, g)
    axis = normalize_axis(f"take_along_axis(%{xv.id}, %{iv.id})", axis, xv.rank)
    return g.apply("take_along_axis", [xv, iv], {"axis": axis})[0]


@defop("gather_nd", attrs=("batch_dims",))
def _gather_nd(node, types, attrs):
    x, idx = types
    desc, b = node.describe(), attrs["batch_dims"]
    _int_indices(desc, idx)
    if not isinstance(b, int) or isinstance(b, bool) or b < 0:
        raise GraphError(f"{desc}: batch_dims={b!r}, expected an int >= 0")
    if idx.rank < 1 or not isinstance(idx.shape[-1], int):
        raise GraphError(f"{desc}: 'indices' is {idx}, expected rank >= 1 with a static last dim (the tuple length)")
    k = idx.shape[-1]
    if b >= min(x.rank, idx.rank) or not 1 <= k <= x.rank - b:
        raise GraphError(f"{desc}: index tuples of length {k} with batch_dims={b} don't fit 'x' {x} "
                         f"(expected 1 <= {k} <= rank - batch_dims = {x.rank - b}, batch_dims < both ranks)")
    for i in range(b):
        if x.shape[i] != idx.shape[i]:
            raise GraphError(f"{desc}: batch dim {i} is {x.shape[i]} in 'x' but {idx.shape[i]} in 'indices'")
    if any(d == 0 for d in x.shape[b:b + k]) and 0 not in idx.shape:
        raise GraphError(f"{desc}: gathers from {x}, which is empty along an indexed dim")
    return x.with_shape(idx.shape[:-1] + x.shape[b + k:])


@reference("gather_nd")
def _gather_nd_ref(node, ins, attrs):
    x, idx = ins
    b, k = attrs["batch_dims"], idx.shape[-1]
    if idx.size and any(d == 0 for d in x.shape[b:b + k]):
        raise InputError(f"{node.describe()}: gathers from a {x.shape} array, empty along an indexed dim")
    out_batch = idx.shape[:-1]
    flat = idx.reshape(-1, k)
    batch = np.indices(idx.shape[:b]).reshape(b, -1).T if b else np.zeros((1, 0), np.int64)
    per_batch = flat.shape[0] // max(batch.shape[0], 1)
    rows = []
    for r in range(flat.shape[0]):
        bi = tuple(batch[r // per_batch]) if b else ()
        tup = tuple(int(gather_indices(np.array(flat[r, j]), x.shape[b + j])) for j in range(k))
        rows.append(x[bi + tup])
    return [np.array(rows, dtype=x.dtype).reshape(out_batch + x.shape[b + k:])]


@builder
def gather_nd(x, indices, batch_dims=0):
    """ONNX GatherND: each tuple indices[..., :] (length k) picks x[batch..., i0, ..., ik-1, ...]; the
    result is indices.shape[:-1] + x.shape[batch_dims + k:]."""
    g = graph_of("gather_nd", x, indices)
    xv = as_value("gather_nd", "x", x, g)
    iv = as_value("gather_nd", "indices", indices, g)
    return g.apply("gather_nd", [xv, iv], {"batch_dims": batch_dims})[0]
