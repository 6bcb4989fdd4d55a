"""Implementation registry: (op, implementation) -> lowering function, chosen per target.

Each implementation declares the target kinds it can serve, whether it is used by default there,
and a `supports(node, target)` check that returns None or the reason it can't take the node. The
choice for every node (and the reasons preferred ones were skipped) is recorded in the artifact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..aliases import current
from ..errors import LoweringError
from ..frontend.graph import Node
from .target import Target


@dataclass
class Impl:
    op: str
    name: str  # "generated", "kernel", "dnn", "blas", ...
    fn: Callable  # (emitter, node, operands, ctx) -> list[T]
    kinds: tuple  # target kinds it can lower for
    default_on: tuple  # target kinds where it is chosen without being asked for
    priority: int  # lower wins among defaults
    supports: Callable | None  # (node, target) -> None | reason
    library: str | None  # compile-wide switch name that enables it (e.g. "dnn")
    # (node, target) -> None | reason: when it pays to use it; checked when the implementation is
    # chosen by default or by `libraries`, not when a node's implementation is asked for by name
    rule: Callable | None = None
    # Eligible on every target of `kinds` even where not enabled (default_on, libraries): what lowers
    # a node when nothing preferred can (the generated implementation)
    fallback: bool = False
    # (node, target) -> int: the priority for this node where it differs from `priority`
    priority_for: Callable | None = None

    def rank(self, node: Node, target: Target) -> int:
        return self.priority if self.priority_for is None else self.priority_for(node, target)


REGISTRY: dict[str, dict[str, Impl]] = {}


GENERATED = "generated"


def lowering(
    *ops: str,
    impl: str = GENERATED,
    kinds=("cpu", "rocm", "cuda"),
    default_on=None,
    priority: int = 100,
    supports=None,
    library: str | None = None,
    rule=None,
    fallback: bool | None = None,
    priority_for=None,
):
    """Register a lowering for one or more ops. The generated implementation (the default `impl`)
    is each op's fallback unless `fallback` says otherwise."""
    fallback = impl == GENERATED if fallback is None else fallback

    def deco(fn):
        for op in ops:
            REGISTRY.setdefault(op, {})[impl] = Impl(
                op,
                impl,
                fn,
                tuple(kinds),
                tuple(kinds if default_on is None else default_on),
                priority,
                supports,
                library,
                rule,
                fallback,
                priority_for,
            )
        return fn

    return deco


@dataclass
class Choice:
    impl: Impl
    skipped: list = field(default_factory=list)  # (implementation, reason)

    def record(self, node: Node) -> dict:
        return {
            "node": f"%{node.outputs[0].id}" if node.outputs else node.op,
            "op": node.op,
            "impl": self.impl.name,
            "skipped": [f"{n}: {r}" for n, r in self.skipped],
        }


def current_options(impl, libraries):
    """compile's `impl` and `libraries` with old names (rocmc.aliases: `impl="hip"`, `libraries=["miopen"]`)
    replaced by the current ones; anything else is left for check_options to judge."""
    if isinstance(impl, dict):
        impl = {op: current(name) for op, name in impl.items()}
    else:
        impl = current(impl)
    if isinstance(libraries, (list, tuple)):
        libraries = type(libraries)(current(lib) for lib in libraries)
    return impl, libraries


def check_options(impl, libraries) -> None:
    """Reject unknown names in compile's `impl` and `libraries` before anything is lowered: a typo
    would otherwise fall back to the defaults without a word."""
    names = sorted({i.name for impls in REGISTRY.values() for i in impls.values()})
    if isinstance(impl, str):
        if impl not in names:
            raise LoweringError(f"compile(impl={impl!r}): unknown implementation; known: {', '.join(names)}")
    elif isinstance(impl, dict):
        for op, name in impl.items():
            if op not in REGISTRY:
                raise LoweringError(
                    f"compile(impl={{{op!r}: ...}}): unknown op {op!r}; known: {', '.join(sorted(REGISTRY))}"
                )
            if name not in REGISTRY[op]:
                raise LoweringError(
                    f"compile(impl={{{op!r}: {name!r}}}): unknown implementation of {op}; "
                    f"known: {', '.join(sorted(REGISTRY[op]))}"
                )
    elif impl is not None:
        raise LoweringError(f"compile(impl={impl!r}): expected an implementation name or a dict {{op: name}}")
    known = sorted({i.library for impls in REGISTRY.values() for i in impls.values() if i.library})
    if not isinstance(libraries, (list, tuple)):
        raise LoweringError(
            f"compile(libraries={libraries!r}): expected a list of library names, e.g. [{', '.join(map(repr, known))}]"
        )
    for lib in libraries:
        if lib not in known:
            raise LoweringError(f"compile(libraries=[{lib!r}]): unknown library; known: {', '.join(known)}")


def choose(node: Node, target: Target, impl=None, libraries=()) -> Choice:
    """Pick the implementation of `node` for `target`.

    `impl` is a dict {op: implementation} or one implementation name for every op (e.g. "generated"
    turns every hand-written kernel and library call off). `libraries` opts into library
    implementations (e.g. ["dnn"]) for every op they cover.
    """
    impls = REGISTRY.get(node.op)
    if not impls:
        raise LoweringError(f"{node.describe()}: no lowering registered for op {node.op!r}")
    requested = impl.get(node.op) if isinstance(impl, dict) else impl
    skipped = []
    if requested is not None:
        if requested not in impls and not isinstance(impl, str):
            raise LoweringError(
                f"{node.describe()}: unknown implementation {requested!r} for {node.op}; "
                f"known: {', '.join(sorted(impls))}"
            )
        cand = impls.get(requested)
        if cand is not None:
            reason = _unfit(cand, node, target)
            if reason is None:
                return Choice(cand)
            skipped.append((cand.name, reason))
    order = sorted(
        (i for i in impls.values() if i.name != requested),
        key=lambda i: (
            0 if (target.kind in i.default_on or (i.library and i.library in libraries)) else 1,
            i.rank(node, target),
        ),
    )
    for cand in order:
        enabled = target.kind in cand.default_on or (cand.library is not None and cand.library in libraries)
        if not enabled and not cand.fallback:
            continue
        reason = _unfit(cand, node, target) or (cand.rule(node, target) if cand.rule else None)
        if reason is None:
            return Choice(cand, skipped)
        skipped.append((cand.name, reason))
    raise LoweringError(
        f"{node.describe()}: no implementation can lower it for {target}: " + "; ".join(f"{n}: {r}" for n, r in skipped)
    )


def _unfit(cand: Impl, node: Node, target: Target):
    if target.kind not in cand.kinds:
        return f"not available for {target.kind} targets"
    return cand.supports(node, target) if cand.supports else None
