"""ONNX constants, shapes and data movement: Constant, Shape, Size, ConstantOfShape, Range, Reshape,
Flatten, Transpose, Concat, Slice, Gather, Unsqueeze, Squeeze, Expand, Split, Pad.

Shapes are values: on arrays known at import these ops are folded, and a shape that holds a symbolic
dim is an object array of ints and size expressions, so the chains exporters write (Shape -> Gather ->
Add -> Concat -> Reshape, Range up to a length, Expand, ConstantOfShape, Slice to a length) keep dims
symbolic in the compiled module. A Slice end or a Range over sizes that the importer cannot place
within bounds is assumed to be (SizeReasoning.at_most), and checked when the module is called.
"""

from __future__ import annotations

import math

import numpy as np

from ... import symbolic
from ..importing import slice_bound
from ..ops.shape import gather_indices
from .importer import Importer, converts, folds
from .values import (
    Node,
    Tensor,
    Unsupported,
    _axes,
    _axis,
    _check_folded,
    _fmt,
    _known_array,
    _ops,
    _static,
    _sym_values,
)


# ---- shape helpers --------------------------------------------------------------------------


def _shape_array(shape) -> np.ndarray:
    """A shape as an import-time value: int64 when static, else an object array with symbol names."""
    if all(isinstance(d, int) for d in shape):
        return np.asarray(shape, dtype=np.int64).reshape(len(shape))
    return np.asarray(list(shape), dtype=object).reshape(len(shape))


def _dims(arr) -> list:
    return [d if isinstance(d, str) else int(d) for d in np.asarray(arr).reshape(-1).tolist()]


def _reshape_target(in_shape, target, allowzero: bool) -> list:
    """ONNX Reshape's target: 0 copies the input dim (unless allowzero); -1 is left to rocmc's reshape."""
    return [in_shape[i] if (isinstance(d, int) and d == 0 and not allowzero) else d for i, d in enumerate(target)]


