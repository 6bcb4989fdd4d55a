"""Index-driven ops: update_slice, narrow, argmax, argmin, topk, arange, cumsum, triu, tril.

update_slice and narrow take their start as a Python int or as a graph value holding one integer
(i32 or i64, shape () or (1,)): a decode step writes its KV-cache row at a position known only at
run time. Starts clamp as in XLA's dynamic_update_slice / dynamic_slice, so the compiled module
never writes or reads out of bounds. A `narrow` length and an `arange` limit may name a symbol of
the graph (a dim of some input, e.g. "kv"): the size is then that input's size at run time.
"""

from __future__ import annotations

import math

import numpy as np

from ... import symbolic
from ...errors import GraphError, InputError
from ... import dtypes as dt
from ..graph import Graph, TensorType, Value
from ..opdef import as_value, builder, check_axis, defop, graph_of, is_int, normalize_axis, reference
from ..reference import symbol_sizes
from .reduce import reduced_shape

__all__ = ["update_slice", "narrow", "argmax", "argmin", "topk", "arange", "cumsum", "triu", "tril"]

# argmax and topk carry positions in 31 bits (lowering/codegen/index.py: topk packs (value,
# position) into one i64 key; argmax reduces positions as i32).
MAX_POSITIONS = 2**31 - 1


def _desc(op: str, *values) -> str:
    """How errors name a node before it exists (the same text as Node.describe)."""
    return f"{op}({', '.join(f'%{v.id}' for v in values if isinstance(v, Value))})"


# ---- dynamic starts ----------------------------------------------------------------------------


def _start_operand(desc: str, graph: Graph, start):
    """(operands, attributes) of a start: no operand and {"start": the int or size expression}, or
    [the Value] and {}."""
    if is_int(start):
        return [], {"start": int(start)}
    if isinstance(start, str):
        _size_expression(desc, graph, start)
        return [], {"start": start}
    if isinstance(start, Value):
        if start.graph is not graph:
            raise GraphError(f"{desc}: argument 'start' belongs to another graph")
        return [start], {}
    raise GraphError(
        f"{desc}: start={start!r}, expected an int, a size expression of the graph's symbols "
        f'("kv-1") or an integer graph value of shape () or (1,)'
    )


def _size_expression(desc: str, graph: Graph, text: str):
    """A start spelled over the graph's symbols: known from the inputs' shapes when the module is called,
    so the device computes nothing and the host reads nothing back to place the slice."""
    expr = symbolic.parse(text)
    unknown = sorted(expr.symbols() - set(graph.symbols()))
    if unknown:
        raise GraphError(f"{desc}: start={text!r} names {', '.join(unknown)}, not a dim of any graph input")
    return expr


def _check_start(desc: str, start_type: TensorType | None, start_attr) -> None:
    if start_type is None:
        if not (is_int(start_attr) or isinstance(start_attr, str)):
            raise GraphError(f"{desc}: start={start_attr!r}, expected an int")
        return
    if start_attr is not None:
        raise GraphError(f"{desc}: start is given both as an operand and as the attribute start={start_attr!r}")
    if start_type.dtype.kind != "int" or start_type.shape not in ((), (1,)):
        raise GraphError(f"{desc}: 'start' is {start_type}, expected one integer: i32 or i64 of shape () or (1,)")


def _start_value(ins: list, attrs: dict, i: int) -> int:
    """The start in a reference: the attribute (an int, or a size expression at this call's sizes), or
    the one integer in operand i."""
    if len(ins) > i:
        return int(np.asarray(ins[i]).reshape(-1)[0])
    start = attrs["start"]
    return symbolic.parse(start).evaluate(symbol_sizes()) if isinstance(start, str) else start


def clamp_start(start: int, dim: int, length: int) -> int:
    """XLA's rule: the window [start, start+length) is moved inside [0, dim)."""
    return min(max(start, 0), dim - length)


# ---- update_slice ------------------------------------------------------------------------------


