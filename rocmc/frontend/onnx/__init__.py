"""ONNX -> rocmc Graph: `import_onnx`.

The package is split into rooms:
- `importer.py`: the importer (model and opset checks, the walk over inputs, initializers and nodes,
  constant folding, the converter registry `CONVERTERS`/`FOLDERS` and `import_onnx`);
- `values.py`: what a converter works with (Tensor, Node, Unsupported, element types, helpers);
- converters by family, each registering its ops with `@converts`/`@folds`: `elementwise.py`
  (arithmetic, comparisons, activations, Cast), `shapes.py` (constants, shapes as values, data
  movement), `nn.py` (reductions, softmax, norms, MatMul/Gemm, attention), `spatial.py` (conv,
  pooling, resize, instance/group norm), `indexing.py` (gathers, scatters, Trilu, Einsum, TopK, ...),
  `quant.py` (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, QLinearMatMul).

Importing the package imports every converter module, so the registry is complete.
"""

from __future__ import annotations

from . import elementwise, indexing, nn, quant, shapes, spatial  # noqa: F401  (each registers its converters)
from .importer import CONVERTERS, FOLDERS, import_onnx

__all__ = ["import_onnx", "CONVERTERS", "FOLDERS"]
