"""Gathers and scatters by per-element indices: take_along_axis (numpy's; ONNX GatherElements) and
gather_nd (ONNX GatherND, index tuples), and their inverses scatter_elements (ONNX ScatterElements, torch
scatter / scatter_reduce) and scatter_nd (ONNX ScatterND).

Indices follow `gather`'s rule: negative ones count from the end once, then everything is clamped into
range, so the compiled module never reads or writes out of bounds and `rocmc.evaluate` gives the same
result. A scatter writes an index still out of range after wrapping at the nearest edge.

Scatters combine an update with what is already there by `reduction`: "none" (overwrite), "add", "mul",
"max" or "min". Several updates may land on one place; they are applied in the order of the updates
(row-major over indices), one after another, so the result is deterministic: with "none" the last
one wins, as in ONNX's reference implementation (which leaves that case undefined)."""

from __future__ import annotations

import numpy as np

from ...errors import GraphError, InputError
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, normalize_axis, reference
from .shape import gather_indices

__all__ = ["take_along_axis", "gather_nd", "scatter_elements", "scatter_nd"]

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _int_indices(desc: str, t: TensorType) -> None:
    if t.dtype.kind != "int":
        raise GraphError(f"{desc}: 'indices' has dtype {t.dtype}, expected an int tensor (i32 or i64)")


@defop("take_along_axis", attrs=("axis",))
def _take_along_axis(node, types, attrs):
    x, idx = types
    desc, axis = node.describe(), attrs["axis"]
    _int_indices(desc, idx)
    if idx.rank != x.rank:
        raise GraphError(
            f"{desc}: 'indices' has rank {idx.rank} ({idx}) but 'x' has rank {x.rank} ({x}); expected the same rank"
        )
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
        raise GraphError(
            f"{desc}: index tuples of length {k} with batch_dims={b} don't fit 'x' {x} "
            f"(expected 1 <= {k} <= rank - batch_dims = {x.rank - b}, batch_dims < both ranks)"
        )
    for i in range(b):
        if x.shape[i] != idx.shape[i]:
            raise GraphError(f"{desc}: batch dim {i} is {x.shape[i]} in 'x' but {idx.shape[i]} in 'indices'")
    if any(d == 0 for d in x.shape[b : b + k]) and 0 not in idx.shape:
        raise GraphError(f"{desc}: gathers from {x}, which is empty along an indexed dim")
    return x.with_shape(idx.shape[:-1] + x.shape[b + k :])


@reference("gather_nd")
def _gather_nd_ref(node, ins, attrs):
    x, idx = ins
    b, k = attrs["batch_dims"], idx.shape[-1]
    if idx.size and any(d == 0 for d in x.shape[b : b + k]):
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
    return [np.array(rows, dtype=x.dtype).reshape(out_batch + x.shape[b + k :])]


@builder
def gather_nd(x, indices, batch_dims=0):
    """ONNX GatherND: each tuple indices[..., :] (length k) picks x[batch..., i0, ..., ik-1, ...]; the
    result is indices.shape[:-1] + x.shape[batch_dims + k:]."""
    g = graph_of("gather_nd", x, indices)
    xv = as_value("gather_nd", "x", x, g)
    iv = as_value("gather_nd", "indices", indices, g)
    return g.apply("gather_nd", [xv, iv], {"batch_dims": batch_dims})[0]


# ---- scatters ----------------------------------------------------------------------------------


def _check_scatter(desc: str, data: TensorType, idx: TensorType, upd: TensorType, reduction) -> None:
    """What both scatters require of their operands' dtypes and of `reduction`."""
    _int_indices(desc, idx)
    if reduction not in REDUCTIONS:
        raise GraphError(f"{desc}: reduction={reduction!r}, expected one of {', '.join(map(repr, REDUCTIONS))}")
    if upd.dtype != data.dtype:
        raise GraphError(f"{desc}: 'updates' is {upd.dtype} but 'data' is {data.dtype}; expected the same dtype")
    if reduction != "none" and data.dtype.kind not in ("float", "int"):
        raise GraphError(f"{desc}: reduction={reduction!r} needs a float or int 'data', got {data.dtype}")
    if data.rank == 0:
        raise GraphError(f"{desc}: 'data' is a scalar ({data}); expected rank >= 1")


def _scatter_into(out: np.ndarray, at: np.ndarray, upd: np.ndarray, reduction: str) -> None:
    """Apply updates upd[i] at out[at[i]] in order (`out` is viewed with the scattered dims flattened
    into its first axis)."""
    if reduction == "none":
        # The last update of each place wins: keep only those, then write them.
        _, first_from_end = np.unique(at[::-1], return_index=True)
        keep = len(at) - 1 - first_from_end
        out[at[keep]] = upd[keep]
        return
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
    ufunc.at(out, at, upd)


@defop("scatter_elements", attrs=("axis", "reduction"))
def _scatter_elements(node, types, attrs):
    data, idx, upd = types
    desc, axis = node.describe(), attrs["axis"]
    _check_scatter(desc, data, idx, upd, attrs["reduction"])
    if idx.rank != data.rank:
        raise GraphError(
            f"{desc}: 'indices' has rank {idx.rank} ({idx}) but 'data' has rank {data.rank} ({data}); "
            f"expected the same rank"
        )
    if upd.shape != idx.shape:
        raise GraphError(f"{desc}: 'updates' is {upd} but 'indices' is {idx}; expected the same shape")
    for i, (a, b) in enumerate(zip(data.shape, idx.shape)):
        if i != axis and isinstance(a, int) and isinstance(b, int) and b > a:
            raise GraphError(f"{desc}: dim {i} of 'indices' is {b}, larger than {a} in 'data' ({idx} vs {data})")
    if data.shape[axis] == 0 and 0 not in idx.shape:
        raise GraphError(f"{desc}: scatters into axis {axis} of {data}, which is empty; nowhere to write")
    return data


