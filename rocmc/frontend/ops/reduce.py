"""Reductions over a set of axes: sum, mean, prod, max, min, amax, norm1, norm2.

Every reduction has the signature `fn(x, axis=None, keepdims=False)` with numpy's meaning of `axis`
(an int, a tuple, or None for all axes; an empty tuple reduces nothing). The node stores the axes
normalized: `{"axes": sorted non-negative ints, "keepdims": bool}`. `max` and `amax` are the same
reduction under two names (MIOpen and ONNX both have both spellings).
"""

from __future__ import annotations

import builtins

import numpy as np

from ...errors import GraphError
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, normalize_axis, reference

_FLOAT = ("float",)
_NUMBER = ("float", "int")

# name -> (accepted dtype kinds, float64 reference(x, axes tuple, keepdims))
REDUCTIONS = {
    "sum": (_NUMBER, lambda x, a, k: np.sum(x, axis=a, keepdims=k)),
    "mean": (_FLOAT, lambda x, a, k: np.mean(x, axis=a, keepdims=k)),
    "prod": (_NUMBER, lambda x, a, k: np.prod(x, axis=a, keepdims=k)),
    "max": (_NUMBER, lambda x, a, k: np.max(x, axis=a, keepdims=k)),
    "min": (_NUMBER, lambda x, a, k: np.min(x, axis=a, keepdims=k)),
    "amax": (_NUMBER, lambda x, a, k: np.max(x, axis=a, keepdims=k)),
    "norm1": (_FLOAT, lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k)),
    "norm2": (_FLOAT, lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k))),
}


def normalize_axes(op: str, axis, rank: int) -> list:
    """numpy-style `axis` (None, int or sequence of ints) -> sorted, unique, non-negative axes."""
    if axis is None:
        return list(range(rank))
    items = [axis] if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) else axis
    if not isinstance(items, (list, tuple)):
        raise GraphError(f"{op}: axis={axis!r} must be None, an int or a tuple of ints")
    out = []
    for a in items:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise GraphError(f"{op}: axis={axis!r} must be None, an int or a tuple of ints")
        a = normalize_axis(op, a, rank, scalar_axis=False)
        if a in out:
            raise GraphError(f"{op}: axis {a} repeated in axis={axis!r}")
        out.append(a)
    return sorted(out)


def reduced_shape(shape: tuple, axes, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _infer(op, kinds):
    def infer(node, types, attrs):
        (t,) = types
        where = node.describe()
        if t.dtype.kind not in kinds:
            raise GraphError(f"{where}: 'x' has dtype {t.dtype}, {op} expects a {' or '.join(kinds)} tensor")
        axes, keepdims = attrs.get("axes"), attrs.get("keepdims")
        if not isinstance(axes, list) or normalize_axes(where, axes, t.rank) != axes:
            raise GraphError(f"{where}: axes={axes!r}, expected a sorted list of distinct axes in 0..{t.rank - 1}")
        if not isinstance(keepdims, bool):
            raise GraphError(f"{where}: keepdims={keepdims!r}, expected a bool")
        return TensorType(reduced_shape(t.shape, axes, keepdims), t.dtype)

    return infer


def _reduce(name, x, axis, keepdims):
    """Add reduction `name` over numpy-style `axis`, stored normalized."""
    g = graph_of(name, x)
    x = as_value(name, "x", x, g)
    if not isinstance(keepdims, (bool, np.bool_)):
        raise GraphError(f"{name}: keepdims={keepdims!r}, expected a bool")
    attrs = {"axes": normalize_axes(name, axis, x.rank), "keepdims": builtins.bool(keepdims)}
    return g.apply(name, [x], attrs)[0]


for _name, (_kinds, _ref) in REDUCTIONS.items():
    defop(_name, attrs=("axes", "keepdims"))(_infer(_name, _kinds))
    reference(_name)(lambda node, ins, attrs, _f=_ref: [_f(ins[0], tuple(attrs["axes"]), attrs["keepdims"])])


@builder
def sum(x, axis=None, keepdims=False):
    """Sum over `axis` (an int, a tuple, or None for every axis)."""
    return _reduce("sum", x, axis, keepdims)


@builder
def mean(x, axis=None, keepdims=False):
    """Mean over `axis` (an int, a tuple, or None for every axis)."""
    return _reduce("mean", x, axis, keepdims)


@builder
def prod(x, axis=None, keepdims=False):
    """Product over `axis` (an int, a tuple, or None for every axis)."""
    return _reduce("prod", x, axis, keepdims)


@builder
def max(x, axis=None, keepdims=False):
    """Maximum over `axis` (an int, a tuple, or None for every axis)."""
    return _reduce("max", x, axis, keepdims)


@builder
def min(x, axis=None, keepdims=False):
    """Minimum over `axis` (an int, a tuple, or None for every axis)."""
    return _reduce("min", x, axis, keepdims)


@builder
def amax(x, axis=None, keepdims=False):
    """Maximum over `axis` (an int, a tuple, or None for every axis); the same reduction as `max`."""
    return _reduce("amax", x, axis, keepdims)


@builder
def norm1(x, axis=None, keepdims=False):
    """Sum of absolute values over `axis` (an int, a tuple, or None for every axis)."""
    return _reduce("norm1", x, axis, keepdims)


@builder
def norm2(x, axis=None, keepdims=False):
    """Euclidean norm over `axis` (an int, a tuple, or None for every axis)."""
    return _reduce("norm2", x, axis, keepdims)


__all__ = list(REDUCTIONS)