@defop("update_slice", attrs=("axis", "start"))
def _update_slice(node, types, attrs):
    x, upd = types[0], types[1]
    desc = node.describe()
    axis = check_axis(desc, attrs["axis"], x.rank)
    _check_start(desc, types[2] if len(types) > 2 else None, attrs.get("start"))
    if upd.dtype != x.dtype:
        raise GraphError(f"{desc}: 'update' is {upd.dtype} but 'x' is {x.dtype}; expected the same dtype")
    if upd.rank != x.rank:
        raise GraphError(f"{desc}: 'update' has rank {upd.rank} ({upd}) but 'x' has rank {x.rank} ({x})")
    for i, (a, b) in enumerate(zip(x.shape, upd.shape)):
        if i != axis and a != b:
            raise GraphError(
                f"{desc}: dim {i} of 'update' is {b} but {a} in 'x' ({upd} into {x}); only dim "
                f"{axis} (the axis) may differ"
            )
    n, u = x.shape[axis], upd.shape[axis]
    if isinstance(n, int) and isinstance(u, int) and u > n:
        raise GraphError(f"{desc}: 'update' has {u} entries along axis {axis}, more than the {n} of 'x'")
    return x


@reference("update_slice")
def _update_slice_ref(node, ins, attrs):
    x, upd, axis = ins[0], ins[1], attrs["axis"]
    n, u = x.shape[axis], upd.shape[axis]
    if u > n:
        raise InputError(f"{node.describe()}: 'update' has {u} entries along axis {axis}, more than the {n} of 'x'")
    s = clamp_start(_start_value(ins, attrs, 2), n, u)
    out = x.copy()
    index = [slice(None)] * x.ndim
    index[axis] = slice(s, s + u)
    out[tuple(index)] = upd
    return [out]


@builder
def update_slice(x, update, start, axis):
    """x with `update` written at [start, start + update.shape[axis]) along `axis` (XLA's
    dynamic_update_slice on one axis); every other dim of `update` equals x's.

    `start` is an int, a size expression over the graph's symbols ("kv-1": computed from the inputs'
    shapes, nothing read back from the device), or a graph value holding one integer (i32 or i64,
    shape () or (1,)). As in XLA,
    a start out of range is clamped to [0, x.shape[axis] - update.shape[axis]], so the update always
    lands whole inside x. update.shape[axis] may be symbolic (a prefill writes "s" rows); a call with
    more rows than x has is an InputError. Lowered to tensor.insert_slice, which IREE performs in place
    when x is a mutable global (a KV cache)."""
    g = graph_of("update_slice", x, update, start)
    xv = as_value("update_slice", "x", x, g)
    uv = as_value("update_slice", "update", update, g, like=xv)
    desc = _desc("update_slice", xv, uv, start)
    operands, attr = _start_operand(desc, g, start)
    axis = normalize_axis(desc, axis, xv.rank)
    return g.apply("update_slice", [xv, uv, *operands], {"axis": axis, **attr})[0]


# ---- narrow ------------------------------------------------------------------------------------


@defop("narrow", attrs=("axis", "start", "length"))
def _narrow(node, types, attrs):
    x, desc, length = types[0], node.describe(), attrs["length"]
    axis = check_axis(desc, attrs["axis"], x.rank)
    _check_start(desc, types[1] if len(types) > 1 else None, attrs.get("start"))
    symbols = node.inputs[0].graph.symbols()
    if isinstance(length, str):
        if not symbolic.parse(length).symbols() <= set(symbols):
            raise GraphError(
                f"{desc}: length={length!r} is not a size over the dims of the graph's inputs "
                f"(symbols: {', '.join(symbols) or 'none'})"
            )
    elif not is_int(length) or length < 0:
        raise GraphError(f"{desc}: length={length!r}, expected an int >= 0 or a size expression")
    n = x.shape[axis]
    if isinstance(n, int) and isinstance(length, int) and length > n:
        raise GraphError(f"{desc}: length={length} is larger than dim {axis} of 'x' ({x}), which is {n}")
    shape = list(x.shape)
    shape[axis] = length
    return x.with_shape(shape)


