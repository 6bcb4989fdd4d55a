"""The layers of docs/architecture.md, read from the source with `ast`.

Every module of rocmc/ belongs to one layer, and a layer imports only from the layers it names as its
`uses` (all below it): no import, at module level or inside a function, goes up or sideways (the runtime
never imports the lowering). Imports at module level form no cycle. Third-party imports are not checked
here.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "rocmc"

# Bottom first: (layer, its modules or packages, the layers it may import besides itself).
LAYERS = (
    (
        "ground",
        (
            "rocmc._version",
            "rocmc.errors",
            "rocmc.dtypes",
            "rocmc.symbolic",
            "rocmc.files",
            "rocmc.group",
            "rocmc.archs",
            "rocmc.progress",
            "rocmc.children",
            "rocmc.arrays",
            "rocmc.externs",
            "rocmc.aliases",
            "rocmc.signature",
        ),
        (),
    ),
    ("frontend", ("rocmc.frontend", "rocmc.ops"), ("ground",)),
    ("rewrite", ("rocmc.rewrite",), ("ground", "frontend")),
    ("artifact", ("rocmc.artifact", "rocmc.parameters", "rocmc.inspect"), ("ground",)),
    ("lowering", ("rocmc.lowering",), ("ground", "frontend", "rewrite", "artifact")),
    ("runtime", ("rocmc.runtime",), ("ground", "frontend", "artifact")),
    ("llm", ("rocmc.llm",), ("ground", "frontend", "rewrite", "artifact", "lowering", "runtime")),
    ("top", ("rocmc", "rocmc.cli"), ("ground", "frontend", "rewrite", "artifact", "lowering", "runtime", "llm")),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str | None:
    """The layer of the longest module or package prefix that names `module`."""
    best, found = -1, None
    for layer, members, _ in LAYERS:
        for m in members:
            if (module == m or module.startswith(m + ".")) and len(m) > best:
                best, found = len(m), layer
    return found


class Import:
    def __init__(self, source: str, target: str, line: int, local: bool):
        self.source, self.target, self.line, self.local = source, target, line, local

    def __str__(self) -> str:
        path = MODULES[self.source].relative_to(PACKAGE.parent)
        where = "inside a function" if self.local else "at module level"
        return f"{path}:{self.line}: {self.source} imports {self.target} ({where})"


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(module: str) -> list[Import]:
    """The rocmc modules `module` imports: `from p import name` is p.name where that is a module, else p.
    An import under `if TYPE_CHECKING:` counts as local (it never runs at import)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def target(base: str, name: str) -> str:
        return f"{base}.{name}" if f"{base}.{name}" in MODULES else base

    def visit(node, local: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, True)
                continue
            if isinstance(child, ast.If) and _type_checking(child):
                visit(child, True)
                continue
            if isinstance(child, ast.Import):
                found.extend(
                    Import(module, a.name, child.lineno, local) for a in child.names if a.name.split(".")[0] == "rocmc"
                )
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([child.module] if child.module else []))
                else:
                    base = child.module
                if base.split(".")[0] == "rocmc":
                    found.extend(Import(module, target(base, a.name), child.lineno, local) for a in child.names)
            visit(child, local)

    visit(ast.parse(path.read_text(), str(path)), False)
    unique = {(i.target, i.line, i.local): i for i in found}
    return list(unique.values())


ALL_IMPORTS = [i for m in MODULES for i in imports(m)]


def test_layers_are_ordered():
    names = [name for name, _, _ in LAYERS]
    for i, (name, _, uses) in enumerate(LAYERS):
        assert set(uses) <= set(names[:i]), f"layer {name} uses a layer that is not below it: {uses}"


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if layer_of(m) is None]
    assert not missing, "modules in no layer (add them to LAYERS in tests/test_layers.py):\n" + "\n".join(missing)


def test_no_import_goes_up_or_sideways():
    uses = {name: {name, *below} for name, _, below in LAYERS}
    bad = []
    for imp in ALL_IMPORTS:
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if src is not None and dst is not None and dst not in uses[src]:
            bad.append(f"{imp}: layer {src} may import only {', '.join(sorted(uses[src]))}, not {dst}")
    print("\n".join(bad))
    assert not bad, "imports against the layers of docs/architecture.md:\n" + "\n".join(bad)


def test_no_import_cycle():
    graph = defaultdict(list)
    for imp in ALL_IMPORTS:
        if not imp.local and imp.target != imp.source:
            graph[imp.source].append(imp)
    cycles, state = [], {}

    def walk(module: str, stack: list[Import]):
        state[module] = "open"
        for imp in graph[module]:
            if state.get(imp.target) == "open":  # back to a module on the path: a cycle
                start = next(k for k, s in enumerate(stack) if s.source == imp.target)
                cycles.append(stack[start:] + [imp])
            elif imp.target not in state:
                walk(imp.target, stack + [imp])
        state[module] = "done"

    for m in sorted(MODULES):
        if m not in state:
            walk(m, [])
    text = ["\n".join(f"  {i}" for i in cycle) for cycle in cycles]
    print("\n\n".join(text))
    assert not cycles, "import cycles (module-level imports):\n" + "\n\n".join(text)
