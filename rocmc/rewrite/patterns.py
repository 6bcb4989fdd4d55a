"""The matching machinery of the rewrite stage: what a pattern is and how one registers, and what a
pattern reads a graph with (who uses a value, constants, symbolic sizes as products, strided views).

A pattern is a function of an anchor node (the last node of the chain, e.g. the final `mul` of an
RMSNorm) returning a `Match` or None, registered with `@pattern(name, *anchor_ops)`. Patterns are tried
at a node in the order they registered: the order of the package's `PATTERN_MODULES`, then the order
within a module.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

from .. import symbolic
from ..frontend.graph import Graph, Node, Value
from ..symbolic import canonical, dim_add, dim_floordiv, dim_mul


@dataclass
class Match:
    """What a pattern recognised: `nodes` are replaced (the anchor among them), `inputs` are the values
    of the graph the replacement reads, `build` emits it and returns the anchor's new value."""

    op: str
    nodes: list
    inputs: list
    build: Callable


@dataclass
class Pattern:
    name: str
    anchors: tuple
    match: Callable  # (node, Uses) -> Match | None


PATTERNS: list[Pattern] = []


def pattern(name: str, *anchors: str):
    """Register a pattern tried at every node whose op is one of `anchors`."""

    def deco(fn):
        PATTERNS.append(Pattern(name, anchors, fn))
        return fn

    return deco


# ---- reading a graph for patterns ------------------------------------------------------------


class Uses:
    """Who reads each value of a graph; graph outputs and assigned states count as outside readers."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.users: dict[int, list[Node]] = {}
        for node in graph.nodes:
            for v in node.inputs:
                if v is not None:
                    self.users.setdefault(v.id, []).append(node)
        self.escaping = {v.id for v in graph.outputs} | {v.id for v in graph.assigns.values()}

    def only_inside(self, v: Value, ids: set) -> bool:
        """Whether every reader of `v` is one of the nodes of `ids` (by id()) and it is no graph output."""
        return v.id not in self.escaping and all(id(u) in ids for u in self.users.get(v.id, ()))

    def count(self, v: Value) -> int:
        return len(self.users.get(v.id, ())) + (v.id in self.escaping)


def producer(v: Value | None, *ops: str) -> Node | None:
    """The node computing `v` if its op is one of `ops`."""
    if v is None or v.producer is None or v.producer.op not in ops:
        return None
    return v.producer


def constant(v: Value | None) -> np.ndarray | None:
    """The array of a constant value, else None."""
    n = producer(v, "constant")
    return None if n is None else v.graph.constants[n.attrs["name"]]


def scalar(v: Value | None) -> float | None:
    """The value of a one-element float constant, else None."""
    a = constant(v)
    if a is None or a.size != 1 or v.dtype.kind != "float":
        return None
    return float(np.asarray(a, dtype=np.float64).reshape(()))


def is_number(v: Value | None, target: float) -> bool:
    """Whether `v` is a one-element constant holding `target` as its dtype rounds it (within one ulp:
    exporters round irrational constants such as sqrt(2) either way)."""
    x = scalar(v)
    if x is None:
        return False
    return x == target or abs(x - target) <= float(ml_dtypes.finfo(v.dtype.np).eps) * abs(target)


def pairs(node: Node):
    """Both orders of a commutative binary node's operands."""
    a, b = node.inputs
    return ((a, b), (b, a))


# ---- sizes: symbolic dims compared and divided as products ------------------------------------------


def same_size(a, b) -> bool:
    """Whether two dims are the same size for every value of their symbols."""
    return a == b or canonical(a) == canonical(b)


def _factors(d) -> tuple[int, list]:
    """A dim as (integer coefficient, the other factors of its product): '(batch*seq*4)' -> (4, [batch, seq]);
    a sum is its terms' common factors times the rest: '((seq*4)+4)' -> (4, ['(seq+1)'])."""
    e = symbolic.parse(canonical(d))
    if isinstance(e, symbolic.Int):
        return e.value, []
    if isinstance(e, symbolic.Chain) and all(op == "*" for op, _ in e.rest):
        coef, names = 1, []
        for x in e.children():
            c, n = _factors(str(x))
            coef, names = coef * c, names + n
        return coef, names
    if isinstance(e, symbolic.Chain) and all(op in "+-" for op, _ in e.rest):
        return _sum_factors([(1, e.first)] + [(1 if op == "+" else -1, x) for op, x in e.rest])
    return 1, [str(e)]