@reference("narrow")
def _narrow_ref(node, ins, attrs):
    x, axis, length = ins[0], attrs["axis"], attrs["length"]
    size = symbolic.parse(length).evaluate(symbol_sizes()) if isinstance(length, str) else length
    n = x.shape[axis]
    if size > n:
        raise InputError(f"{node.describe()}: length {length} = {size} is larger than dim {axis} of 'x', which is {n}")
    s = clamp_start(_start_value(ins, attrs, 1), n, size)
    return [np.take(x, np.arange(s, s + size), axis=axis)]


@builder
def narrow(x, axis, start, length):
    """x[..., start:start+length, ...] along `axis` (torch.narrow; XLA's dynamic_slice on one axis).

    `start` is an int, a size expression over the graph's symbols ("kv-1"), or a graph value holding
    one integer (i32 or i64, shape () or (1,)), clamped
    to [0, x.shape[axis] - length] as in XLA. `length` is an int or a size over the graph's symbols ("kv",
    a dim of some input, or "(kv-1)"), and is the result's dim. A length larger than the dim is a GraphError when
    both are static, else an InputError when the module is called."""
    g = graph_of("narrow", x, start)
    xv = as_value("narrow", "x", x, g)
    desc = _desc("narrow", xv, start)
    operands, attr = _start_operand(desc, g, start)
    axis = normalize_axis(desc, axis, xv.rank)
    if not (is_int(length) or isinstance(length, str)):
        raise GraphError(f"{desc}: length={length!r}, expected an int or a size expression")
    length = int(length) if is_int(length) else length
    return g.apply("narrow", [xv, *operands], {"axis": axis, **attr, "length": length})[0]


# ---- argmax ------------------------------------------------------------------------------------


def _check_bool(desc: str, name: str, v) -> None:
    if not isinstance(v, bool):
        raise GraphError(f"{desc}: {name}={v!r}, expected a bool")


def _operand(op: str, x, **flags) -> tuple:
    """(graph, x as a Value, how errors name the node) for a builder taking one tensor of rank >= 1 and
    bool flags (numpy bools accepted)."""
    g = graph_of(op, x)
    xv = as_value(op, "x", x, g)
    desc = _desc(op, xv)
    if xv.rank == 0:
        raise GraphError(f"{desc}: 'x' is a scalar ({xv.type}); expected rank >= 1")
    for name, v in flags.items():
        if not isinstance(v, (bool, np.bool_)):
            raise GraphError(f"{desc}: {name}={v!r}, expected a bool")
    return g, xv, desc


def _require_positions(desc: str, x: TensorType, axis: int) -> None:
    n = x.shape[axis]
    if isinstance(n, int) and n > MAX_POSITIONS:
        raise GraphError(f"{desc}: dim {axis} of 'x' has {n} entries; at most 2**31-1 positions are supported")


def _require_nonempty(desc: str, x: TensorType, axis: int) -> None:
    if x.shape[axis] == 0:
        raise GraphError(f"{desc}: axis {axis} of 'x' ({x}) is empty; there is nothing to select")


def _arg_extreme(node, types, attrs):
    x, desc = types[0], node.describe()
    if x.dtype.kind not in ("float", "int"):
        raise GraphError(f"{desc}: 'x' has dtype {x.dtype}, expected a float or int tensor")
    axis = check_axis(desc, attrs["axis"], x.rank)
    _check_bool(desc, "keepdims", attrs["keepdims"])
    _check_bool(desc, "last_index", attrs.get("last_index", False))
    _require_nonempty(desc, x, axis)
    _require_positions(desc, x, axis)
    return TensorType(reduced_shape(x.shape, [axis], attrs["keepdims"]), dt.i64)


defop("argmax", attrs=("axis", "keepdims", "last_index"))(_arg_extreme)
defop("argmin", attrs=("axis", "keepdims", "last_index"))(_arg_extreme)


