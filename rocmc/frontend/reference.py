"""Evaluate a graph with the ops' float64 numpy references (the ground truth of every test)."""

from __future__ import annotations

import contextvars

import numpy as np

from ..arrays import as_numpy, is_tensor
from ..errors import GraphError, InputError
from ..signature import bind, input_specs
from .graph import Graph
from .opdef import dim_constraints, np_float
from .registry import get_op


# Sizes of the graph's symbolic dims during `evaluate`, for references whose result sizes name a
# symbol that their operands lack (broadcast_to a graph symbol, reshape of (b*seq) to (b, seq)).
_SYMBOLS: contextvars.ContextVar = contextvars.ContextVar("rocmc_symbol_sizes", default={})  # noqa: B039 - never mutated: set() replaces it


def _array(x):
    """Scalars and lists as arrays (a float64 reference takes them); None stays missing, a torch tensor
    stays for `bind` to take under the input's name."""
    return x if x is None or isinstance(x, np.ndarray) or is_tensor(x) else np.asarray(x)


def symbol_sizes() -> dict:
    """{symbol: size} of the graph being evaluated (a copy)."""
    return dict(_SYMBOLS.get())


def evaluate(graph: Graph, *args, **feeds):
    """Run `graph` on numpy inputs in float64 (integers stay integers). Returns one array or a tuple.
    Inputs, parameters and states may be CPU torch tensors too (rocmc.arrays.as_numpy).

    Inputs are checked as a compiled module checks them (InputError), except that any float dtype
    is accepted for a float input and any integer dtype for an integer one (converted to the input's
    dtype: integer results wrap at each node's width, as the module's). round_to_dtype=True rounds every
    intermediate result to its graph dtype (models storage rounding); an array passed as `round_to_dtype=`
    is the input of that name.
    parameters={name: array} gives the graph's parameters. A graph with states takes state={name:
    array} (their values before the call) and returns (outputs, new state dict).
    """
    round_to_dtype = _option(feeds, "round_to_dtype", False)
    parameters = _option(feeds, "parameters", None) or {}
    state = _option(feeds, "state", None)
    parameters = _leaves("parameter", parameters)
    state = _leaves("state", state)
    _check_leaves(graph, "parameter", graph.parameters, parameters)
    if graph.states:
        _check_leaves(graph, "state", graph.states, state if state is not None else {})
    state = dict(state or {})
    given, sizes = bind(
        input_specs(graph),
        [_array(a) for a in args],
        {k: _array(v) for k, v in feeds.items()},
        dim_constraints(graph),
        exact_dtype=False,
        what="graph",
    )
    values = {v.id: _input(v, a) for v, a in zip(graph.inputs, given)}
    _SYMBOLS.set(sizes)
    for node in graph.nodes:
        if node.op == "constant":
            values[node.outputs[0].id] = np_float(graph.constants[node.attrs["name"]])
            continue
        if node.op in ("parameter", "state"):
            values[node.outputs[0].id] = np_float((parameters if node.op == "parameter" else state)[node.attrs["name"]])
            continue
        ref = get_op(node.op).reference
        if ref is None:
            raise GraphError(f"{node.describe()}: op has no reference implementation")
        outs = ref(node, [None if v is None else values[v.id] for v in node.inputs], dict(node.attrs))
        for v, o in zip(node.outputs, outs):
            o = np.asarray(o)
            if v.dtype.kind == "float":
                o = o.astype(np.float64)
                if round_to_dtype:
                    o = o.astype(v.dtype.np).astype(np.float64)
            elif v.dtype.kind == "bool":
                o = o.astype(np.bool_)
            else:
                o = o.astype(v.dtype.np)
            values[v.id] = o
    res = tuple(values[v.id] for v in graph.outputs)
    out = res[0] if len(res) == 1 else res
    if graph.states:
        new_state = {**state, **{name: values[v.id] for name, v in graph.assigns.items()}}
        return out, new_state
    return out


def _input(v, a):
    """A graph input as the references take it: floats as float64, integers in the input's own dtype
    (an int64 array fed to a u8 input wraps as the module's u8 arithmetic does)."""
    a = np_float(a)
    return a.astype(v.dtype.np) if v.dtype.kind == "int" else a


def _option(feeds: dict, key: str, default):
    """A keyword option of evaluate, unless an array of that name is a graph input."""
    if key in feeds and not isinstance(feeds[key], np.ndarray) and not is_tensor(feeds[key]):
        return feeds.pop(key)
    return default


def _leaves(kind: str, given):
    """parameters= or state= with torch tensors taken as numpy arrays (anything not a dict is left for
    _check_leaves to refuse)."""
    if not isinstance(given, dict):
        return given
    return {k: as_numpy(v, f"evaluate: {kind} {k!r}") for k, v in given.items()}


def _check_leaves(graph: Graph, kind: str, declared: dict, given) -> None:
    """Every parameter (or state) the graph declares, given as an array of its shape."""
    keyword = "state" if kind == "state" else "parameters"
    if not isinstance(given, dict):
        raise InputError(f"evaluate: {keyword}= must be a dict of name -> array, got {type(given).__name__}")
    for name, t in declared.items():
        if name not in given:
            raise InputError(f"evaluate: graph {graph.name!r} needs {kind} {name!r} ({t}); pass it in {keyword}=")
        a = np.asarray(given[name])
        if tuple(a.shape) != tuple(t.shape):
            raise InputError(f"evaluate: {kind} {name!r} has shape {list(a.shape)}, expected {list(t.shape)}")
