"""rocmc.ops: every op builder, one namespace (keyword names follow torch.nn.functional, axes numpy's)."""
from .frontend.ops.elementwise import *  # noqa: F401,F403
