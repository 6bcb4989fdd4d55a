"""Generated lowering of the fused ops: fused_conv2d is conv2d's own lowering (the named conv, or the
CPU's depthwise form), then the residual add and the activation as one elementwise linalg.generic on
its result; fused_linear is linear's lowering, then its activation the same way.

IREE's dispatch formation fuses that elementwise consumer into the convolution's (the contraction's)
dispatch, so the result is never written out and read back. The epilogue computes as the separate
ops would (f16/bf16 in f32, rounding once), so a rewritten graph gives the results of the graph as given.
"""

from __future__ import annotations

from ...dtypes import acc_mlir
from ..emitter import Emitter, T
from ..registry import lowering
from .conv import _lower_conv
from ...frontend.ops.fused import LINEAR_ACTIVATIONS
from .depthwise import _is_depthwise, _lower_depthwise
from .elementwise import BINARY, UNARY
from .linalg import lower_linear

ACTIVATIONS = {"none": None, "relu": UNARY["relu"]}


def _epilogue(E: Emitter, node, y: T, residual: T | None) -> T:
    """activation(y + residual) elementwise, in the compute type of y's storage type."""
    act = ACTIVATIONS[node.attrs["activation"]]
    if residual is None and act is None:
        return y
    storage = y.mlir_elt
    t = acc_mlir(storage)

    def body(E, a):
        v = E.cast_scalar(a[0], storage, t)
        if residual is not None:
            v = BINARY["add"](E, v, E.cast_scalar(a[1], storage, t), t)
        if act is not None:
            v = act(E, v, t)
        return E.cast_scalar(v, t, storage)

    return E.map([y] + ([residual] if residual is not None else []), node.outputs[0].type, body)


def _with_epilogue(conv_lowering):
    """A fused_conv2d lowering from a conv2d lowering, which reads (x, w, b) and the node's conv attributes."""

    def lower(E: Emitter, node, ins, ctx):
        y = conv_lowering(E, node, ins[:3], ctx)[0]
        return [_epilogue(E, node, y, ins[3])]

    return lower


lowering("fused_conv2d")(_with_epilogue(_lower_conv))
lowering("fused_conv2d", impl="depthwise", kinds=("cpu",), priority=50, supports=_is_depthwise)(
    _with_epilogue(_lower_depthwise)
)


@lowering("fused_linear")
def _lower_fused_linear(E: Emitter, node, ins, ctx):
    """linear's contraction (rounded to the storage type, as linear's result is), then the activation
    as the elementwise op computes it."""
    y = lower_linear(E, node, ins, ctx)[0]
    op, attrs = LINEAR_ACTIVATIONS[node.attrs["activation"]]
    storage = y.mlir_elt
    t = acc_mlir(storage)
    return [
        E.map(
            [y],
            node.outputs[0].type,
            lambda E, a: E.cast_scalar(UNARY[op](E, E.cast_scalar(a[0], storage, t), t, **attrs), t, storage),
        )
    ]
