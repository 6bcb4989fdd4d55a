"""Frontend: the graph IR, op definitions with shape/dtype rules and float64 references, importers."""

from . import ops as _ops  # noqa: F401  (registers every op)
from ..dtypes import DType, dtype
from .graph import Graph, Node, TensorType, Value

__all__ = ["DType", "Graph", "Node", "TensorType", "Value", "dtype"]
