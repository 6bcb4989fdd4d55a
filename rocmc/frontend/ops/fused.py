"""Fused ops the graph rewrite puts in place of chains (rocmc.rewrite): a 2-D convolution with its
epilogue, y = activation(conv2d(x, w, b) + residual), and a linear layer with its activation,
y = activation(linear(x, w, b)).

A CNN's conv -> (batch norm, folded into w and b) -> residual add -> relu is one op here, so a
lowering computes the epilogue on the conv's output before it is stored (IREE fuses the elementwise
tail into the conv's dispatch; a library call can take the whole op). The convolution part is
conv2d's: the same attributes, shape rule and reference. Likewise a transformer MLP's first
projection and its relu / tanh-approximated GELU: a GEMM library applies them as its epilogue.
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphError
from .conv import CONV_ATTRS, _conv_infer, _conv_ref, _operands, conv_attrs
from .linalg import _linear, _linear_ref
from ..opdef import as_value, builder, defop, graph_of, reference
from ..registry import OPS

__all__ = ["fused_conv2d", "fused_linear"]

ACTIVATIONS = {"none": lambda y: y, "relu": lambda y: np.maximum(y, 0.0)}


@defop("fused_conv2d", attrs=(*CONV_ATTRS, "activation"))
def _fused_conv2d_infer(node, types, attrs):
    """conv2d's rule for (x, w, b); the residual is added elementwise, so it has the result's type."""
    y = _conv_infer(node, types[:3], attrs)
    r = types[3]
    if r is not None and r != y:
        raise GraphError(f"{node.describe()}: 'residual' is {r}, expected the convolution's result type {y}")
    if attrs.get("activation") not in ACTIVATIONS:
        raise GraphError(
            f"{node.describe()}: attribute activation={attrs.get('activation')!r}, expected one of "
            f"{', '.join(map(repr, ACTIVATIONS))}"
        )
    return y


@reference("fused_conv2d")
def _fused_conv2d_ref(node, ins, attrs):
    x, w, b, r = ins
    y = _conv_ref(node, [x, w, b], attrs)[0]
    return [ACTIVATIONS[attrs["activation"]](y if r is None else y + r)]


@builder
def fused_conv2d(x, weight, bias=None, residual=None, *, stride=1, padding=0, dilation=1, groups=1, activation="none"):
    """activation(conv2d(x, weight, bias, ...) + residual): conv2d's keywords; `residual` (optional) has
    the convolution's result shape and dtype; activation is "none" or "relu"."""
    g, operands = _operands("fused_conv2d", x, weight, bias)
    rv = None if residual is None else as_value("fused_conv2d", "residual", residual, g, like=operands[0])
    attrs = {**conv_attrs("fused_conv2d", 2, operands[1], stride, padding, dilation, groups), "activation": activation}
    return g.apply("fused_conv2d", [*operands, rv], attrs)[0]


# fused_linear's activations (the GEMM library's epilogue names): the elementwise op each one is, with
# its attributes, so the reference and the generated lowering are that op's own.
LINEAR_ACTIVATIONS = {"relu": ("relu", {}), "gelu_tanh": ("gelu", {"approximate": "tanh"})}


@defop("fused_linear", attrs=("activation",))
def _fused_linear_infer(node, types, attrs):
    """linear's rule; the activations are float functions."""
    y = _linear(node, types, attrs)
    if attrs.get("activation") not in LINEAR_ACTIVATIONS:
        raise GraphError(
            f"{node.describe()}: attribute activation={attrs.get('activation')!r}, expected one of "
            f"{', '.join(map(repr, LINEAR_ACTIVATIONS))}"
        )
    if not y.dtype.is_float:
        raise GraphError(f"{node.describe()}: 'x' has dtype {y.dtype}, expected a float tensor")
    return y


@reference("fused_linear")
def _fused_linear_ref(node, ins, attrs):
    op, act_attrs = LINEAR_ACTIVATIONS[attrs["activation"]]
    return OPS[op].reference(node, _linear_ref(node, ins, {}), act_attrs)


@builder
def fused_linear(x, weight, bias=None, *, activation):
    """activation(linear(x, weight, bias)): linear's operands; activation is "relu" or "gelu_tanh"
    (gelu with approximate="tanh")."""
    g = graph_of("fused_linear", x)
    x = as_value("fused_linear", "x", x, g)
    weight = as_value("fused_linear", "weight", weight, g, x)
    bias = None if bias is None else as_value("fused_linear", "bias", bias, g, x)
    return g.apply("fused_linear", [x, weight, bias], {"activation": activation})[0]
