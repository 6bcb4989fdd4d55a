"""torch.export -> rocmc Graph: `import_torch`.

The package is split into:
- `importer.py`: the importer (export and decomposition to core ATen, the walk over the FX graph,
  symbolic dims and their assumptions, dtype promotion, the converter registry `CONVERTERS` with
  `@converts`, `import_torch` and `load_program`);
- converters by family, each registering its ATen ops with `@converts`: `elementwise.py`, `views.py`,
  `nn.py`.

`CONVERTER_MODULES` is the one list of the converter modules: importing the package imports each of
them, so the registry is complete (no two of them convert the same op).
"""

from __future__ import annotations

import importlib

from .importer import (
    CONVERTERS,
    DTYPES,
    Importer,
    Missing,
    Node,
    Unsupported,
    converts,
    decompositions,
    import_torch,
    load_program,
    op_name,
    promote,
    rocmc_dtype,
)

CONVERTER_MODULES = ("elementwise", "views", "nn")

for _name in CONVERTER_MODULES:
    importlib.import_module(f"{__name__}.{_name}")
del _name

__all__ = [
    "import_torch",
    "load_program",
    "decompositions",
    "op_name",
    "CONVERTERS",
    "CONVERTER_MODULES",
    "converts",
    "Importer",
    "Node",
    "Unsupported",
    "Missing",
    "DTYPES",
    "promote",
    "rocmc_dtype",
]
