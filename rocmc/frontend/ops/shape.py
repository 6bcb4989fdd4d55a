"""Shape and data-movement ops: reshape, transpose, concat, slice, gather, broadcast_to, pad.

squeeze, unsqueeze, flatten, permute and embedding are builders over these. Symbolic sizes are
tracked as products (`Size`): a reshape of f32[b,seq,512] to [b*seq,512] and back is checked and
typed exactly, the way a person would reason about it; anything that is not a product (a sum from
concat, a clamped slice) is an opaque atom that only matches itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ...errors import GraphError, InputError
from ... import symbolic
from ...symbolic import BIG, slice_bounds
from ..graph import Graph, TensorType, Value
from ..opdef import (
    as_value,
    broadcast_shapes,
    builder,
    check_axis,
    defop,
    dim_expr,
    graph_of,
    is_int,
    normalize_axis,
    reference,
    same_dtype,
)
from ..reference import symbol_sizes

__all__ = [
    "sizes",
    "reshape",
    "transpose",
    "permute",
    "concat",
    "slice",
    "gather",
    "embedding",
    "broadcast_to",
    "pad",
    "squeeze",
    "unsqueeze",
    "flatten",
]

# ---- symbolic sizes as products ------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """A dim as coefficient * product of atoms (symbols, or opaque expressions like '(n+4)')."""

    coef: int
    atoms: tuple = ()  # sorted, with repetition

    def __mul__(self, o: "Size") -> "Size":
        return Size(self.coef * o.coef, tuple(sorted(self.atoms + o.atoms)))

    def divide(self, o: "Size") -> "Size | None":
        """Exact quotient, or None when o does not divide self."""
        if o.coef == 0 or self.coef % o.coef:
            return None
        rest = Counter(self.atoms)
        rest.subtract(o.atoms)
        if any(n < 0 for n in rest.values()):
            return None
        return Size(self.coef // o.coef, tuple(sorted(rest.elements())))

    @property
    def dim(self):
        """The canonical graph dim: an int, a symbol, or '(a*b*4)'."""
        if not self.atoms or self.coef == 0:
            return self.coef
        if self.coef == 1 and len(self.atoms) == 1:
            return self.atoms[0]
        return "(" + "*".join(list(self.atoms) + ([str(self.coef)] if self.coef != 1 else [])) + ")"


def _split_product(s: str):
    """'(a*(b*c)*4)' -> ['a', '(b*c)', '4']; None when s is not a parenthesised product."""
    if not (s.startswith("(") and s.endswith(")")):
        return None
    parts, depth, cur = [], 0, ""
    for ch in s[1:-1]:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            return None  # '(a)+(b)': the outer parentheses do not match each other
        if ch == "*" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts if len(parts) > 1 and depth == 0 else None


def size_of(d) -> Size:
    if isinstance(d, (int, np.integer)):
        return Size(int(d))
    parts = _split_product(d)
    if parts is None:
        return Size(1, (d,))
    out = Size(1)
    for p in parts:
        out = out * (Size(int(p)) if p.isdigit() else size_of(p))
    return out


def product(dims) -> Size:
    out = Size(1)
    for d in dims:
        out = out * size_of(d)
    return out


def _fmt(dims) -> str:
    return "[" + ",".join(map(str, dims)) + "]"


def _desc(op: str, *values) -> str:
    """How errors name a node before it exists (the same text as Node.describe)."""
    return f"{op}({', '.join(f'%{v.id}' for v in values)})"


def _int_list(desc: str, arg: str, v) -> list:
    v = [v] if is_int(v) else v
    if not isinstance(v, (list, tuple)) or not all(is_int(a) for a in v):
        raise GraphError(f"{desc}: {arg}={v!r}, expected an int or a list of ints")
    return [int(a) for a in v]


def _value(op: str, x) -> Value:
    g = graph_of(op, x)
    return as_value(op, "x", x, g)


# ---- sizes as values ------------------------------------------------------------------------


@defop("sizes", attrs=("dims", "dtype"))
def _sizes(node, types, attrs):
    desc, dims = node.describe(), attrs["dims"]
    if attrs["dtype"] not in ("i32", "i64"):
        raise GraphError(f"{desc}: dtype={attrs['dtype']!r}, expected i32 or i64")
    if not isinstance(dims, list) or not all(is_int(d) or isinstance(d, str) for d in dims):
        raise GraphError(f"{desc}: dims={dims!r}, expected a list of ints and size expressions")
    from ...dtypes import dtype

    return TensorType((len(dims),), dtype(attrs["dtype"]))


@reference("sizes")
def _sizes_ref(node, ins, attrs):
    sizes = symbol_sizes()
    return [np.asarray([_size(d, sizes) for d in attrs["dims"]], dtype=np.int64)]


@builder
def sizes(graph, dims, dtype="i64"):
    """A 1-d integer tensor of sizes: ints and size expressions over the graph's symbols ("seq",
    "(seq+1)", "(b*seq)"), computed from the inputs' shapes when the module is called. What an
    imported model's shape arithmetic becomes when its result is used as data (ONNX Shape feeding a
    Cast or a Range)."""
    if not isinstance(graph, Graph):
        raise GraphError(f"sizes: graph={graph!r}, expected the rocmc.Graph to build in")
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    out = []
    for d in dims:
        if is_int(d):
            out.append(int(d))
        elif isinstance(d, str) and _over(d, graph.symbols()):
            out.append(symbolic.canonical(d))
        else:
            raise GraphError(
                f"sizes: dim {d!r} is neither an int nor a size over the symbols of graph "
                f"{graph.name!r} ({', '.join(graph.symbols()) or 'none'})"
            )
    if dtype not in ("i32", "i64"):
        raise GraphError(f"sizes: dtype={dtype!r}, expected 'i32' or 'i64'")
    return graph.apply("sizes", [], {"dims": out, "dtype": dtype})[0]


# ---- reshape -----------------------------------------------------------------------------


def resolve_reshape(desc: str, in_shape: tuple, shape) -> tuple[list, tuple]:
    """Check a reshape target against the input shape; returns (attribute list, output shape).

    Entries are ints >= 0, at most one -1, or dims built from x's symbols ('seq', '(b*seq)'). The
    -1 becomes the quotient when it is a product; otherwise it stays -1 in the attribute and the
    output dim is an exact division '(total/known)' computed at run time: a call whose sizes do not
    divide is an InputError (symbolic.constraints). Idempotent on its own result.
    """
    shape = [shape] if isinstance(shape, (int, np.integer, str)) else shape
    if not isinstance(shape, (list, tuple)):
        raise GraphError(f"{desc}: shape={shape!r}, expected a list of ints, -1 or symbol names")
    atoms = set(product(in_shape).atoms)
    attr, out, infer_at = [], [], None
    for d in shape:
        if is_int(d) and d == -1:
            if infer_at is not None:
                raise GraphError(f"{desc}: shape {list(shape)} has more than one -1")
            infer_at = len(out)
            attr.append(-1)
            out.append(None)
        elif is_int(d) and d >= 0:
            attr.append(int(d))
            out.append(int(d))
        elif isinstance(d, str) and d:
            if not set(size_of(d).atoms) <= atoms:
                raise GraphError(
                    f"{desc}: shape entry {d!r} is not built from the symbols of x's shape "
                    f"{_fmt(in_shape)}; expected ints, -1 or those symbols"
                )
            dim = d if d in in_shape else size_of(d).dim
            attr.append(dim)
            out.append(dim)
        else:
            raise GraphError(f"{desc}: shape entry {d!r} is invalid; expected an int >= 0, -1 or a symbol name")
    total = product(in_shape)
    known = product(d for d in out if d is not None)
    if infer_at is None:
        if known != total:
            raise GraphError(
                f"{desc}: cannot reshape {_fmt(in_shape)} ({total.dim} elements) to {_fmt(out)} ({known.dim} elements)"
            )
        return attr, tuple(out)
    q = total.divide(known)
    if q is not None:
        out[infer_at] = attr[infer_at] = q.dim
    elif total.atoms and known.coef and Size(1, total.atoms).divide(Size(1, known.atoms)) is not None:
        # Only the coefficient fails to divide: a run-time quotient such as (n/2).
        out[infer_at] = f"({total.dim}/{known.dim})"
    else:
        raise GraphError(
            f"{desc}: cannot infer -1 in {list(shape)}: {total.dim} elements of x are not a multiple of {known.dim}"
        )
    return attr, tuple(out)


@defop("reshape", attrs=("shape",))
def _reshape(node, types, attrs):
    x = types[0]
    _, out = resolve_reshape(node.describe(), x.shape, attrs["shape"])
    return x.with_shape(out)


def _concrete_reshape(x: np.ndarray, in_shape: tuple, attr: list) -> list:
    """Concrete sizes for an attribute list, binding x's plain symbols to x's sizes."""
    bound = symbol_sizes()
    bound.update({d: n for d, n in zip(in_shape, x.shape) if isinstance(d, str)})
    for d, n in zip(in_shape, x.shape):
        s = size_of(d)
        if len(s.atoms) == 1 and s.atoms[0] not in bound and s.coef:
            bound[s.atoms[0]] = n // s.coef
    out = []
    for d in attr:
        if isinstance(d, str):
            if d in bound:
                out.append(bound[d])
                continue
            s = size_of(d)
            if not all(a in bound for a in s.atoms):
                out.append(-1)  # the one size numpy may infer
                continue
            out.append(s.coef * int(np.prod([bound[a] for a in s.atoms])))
        else:
            out.append(d)
    return out


@reference("reshape")
def _reshape_ref(node, ins, attrs):
    return [ins[0].reshape(_concrete_reshape(ins[0], node.inputs[0].shape, attrs["shape"]))]


@builder
def reshape(x, shape):
    """Reshape; entries are ints, one -1 (inferred) or symbols of x's shape, e.g. ("b", "seq", 8, 64)."""
    x = _value("reshape", x)
    attr, _ = resolve_reshape(_desc("reshape", x), x.shape, shape)
    return x.graph.apply("reshape", [x], {"shape": attr})[0]


