"""Linear algebra: matmul (numpy semantics, with transpose flags) and linear (torch's x @ W^T + b).

Float matmuls accumulate in f32 whatever the storage type; integer matmuls accumulate in their own type.
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ..graph import TensorType, Value, value_operator
from ..opdef import as_value, broadcast_shapes, builder, defop, graph_of, reference, same_dtype

__all__ = ["matmul", "linear", "einsum"]

KINDS = ("float", "int")


def _check_operands(node, types, names):
    desc = node.describe()
    for t, n in zip(types, names):
        if t is not None and t.dtype.kind not in KINDS:
            raise GraphError(f"{desc}: {n!r} has dtype {t.dtype}, expected a float or int tensor")
    present = [(t, n) for t, n in zip(types, names) if t is not None]
    same_dtype(desc, [t for t, _ in present], [n for _, n in present])


def _inner_dims(node, ka, kb) -> None:
    if ka != kb:
        raise GraphError(f"{node.describe()}: inner dims differ: {ka} vs {kb}")


def matmul_shape(node, a: TensorType, b: TensorType, transpose_a: bool, transpose_b: bool) -> tuple:
    """numpy.matmul's result shape after the optional swap of each operand's last two dims."""
    desc = node.describe()
    for t, arg, flag in ((a, "a", transpose_a), (b, "b", transpose_b)):
        if t.rank == 0:
            raise GraphError(f"{desc}: {arg!r} is a scalar, expected rank >= 1")
        if flag and t.rank < 2:
            raise GraphError(f"{desc}: transpose_{arg}=True needs {arg!r} of rank >= 2, got {t}")
    sa, sb = swap_last(a.shape, transpose_a), swap_last(b.shape, transpose_b)
    _inner_dims(node, sa[-1], sb[-2] if len(sb) >= 2 else sb[0])
    batch = broadcast_shapes(desc, sa[:-2], sb[:-2])
    return batch + sa[-2:-1] + (sb[-1:] if len(sb) >= 2 else ())


def swap_last(shape: tuple, flag: bool) -> tuple:
    return shape[:-2] + (shape[-1], shape[-2]) if flag else shape


@defop("matmul", attrs=("transpose_a", "transpose_b"))
def _matmul(node, types, attrs):
    a, b = types
    _check_operands(node, types, ("a", "b"))
    return TensorType(matmul_shape(node, a, b, attrs["transpose_a"], attrs["transpose_b"]), a.dtype)


@reference("matmul")
def _matmul_ref(node, ins, attrs):
    a, b = ins
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    return [np.matmul(a, b)]


@defop("linear")
def _linear(node, types, attrs):
    x, w, bias = types
    _check_operands(node, types, ("x", "weight", "bias"))
    desc = node.describe()
    if x.rank < 1:
        raise GraphError(f"{desc}: 'x' is a scalar, expected rank >= 1 (..., in_features)")
    if w.rank != 2:
        raise GraphError(f"{desc}: 'weight' has rank {w.rank} ({w}), expected rank 2 (out_features, in_features)")
    _inner_dims(node, x.shape[-1], w.shape[1])
    if bias is not None and bias.shape != (w.shape[0],):
        raise GraphError(f"{desc}: 'bias' has shape {bias}, expected [{w.shape[0]}] (out_features)")
    return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)


@reference("linear")
def _linear_ref(node, ins, attrs):
    x, w, bias = ins
    y = np.matmul(x, w.T)
    return [y if bias is None else y + bias]


@value_operator
@builder
def matmul(a, b, transpose_a=False, transpose_b=False):
    """numpy.matmul (1-D operands and batch broadcasting included); a transpose flag swaps the last
    two dims of its operand first. f16/bf16 accumulate in f32."""
    g = graph_of("matmul", a, b)
    like = a if isinstance(a, Value) else b
    operands = [as_value("matmul", "a", a, g, like), as_value("matmul", "b", b, g, like)]
    return g.apply(
        "matmul",
        operands,
        {
            "transpose_a": _flag("matmul", "transpose_a", transpose_a),
            "transpose_b": _flag("matmul", "transpose_b", transpose_b),
        },
    )[0]


@builder
def linear(x, weight, bias=None):
    """torch.nn.functional.linear: x @ weight^T + bias, weight of shape (out_features, in_features)."""
    g = graph_of("linear", x)
    x = as_value("linear", "x", x, g)
    weight = as_value("linear", "weight", weight, g, x)
    bias = None if bias is None else as_value("linear", "bias", bias, g, x)
    return g.apply("linear", [x, weight, bias])[0]


def _flag(op, name, v) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise GraphError(f"{op}: {name}={v!r}, expected a bool")
    return bool(v)


# ---- einsum ------------------------------------------------------------------------------------

_ELLIPSIS = "..."


def _einsum_terms(equation: str, ranks: list) -> tuple[list, list]:
    """Labels of each operand and of the result, with the dims under '...' given labels of their own
    ('.1' is the last such dim, '.2' the one before, ...: aligned from the right, as they broadcast)."""
    desc = f"einsum({equation!r})"
    if not isinstance(equation, str):
        raise GraphError(f"einsum: equation={equation!r}, expected a string such as 'bij,bjk->bik'")
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise GraphError(f"{desc}: the equation names {len(terms)} operand(s) but {len(ranks)} were given")
    width = 0
    labels = []
    for t, r in zip(terms, ranks):
        letters = t.replace(_ELLIPSIS, "")
        if not letters.isalpha() and letters or t.count(_ELLIPSIS) > 1:
            raise GraphError(f"{desc}: term {t!r} is not letters with at most one '...'")
        if len(letters) > r or (_ELLIPSIS not in t and len(letters) != r):
            raise GraphError(f"{desc}: term {t!r} has {len(letters)} labels for an operand of rank {r}")
        n = r - len(letters)
        width = max(width, n)
        labels.append(_expand(t, n))
    for t, ls in zip(terms, labels):
        repeated = sorted({l for l in ls if ls.count(l) > 1})
        if repeated:
            raise GraphError(
                f"{desc}: label {repeated[0]!r} repeats in term {t!r}: diagonals and traces are not "
                f"supported by rocmc's einsum"
            )
    ell = [f".{i}" for i in range(width, 0, -1)]
    if arrow:
        if rhs.count(_ELLIPSIS) > 1 or (rhs.replace(_ELLIPSIS, "") and not rhs.replace(_ELLIPSIS, "").isalpha()):
            raise GraphError(f"{desc}: result {rhs!r} is not letters with at most one '...'")
        out = _expand(rhs, width)
    else:  # numpy's implicit result: '...' first, then the labels used once, sorted
        used = [l for ls in labels for l in ls if not l.startswith(".")]
        out = ell + sorted(l for l in set(used) if used.count(l) == 1)
    known = {l for ls in labels for l in ls}
    for l in out:
        if out.count(l) > 1 or l not in known:
            raise GraphError(f"{desc}: result label {l!r} " + ("repeats" if l in known else "is in no operand"))
    return labels, out


def _expand(term: str, n: int) -> list:
    head, dots, tail = term.partition(_ELLIPSIS)
    return list(head) + ([f".{i}" for i in range(n, 0, -1)] if dots else []) + list(tail)


def _label_sizes(desc: str, operands, labels) -> dict:
    """Each label's size; a '...' dim may be 1 in some operands (it broadcasts), a letter may not."""
    sizes: dict = {}
    for v, ls in zip(operands, labels):
        for l, d in zip(ls, v.shape):
            s = sizes.setdefault(l, d)
            if s != d:
                if l.startswith(".") and 1 in (s, d):
                    sizes[l] = d if s == 1 else s
                else:
                    raise GraphError(f"{desc}: label {l!r} has size {s} in one operand and {d} in another")
    return sizes


