"""The rewrite driver: finds the non-overlapping matches of the registered patterns in a graph, checks
that every replaced intermediate is read only inside its match, and builds the rewritten graph with the
records of what was replaced."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import GraphError, LoweringError
from ..frontend.graph import Graph, Node, Value
from ..progress import step
from .patterns import PATTERNS, Match, Pattern, Uses


# ---- building the rewritten graph ----------------------------------------------------------------


class Builder:
    """Emits into the rewritten graph: `value(v)` is the new value of an old one; `shared(key, make)`
    builds a value once per rewrite (a RoPE table both q and k read); `constant(array)` adds a constant
    under a name the given graph does not use (its constants are copied in later, under their names)."""

    def __init__(self, given: Graph):
        self.graph = Graph(given.name)
        self.env: dict[int, Value] = {}
        self._shared: dict = {}
        self._taken = set(given.constants) | {v.name for v in given.inputs}

    def constant(self, array) -> Value:
        i = len(self.graph.constants)
        while f"rewrite_c{i}" in self._taken or f"rewrite_c{i}" in self.graph.constants:
            i += 1
        return self.graph.constant(f"rewrite_c{i}", np.asarray(array))

    def value(self, v: Value | None) -> Value | None:
        return None if v is None else self.env[v.id]

    def shared(self, key, make: Callable[[], Value]) -> Value:
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]


@dataclass
class Record:
    """One rewrite: pattern `pattern` replaced `replaced` ((id, op) in the given graph) by node `node`
    (its id in the rewritten graph) of op `op`."""

    function: str
    pattern: str
    op: str
    node: str
    replaced: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "function": self.function,
            "pattern": self.pattern,
            "op": self.op,
            "node": self.node,
            "replaced": [list(r) for r in self.replaced],
        }


def find_matches(graph: Graph, uses: Uses) -> dict[int, tuple[Pattern, Match]]:
    """Non-overlapping matches by anchor node, tried from the last node back."""
    by_op: dict[str, list[Pattern]] = {}
    for p in PATTERNS:
        for op in p.anchors:
            by_op.setdefault(op, []).append(p)
    claimed: set[int] = set()
    found = {}
    for node in reversed(graph.nodes):
        if id(node) in claimed:
            continue
        for p in by_op.get(node.op, ()):
            m = p.match(node, uses)
            if m is not None:
                m.nodes = list({id(n): n for n in m.nodes}.values())
            if m is None or any(id(n) in claimed for n in m.nodes) or not _closed(m, node, uses):
                continue
            claimed.update(id(n) for n in m.nodes)
            found[id(node)] = (p, m)
            break
    return found


def _closed(m: Match, anchor: Node, uses: Uses) -> bool:
    """Every node the match replaces, but the anchor, is read only inside the match."""
    ids = {id(n) for n in m.nodes}
    if id(anchor) not in ids or any(id(v.producer) in ids for v in m.inputs if v is not None):
        return False
    return all(uses.only_inside(v, ids) for n in m.nodes if n is not anchor for v in n.outputs)


def rewrite(graph: Graph, function: str = "main") -> tuple[Graph, list[Record]]:
    """The graph with every pattern found replaced, and what was replaced. Without a match the given
    graph itself is returned."""
    uses = Uses(graph)
    found = find_matches(graph, uses)
    if not found:
        return graph, []
    replaced = {id(n) for _, m in found.values() for n in m.nodes}
    dead = _dead(graph, uses, found, replaced)
    b = Builder(graph)
    g = b.graph
    for v in graph.inputs:
        b.env[v.id] = g.input(v.name, v.shape, v.dtype)
    records = []
    for node in graph.nodes:
        if id(node) in dead or (id(node) in replaced and id(node) not in found):
            continue
        out = node.outputs[0] if node.outputs else None
        if id(node) in found:
            p, m = found[id(node)]
            try:
                new = m.build(b)
            except GraphError as e:
                raise LoweringError(
                    f"rewrite {p.name} of {node.describe()} failed: {e}; compile with "
                    f"rewrite=False to lower the graph as given"
                ) from None
            if new.type != out.type:
                raise LoweringError(
                    f"rewrite {p.name} of {node.describe()}: the replacement is {new.type}, expected {out.type}"
                )
            b.env[out.id] = new
            records.append(
                Record(
                    function,
                    p.name,
                    m.op,
                    f"%{new.id}",
                    [(f"%{n.outputs[0].id}", n.op) for n in sorted(m.nodes, key=lambda n: n.id)],
                )
            )
        elif node.op == "constant":
            b.env[out.id] = g.share_constant(graph, node.attrs["name"])
        elif node.op == "parameter":
            b.env[out.id] = g.parameter(node.attrs["name"], out.shape, out.dtype)
        elif node.op == "state":
            b.env[out.id] = g.state(node.attrs["name"], out.shape, out.dtype)
        else:
            news = g.apply(node.op, [b.value(v) for v in node.inputs], node.attrs)
            for o, n in zip(node.outputs, news):
                b.env[o.id] = n
    g.output(*[b.value(v) for v in graph.outputs])
    for name, v in graph.assigns.items():
        g.assign(name, b.value(v))
    for c in graph.assumptions:  # what the graph was built assuming holds for the rewritten one too
        g.assume(c)
    return g, records


def _dead(graph: Graph, uses: Uses, found: dict, replaced: set) -> set:
    """Nodes whose every reader a rewrite removed (nodes unread in the given graph stay)."""
    live = {v.id for v in graph.outputs} | {v.id for v in graph.assigns.values()}
    dead = set()
    for node in reversed(graph.nodes):
        if id(node) in replaced and id(node) not in found:
            continue
        keep = (
            node.op in ("parameter", "state")
            or any(o.id in live for o in node.outputs)
            or all(uses.count(o) == 0 for o in node.outputs)
        )
        if not keep:
            dead.add(id(node))
            continue
        reads = found[id(node)][1].inputs if id(node) in found else node.inputs
        live.update(v.id for v in reads if v is not None)
    return dead


def rewrite_program(program: dict) -> tuple[dict, list[dict]]:
    """Rewrite each function of a {name: Graph} program; the records of all, as JSON."""
    out, records = {}, []
    with step(
        f"rewrite: fused ops into {', '.join(g.name for g in program.values())}", logger=__package__
    ):  # the stage's logger: rocmc.rewrite
        for name, graph in program.items():
            out[name], recs = rewrite(graph, name)
            records += [r.to_json() for r in recs]
    return out, records
