"""Graph rewrites: recognise what model exporters decompose and put rocmc's fused ops in its place.

torch's and transformers' ONNX exports spell RMSNorm, GELU, RoPE and attention as chains of small ops;
lowered as they are, a GPU never runs the hand-written rms_norm/rope kernels or the fused attention.
`rewrite(graph)` returns a new graph in which each recognised chain is one op, and the records of what
was recognised. The given graph is not changed.

A pattern is a function of an anchor node (the last node of the chain, e.g. the final `mul` of an
RMSNorm) returning a `Match` or None. Patterns are exact: a match must prove from shapes, axes and
constant values that the fused op computes the same function (results differ by float rounding at
most), and every intermediate it replaces must be used only inside the match (checked here for every
pattern). Anchors are tried from the last node back, so a larger pattern claims its nodes before a
smaller one sees them. Nodes left without users by a rewrite (a pattern's constants) are dropped.

The package is split into:
- `patterns.py`: the matching machinery (`Match`, `@pattern` and its registry `PATTERNS`, `Uses`, and
  what patterns read a graph with: constants, sizes compared and divided as products, strided `View`s);
- `driver.py`: `rewrite(graph)` and `rewrite_program(program)`, which find the matches, check that they
  are closed and build the rewritten graph;
- pattern families, one module each, registering with `@pattern(name, *anchor_ops)`.

`PATTERN_MODULES` is the one list of the families: importing this package imports each of them in that
order, which is the order their patterns are tried at a node (attention first; conv before linear and
linear before activations, so a GEMM's or conv's epilogue claims its activation before the plain
activation patterns see it). A new family is a module here and its name in the list.
"""

from __future__ import annotations

import importlib

from .driver import Builder, Record, find_matches, rewrite, rewrite_program
from .patterns import (
    LAYOUT_OPS,
    PATTERNS,
    Match,
    Pattern,
    Uses,
    View,
    apply_layout,
    as_permutation,
    constant,
    is_number,
    layout_chain,
    only_broadcasts,
    pairs,
    pattern,
    producer,
    quotient,
    relu_input,
    same_size,
    scalar,
    view_of,
)

PATTERN_MODULES = ("attention", "norms", "conv", "linear", "activations", "rope")

for _name in PATTERN_MODULES:
    importlib.import_module(f"{__name__}.{_name}")
del _name

__all__ = [
    "rewrite",
    "rewrite_program",
    "Record",
    "Builder",
    "find_matches",
    "PATTERN_MODULES",
    "PATTERNS",
    "Pattern",
    "Match",
    "pattern",
    "Uses",
    "View",
    "LAYOUT_OPS",
    "apply_layout",
    "as_permutation",
    "constant",
    "is_number",
    "layout_chain",
    "only_broadcasts",
    "pairs",
    "producer",
    "quotient",
    "relu_input",
    "same_size",
    "scalar",
    "view_of",
]
