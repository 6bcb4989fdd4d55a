"""A linear layer and the activation after it -> fused_linear, which a GEMM library computes as one call
with the activation as its epilogue (lowering/blas.py).

  linear_activation:  act(linear(x, w, b))                      -> fused_linear(x, w, b, act)
                      act(matmul(x, W) + b)  (GPT-2's Conv1D)     -> fused_linear(x, W^T, b, act)
                      act(reshape(...)) of either                -> reshape(fused_linear(...))
  act: relu (also maximum(y, 0)), gelu(approximate="tanh") or the tanh GELU spelled out (activations.py);
  the erf GELU is no epilogue of the libraries and stays as it is.

The matmul form: x @ W with a 2-D W (no transpose of x), plus an optional bias that broadcasts over the
last dim only. W stored (out, in) (transpose_b) is linear's weight as it is; a constant W stored (in, out)
is transposed here, at compile time; any other W (a parameter) would need a transpose per call, so
that matmul is left alone. A reshape between the GEMM and the activation (torch's exports flatten the
rows for the GEMM and restore them after) commutes with an elementwise activation, so it moves after
the fused op. Every value in between must be read only by the chain (the framework checks it).

Registered before activations: at a `mul` anchor the spelled-out GELU over a GEMM is this pattern's,
with the GEMM, rather than the plain gelu pattern's.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from .patterns import PATTERNS, Match, constant, only_broadcasts, pairs, pattern, producer, relu_input, same_size


def _spelled_gelu(node, uses):
    """(x, nodes) when node ends a tanh GELU spelled out, as the gelu pattern recognises it."""
    gelu = next(p for p in PATTERNS if p.name == "gelu")
    m = gelu.match(node, uses)
    if m is None or not any(n.op == "tanh" for n in m.nodes):
        return None, None
    return m.inputs[0], m.nodes


def _activation(node, uses):
    """(activation, its input, the nodes computing it) of an anchor, or (None, None, None)."""
    if node.op == "gelu":
        tanh = node.attrs["approximate"] == "tanh"
        return ("gelu_tanh", node.inputs[0], [node]) if tanh else (None, None, None)
    if node.op == "mul":
        x, nodes = _spelled_gelu(node, uses)
        return ("gelu_tanh", x, nodes) if x is not None else (None, None, None)
    x = relu_input(node)
    return ("relu", x, [node]) if x is not None else (None, None, None)


def _weight(mm):
    """(the values read, a function of the Builder giving linear's (out, in) weight) of matmul node mm,
    or None when the weight would cost a transpose per call."""
    w = mm.inputs[1]
    if mm.attrs["transpose_b"]:
        return [w], lambda b: b.value(w)
    array = constant(w)
    if array is None:
        return None
    transposed = np.ascontiguousarray(np.asarray(array).T)
    return [], lambda b: b.constant(transposed)


def _matmul(v):
    """(x, reads, weight) when v is x @ W with a 2-D float W and no transpose of x, else None."""
    mm = producer(v, "matmul")
    if mm is None or mm.attrs["transpose_a"] or mm.inputs[1].rank != 2 or not v.dtype.is_float:
        return None
    found = _weight(mm)
    if found is None:
        return None
    reads, weight = found
    return mm, mm.inputs[0], reads, weight


def _row_bias(bias, y) -> bool:
    """Whether bias is one value per column of y (its last dim), broadcast over the rows."""
    return (
        bias.rank >= 1
        and only_broadcasts(bias, y)
        and same_size(bias.shape[-1], y.shape[-1])
        and all(d == 1 for d in bias.shape[:-1])
    )


def _gemm(v):
    """(nodes, x, reads, weight(b), bias(b)) when v is linear(x, w, b), x @ W or x @ W + bias."""
    lin = producer(v, "linear")
    if lin is not None and v.dtype.is_float:
        x, w, bias = lin.inputs
        return [lin], x, [w] + ([bias] if bias is not None else []), lambda b: b.value(w), lambda b: b.value(bias)
    found = _matmul(v)
    if found is not None:
        mm, x, reads, weight = found
        return [mm], x, reads, weight, lambda b: None
    add = producer(v, "add")
    for y, bias in pairs(add) if add is not None else ():
        found = _matmul(y)
        if found is None or not _row_bias(bias, y):
            continue
        mm, x, reads, weight = found
        n = y.shape[-1]
        flat = (lambda b: b.value(bias)) if bias.rank == 1 else (lambda b: ops.reshape(b.value(bias), [n]))
        return [add, mm], x, reads + [bias], weight, flat
    return None


@pattern("linear_activation", "relu", "maximum", "gelu", "mul")
def _linear_activation(node, uses):
    activation, v, act_nodes = _activation(node, uses)
    if activation is None:
        return None
    view = producer(v, "reshape")
    found = _gemm(view.inputs[0] if view is not None else v)
    if found is None:
        return None
    gemm_nodes, x, reads, weight, bias = found

    def build(b):
        y = ops.fused_linear(b.value(x), weight(b), bias(b), activation=activation)
        return y if view is None else ops.reshape(y, view.attrs["shape"])

    nodes = act_nodes + ([view] if view is not None else []) + gemm_nodes
    return Match("fused_linear", nodes, [x, *reads], build)


def _residual(add, y):
    """The other operand of `add` when it is a residual of y's own shape and dtype (a skip connection), else None."""
    r = next((b for a, b in pairs(add) if a is y), None)
    if r is None or r is y or r.dtype != y.dtype or r.rank != y.rank:
        return None
    return r if all(same_size(a, b) for a, b in zip(r.shape, y.shape)) else None


@pattern("linear_residual", "add")
def _linear_residual(node, uses):
    """y + r with y = linear(x, w, b), x @ W or x @ W + bias (W as _weight takes it) and r a residual of y's shape
    -> fused_linear(x, w, b, residual=r): the skip connection added in the GEMM's epilogue (one pass over y)."""
    for y, _ in pairs(node):
        found = _gemm(y)
        r = _residual(node, y) if found is not None else None
        if r is None:
            continue
        gemm_nodes, x, reads, weight, bias = found

        def build(b, x=x, weight=weight, bias=bias, r=r):
            return ops.fused_linear(b.value(x), weight(b), bias(b), b.value(r))

        return Match("fused_linear", [node, *gemm_nodes], [x, *reads, r], build)
    return None


@pattern("constant_linear", "matmul", "add")
def _constant_linear(node, uses):
    """x @ C (+ a row bias) with C a constant stored (in, out) -> linear(x, C^T (+ bias)), C transposed here, at
    compile time: linear is what the GEMM kernels take (on the GPUs, linear_mm; the (in, out) layout is IREE's
    code only). A W that is not a constant (a transpose per call) or is stored (out, in) already is left alone."""
    v = node.outputs[0]
    found = _gemm(v)
    if found is None:
        return None
    gemm_nodes, x, reads, weight, bias = found
    mm = next((n for n in gemm_nodes if n.op == "matmul"), None)
    if mm is None or mm.attrs["transpose_b"]:
        return None

    def build(b):
        return ops.linear(b.value(x), weight(b), bias(b))

    return Match("linear", gemm_nodes, [x, *reads], build)
