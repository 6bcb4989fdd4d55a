"""Op definitions by family; importing registers them."""
from . import attention, collective, conv, elementwise, linalg, norm, reduce, rnn, rope, shape  # noqa: F401
from . import fused  # noqa: F401