def _sum_factors(terms) -> tuple[int, list]:
    """_factors of a sum of (sign, term): the gcd of the coefficients and the factors every term has,
    times the sum of what is left of each term (one factor)."""
    parts = [(sign * c, n) for sign, t in terms for c, n in [_factors(str(t))]]
    content = functools.reduce(math.gcd, (abs(c) for c, _ in parts))
    common = list(parts[0][1])
    for _, n in parts[1:]:
        common = [f for i, f in enumerate(common) if common[:i].count(f) < n.count(f)]
    rest = 0
    for c, n in parts:
        left = list(n)
        for f in common:
            left.remove(f)
        rest = dim_add(rest, functools.reduce(dim_mul, left, c // content))
    return content, common + [canonical(rest)]


def quotient(a, b):
    """a / b as a dim when b divides a for every value of their symbols (an integer b divides every
    coefficient of a; a symbolic b's factors are among a's), else None."""
    k = canonical(b)
    if isinstance(k, int) and k != 0:
        q = dim_floordiv(a, k)
        return q if same_size(dim_mul(q, k), a) else None
    (ca, na), (cb, nb) = _factors(a), _factors(b)
    if cb == 0 or ca % cb:
        return None
    rest = list(na)
    for f in nb:
        if f not in rest:
            return None
        rest.remove(f)
    return functools.reduce(dim_mul, rest, ca // cb)


def only_broadcasts(v: Value, over: Value) -> bool:
    """Whether `v` broadcasts onto `over` without changing `over`'s shape or rank."""
    if v.rank > over.rank:
        return False
    return all(d == 1 or same_size(d, o) for d, o in zip(v.shape[::-1], over.shape[::-1]))


# ---- strided views: proving that reshape/transpose/broadcast chains are a known layout ------------


class View:
    """Where the elements of a tensor lie in a dense source tensor. Each dim is a list of atoms
    (size, element stride), row-major (a merged dim has several; a broadcast one has stride 0), so
    reshape, transpose and broadcast_to of a view are views again: following a chain of them proves
    which source element each result element reads. Sizes and strides are dims (ints or symbolic
    products, in canonical spelling): a reshape splits or merges atoms only where the sizes divide
    each other as products, so what a view proves holds for every value of the symbols."""

    def __init__(self, shape, dims):
        self.shape, self.dims = tuple(canonical(d) for d in shape), dims

    @classmethod
    def dense(cls, shape) -> "View":
        dims, step = [], 1
        for d in reversed(tuple(shape)):
            dims.insert(0, [(canonical(d), step)])
            step = dim_mul(step, d)
        return cls(shape, dims)

    def transpose(self, perm) -> "View":
        return View([self.shape[p] for p in perm], [self.dims[p] for p in perm])

    def broadcast_to(self, shape) -> "View | None":
        pad = len(shape) - len(self.shape)
        if pad < 0:
            return None
        old = [(1, [])] * pad + list(zip(self.shape, self.dims))
        if any(d != 1 and not same_size(d, n) for (d, _), n in zip(old, shape)):
            return None
        return View(shape, [atoms if same_size(d, n) else [(canonical(n), 0)] for (d, atoms), n in zip(old, shape)])

    def reshape(self, shape) -> "View | None":
        """The same elements in row-major order as `shape` (None for a reshape that is impossible or
        not provable for every value of the symbols)."""
        atoms = [a for dim in self.dims for a in dim if a[0] != 1]
        dims = []
        for n in shape:
            dim, need = [], canonical(n)
            while need != 1:
                if not atoms:
                    return None
                size, stride = atoms.pop(0)
                rest, split = quotient(need, size), quotient(size, need)
                if rest is not None:
                    dim.append((size, stride))
                    need = rest
                elif split is not None:
                    dim.append((need, dim_mul(stride, split)))
                    atoms.insert(0, (split, stride))
                    need = 1
                else:
                    return None
            dims.append(dim)
        return None if atoms else View(shape, dims)

    def strides(self) -> list | None:
        """One element stride per dim (0 for size 1), or None if some dim is no single stride."""
        out = []
        for dim in self.dims:
            merged = []
            for size, stride in (a for a in dim if a[0] != 1):
                if merged and same_size(merged[-1][1], dim_mul(size, stride)):
                    merged[-1] = (dim_mul(merged[-1][0], size), stride)
                else:
                    merged.append((size, stride))
            if len(merged) > 1:
                return None
            out.append(merged[0][1] if merged else 0)
        return out


LAYOUT_OPS = ("reshape", "transpose", "broadcast_to")


def apply_layout(view: View, node: Node) -> View | None:
    if node.op == "transpose":
        return view.transpose(node.attrs["perm"])
    if node.op == "broadcast_to":
        return view.broadcast_to(node.outputs[0].shape)
    return view.reshape(node.outputs[0].shape)


def layout_chain(v: Value, uses: Uses) -> list[tuple[Value, list]]:
    """(source, nodes) for each value `v` is a layout chain of: `v` itself with no nodes, then walking
    back through reshape/transpose/broadcast_to while the values passed are read only by the chain."""
    out, chain, cur = [(v, [])], [], v
    while True:
        n = producer(cur, *LAYOUT_OPS)
        if n is None:
            return out
        if cur is not v and uses.count(cur) != 1:
            return out
        chain = [n, *chain]
        cur = n.inputs[0]
        out.append((cur, chain))


def view_of(source: Value, chain: list) -> View | None:
    view = View.dense(source.shape)
    for n in chain:
        view = apply_layout(view, n)
        if view is None:
            return None
    return view


def as_permutation(source: Value, sizes: tuple, strides) -> list | None:
    """A permutation p with transpose(source, p) of shape `sizes` and element strides `strides`
    (size-1 dims may sit anywhere), or None."""
    dense = View.dense(source.shape).strides()
    if source.rank != len(sizes):
        return None
    perm, free = [None] * len(sizes), list(range(source.rank))
    for i, (n, s) in enumerate(zip(sizes, strides)):
        if n == 1:
            continue
        k = next((k for k in free if same_size(source.shape[k], n) and same_size(dense[k], s)), None)
        if k is None:
            return None
        perm[i] = k
        free.remove(k)
    for i, n in enumerate(sizes):
        if perm[i] is None:
            k = next((k for k in free if source.shape[k] == 1), None)
            if k is None:
                return None
            perm[i] = k
            free.remove(k)
    return perm


def relu_input(node: Node) -> Value | None:
    """x when node is relu(x) or maximum(x, 0) (0 a constant that only broadcasts), else None."""
    if node.op == "relu":
        return node.inputs[0]
    for x, zero in pairs(node):
        if is_number(zero, 0.0) and only_broadcasts(zero, x) and node.outputs[0].shape == x.shape:
            return x
    return None
