"""RMSNorm and LayerNorm spelled out as elementwise ops and means -> rms_norm / layer_norm.

The normalized core, over trailing axes k..rank-1 of x (means with keepdims):
  rms:   x * rsqrt(mean(x^2) + eps)   (rsqrt, 1/sqrt, reciprocal(sqrt) or x / sqrt(...); x^2 as pow(x, 2) or x*x)
  layer: d * rsqrt(mean(d^2) + eps) with d = x - mean(x)   (same spellings)
around it, outermost first: an optional bias add, an optional weight mul, an optional cast back to x's
dtype, an optional weight mul (transformers' LlamaRMSNorm: `w * h.to(dtype)`, Gemma: `(h * (1 + w)).to(dtype)`,
where 1 + w is simply the weight). x may be a widening cast of the real input (`hidden.to(float32)`):
that cast is exact and rms_norm/layer_norm compute in f32, so the fused op reads the input itself.
Weight and bias must have the shape x.shape[k:] (leading 1s allowed) and x's dtype.
"""

from __future__ import annotations

from .. import ops
from .patterns import Match, pairs, pattern, producer, scalar

_WIDENING = {"f16", "bf16", "f32"}


def _trailing(mean, rank: int) -> int | None:
    """The first normalized axis when `mean` reduces axes k..rank-1 with keepdims, else None."""
    axes = mean.attrs["axes"]
    if not mean.attrs["keepdims"] or not axes or axes != list(range(axes[0], rank)):
        return None
    return axes[0]


def _square_of(v):
    """(x, node) when v is pow(x, 2) or x*x."""
    n = producer(v, "pow")
    if n is not None and scalar(n.inputs[1]) == 2.0:
        return n.inputs[0], n
    n = producer(v, "mul")
    if n is not None and n.inputs[0] is n.inputs[1]:
        return n.inputs[0], n
    return None, None


def _scaled_by_rsqrt(n_value):
    """(x, a, nodes) when n_value is x * rsqrt(a), x / sqrt(a), x * (1/sqrt(a)) or x * reciprocal(sqrt(a))."""
    div = producer(n_value, "div")
    if div is not None:
        s = producer(div.inputs[1], "sqrt")
        return (div.inputs[0], s.inputs[0], [div, s]) if s is not None else (None, None, None)
    mul = producer(n_value, "mul")
    if mul is None:
        return None, None, None
    for x, r in pairs(mul):
        inv = producer(r, "rsqrt")
        if inv is not None:
            return x, inv.inputs[0], [mul, inv]
        inv = producer(r, "reciprocal") or producer(r, "div")
        if inv is None or (inv.op == "div" and scalar(inv.inputs[0]) != 1.0):
            continue
        s = producer(inv.inputs[-1], "sqrt")
        if s is not None:
            return x, s.inputs[0], [mul, inv, s]
    return None, None, None


def _eps_plus(a):
    """(statistic, eps, node) when a is stat + eps with eps a scalar constant >= 0."""
    add = producer(a, "add")
    if add is None:
        return None, None, None
    for stat, e in pairs(add):
        eps = scalar(e)
        if eps is not None and eps >= 0 and e.rank <= stat.rank:
            return stat, eps, add
    return None, None, None


def _rms_core(v):
    """(x, axis, eps, nodes) of x * rsqrt(mean(x^2) + eps)."""
    x, a, nodes = _scaled_by_rsqrt(v)
    stat, eps, add = _eps_plus(a)
    mean = producer(stat, "mean")
    if mean is None:
        return None
    sq_of, sq = _square_of(mean.inputs[0])
    axis = _trailing(mean, x.rank)
    if sq_of is not x or axis is None:
        return None
    return x, axis, eps, [*nodes, add, mean, sq]