class _Term:
    """An operand under contraction: its value and the label of each dim."""

    def __init__(self, value: Value, labels: list):
        self.value, self.labels = value, list(labels)

    def arranged(self, order: list, sizes: dict) -> Value:
        """The value with dims in `order` (labels it lacks become size-1 dims), each broadcast to its
        label's size when `sizes` names it."""
        from .shape import broadcast_to, permute, reshape

        have = [l for l in order if l in self.labels]
        v = permute(self.value, [self.labels.index(l) for l in have]) if have != self.labels else self.value
        shape = [v.shape[have.index(l)] if l in have else 1 for l in order]
        if len(order) != len(have):
            v = reshape(v, shape)
        want = [sizes.get(l, d) for l, d in zip(order, shape)]
        return broadcast_to(v, want) if want != shape else v

    def sum_out(self, labels) -> "_Term":
        from .reduce import sum as reduce_sum

        axes = [i for i, l in enumerate(self.labels) if l in labels]
        if not axes:
            return self
        return _Term(reduce_sum(self.value, axis=tuple(axes)), [l for l in self.labels if l not in labels])


def _contract(a: _Term, b: _Term, keep: set, sizes: dict) -> _Term:
    """a and b combined, labels in neither `keep` nor only one operand summed: a matmul over the
    shared labels not kept (batched over those kept), or a broadcast product when there are none."""
    from .shape import product
    from .elementwise import mul

    shared = [l for l in a.labels if l in b.labels]
    batch = [l for l in shared if l in keep]
    inner = [l for l in shared if l not in keep]
    a_only = [l for l in a.labels if l not in shared]
    b_only = [l for l in b.labels if l not in shared]
    common = {l: sizes[l] for l in shared}
    if not inner:
        order = batch + a_only + b_only
        return _Term(mul(a.arranged(order, common), b.arranged(order, common)), order)
    lead = [sizes[l] for l in batch]
    m, k, n = (product(sizes[l] for l in ls).dim for ls in (a_only, inner, b_only))
    # An operand already laid out with its contracted labels first (a) or last (b) is taken as it is,
    # through matmul's transpose flag, rather than permuted.
    ta, tb = a.labels == batch + inner + a_only, b.labels == batch + b_only + inner
    x = _reshaped(
        a.arranged(batch + inner + a_only if ta else batch + a_only + inner, common), lead + ([k, m] if ta else [m, k])
    )
    y = _reshaped(
        b.arranged(batch + b_only + inner if tb else batch + inner + b_only, common), lead + ([n, k] if tb else [k, n])
    )
    out = matmul(x, y, transpose_a=ta, transpose_b=tb)
    return _Term(_reshaped(out, lead + [sizes[l] for l in a_only + b_only]), batch + a_only + b_only)


