"""Op definitions by family; importing registers them."""
from . import attention, conv, elementwise, linalg, norm, reduce, rope, shape  # noqa: F401