def _require_rows(node, x: np.ndarray, axis: int) -> None:
    if x.shape[axis] == 0:
        raise InputError(f"{node.describe()}: axis {axis} of 'x' is empty in this call; there is nothing to select")


@reference("argmax", "argmin")
def _arg_extreme_ref(node, ins, attrs):
    x, axis = ins[0], attrs["axis"]
    _require_rows(node, x, axis)
    pick = np.argmax if node.op == "argmax" else np.argmin
    if not attrs.get("last_index", False):
        return [pick(x, axis=axis, keepdims=attrs["keepdims"])]
    n = x.shape[axis]  # the first position in the reversed axis is the last one
    return [n - 1 - pick(np.flip(x, axis), axis=axis, keepdims=attrs["keepdims"])]


def _arg_builder(op: str, x, axis, keepdims, last_index):
    g, xv, desc = _operand(op, x, keepdims=keepdims, last_index=last_index)
    attrs = {"axis": normalize_axis(desc, axis, xv.rank), "keepdims": bool(keepdims)}
    if last_index:  # absent when False: graphs built before the flag existed print and hash the same
        attrs["last_index"] = True
    return g.apply(op, [xv], attrs)[0]


@builder
def argmax(x, axis=-1, keepdims=False, last_index=False):
    """Index (i64) of the largest entry along `axis`: the first one on ties (the last with
    last_index=True), and NaN counts as the largest value (the first NaN wins, or the last), as
    numpy.argmax and ONNX ArgMax (select_last_index)."""
    return _arg_builder("argmax", x, axis, keepdims, last_index)


@builder
def argmin(x, axis=-1, keepdims=False, last_index=False):
    """Index (i64) of the smallest entry along `axis`: the first one on ties (the last with
    last_index=True); NaN counts as the smallest value (the first NaN wins, or the last), as
    numpy.argmin and ONNX ArgMin (select_last_index)."""
    return _arg_builder("argmin", x, axis, keepdims, last_index)


# ---- topk --------------------------------------------------------------------------------------


@defop("topk", attrs=("k", "axis", "largest", "sorted"))
def _topk(node, types, attrs):
    x, desc, k = types[0], node.describe(), attrs["k"]
    if x.dtype.kind not in ("float", "int"):
        raise GraphError(f"{desc}: 'x' has dtype {x.dtype}, expected a float or int tensor")
    axis = check_axis(desc, attrs["axis"], x.rank)
    for name in ("largest", "sorted"):
        _check_bool(desc, name, attrs[name])
    n = x.shape[axis]
    if not is_int(k) or k < 0:
        raise GraphError(f"{desc}: k={k!r}, expected an int >= 0")
    if isinstance(n, int) and k > n:
        raise GraphError(f"{desc}: k={k} is larger than dim {axis} of 'x' ({x}), which is {n}")
    _require_positions(desc, x, axis)
    shape = list(x.shape)
    shape[axis] = int(k)
    return [x.with_shape(shape), TensorType(tuple(shape), dt.i64)]


