"""Collectives across the ranks of a tensor-parallel run: all_reduce (sum) and all_gather.

A graph holding them is one rank's program: every rank runs the same graph on its own slice of the
weights, and these ops combine what the ranks computed. `world` is the number of ranks the graph was
built for (the tensor-parallel degree); a run must have exactly that many.

all_reduce(x): the elementwise sum of every rank's x, on every rank.
all_gather(x): every rank's x stacked along axis 0 in rank order, (world * x.shape[0], ...): the
  result holds rank 0's x first. Gathering along another axis is this op plus a reshape and permute.

The float64 reference exchanges the ranks' values through the group collectives run in
(rocmc.group: the hook rocmc.runtime.distributed installs, for a process group or the threads of
`simulate`).
"""

from __future__ import annotations

import numpy as np

from ... import group
from ...errors import GraphError
from ..graph import TensorType
from ..opdef import as_value, builder, defop, dim_expr, graph_of, reference

__all__ = ["all_reduce", "all_gather"]


def _check(node, types, attrs) -> None:
    bound = attrs.get("max_size")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
        raise GraphError(f"{node.describe()}: max_size={bound!r}, expected None or an element count >= 1")
    world = attrs.get("world")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise GraphError(f"{node.describe()}: world={world!r}, expected the number of ranks (an int >= 1)")
    if types[0].rank == 0:
        raise GraphError(f"{node.describe()}: 'x' is 0-d, expected a tensor of rank >= 1")
    if types[0].dtype.kind not in ("float", "int"):
        raise GraphError(f"{node.describe()}: 'x' has dtype {types[0].dtype}, expected a float or integer tensor")


@defop("all_reduce", attrs=("world", "max_size"))
def _all_reduce_infer(node, types, attrs):
    _check(node, types, attrs)
    return types[0]


@defop("all_gather", attrs=("world", "max_size"))
def _all_gather_infer(node, types, attrs):
    _check(node, types, attrs)
    x = types[0]
    return TensorType((dim_expr("*", attrs["world"], x.shape[0]), *x.shape[1:]), x.dtype)


def _group(node, world: int):
    g = group.current()
    if g.world_size != world:
        raise GraphError(f"{node.describe()}: built for {world} ranks, run in a group of {g.world_size}")
    return g


@reference("all_reduce")
def _all_reduce_ref(node, ins, attrs):
    if attrs["world"] == 1:
        return [ins[0]]
    return [_group(node, attrs["world"]).all_reduce(np.asarray(ins[0]))]


@reference("all_gather")
def _all_gather_ref(node, ins, attrs):
    x = np.asarray(ins[0])
    if attrs["world"] == 1:
        return [x]
    stacked = _group(node, attrs["world"]).all_gather(x)
    return [stacked.reshape((-1, *x.shape[1:]))]


def _world(op: str, world) -> int:
    if isinstance(world, bool) or not isinstance(world, (int, np.integer)) or world < 1:
        raise GraphError(f"{op}: world={world!r}, expected the number of ranks (an int >= 1)")
    return int(world)


def _bound(op: str, max_size):
    if max_size is None:
        return None
    if isinstance(max_size, bool) or not isinstance(max_size, (int, np.integer)) or max_size < 1:
        raise GraphError(f"{op}: max_size={max_size!r}, expected None or an element count >= 1")
    return int(max_size)


@builder
def all_reduce(x, world, max_size=None):
    """The sum of x over the `world` ranks of a tensor-parallel run, on every rank. max_size: at most this
    many elements when x's shape is symbolic (a GPU then moves that many in one collective; a call with
    more elements fails), else static pieces are moved one after another."""
    g = graph_of("all_reduce", x)
    x = as_value("all_reduce", "x", x, g)
    return g.apply(
        "all_reduce", [x], {"world": _world("all_reduce", world), "max_size": _bound("all_reduce", max_size)}
    )[0]


@builder
def all_gather(x, world, max_size=None):
    """The `world` ranks' x stacked along axis 0 in rank order, on every rank (max_size as for all_reduce)."""
    g = graph_of("all_gather", x)
    x = as_value("all_gather", "x", x, g)
    return g.apply(
        "all_gather", [x], {"world": _world("all_gather", world), "max_size": _bound("all_gather", max_size)}
    )[0]