def _broadcast(a, b, imp: Importer) -> list:
    """Numpy broadcasting of two shapes; symbolic dims are equal when their sizes are (decided by
    `imp`, which may assume symbols >= 2: a symbolic dim against 1 is then the dim)."""
    rank = max(len(a), len(b))
    a = [1] * (rank - len(a)) + list(a)
    b = [1] * (rank - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif (isinstance(x, str) or isinstance(y, str)) and _equal_sizes(imp, x, y):
            out.append(x)
        else:
            raise Unsupported(f"shapes {_fmt(a)} and {_fmt(b)} do not broadcast")
    return out


def _equal_sizes(imp: Importer, x, y) -> bool:
    try:
        return imp.decide(x, "==", y)
    except Unsupported:
        return False


# ---- constants and shapes (folded at import) --------------------------------------------------


@converts("Constant")
def _constant(n: Node):
    from onnx import numpy_helper

    kinds = {
        "value": None,
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": np.int64,
        "value_ints": np.int64,
    }
    for key, dtype in kinds.items():
        if key in n.attrs:
            v = n.attr(key)
            arr = numpy_helper.to_array(v) if dtype is None else np.asarray(v, dtype=dtype)
            if arr.dtype.kind in "OUS":
                raise Unsupported("string tensors are not supported")
            return [arr]
    raise Unsupported(f"Constant with {', '.join(n.attrs)} is not supported (only tensor, float(s), int(s))")


@converts("Shape")
def _shape(n: Node):
    shape = n.inputs[0].shape
    r = len(shape)
    start, end = n.attr("start", 0), n.attr("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return [_shape_array(shape[start:end])]


@converts("Size")
def _size(n: Node):
    total = 1
    for d in n.inputs[0].shape:
        total = symbolic.dim_mul(total, d)
    return [_known_array(np.asarray(total, dtype=object))]


@converts("ConstantOfShape")
def _constant_of_shape(n: Node):
    from onnx import numpy_helper

    shape = _dims(n.known(0, "input"))
    v = n.attr("value")
    fill = numpy_helper.to_array(v).reshape(-1)[0] if v is not None else np.float32(0)
    if any(isinstance(d, str) for d in shape):  # filled at run time, to sizes the inputs give
        return _ops().broadcast_to(n.imp.value(Tensor(known=np.asarray(fill), name="fill")), shape)
    _check_folded(shape, np.asarray(fill).dtype, "ConstantOfShape")
    return [np.full(shape, fill, dtype=np.asarray(fill).dtype)]


@converts("Range")
def _range(n: Node):
    start, limit, delta = (n.known(i, w) for i, w in enumerate(("start", "limit", "delta")))
    if any(np.asarray(v).dtype.kind in "OU" for v in (start, limit, delta)):  # a symbolic dim among them
        return _symbolic_range(n, start, limit, delta)
    count = np.ceil((np.float64(limit) - np.float64(start)) / np.float64(delta)) if delta != 0 else np.inf
    if not np.isfinite(count):
        raise Unsupported(f"Range({start}, {limit}, {delta}) has no finite length")
    _check_folded((max(int(count), 0),), np.asarray(start).dtype, "Range")
    return [np.arange(start, limit, delta).astype(np.asarray(start).dtype)]


def _symbolic_range(n: Node, start, limit, delta):
    """Range over symbolic sizes (positions from a Shape: Range(past, past+seq, 1)): an arange of the
    symbolic length, scaled by the step and shifted by the start, both computed at run time."""
    R = _ops()
    start, limit, delta = (np.asarray(v).reshape(-1) for v in (start, limit, delta))
    if not (start.size == limit.size == delta.size == 1) or np.asarray(delta).dtype == object or int(delta[0]) <= 0:
        raise Unsupported(
            f"Range({_fmt(start)}, {_fmt(limit)}, {_fmt(delta)}) over symbolic sizes needs scalars "
            f"and a positive integer step"
        )
    s, e, d = _entry(start[0]), _entry(limit[0]), int(delta[0])
    if not n.imp.at_most(s, e):
        raise Unsupported(f"Range({s}, {e}, {d}) is empty for every size; rocmc has no empty tensors")
    span = symbolic.dim_sub(e, s)
    count = span if d == 1 else symbolic.dim_floordiv(symbolic.dim_add(span, d - 1), d)
    dtype = n.inputs[0].dtype_name()
    r = R.arange(n.imp.graph, 0, count, 1, dtype=dtype)
    if d != 1:
        r = R.mul(r, np.asarray(d, dtype=r.dtype.np))
    if s != 0:
        r = R.add(r, n.imp.value(Tensor(known=_known_array(np.asarray(s, dtype=object)), int_type=dtype, name="start")))
    return r


def _entry(v):
    return v if isinstance(v, str) else int(v)


# ---- data movement --------------------------------------------------------------------------


@converts("Reshape")
def _reshape(n: Node):
    shape = _reshape_target(
        n.inputs[0].shape,
        _dims(n.known(1, "shape")) if n.version >= 5 else n.attr("shape"),
        bool(n.attr("allowzero", 0)),
    )
    return _ops().reshape(n.value(0), tuple(shape))


@folds("Reshape")
def _fold_reshape(n: Node):
    a = n.known(0, "data")
    target = _reshape_target(a.shape, _dims(n.known(1, "shape")), bool(n.attr("allowzero", 0)))
    return [a.reshape(target)]


@converts("Flatten")
def _flatten(n: Node):
    from ..ops.shape import product

    x = n.inputs[0]
    axis = n.attr("axis", 1)
    if axis != x.rank:  # Flatten's axis ranges over [-rank, rank]; rank makes all of x the rows
        axis = _axis(n, axis, x.rank, scalar_axis=False)
    if x.known is not None:
        return [x.known.reshape(math.prod(x.shape[:axis]), -1)]
    return _ops().reshape(n.value(0), (product(x.shape[:axis]).dim, product(x.shape[axis:]).dim))


@converts("Transpose")
def _transpose(n: Node):
    perm = n.attr("perm") or list(reversed(range(n.inputs[0].rank)))
    if n.inputs[0].known is not None:
        return [np.transpose(n.inputs[0].known, perm)]
    return _ops().permute(n.value(0), tuple(int(p) for p in perm))


@converts("Concat")
def _concat(n: Node):
    ts = [t for t in n.inputs if t is not None]
    axis = _axis(n, n.attr("axis"), ts[0].rank)
    return _ops().concat([n.imp.value(t) for t in ts], axis=axis)


@folds("Concat")
def _fold_concat(n: Node):
    arrs = [t.known for t in n.inputs if t is not None]
    axis = _axis(n, n.attr("axis"), arrs[0].ndim)
    if any(a.dtype == object for a in arrs):
        arrs = [a.astype(object) for a in arrs]
    return [np.concatenate(arrs, axis=axis)]


def _slice_args(n: Node, rank: int):
    if n.version < 10:
        starts, ends = n.attr("starts"), n.attr("ends")
        axes, steps = n.attr("axes") or list(range(len(starts))), [1] * len(starts)
    else:
        starts, ends = n.ints(1, "starts"), n.ints(2, "ends")
        axes = n.ints(3, "axes") or list(range(len(starts)))
        steps = n.ints(4, "steps") or [1] * len(starts)
    return (
        [int(s) for s in starts],
        [int(e) for e in ends],
        [_axis(n, int(a), rank, "axes") for a in axes],
        [int(s) for s in steps],
    )


@converts("Slice")
def _slice(n: Node):
    x = n.inputs[0]
    if n.version >= 10 and _sym_values([n.known(i, w) for i, w in ((1, "starts"), (2, "ends")) if n.has(i)]):
        return _symbolic_slice(n, x)
    starts, ends, axes, steps = _slice_args(n, x.rank)
    if x.known is not None:
        return [_np_slice(x.known, starts, ends, axes, steps)]
    if any(s == 0 for s in steps):
        raise Unsupported("Slice step 0")
    return _ops().slice(n.value(0), starts, ends, axes, steps)


def _symbolic_slice(n: Node, x: Tensor):
    """Slice with sizes among its bounds (x[:, :seq], x[past:past+seq]): step 1 on those axes, each a
    `narrow` of a symbolic length. Bounds are clamped to the dim as ONNX does when the importer can
    decide it, else the end is assumed within the dim (and checked when the module is called)."""
    starts, ends = (np.asarray(n.known(i, w)).reshape(-1).tolist() for i, w in ((1, "starts"), (2, "ends")))
    axes = n.ints(3, "axes") or list(range(len(starts)))
    steps = n.ints(4, "steps") or [1] * len(starts)
    R, v = _ops(), n.value(0)
    for s, e, ax, st in zip(starts, ends, axes, steps):
        ax = _axis(n, ax, x.rank, "axes")
        if isinstance(s, int) and isinstance(e, int) and not isinstance(x.shape[ax], str):
            v = R.slice(v, [s], [e], [ax], [st])
            continue
        if st != 1:
            raise Unsupported(f"Slice with symbolic bounds ({s}:{e}) and step {st}; only step 1 is supported")
        dim = x.shape[ax]
        s, e = slice_bound(n.imp.at_most, s, dim), slice_bound(n.imp.at_most, e, dim)
        if not n.imp.at_most(e, dim):
            e = dim
        if not n.imp.at_most(s, e):
            raise Unsupported(f"Slice {s}:{e} of axis {ax} is empty; rocmc has no empty tensors")
        v = R.narrow(v, ax, s, symbolic.dim_sub(e, s))
    return v


def _np_slice(a, starts, ends, axes, steps):
    index = [slice(None)] * a.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        dim = a.shape[ax]
        # ONNX clamps start/end like Python slicing, but INT64_MIN/MAX mean "past the end".
        index[ax] = slice(max(min(s, dim), -dim - 1), max(min(e, dim), -dim - 1), st)
    return a[tuple(index)]


@converts("Gather")
def _gather(n: Node):
    data, idx = n.inputs[0], n.inputs[1]
    axis = _axis(n, n.attr("axis", 0), data.rank)
    if idx.known is not None and data.known is not None and data.shape[axis] > 0:
        return [np.take(data.known, gather_indices(idx.known, data.shape[axis]), axis=axis)]
    return _ops().gather(n.value(0), n.value(1), axis=axis)


def _unsqueeze_axes(n: Node, rank: int):
    axes = n.ints(1, "axes") if n.version >= 13 else n.attr("axes")
    return sorted(_axis(n, int(a), rank + len(axes), "axes") for a in axes)


@converts("Unsqueeze")
def _unsqueeze(n: Node):
    x = n.inputs[0]
    axes = _unsqueeze_axes(n, x.rank)
    if x.known is not None:
        return [np.expand_dims(x.known, tuple(axes))]
    return _ops().unsqueeze(n.value(0), axes)


@converts("Squeeze")
def _squeeze(n: Node):
    x = n.inputs[0]
    axes = n.ints(1, "axes") if n.version >= 13 else n.attr("axes")
    if axes:
        axes = _axes(n, axes, x.rank)
        if any(x.shape[a] != 1 for a in axes):
            raise Unsupported(f"squeezed axes {axes} of [{', '.join(map(str, x.shape))}] are not all 1")
    else:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    if x.known is not None:
        return [np.squeeze(x.known, tuple(axes))]
    return _ops().squeeze(n.value(0), axes)


@converts("Expand")
def _expand(n: Node):
    x = n.inputs[0]
    shape = _broadcast(x.shape, _dims(n.known(1, "shape")), n.imp)
    if x.known is not None and all(isinstance(d, int) for d in shape) and math.prod(shape) <= 1 << 16:
        return [np.broadcast_to(x.known, shape).copy()]
    return _ops().broadcast_to(n.value(0), tuple(shape))


@converts("Split")
def _split(n: Node):
    x = n.inputs[0]
    axis = _axis(n, n.attr("axis", 0), x.rank)
    dim = x.shape[axis]
    sizes = n.ints(1, "split") if n.version >= 13 else n.attr("split")
    if not sizes:
        count = n.attr("num_outputs") or n.n_outputs
        dim = _static((dim,), "Split into equal parts")[0]
        part = -(-dim // count)
        sizes = [min(part, dim - i * part) for i in range(count)]
    outs, start = [], 0
    for size in sizes:
        end = start + int(size)
        if x.known is not None:
            outs.append(_np_slice(x.known, [start], [end], [axis], [1]))
        else:
            outs.append(_ops().slice(n.value(0), [start], [end], [axis], [1]))
        start = end
    return outs


@converts("Pad")
def _pad(n: Node):
    x = n.value(0)
    mode = n.attr("mode", "constant")
    if n.version < 11:
        pads, value, axes = n.attr("pads"), float(n.attr("value", 0.0)), None
    else:
        pads = n.ints(1, "pads")
        cv = n.known(2, "constant_value")
        value = 0 if cv is None else np.asarray(cv).reshape(-1)[0].item()
        axes = n.ints(3, "axes")
    axes = list(range(x.rank)) if not axes else [_axis(n, a, x.rank, "axes") for a in axes]
    k = len(axes)
    width = [[0, 0] for _ in range(x.rank)]
    for i, a in enumerate(axes):
        width[a] = [int(pads[i]), int(pads[i + k])]
    return _ops().pad(x, [tuple(w) for w in width], mode=mode, value=value)
