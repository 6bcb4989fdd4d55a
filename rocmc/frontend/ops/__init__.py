"""Op definitions by family, one module each.

`FAMILIES` is the one list of families: importing this package imports each of them (which registers
its ops in rocmc/frontend/registry.py), and `rocmc.ops` is the union of their builders (each module's
`__all__`). A new family is a module here and its name in `FAMILIES`.
"""

from __future__ import annotations

import importlib

FAMILIES = (
    "attention",
    "collective",
    "conv",
    "elementwise",
    "fused",
    "gathers",
    "index",
    "linalg",
    "norm",
    "quant",
    "random",
    "reduce",
    "resize",
    "rnn",
    "rope",
    "shape",
)

# Ops of the registry with no builder in rocmc.ops (made only by rocmc itself); none today.
INTERNAL: frozenset = frozenset()


def family_modules() -> list:
    """Each family's module, in FAMILIES order."""
    return [importlib.import_module(f"{__name__}.{name}") for name in FAMILIES]


family_modules()
