"""The op registry: each op's definition (allowed attributes, shape/dtype rule, float64 reference) by
name. A leaf of the frontend: the graph consults it whenever a node is built, and the op modules fill
it through rocmc/frontend/opdef.py (`defop`, `reference`), which build on the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import GraphError


@dataclass
class OpDef:
    name: str
    infer: Callable  # (node, input types, attrs) -> list[TensorType]
    attrs: tuple = ()  # allowed attribute names
    reference: Callable | None = None  # (node, inputs as numpy (floats as float64), attrs) -> list[np.ndarray]
    doc: str = ""

    def check_attrs(self, node) -> None:
        unknown = [k for k in node.attrs if k not in self.attrs]
        if unknown:
            raise GraphError(
                f"{node.op}: unknown attribute {', '.join(map(repr, unknown))}; "
                f"expected {', '.join(self.attrs) or 'none'}"
            )


OPS: dict[str, OpDef] = {}


def get_op(name: str) -> OpDef:
    if name not in OPS:
        raise GraphError(f"unknown op {name!r}")
    return OPS[name]
