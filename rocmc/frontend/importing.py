"""What the model importers (ONNX, torch.export) share: names made into graph identifiers, a slice
bound read as a size, and the reasoning about symbolic sizes (deciding a comparison, and recording
what deciding it assumed as a constraint of the graph)."""

from __future__ import annotations

import re

from .. import symbolic

_IDENT = re.compile(r"[^A-Za-z0-9_]")


def identifier(name: str, fallback: str) -> str:
    """`name` as a graph identifier: other characters become `_`; a leading digit gets a `v`."""
    s = _IDENT.sub("_", name or "")
    if not s:
        return fallback
    return s if not s[0].isdigit() else f"v{s}"


def slice_bound(at_most, b, dim):
    """A slice bound as a size of a dim of size `dim`: negative ints count from the end, INT_MAX-like
    ones mean the end; `at_most(a, b)` decides a <= b for sizes (the importer's assumptions)."""
    if isinstance(b, str):
        return b
    if b >= symbolic.BIG:
        return dim
    if b < 0:
        b = symbolic.dim_add(dim, b)
        if not at_most(0, b):
            return 0
    return b


class SizeReasoning:
    """Comparisons of symbolic sizes, for an importer: a base class of it. The importer has `graph`
    (the Graph being built), `label` (the node being converted, which names each assumption) and
    `unsupported` (its exception for what it cannot import). Each assumption is a constraint of the
    graph (`graph.assume`), checked when the module is called."""

    unsupported: type[Exception] = Exception

    def assume_symbols(self, least: dict) -> None:
        """The node being converted decided a comparison by assuming these least sizes {symbol: n}."""
        for name, n in sorted(least.items()):
            self.graph.assume(
                symbolic.Constraint(
                    f"{self.label} (imported assuming {name} >= {n})", "at_least", symbolic.Sym(name), symbolic.Int(n)
                )
            )

    def assume_at_most(self, a, b) -> None:
        """The node being converted assumed size a <= size b (checked when the module is called)."""
        self.graph.assume(
            symbolic.Constraint(
                f"{self.label} (imported assuming {a} <= {b})", "at_least", symbolic.parse(b), symbolic.parse(a)
            )
        )

    def decide(self, a, relation: str, b) -> bool:
        """Whether `a relation b` holds for two sizes (symbolic.decide, recording what it assumed);
        `unsupported` when no assumption decides it."""
        try:
            ok, needs = symbolic.decide(a, relation, b)
        except symbolic.Undecided as e:
            raise self.unsupported(f"cannot decide {a} {relation} {b}: {e}") from None
        self.assume_symbols(needs)
        return ok

    def at_most(self, a, b) -> bool:
        """Whether size a <= size b; when nothing decides it, assumed true (a slice's symbolic end within
        its dim: a call that breaks it is an InputError, not a silently shorter slice)."""
        try:
            return self.decide(a, "<=", b)
        except self.unsupported:
            self.assume_at_most(a, b)
            return True