def topk_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Positions along `axis` in topk order: by value (NaN the largest, -0.0 equal to 0.0), lower
    position first among equal values."""
    x = np.moveaxis(np.asarray(x), axis, -1)
    if x.dtype.kind in "iu":  # bitwise not reverses the order without overflowing
        return np.moveaxis(np.argsort(~x if largest else x, axis=-1, kind="stable"), -1, axis)
    x = x.astype(np.float64)
    nan = np.isnan(x)
    v = np.where(nan, 0.0, x)
    pos = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
    # lexsort: the last key is the primary one.
    keys = (pos, -v, ~nan) if largest else (pos, v, nan)
    return np.moveaxis(np.lexsort(keys, axis=-1), -1, axis)


@reference("topk")
def _topk_ref(node, ins, attrs):
    x, axis, k = ins[0], attrs["axis"], attrs["k"]
    if k > x.shape[axis]:
        raise InputError(
            f"{node.describe()}: k={k} is larger than dim {axis} of 'x', which is {x.shape[axis]} in this call"
        )
    idx = np.take(topk_order(x, axis, attrs["largest"]), np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


@builder
def topk(x, k, axis=-1, largest=True, sorted=True):
    """The k largest (or smallest) entries along `axis` and their positions (i64), largest first
    (smallest first with largest=False); among equal values the lower position comes first (as
    torch.topk and ONNX TopK), -0.0 equals 0.0, and NaN counts as the largest value. `k` is a static
    int up to the axis size (a symbolic axis smaller than k is an InputError at the call). The
    result is always sorted; sorted=False (order unspecified) is accepted for ONNX.
    64-bit inputs (i64, u64, f64) rank the whole axis (quadratic in its size) instead of a k-best selection."""
    g, xv, desc = _operand("topk", x, largest=largest, sorted=sorted)
    if not is_int(k):
        raise GraphError(f"{desc}: k={k!r}, expected a static int")
    attrs = {"k": int(k), "axis": normalize_axis(desc, axis, xv.rank), "largest": bool(largest), "sorted": bool(sorted)}
    values, indices = g.apply("topk", [xv], attrs)
    return values, indices


# ---- arange ------------------------------------------------------------------------------------


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def arange_size(start, limit, delta):
    """numpy.arange's length: an int for a numeric limit, '(s-start)' (or the symbol) for a symbol."""
    if isinstance(limit, str):
        return symbolic.dim_sub(limit, start)
    return max(math.ceil((limit - start) / delta), 0)


@defop("arange", attrs=("start", "limit", "delta", "dtype"))
def _arange(node, types, attrs):
    desc, (start, limit, delta) = node.describe(), (attrs["start"], attrs["limit"], attrs["delta"])
    if attrs["dtype"] not in dt.ALL or dt.ALL[attrs["dtype"]].kind not in ("float", "int"):
        raise GraphError(
            f"{desc}: dtype={attrs['dtype']!r}, expected one of "
            f"{', '.join(n for n, d in dt.ALL.items() if d.kind in ('float', 'int'))}"
        )
    out = dt.ALL[attrs["dtype"]]
    for name, v in (("start", start), ("delta", delta)) + ((("limit", limit),) if not isinstance(limit, str) else ()):
        if not _is_number(v) or not math.isfinite(v):
            raise GraphError(f"{desc}: {name}={v!r}, expected a finite number")
        if out.kind == "int" and not is_int(v):
            raise GraphError(f"{desc}: {name}={v!r} is not an integer but dtype is {out}")
    if delta == 0:
        raise GraphError(f"{desc}: delta=0; expected a non-zero step")
    if isinstance(limit, str) and (not is_int(start) or delta != 1):
        raise GraphError(
            f"{desc}: a symbolic limit ({limit!r}) needs an int start and delta=1, got start={start!r}, delta={delta!r}"
        )
    return TensorType((arange_size(start, limit, delta),), out)


@reference("arange")
def _arange_ref(node, ins, attrs):
    start, limit, delta = attrs["start"], attrs["limit"], attrs["delta"]
    n = (
        symbolic.parse(limit).evaluate(symbol_sizes()) - start
        if isinstance(limit, str)
        else arange_size(start, limit, delta)
    )
    return [start + np.arange(n, dtype=np.float64) * delta]


@builder
def arange(graph, start, limit, delta=1, dtype="i64"):
    """numpy.arange(start, limit, delta) as a 1-d tensor of `dtype` (i64 by default), built in `graph`.

    start, limit and delta are Python numbers (integers for an integer dtype). `limit` may also be a
    size over the graph's symbols (a dim of some input, e.g. "s", or "(s+p)"): arange(g, 0, "s") is
    the positions 0..s-1 of a call; a symbolic limit needs an int start and delta=1, and has limit - start entries (a
    call with limit < start is an InputError)."""
    if not isinstance(graph, Graph):
        raise GraphError(f"arange: graph={graph!r}, expected the rocmc.Graph to build in")
    try:
        name = dt.dtype(dtype).name
    except GraphError:
        raise GraphError(f"arange: dtype={dtype!r}, expected one of f32, f16, bf16, i32, i64") from None
    if isinstance(limit, str) and not symbolic.parse(limit).symbols() <= set(graph.symbols()):
        raise GraphError(
            f"arange: limit={limit!r} is not a size over the dims of graph {graph.name!r}'s inputs "
            f"(symbols: {', '.join(graph.symbols()) or 'none'})"
        )
    attrs = {
        "start": _plain(start),
        "limit": limit if isinstance(limit, str) else _plain(limit),
        "delta": _plain(delta),
        "dtype": name,
    }
    return graph.apply("arange", [], attrs)[0]


