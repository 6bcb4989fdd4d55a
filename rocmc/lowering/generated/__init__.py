"""The `generated` implementation of every op: linalg / tensor / arith / math / iree_linalg_ext,
leaving code generation to IREE. One module per op family; importing registers them."""
from . import attention, conv, elementwise, linalg, norm, reduce, rnn, rope, shape  # noqa: F401
from . import index  # noqa: F401
from . import random  # noqa: F401
from . import gathers  # noqa: F401
from . import resize  # noqa: F401
from . import depthwise  # noqa: F401  (after conv: the depthwise form of conv1d/conv2d)
from . import fused  # noqa: F401  (after conv and depthwise: fused_conv2d lowers through them)