@builder
def flatten(x, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim into one (torch.flatten)."""
    x = _value("flatten", x)
    desc = _desc("flatten", x)
    if x.rank == 0:
        return reshape(x, [1])
    s = normalize_axis(desc, start_dim, x.rank, "start_dim")
    e = normalize_axis(desc, end_dim, x.rank, "end_dim")
    if s > e:
        raise GraphError(f"{desc}: start_dim={start_dim} comes after end_dim={end_dim} for rank {x.rank}")
    merged = product(x.shape[s : e + 1]).dim if e > s else x.shape[s]
    return reshape(x, [*x.shape[:s], merged, *x.shape[e + 1 :]])


@builder
def unsqueeze(x, axes):
    """Insert size-1 dims at `axes` (positions in the result, ONNX Unsqueeze)."""
    x = _value("unsqueeze", x)
    desc = _desc("unsqueeze", x)
    axes = _int_list(desc, "axes", axes)
    rank = x.rank + len(axes)
    norm = sorted(normalize_axis(desc, a, rank, "axes") for a in axes)
    if len(set(norm)) != len(norm):
        raise GraphError(f"{desc}: axes={axes} repeats an axis")
    dims = iter(x.shape)
    return reshape(x, [1 if i in norm else next(dims) for i in range(rank)])


@builder
def squeeze(x, axes=None):
    """Remove size-1 dims (all static ones when axes is None)."""
    x = _value("squeeze", x)
    desc = _desc("squeeze", x)
    if axes is None:
        norm = {i for i, d in enumerate(x.shape) if d == 1}
    else:
        norm = {normalize_axis(desc, a, x.rank, "axes") for a in _int_list(desc, "axes", axes)}
        for a in sorted(norm):
            if x.shape[a] != 1:
                what = "symbolic" if isinstance(x.shape[a], str) else "not 1"
                raise GraphError(
                    f"{desc}: cannot squeeze axis {a} of {x.type}: its size {x.shape[a]} is {what}; "
                    f"expected a static size-1 dim"
                )
    return reshape(x, [d for i, d in enumerate(x.shape) if i not in norm])


# ---- transpose -----------------------------------------------------------------------------


@defop("transpose", attrs=("perm",))
def _transpose(node, types, attrs):
    x, perm = types[0], attrs["perm"]
    if not isinstance(perm, list) or sorted(perm) != list(range(x.rank)) or not all(is_int(p) for p in perm):
        raise GraphError(f"{node.describe()}: perm={perm!r} is not a permutation of 0..{x.rank - 1} for {x}")
    return x.with_shape([x.shape[p] for p in perm])


@reference("transpose")
def _transpose_ref(node, ins, attrs):
    return [np.transpose(ins[0], attrs["perm"])]


@builder
def permute(x, dims):
    """Reorder dims: result dim i is x's dim dims[i] (negative entries count from the end)."""
    x = _value("permute", x)
    desc = _desc("transpose", x)
    dims = _int_list(desc, "dims", dims)
    if len(dims) != x.rank:
        raise GraphError(f"{desc}: dims={dims} has {len(dims)} entries, expected {x.rank} for {x.type}")
    perm = [normalize_axis(desc, d, x.rank, "dims") for d in dims]
    return x.graph.apply("transpose", [x], {"perm": perm})[0]


@builder
def transpose(x, dim0, dim1):
    """Swap two dims (torch.transpose)."""
    x = _value("transpose", x)
    desc = _desc("transpose", x)
    a, b = normalize_axis(desc, dim0, x.rank, "dim0"), normalize_axis(desc, dim1, x.rank, "dim1")
    perm = list(range(x.rank))
    perm[a], perm[b] = b, a
    return x.graph.apply("transpose", [x], {"perm": perm})[0]


# ---- concat --------------------------------------------------------------------------------


def dim_sum(dims):
    """Sum of dims: static parts fold, symbolic parts become '(a+b)' expressions."""
    static = sum(d for d in dims if isinstance(d, int))
    out = None
    for d in dims:
        if isinstance(d, str):
            out = d if out is None else dim_expr("+", out, d)
    return static if out is None else dim_expr("+", out, static)


@defop("concat", attrs=("axis",))
def _concat(node, types, attrs):
    desc, axis = node.describe(), attrs["axis"]
    names = [f"%{v.id}" for v in node.inputs]
    if not types:
        raise GraphError(f"{desc}: expected at least one tensor")
    dtype = same_dtype(desc, types, names)
    first = types[0]
    check_axis(desc, axis, first.rank)
    for t, n in zip(types[1:], names[1:]):
        if t.rank != first.rank:
            raise GraphError(
                f"{desc}: {n} has rank {t.rank} ({t}) but {names[0]} has rank {first.rank}; expected the same rank"
            )
        for i, (a, b) in enumerate(zip(first.shape, t.shape)):
            if i != axis and a != b:
                raise GraphError(f"{desc}: dim {i} of {n} is {b} but {a} in {names[0]}; only axis {axis} may differ")
    shape = list(first.shape)
    shape[axis] = dim_sum([t.shape[axis] for t in types])
    return TensorType(tuple(shape), dtype)


@reference("concat")
def _concat_ref(node, ins, attrs):
    return [np.concatenate(ins, axis=attrs["axis"])]


@builder
def concat(values, axis=0):
    """Join tensors along `axis`; the other dims must match (symbolic dims included)."""
    if isinstance(values, Value) or not isinstance(values, (list, tuple)) or not values:
        raise GraphError(f"concat: values={values!r}, expected a non-empty list of tensors")
    g = graph_of("concat", *values)
    like = next(v for v in values if isinstance(v, Value))
    vs = [as_value("concat", f"values[{i}]", v, g, like) for i, v in enumerate(values)]
    axis = normalize_axis(_desc("concat", *vs), axis, vs[0].rank)
    return g.apply("concat", vs, {"axis": axis})[0]


# ---- slice ---------------------------------------------------------------------------------


def _slice_dim(d, start, end, step):
    if isinstance(d, int):
        return slice_bounds(d, start, end, step)[1]
    if step == 1 and 0 <= start < BIG and end >= BIG:
        return dim_expr("-", d, start)
    return f"slice({d},{start},{end},{step})"


def normalize_slice(desc: str, shape: tuple, starts, ends, axes, steps) -> dict:
    """Canonical Slice attributes: axes non-negative and sorted; static dims get clamped bounds."""
    starts, ends = _int_list(desc, "starts", starts), _int_list(desc, "ends", ends)
    axes = list(range(len(starts))) if axes is None else _int_list(desc, "axes", axes)
    steps = [1] * len(starts) if steps is None else _int_list(desc, "steps", steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise GraphError(
            f"{desc}: starts, ends, axes and steps have {len(starts)}, {len(ends)}, {len(axes)} and "
            f"{len(steps)} entries; expected the same number"
        )
    axes = [normalize_axis(desc, a, len(shape), "axes") for a in axes]
    if len(set(axes)) != len(axes):
        raise GraphError(f"{desc}: axes={axes} repeats an axis")
    rows = []
    for a, s, e, st in sorted(zip(axes, starts, ends, steps)):
        if st == 0:
            raise GraphError(f"{desc}: step 0 on axis {a}; expected a non-zero step")
        d = shape[a]
        if isinstance(d, int):
            first, n = slice_bounds(d, s, e, st)
            # -(d+1) means "before index 0" for negative steps and stays so when normalized again.
            e = min(first + n * st, d) if n else first
            s, e = first, (e if e >= 0 else -(d + 1))
        else:
            s, e = max(min(s, BIG), -BIG), max(min(e, BIG), -BIG)
        rows.append((a, s, e, st))
    return {
        "axes": [r[0] for r in rows],
        "starts": [r[1] for r in rows],
        "ends": [r[2] for r in rows],
        "steps": [r[3] for r in rows],
    }


@defop("slice", attrs=("axes", "starts", "ends", "steps"))
def _slice(node, types, attrs):
    x = types[0]
    norm = normalize_slice(node.describe(), x.shape, attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"])
    shape = list(x.shape)
    for a, s, e, st in zip(norm["axes"], norm["starts"], norm["ends"], norm["steps"]):
        shape[a] = _slice_dim(x.shape[a], s, e, st)
    return x.with_shape(shape)


@reference("slice")
def _slice_ref(node, ins, attrs):
    x = ins[0]
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        first, n = slice_bounds(x.shape[a], s, e, st)
        x = np.take(x, first + st * np.arange(n, dtype=np.int64), axis=a)
    return [x]


@builder
def slice(x, starts, ends, axes=None, steps=None):
    """ONNX Slice: per-axis [start, end) with step; negative indices count from the end, out-of-range
    bounds clamp, negative steps walk backwards."""
    x = _value("slice", x)
    attrs = normalize_slice(_desc("slice", x), x.shape, starts, ends, axes, steps)
    return x.graph.apply("slice", [x], attrs)[0]


# ---- gather --------------------------------------------------------------------------------


@defop("gather", attrs=("axis",))
def _gather(node, types, attrs):
    x, idx = types
    desc, axis = node.describe(), attrs["axis"]
    if idx.dtype.kind != "int":
        raise GraphError(f"{desc}: indices have dtype {idx.dtype}, expected an int tensor (i32 or i64)")
    if x.rank == 0:
        raise GraphError(f"{desc}: x is a scalar ({x}); expected rank >= 1")
    check_axis(desc, axis, x.rank)
    if x.shape[axis] == 0 and 0 not in idx.shape:
        raise GraphError(f"{desc}: gathers from axis {axis} of {x}, which is empty; nothing to read")
    return x.with_shape(x.shape[:axis] + idx.shape + x.shape[axis + 1 :])


def gather_indices(idx: np.ndarray, n: int) -> np.ndarray:
    """Where `gather` reads along an axis of size n > 0: negative indices count from the end once,
    then everything is clamped to [0, n-1] (the compiled module does the same)."""
    i = idx.astype(np.int64)
    return np.clip(np.where(i < 0, i + n, i), 0, n - 1)


@reference("gather")
def _gather_ref(node, ins, attrs):
    x, idx = ins
    n = x.shape[attrs["axis"]]
    if n == 0 and idx.size:
        raise InputError(
            f"{node.describe()}: gathers {idx.size} indices from axis {attrs['axis']} of a "
            f"{x.shape} array, which is empty; nothing to read"
        )
    return [np.take(x, gather_indices(idx, n), axis=attrs["axis"])]


@builder
def gather(x, indices, axis=0):
    """numpy.take: out shape x.shape[:axis] + indices.shape + x.shape[axis+1:].

    Negative indices count from the end, as in numpy and ONNX Gather (-1 is the last). Indices still
    out of range after that are clamped to [0, n-1], as JAX does for out-of-bounds reads (`x[i]`): the
    compiled module never reads out of bounds, and `rocmc.evaluate` gives the same result."""
    g = graph_of("gather", x, indices)
    xv = as_value("gather", "x", x, g)
    iv = as_value("gather", "indices", indices, g)
    axis = normalize_axis(_desc("gather", xv, iv), axis, xv.rank)
    return g.apply("gather", [xv, iv], {"axis": axis})[0]


@builder
def embedding(indices, weight):
    """Rows of `weight` picked by `indices` (torch.nn.functional.embedding)."""
    return gather(weight, indices, 0)


# ---- broadcast_to --------------------------------------------------------------------------


@defop("broadcast_to", attrs=("shape",))
def _broadcast_to(node, types, attrs):
    x, shape, desc = types[0], attrs["shape"], node.describe()
    if not isinstance(shape, list) or len(shape) < x.rank:
        raise GraphError(f"{desc}: shape={shape!r} must be a list of at least rank {x.rank} for {x}")
    symbols = set(node.inputs[0].graph.symbols())
    known = symbols | {d for d in x.shape if isinstance(d, str)}
    for d in shape:
        if not ((is_int(d) and d >= 0) or (isinstance(d, str) and (d in known or _over(d, symbols)))):
            raise GraphError(
                f"{desc}: target dim {d!r} is neither an int >= 0 nor a size over the graph's "
                f"symbols ({', '.join(sorted(known)) or 'none'})"
            )
    got = broadcast_shapes(desc, x.shape, tuple(shape))
    if list(got) != shape:
        raise GraphError(f"{desc}: {x} does not broadcast to {_fmt(shape)}")
    return x.with_shape(shape)


@reference("broadcast_to")
def _broadcast_to_ref(node, ins, attrs):
    x, shape = ins[0], attrs["shape"]
    sizes = symbol_sizes()
    sizes.update({d: n for d, n in zip(node.inputs[0].shape, x.shape) if isinstance(d, str)})
    return [np.broadcast_to(x, [_size(d, sizes) for d in shape]).copy()]


def _over(d: str, symbols) -> bool:
    """Whether d is a size expression over `symbols` (which the module computes from its inputs)."""
    try:
        return symbolic.parse(d).symbols() <= set(symbols)
    except GraphError:
        return False


def _size(d, sizes: dict) -> int:
    """A dim's size in a reference: ints as they are, bound names, else the expression evaluated."""
    if isinstance(d, int):
        return d
    return sizes[d] if d in sizes else symbolic.parse(d).evaluate(sizes)


@builder
def broadcast_to(x, shape):
    """numpy.broadcast_to; target dims are ints, dims of x, or sizes over the graph's symbols ("(s+1)")."""
    x = _value("broadcast_to", x)
    shape = [shape] if isinstance(shape, (int, str)) else shape
    if not isinstance(shape, (list, tuple)):
        raise GraphError(f"{_desc('broadcast_to', x)}: shape={shape!r}, expected a list of ints or symbols")
    shape = [int(d) if is_int(d) else d for d in shape]
    return x.graph.apply("broadcast_to", [x], {"shape": shape})[0]


# ---- pad -----------------------------------------------------------------------------------

PAD_MODES = ("constant", "reflect", "edge")


def _pad_pairs(desc: str, rank: int, pad_width) -> list:
    """numpy's pad_width forms: int, (lo, hi), or one (lo, hi) per dim."""
    if is_int(pad_width):
        pairs = [(pad_width, pad_width)] * rank
    elif isinstance(pad_width, (list, tuple)) and len(pad_width) == 2 and all(is_int(p) for p in pad_width):
        pairs = [tuple(pad_width)] * rank
    elif (
        isinstance(pad_width, (list, tuple))
        and len(pad_width) == rank
        and all(isinstance(p, (list, tuple)) and len(p) == 2 and all(is_int(q) for q in p) for p in pad_width)
    ):
        pairs = [tuple(p) for p in pad_width]
    else:
        raise GraphError(f"{desc}: pad_width={pad_width!r}, expected an int or {rank} (lo, hi) pairs of ints")
    if any(q < 0 for p in pairs for q in p):
        raise GraphError(f"{desc}: pad_width={pad_width!r} has a negative width; expected widths >= 0")
    return [[int(lo), int(hi)] for lo, hi in pairs]


@defop("pad", attrs=("pad_width", "mode", "value"))
def _pad(node, types, attrs):
    x, desc, mode = types[0], node.describe(), attrs["mode"]
    pairs = _pad_pairs(desc, x.rank, attrs["pad_width"])
    if mode not in PAD_MODES:
        raise GraphError(f"{desc}: mode={mode!r}, expected one of {', '.join(PAD_MODES)}")
    if not isinstance(attrs["value"], (int, float)) or isinstance(attrs["value"], bool):
        raise GraphError(f"{desc}: value={attrs['value']!r}, expected a number")
    for i, (d, (lo, hi)) in enumerate(zip(x.shape, pairs)):
        if isinstance(d, int) and (lo or hi):
            limit = {"constant": None, "edge": 1, "reflect": 2}[mode]
            if limit and d < limit:
                raise GraphError(f"{desc}: {mode} padding of dim {i} needs a size >= {limit}, got {d}")
            if mode == "reflect" and max(lo, hi) > d - 1:
                raise GraphError(f"{desc}: reflect padding ({lo}, {hi}) of dim {i} exceeds size - 1 = {d - 1}")
    return x.with_shape([dim_expr("+", d, lo + hi) for d, (lo, hi) in zip(x.shape, pairs)])


@reference("pad")
def _pad_ref(node, ins, attrs):
    x, mode = ins[0], attrs["mode"]
    kw = {"constant_values": np.asarray(attrs["value"]).astype(x.dtype)} if mode == "constant" else {}
    return [np.pad(x, attrs["pad_width"], mode=mode, **kw)]


@builder
def pad(x, pad_width, mode="constant", value=0.0):
    """numpy.pad: pad_width is an int or (lo, hi) per dim; modes constant, reflect and edge."""
    x = _value("pad", x)
    desc = _desc("pad", x)
    if mode not in PAD_MODES:
        raise GraphError(f"{desc}: mode={mode!r} is not supported; expected one of {', '.join(PAD_MODES)}")
    if not isinstance(value, (int, float, np.number)) or isinstance(value, (bool, np.bool_)):
        raise GraphError(f"{desc}: value={value!r}, expected a number")
    value = int(value) if x.dtype.kind != "float" and float(value).is_integer() else float(value)
    return x.graph.apply("pad", [x], {"pad_width": _pad_pairs(desc, x.rank, pad_width), "mode": mode, "value": value})[
        0
    ]
