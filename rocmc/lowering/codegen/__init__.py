"""The `generated` implementation of the ops: linalg / tensor / arith / math / iree_linalg_ext, leaving
code generation to IREE. One module per op family (as in rocmc/frontend/ops), plus `depthwise` (the CPU's
form of a depthwise conv1d/conv2d, its own implementation) and the helper `padding`.

Importing the package imports every module of `MODULES`. Registration does not depend on their order: a
module that lowers through another's functions (`depthwise` through `conv`'s, `fused` through `conv`,
`depthwise`, `linalg` and `elementwise`) imports them itself, and no two modules register the same
(op, implementation) (tests/frontend/test_registration.py imports them in other orders).
"""

from __future__ import annotations

import importlib

MODULES = (
    "attention",
    "conv",
    "depthwise",
    "elementwise",
    "fp8",
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

# Ops with no generated lowering, and why: the collectives lower to IREE's own collectives
# (`flow.collective.*`, implementation "iree") on GPUs and to extern calls the process group serves
# on the host ("host") on the CPU (rocmc/lowering/collective.py).
NOT_GENERATED = frozenset({"all_reduce", "all_gather"})

for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")
del _name