def _reshaped(v: Value, shape: list) -> Value:
    from .shape import reshape

    return v if list(v.shape) == list(shape) else reshape(v, shape)


@builder
def einsum(equation, *operands):
    """numpy.einsum / ONNX Einsum over rocmc's own ops: labels of one operand that appear nowhere
    else are summed first, then operands are combined left to right, each pair by a batched matmul
    (permute + reshape around it) over the labels they share, or by a broadcast mul when they share
    none that is summed; finally the result is permuted into the output order. '...' and numpy's
    implicit output (no '->') are accepted. A label repeated within one term (a diagonal, a trace)
    is a GraphError."""
    from .shape import permute

    if not operands:
        raise GraphError("einsum: no operands given")
    g = graph_of("einsum", *operands)
    like = next(v for v in operands if isinstance(v, Value))
    vals = [as_value("einsum", f"operands[{i}]", v, g, like) for i, v in enumerate(operands)]
    labels, out = _einsum_terms(equation, [v.rank for v in vals])
    desc = f"einsum({equation!r}, {', '.join(f'%{v.id}' for v in vals)})"
    sizes = _label_sizes(desc, vals, labels)
    terms = [_Term(v, ls) for v, ls in zip(vals, labels)]
    for i, t in enumerate(terms):
        elsewhere = set(out).union(*(o.labels for j, o in enumerate(terms) if j != i))
        terms[i] = t.sum_out(set(t.labels) - elsewhere)
    cur = terms[0]
    for i, t in enumerate(terms[1:], 1):
        keep = set(out).union(*(o.labels for o in terms[i + 1 :]))
        cur = _contract(cur, t, keep, sizes)
    cur = cur.sum_out(set(cur.labels) - set(out))
    v = cur.value
    if cur.labels != out:
        v = permute(v, [cur.labels.index(l) for l in out])
    return v