def _plain(v):
    """numpy scalars as Python numbers (attributes print and hash as Python values)."""
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


# ---- cumsum ------------------------------------------------------------------------------------


@defop("cumsum", attrs=("axis", "exclusive", "reverse"))
def _cumsum(node, types, attrs):
    x, desc = types[0], node.describe()
    if x.dtype.kind not in ("float", "int"):
        raise GraphError(f"{desc}: 'x' has dtype {x.dtype}, expected a float or int tensor")
    check_axis(desc, attrs["axis"], x.rank)
    for name in ("exclusive", "reverse"):
        _check_bool(desc, name, attrs[name])
    return x


@reference("cumsum")
def _cumsum_ref(node, ins, attrs):
    x, axis = ins[0], attrs["axis"]
    if attrs["reverse"]:
        x = np.flip(x, axis)
    s = np.cumsum(x, axis=axis, dtype=x.dtype)
    if attrs["exclusive"] and x.shape[axis]:  # shifted by one: each sum leaves its own entry out
        first = np.zeros_like(np.take(s, [0], axis=axis))
        s = np.concatenate([first, np.take(s, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)
    return [np.flip(s, axis) if attrs["reverse"] else s]


@builder
def cumsum(x, axis, exclusive=False, reverse=False):
    """Running sums along `axis` (numpy.cumsum, ONNX CumSum): exclusive leaves each entry out of its
    own sum (the first is 0), reverse sums from the end. f16/bf16 accumulate in f32; integers wrap
    as numpy's do."""
    g, xv, desc = _operand("cumsum", x, exclusive=exclusive, reverse=reverse)
    attrs = {"axis": normalize_axis(desc, axis, xv.rank), "exclusive": bool(exclusive), "reverse": bool(reverse)}
    return g.apply("cumsum", [xv], attrs)[0]


# ---- triu / tril -------------------------------------------------------------------------------


def _triangle(node, types, attrs):
    x, desc, k = types[0], node.describe(), attrs["k"]
    if x.rank < 2:
        raise GraphError(f"{desc}: 'x' has rank {x.rank} ({x}); expected rank >= 2 (a matrix, or a batch of them)")
    if not is_int(k):
        raise GraphError(f"{desc}: k={k!r}, expected an int (the diagonal: 0 main, > 0 above, < 0 below)")
    return x


defop("triu", attrs=("k",))(_triangle)
defop("tril", attrs=("k",))(_triangle)


@reference("triu", "tril")
def _triangle_ref(node, ins, attrs):
    keep = np.triu if node.op == "triu" else np.tril
    return [keep(ins[0], attrs["k"])]


def _triangle_builder(op: str, x, k):
    g = graph_of(op, x)
    xv = as_value(op, "x", x, g)
    if not is_int(k):
        raise GraphError(f"{_desc(op, xv)}: k={k!r}, expected an int")
    return g.apply(op, [xv], {"k": int(k)})[0]


@builder
def triu(x, k=0):
    """numpy.triu on the last two dims (ONNX Trilu upper=1): entries with column - row >= k kept, the
    rest zero (False for bool). Sizes may be symbolic (exporters build causal masks this way over the
    sequence length)."""
    return _triangle_builder("triu", x, k)


@builder
def tril(x, k=0):
    """numpy.tril on the last two dims (ONNX Trilu upper=0): entries with column - row <= k kept, the
    rest zero (False for bool)."""
    return _triangle_builder("tril", x, k)
