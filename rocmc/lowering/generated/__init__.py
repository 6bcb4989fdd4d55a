"""The `generated` implementation of every op: linalg / tensor / arith / math / iree_linalg_ext,
leaving code generation to IREE. One module per op family; importing registers them."""
from . import elementwise  # noqa: F401