def _layer_core(v):
    """(x, axis, eps, nodes) of (x - mean(x)) * rsqrt(mean((x - mean(x))^2) + eps)."""
    d, a, nodes = _scaled_by_rsqrt(v)
    sub = producer(d, "sub")
    stat, eps, add = _eps_plus(a)
    var = producer(stat, "mean")
    if sub is None or var is None:
        return None
    x, mu = sub.inputs
    mean = producer(mu, "mean")
    sq_of, sq = _square_of(var.inputs[0])
    if mean is None or mean.inputs[0] is not x or sq_of is not d:
        return None
    axis = _trailing(mean, x.rank)
    if axis is None or _trailing(var, x.rank) != axis:
        return None
    return x, axis, eps, [*nodes, sub, add, var, mean, sq]


def _peel(v, op):
    """[(operand, other, node)] for each way v = op(operand, other); [] if v is not an op result."""
    n = producer(v, op)
    return [] if n is None else [(a, b, n) for a, b in pairs(n)]


def _tails(y, with_bias: bool):
    """Every reading of y as [bias add] [weight mul] [cast] [weight mul] around a core value:
    (core, weight, bias, cast node or None, whether the weight is inside the cast, nodes)."""
    biased = [(y, None, [])] + ([(c, b, [n]) for c, b, n in _peel(y, "add")] if with_bias else [])
    for v, bias, bn in biased:
        for u, w, wn in [(v, None, [])] + [(c, w, [n]) for c, w, n in _peel(v, "mul")]:
            cast = producer(u, "cast")
            for inner, cn in ([(cast.inputs[0], [cast])] if cast is not None else []) + [(u, [])]:
                yield inner, w, bias, cast if cn else None, False, [*bn, *wn, *cn]
                if w is None:
                    for core, w2, n in _peel(inner, "mul"):
                        yield core, w2, bias, cast if cn else None, True, [*bn, *cn, n]


def _affine(t, x, axis: int, dtype):
    """Whether t can be the weight/bias of a norm over x.shape[axis:] with result dtype `dtype`."""
    want = tuple(x.shape[axis:])
    shape = tuple(t.shape)
    while len(shape) > len(want) and shape[0] == 1:
        shape = shape[1:]
    return shape == want and t.rank <= x.rank and t.dtype == dtype


def _unwiden(x):
    """The value under an exact widening cast to f32, or None."""
    c = producer(x, "cast")
    if c is not None and x.dtype.name == "f32" and c.inputs[0].dtype.name in _WIDENING:
        return c.inputs[0]
    return None


def _norm_match(op: str, core_fn, with_bias: bool):
    def match(node, uses):
        y = node.outputs[0]
        for core_value, w, bias, cast, inner, tail in _tails(y, with_bias):
            found = core_fn(core_value)
            if found is None or y.shape != found[0].shape:
                continue
            x, axis, eps, core = found
            if cast is not None and cast.attrs["dtype"] != y.dtype.name:
                continue
            for x0 in (_unwiden(x), x):
                if x0 is None or x0.dtype != y.dtype:
                    continue
                # A weight inside the cast is in the compute type: read it before its widening cast.
                w0 = _unwiden(w) if w is not None and inner and w.dtype != x0.dtype else w
                if any(t is not None and not _affine(t, x, axis, x0.dtype) for t in (w0, bias)) or (
                    w is not None and w0 is None
                ):
                    continue
                nodes = [node, *tail, *core]
                if x0 is not x and uses.only_inside(x, {id(n) for n in nodes}):
                    nodes.append(x.producer)
                return Match(op, nodes, [x0, w0, bias], _builder(op, x0, w0, bias, eps, axis))
        return None

    return match


def _builder(op, x, w, bias, eps, axis):
    def build(b):
        def affine(t):
            if t is None:
                return None
            v = b.value(t)
            return v if v.shape == x.shape[axis:] else ops.reshape(v, list(x.shape[axis:]))

        if op == "rms_norm":
            return ops.rms_norm(b.value(x), affine(w), eps=eps, axis=axis)
        return ops.layer_norm(b.value(x), affine(w), affine(bias), eps=eps, axis=axis)

    return build


pattern("rms_norm", "mul", "div", "cast")(_norm_match("rms_norm", _rms_core, with_bias=False))
pattern("layer_norm", "add", "mul", "div", "cast")(_norm_match("layer_norm", _layer_core, with_bias=True))
