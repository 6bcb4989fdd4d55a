"""Evaluate a graph with the ops' float64 numpy references (the ground truth of every test)."""
from __future__ import annotations

import contextvars

import numpy as np

from ..errors import GraphError
from .graph import Graph
from .opdef import get_op, np_float


# Sizes of the graph's symbolic dims during `evaluate`, for references whose result sizes name a
# symbol that their operands lack (broadcast_to a graph symbol, reshape of (b*seq) to (b, seq)).
_SYMBOLS: contextvars.ContextVar = contextvars.ContextVar("rocmc_symbol_sizes", default={})


def symbol_sizes() -> dict:
    """{symbol: size} of the graph being evaluated (a copy)."""
    return dict(_SYMBOLS.get())


def evaluate(graph: Graph, *args, round_to_dtype: bool = False, **feeds):
    """Run `graph` on numpy inputs in float64 (integers stay integers). Returns one array or a tuple.

    round_to_dtype: round every intermediate result to its graph dtype (models storage rounding).
    """
    values = {}
    names = [v.name for v in graph.inputs]
    given = dict(zip(names, args))
    given.update(feeds)
    for v in graph.inputs:
        if v.name not in given:
            raise GraphError(f"evaluate: missing input {v.name!r}")
        values[v.id] = np_float(given[v.name])
    _SYMBOLS.set({d: n for v in graph.inputs for d, n in zip(v.shape, np.shape(given[v.name])) if isinstance(d, str)})
    for node in graph.nodes:
        if node.op == "constant":
            values[node.outputs[0].id] = np_float(graph.constants[node.attrs["name"]])
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
    return res[0] if len(res) == 1 else res