@reference("scatter_elements")
def _scatter_elements_ref(node, ins, attrs):
    data, idx, upd = ins
    axis, n = attrs["axis"], data.shape[attrs["axis"]]
    for i, (a, b) in enumerate(zip(data.shape, idx.shape)):
        if i != axis and b > a:
            raise InputError(f"{node.describe()}: dim {i} of 'indices' is {b}, larger than {a} in 'data'")
    if n == 0 and idx.size:
        raise InputError(f"{node.describe()}: scatters into axis {axis} of a {data.shape} array, which is empty")
    out = data.copy()
    if idx.size:
        where = list(np.indices(idx.shape))
        where[axis] = gather_indices(idx, n)
        at = np.ravel_multi_index([w.reshape(-1) for w in where], data.shape)
        _scatter_into(out.reshape(-1), at, upd.reshape(-1), attrs["reduction"])
    return [out]


@builder
def scatter_elements(data, indices, updates, axis=0, reduction="none"):
    """ONNX ScatterElements, torch scatter / scatter_reduce(include_self=True): data with each
    updates[p] combined into data at p with p[axis] replaced by indices[p]. `indices` and `updates`
    have one shape, of data's rank, no larger than data's except along `axis`. reduction: "none"
    (overwrite), "add", "mul", "max" or "min"; updates meeting at one place apply in row-major order
    (with "none" the last wins). Indices wrap and clamp as `gather`'s."""
    g = graph_of("scatter_elements", data, indices, updates)
    dv = as_value("scatter_elements", "data", data, g)
    iv = as_value("scatter_elements", "indices", indices, g)
    uv = as_value("scatter_elements", "updates", updates, g, like=dv)
    axis = normalize_axis(f"scatter_elements(%{dv.id}, %{iv.id}, %{uv.id})", axis, dv.rank)
    return g.apply("scatter_elements", [dv, iv, uv], {"axis": axis, "reduction": reduction})[0]


@defop("scatter_nd", attrs=("reduction", "unique_indices"))
def _scatter_nd(node, types, attrs):
    data, idx, upd = types
    desc = node.describe()
    _check_scatter(desc, data, idx, upd, attrs["reduction"])
    if idx.rank < 1 or not isinstance(idx.shape[-1], int) or not 1 <= idx.shape[-1] <= data.rank:
        raise GraphError(
            f"{desc}: 'indices' is {idx}, expected rank >= 1 with a static last dim (the tuple "
            f"length) from 1 to {data.rank}, the rank of 'data'"
        )
    k = idx.shape[-1]
    want = idx.shape[:-1] + data.shape[k:]
    if upd.shape != want:
        raise GraphError(
            f"{desc}: 'updates' is {upd}, expected shape [{','.join(map(str, want))}] "
            f"(indices.shape[:-1] + data.shape[{k}:])"
        )
    if any(d == 0 for d in data.shape[:k]) and 0 not in idx.shape[:-1]:
        raise GraphError(f"{desc}: scatters into {data}, which is empty along an indexed dim")
    if not isinstance(attrs.get("unique_indices", False), bool):
        raise GraphError(f"{desc}: unique_indices={attrs['unique_indices']!r}, expected a bool")
    return data


@reference("scatter_nd")
def _scatter_nd_ref(node, ins, attrs):
    data, idx, upd = ins
    k = idx.shape[-1]
    tuples = idx.reshape(-1, k)
    if len(tuples) and any(d == 0 for d in data.shape[:k]):
        raise InputError(f"{node.describe()}: scatters into a {data.shape} array, empty along an indexed dim")
    out = data.copy()
    if len(tuples):
        at = np.ravel_multi_index([gather_indices(tuples[:, j], data.shape[j]) for j in range(k)], data.shape[:k])
        if attrs.get("unique_indices") and len(np.unique(at)) < len(at):
            raise InputError(f"{node.describe()}: unique_indices=True but two index tuples select the same slice")
        flat = out.reshape((-1,) + data.shape[k:])
        _scatter_into(flat, at, upd.reshape((-1,) + data.shape[k:]), attrs["reduction"])
    return [out]


@builder
def scatter_nd(data, indices, updates, reduction="none", unique_indices=False):
    """ONNX ScatterND: each tuple indices[..., :] (length k) selects the slice data[i0, ..., ik-1, ...],
    which is combined with updates[...] (updates is indices.shape[:-1] + data.shape[k:]). reduction:
    "none" (overwrite), "add", "mul", "max" or "min"; updates meeting at one slice apply in row-major
    order (with "none" the last wins). Indices wrap and clamp as `gather`'s.

    unique_indices=True (XLA's and JAX's flag of the same name): the caller promises that no two tuples
    select the same slice, so the updates are written in parallel (without it IREE writes them one after
    the other, as their order matters); `evaluate` checks the promise, a compiled module does not."""
    g = graph_of("scatter_nd", data, indices, updates)
    dv = as_value("scatter_nd", "data", data, g)
    iv = as_value("scatter_nd", "indices", indices, g)
    uv = as_value("scatter_nd", "updates", updates, g, like=dv)
    attrs = {"reduction": reduction} | ({"unique_indices": True} if unique_indices is True else {})
    if not isinstance(unique_indices, (bool, np.bool_)):
        raise GraphError(f"scatter_nd: unique_indices={unique_indices!r}, expected a bool")
    return g.apply("scatter_nd", [dv, iv, uv], attrs)[0]
