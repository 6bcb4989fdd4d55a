"""GELU and SiLU spelled out -> gelu / silu.

  gelu (erf):  0.5 * x * (1 + erf(x / sqrt(2)))                      (or x * (1/sqrt(2)))
  gelu (tanh): 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  (x^3 as pow(x, 3) or x*x*x)
  silu:        x * sigmoid(x)
The three factors of a GELU may be multiplied in any order and grouping; each constant must be the
exact value as its dtype rounds it.
"""

from __future__ import annotations

import math

from .. import ops
from .patterns import Match, is_number, only_broadcasts, pairs, pattern, producer, scalar


@pattern("silu", "mul")
def _silu(node, uses):
    for x, s in pairs(node):
        sig = producer(s, "sigmoid")
        if sig is not None and sig.inputs[0] is x and node.outputs[0].shape == x.shape:
            return Match("silu", [node, sig], [x], lambda b: ops.silu(b.value(x)))
    return None


def _products(v, stop=None, nodes=None):
    """The factors of v through nested muls (not looking into `stop`), and those muls."""
    nodes = [] if nodes is None else nodes
    n = producer(v, "mul")
    if n is None or v is stop:
        return [v], nodes
    nodes.append(n)
    left, _ = _products(n.inputs[0], stop, nodes)
    right, _ = _products(n.inputs[1], stop, nodes)
    return left + right, nodes


def _erf_arg(u):
    """(x, node) when u is x / sqrt(2) or x * (1/sqrt(2))."""
    n = producer(u, "div")
    if n is not None and is_number(n.inputs[1], math.sqrt(2.0)):
        return n.inputs[0], n
    n = producer(u, "mul")
    for x, c in pairs(n) if n is not None else ():
        if is_number(c, 1.0 / math.sqrt(2.0)):
            return x, n
    return None, None


def _cube_of(v):
    """(x, nodes) when v is pow(x, 3), x*x*x or x*(x*x)."""
    n = producer(v, "pow")
    if n is not None and scalar(n.inputs[1]) == 3.0:
        return n.inputs[0], [n]
    factors, nodes = _products(v)
    if len(factors) == 3 and factors[0] is factors[1] is factors[2]:
        return factors[0], nodes
    return None, None


def _tanh_arg(u):
    """(x, nodes) when u is sqrt(2/pi) * (x + 0.044715 * x^3)."""
    n = producer(u, "mul")
    for s, c in pairs(n) if n is not None else ():
        add = producer(s, "add")
        if add is None or not is_number(c, math.sqrt(2.0 / math.pi)):
            continue
        for x, t in pairs(add):
            m = producer(t, "mul")
            for cube, k in pairs(m) if m is not None else ():
                cx, cn = _cube_of(cube)
                if cx is x and is_number(k, 0.044715):
                    return x, [n, add, m, *cn]
    return None, None


def _one_plus(v):
    """(x, approximate, nodes) when v is 1 + erf(x/sqrt 2) or 1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))."""
    add = producer(v, "add")
    for one, f in pairs(add) if add is not None else ():
        if not is_number(one, 1.0):
            continue
        for op, arg, approximate in (("erf", _erf_arg, "none"), ("tanh", _tanh_arg, "tanh")):
            fn = producer(f, op)
            if fn is None:
                continue
            x, nodes = arg(fn.inputs[0])
            if x is not None:
                return x, approximate, [add, fn, *(nodes if isinstance(nodes, list) else [nodes])]
    return None, None, None


@pattern("gelu", "mul")
def _gelu(node, uses):
    y = node.outputs[0]
    factors, _ = _products(y)
    for f in factors:
        x, approximate, inner = _one_plus(f)
        if x is None:
            continue
        # The factors again, this time not looking into x (which may itself be a product).
        leaves, muls = _products(y, stop=x)
        rest = [v for v in leaves if v is not x and v is not f]
        if len(leaves) != 3 or sum(v is x for v in leaves) != 1 or len(rest) != 1:
            continue
        half = rest[0]
        if is_number(half, 0.5) and only_broadcasts(half, x) and y.shape == x.shape:
            return Match(
                "gelu", [node, *muls, *inner], [x], lambda b, x=x, a=approximate: ops.gelu(b.value(x), approximate=a)
            )
    return None
