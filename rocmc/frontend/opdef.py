"""Op definitions: each op is defined once, with its attributes, shape/dtype rule and float64 reference.

Frontend modules under rocmc/frontend/ops/ register ops in the op registry (registry.py) with
`@defop` (the shape rule) and `@reference` (numpy semantics); user-facing builders are wrapped with
`@builder` so unknown keyword arguments give a typed GraphError naming the op.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

from .. import symbolic
from ..errors import GraphError
from ..dtypes import DType, np_kind
from .graph import Dim, Graph, TensorType, Value
from .registry import OPS, OpDef


def defop(name: str, attrs=()):
    """Register the shape/dtype rule of an op: `infer(node, types, attrs) -> TensorType | list`."""

    def deco(fn):
        def infer(node, types, a):
            out = fn(node, types, a)
            return list(out) if isinstance(out, (list, tuple)) else [out]

        OPS[name] = OpDef(name, infer, tuple(attrs), doc=fn.__doc__ or "")
        return fn

    return deco


def reference(*names: str):
    """Register the float64 numpy semantics of one or more ops."""

    def deco(fn):
        for n in names:
            OPS[n].reference = fn
        return fn

    return deco


def builder(fn):
    """Wrap a user-facing op function: unknown keywords become GraphError, not TypeError."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise GraphError(f"{fn.__name__}: {e}; expected arguments ({', '.join(p.name for p in params)})") from None
        return fn(*args, **kwargs)

    return wrapper


# ---- helpers for builders and shape rules ----------------------------------------------------


def graph_of(op: str, *operands) -> Graph:
    for v in operands:
        if isinstance(v, Value):
            return v.graph
    raise GraphError(f"{op}: at least one operand must be a graph Value")


def as_value(op: str, arg: str, x, graph: Graph, like: Value | None = None) -> Value:
    """A Value from a Value, numpy array or Python scalar (scalars take `like`'s dtype)."""
    if isinstance(x, Value):
        if x.graph is not graph:
            raise GraphError(f"{op}: argument {arg!r} belongs to another graph")
        return x
    if isinstance(x, (bool, int, float, np.number, np.bool_)) and not isinstance(x, np.ndarray):
        if like is None:
            raise GraphError(f"{op}: argument {arg!r} is a scalar but no tensor gives its dtype")
        return graph.constant(None, np.asarray(x, dtype=like.dtype.np), dtype=like.dtype)
    if isinstance(x, np.ndarray):
        if x.dtype == np.float64:
            if like is None or not like.dtype.is_float:
                raise GraphError(f"{op}: argument {arg!r} is float64; cast it to a float dtype (f32, f64, ...)")
            return graph.constant(None, x, dtype=like.dtype)
        return graph.constant(None, x)
    raise GraphError(f"{op}: argument {arg!r} must be a Value, numpy array or scalar, got {type(x).__name__}")


def is_int(v) -> bool:
    """Whether `v` is an integer (Python's or numpy's), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def int_tuple(v):
    """A tuple or list as a tuple, its ints (numpy's too) as Python ints; anything else as given, for the op's
    shape rule to refuse with its own message."""
    return tuple(int(e) if is_int(e) else e for e in v) if isinstance(v, (tuple, list)) else v


def _axis_int(op: str, axis, arg: str) -> None:
    if not is_int(axis):
        raise GraphError(f"{op}: {arg}={axis!r} must be an int")


def _axis_range_error(op: str, axis, rank: int, arg: str, lo: int, hi: int) -> GraphError:
    expect = f"expected {lo}..{hi}" if lo <= hi else "a 0-d tensor has no axes"
    return GraphError(f"{op}: {arg}={int(axis)} is out of range for rank {rank}; {expect}")


def normalize_axis(op: str, axis, rank: int, arg: str = "axis", *, scalar_axis: bool = True) -> int:
    """A numpy-style axis of a rank-`rank` tensor (negative counts from the end), made non-negative.

    With `scalar_axis`, a 0-d tensor takes axis 0 (the shape rule then decides); without it a 0-d
    tensor has no axes (reductions, resize)."""
    _axis_int(op, axis, arg)
    top = max(rank, 1) if scalar_axis else rank
    if not -rank <= axis < top:
        raise _axis_range_error(op, axis, rank, arg, -rank, top - 1)
    return int(axis) % top


def check_axis(op: str, axis, rank: int, arg: str = "axis") -> int:
    """A stored (already normalized) axis attribute: an int in 0..rank-1."""
    _axis_int(op, axis, arg)
    if not 0 <= axis < rank:
        raise _axis_range_error(op, axis, rank, arg, 0, rank - 1)
    return int(axis)


def broadcast_shapes(op: str, *shapes) -> tuple:
    """numpy broadcasting; a symbolic dim matches itself or 1."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0]
        d = 1
        for x in dims:
            if x == 1 or x == d:
                continue
            if d == 1:
                d = x
            else:
                raise GraphError(
                    f"{op}: shapes {' and '.join('[' + ','.join(map(str, s)) + ']' for s in shapes)} "
                    f"do not broadcast: dim {i} is {d} vs {x}"
                )
        out.append(d)
    return tuple(out)


def same_dtype(op: str, types, args) -> DType:
    first = types[0].dtype
    for t, a in zip(types[1:], args[1:]):
        if t.dtype != first:
            raise GraphError(f"{op}: {args[0]!r} is {first} but {a!r} is {t.dtype}; expected the same dtype")
    return first


def require_dtype(op: str, arg: str, t: TensorType, kinds=("float",)) -> None:
    if t.dtype.kind not in kinds:
        raise GraphError(f"{op}: {arg!r} has dtype {t.dtype}, expected a {' or '.join(kinds)} tensor")


def dim_expr(op: str, a: Dim, b: Dim) -> Dim:
    """Combine two dims; ints fold, symbols become an expression string such as '(seq+4)' (the
    spelling rocmc.symbolic parses)."""
    if isinstance(a, int) and isinstance(b, int):
        return {"+": a + b, "*": a * b, "-": a - b}[op]
    if op == "*" and (a == 1 or b == 1):
        return b if a == 1 else a
    if op in "+-" and b == 0:
        return a
    return f"({a}{op}{b})"


def dim_constraints(graph: Graph) -> list:
    """What a call's sizes must satisfy for the graph's types to hold (symbolic.constraints): checked
    by `evaluate`, by the runtime from the metadata, and by the compiled module itself. Only sizes of
    the inputs' symbols can be checked before a call."""
    known = set(graph.symbols())
    found = symbolic.constraints((n.describe(), [d for v in n.outputs for d in v.shape]) for n in graph.nodes)
    return list(graph.assumptions) + [c for c in found if c.lhs.symbols() | c.rhs.symbols() <= known]


def np_float(x):
    """Inputs to a reference: floats as float64, everything else unchanged."""
    if x is None:
        return None
    a = np.asarray(x)
    return a.astype(np.float64) if np_kind(a.dtype) == "f" else a
