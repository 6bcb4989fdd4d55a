"""rocmc.ops: every op builder, one namespace (keyword names follow torch.nn.functional, axes numpy's)."""
from .frontend.ops.attention import *  # noqa: F401,F403
from .frontend.ops.collective import *  # noqa: F401,F403
from .frontend.ops.conv import *  # noqa: F401,F403
from .frontend.ops.elementwise import *  # noqa: F401,F403
from .frontend.ops.fused import *  # noqa: F401,F403
from .frontend.ops.index import *  # noqa: F401,F403
from .frontend.ops.random import *  # noqa: F401,F403
from .frontend.ops.gathers import *  # noqa: F401,F403
from .frontend.ops.linalg import *  # noqa: F401,F403
from .frontend.ops.norm import *  # noqa: F401,F403
from .frontend.ops.reduce import *  # noqa: F401,F403
from .frontend.ops.resize import *  # noqa: F401,F403
from .frontend.ops.rnn import *  # noqa: F401,F403
from .frontend.ops.rope import *  # noqa: F401,F403
from .frontend.ops.shape import *  # noqa: F401,F403
