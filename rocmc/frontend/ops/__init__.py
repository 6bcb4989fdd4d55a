"""Op definitions by family; importing registers them."""
from . import elementwise  # noqa: F401
