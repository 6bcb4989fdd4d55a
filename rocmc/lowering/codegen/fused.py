"""Generated lowering of the fused ops: fused_conv2d is conv2d's own lowering (the named conv, or the
CPU's depthwise form), then the residual add and the activation as one elementwise linalg.generic on
its result; fused_linear is linear's lowering, then its residual add and activation the same way, and
gated_linear linear's lowering over the joined weight, then act(gate) * up; rms_norm_linear is rms_norm's
code, then linear's or gated_linear's.

IREE's dispatch formation fuses that elementwise consumer into the convolution's (the contraction's)
dispatch, so the result is never written out and read back. The epilogue computes as the separate
ops would (f16/bf16 in f32, rounding once), so a rewritten graph gives the results of the graph as given.
"""

from __future__ import annotations

from ...dtypes import acc_mlir
from ...frontend.graph import TensorType
from ..emitter import Emitter, T, tensor_type
from ..registry import lowering
from .conv import _lower_conv
from ...frontend.ops.fused import GATE_ACTIVATIONS, LINEAR_ACTIVATIONS
from .depthwise import _is_depthwise, _lower_depthwise
from .elementwise import BINARY, UNARY
from .index import _ints
from .linalg import lower_linear
from .norm import rms_norm_of


def _activation(name: str):
    """The epilogue's activation `name` (fused_linear's names; fused_conv2d's "none" and "relu" among them) as
    (E, v, t) -> v, the elementwise op's own code; None for "none"."""
    if LINEAR_ACTIVATIONS[name] is None:
        return None
    op, attrs = LINEAR_ACTIVATIONS[name]
    return lambda E, v, t: UNARY[op](E, v, t, **attrs)


def _epilogue(E: Emitter, node, y: T, residual: T | None) -> T:
    """activation(y + residual) elementwise, in the compute type of y's storage type, rounded once."""
    return epilogue(E, y, residual, node.attrs["activation"], node.outputs[0].type)


def epilogue(E: Emitter, y: T, residual: T | None, activation: str, out: TensorType) -> T:
    """activation(y + residual) of result type `out` (fused_linear's activation names)."""
    act = _activation(activation)
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

    return E.map([y] + ([residual] if residual is not None else []), out, body)


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
    """linear's contraction (rounded to the storage type, as linear's result is), then fused_conv2d's epilogue:
    the residual add and the activation as the elementwise ops compute them, rounded once."""
    y = lower_linear(E, node, ins[:3], ctx)[0]
    return [_epilogue(E, node, y, ins[3] if len(ins) > 3 else None)]


@lowering("gated_linear")
def _lower_gated_linear(E: Emitter, node, ins, ctx):
    return _gated(E, node, ins, ctx, node.attrs["activation"])


def _gated(E: Emitter, node, ins, ctx, activation: str):
    """linear's contraction over the joined weight (2n outputs, rounded as linear's), then act(gate), rounded as
    the activation's result, times up, rounded: the separate ops' arithmetic, as one elementwise consumer that
    IREE fuses into the contraction's dispatch where it can."""
    out = node.outputs[0].type
    joined = TensorType(out.shape[:-1] + (2 * out.shape[-1],), out.dtype)
    return [gate_halves(E, lower_linear(E, node, ins, ctx, joined)[0], activation, out)]


def gate_halves(E: Emitter, both: T, activation: str, out: TensorType) -> T:
    """act(gate) * up of `both` (..., 2n): its first n features the gate's, the rest the up's; result type
    `out`."""
    n, sizes = out.shape[-1], E.dims(both)[:-1]

    def half(start: int) -> T:
        r = E.op(
            f"tensor.extract_slice {both.name}[{_ints([0] * (both.rank - 1) + [start])}][{_ints(sizes + [n])}]"
            f"[{_ints([1] * both.rank)}] : {both.mlir} to {tensor_type(out.shape, both.mlir_elt)}"
        )
        return T(r, out, both.elt)

    gate, up = half(0), half(n)
    op, attrs = GATE_ACTIVATIONS[activation]
    storage = both.mlir_elt
    t = acc_mlir(storage)

    def body(E, a):
        g = E.cast_scalar(UNARY[op](E, E.cast_scalar(a[0], storage, t), t, **attrs), t, storage)
        v = BINARY["mul"](E, E.cast_scalar(g, storage, t), E.cast_scalar(a[1], storage, t), t)
        return E.cast_scalar(v, t, storage)

    return E.map([gate, up], out, body)


@lowering("rms_norm_linear")
def _lower_rms_norm_linear(E: Emitter, node, ins, ctx):
    """rms_norm's code, then linear's or gated_linear's on its result: the separate ops' arithmetic."""
    x, norm, w, bias = ins
    h = rms_norm_of(E, x, norm, node.attrs["eps"], x.rank - 1)
    if node.attrs["gate"] == "none":
        return lower_linear(E, node, [h, w, bias], ctx)
    return _gated(E, node, [h, w, bias], ctx, node.attrs["gate"])
