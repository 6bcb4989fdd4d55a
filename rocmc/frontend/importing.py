"""What the model importers (ONNX, torch.export) share: names made into graph identifiers, and a
slice bound read as a size."""
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
