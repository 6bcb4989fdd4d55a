"""Sizes, views and data movement: the program's size arithmetic (sym_size, operator.mul, ...) on rocmc
size expressions, view/reshape, permute, expand, slice/select, cat/split, index/index_put, gather/scatter,
arange and padding.
"""

from __future__ import annotations

import operator

from ... import symbolic
from ...errors import GraphError
from ..importing import slice_bound
from .importer import Node, Unsupported, _ops, converts, is_size

# ---- size arithmetic --------------------------------------------------------------------------------


@converts("aten.sym_size.int")
def _sym_size(n: Node):
    x = n.a["self"]
    return x.shape[n.axis(n.a["dim"], x.rank, scalar=False)]


@converts("aten.sym_numel.default")
def _sym_numel(n: Node):
    total = 1
    for d in n.a["self"].shape:
        total = symbolic.dim_mul(total, d)
    return total


_SIZE_ARITH = {"add": symbolic.dim_add, "sub": symbolic.dim_sub, "mul": symbolic.dim_mul}
_SIZE_COMPARE = {"eq": "==", "ne": "==", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _sizes(n: Node) -> list:
    xs = list(n.args)
    if not all(is_size(x) for x in xs):
        raise Unsupported(f"arithmetic on {', '.join(type(x).__name__ for x in xs)}: only on sizes (ints)")
    return [x if isinstance(x, str) else int(x) for x in xs]


@converts(*(f"operator.{op}" for op in ("add", "sub", "mul")))
def _size_arith(n: Node):
    a, b = _sizes(n)
    return _SIZE_ARITH[n.fx.target.__name__](a, b)


@converts("operator.floordiv", "operator.mod")
def _size_div(n: Node):
    a, b = _sizes(n)
    if not (n.imp.decide(b, ">", 0) and n.imp.decide(a, ">=", 0)):
        raise Unsupported(f"{n.fx.target.__name__} of sizes {a} and {b}: only non-negative by positive")
    return (symbolic.dim_floordiv if n.fx.target is operator.floordiv else symbolic.dim_mod)(a, b)


@converts("operator.neg")
def _size_neg(n: Node):
    return symbolic.dim_sub(0, _sizes(n)[0])


@converts(*(f"operator.{op}" for op in _SIZE_COMPARE))
def _size_compare(n: Node):
    a, b = _sizes(n)
    op = n.fx.target.__name__
    same = n.imp.decide(a, _SIZE_COMPARE[op], b)
    return not same if op == "ne" else same


@converts("torch.sym_max", "torch.sym_min")
def _size_extreme(n: Node):
    a, b = _sizes(n)
    assumed: dict = {}
    out = (symbolic.dim_max if n.fx.target.__name__ == "sym_max" else symbolic.dim_min)(a, b, assumed)
    n.imp.assume_symbols(assumed)
    return out


@converts("operator.getitem")
def _getitem(n: Node):
    seq, i = n.args
    if not isinstance(seq, (list, tuple)):
        raise Unsupported(f"getitem of a {type(seq).__name__}")
    return seq[i]


# ---- views -----------------------------------------------------------------------------------------


@converts("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(n: Node):
    """torch has checked the sizes agree; where rocmc cannot prove a symbolic entry is the quotient of
    the others (a floor division, a derived Dim), that entry is left for reshape to infer."""
    R = _ops()
    x = n.value("self")
    shape = n.size_list("size")
    try:
        return R.reshape(x, tuple(shape))
    except GraphError as first:
        for i, d in enumerate(shape):
            if isinstance(d, str) and -1 not in shape:
                try:
                    return R.reshape(x, tuple(shape[:i] + [-1] + shape[i + 1 :]))
                except GraphError:
                    continue
        raise Unsupported(str(first)) from None


@converts("aten.permute.default")
def _permute(n: Node):
    x = n.value("self")
    return _ops().permute(x, tuple(n.axis(d, x.rank, "dims") for d in n.int_list("dims")))


@converts("aten.t.default", "aten.numpy_T.default")
def _t(n: Node):
    x = n.value("self")
    return x if x.rank < 2 else _ops().permute(x, tuple(reversed(range(x.rank))))


@converts("aten.transpose.int")
def _transpose(n: Node):
    x = n.value("self")
    perm = list(range(x.rank))
    a, b = n.axis(n.a["dim0"], x.rank, "dim0", scalar=False), n.axis(n.a["dim1"], x.rank, "dim1", scalar=False)
    perm[a], perm[b] = perm[b], perm[a]
    return _ops().permute(x, tuple(perm))


@converts("aten.expand.default")
def _expand(n: Node):
    x = n.value("self")
    size = n.size_list("size")
    lead = len(size) - x.rank
    target = [x.shape[i - lead] if isinstance(d, int) and d == -1 else d for i, d in enumerate(size)]
    if tuple(target) == tuple(x.shape):
        return x
    return _ops().broadcast_to(x, tuple(target))


@converts("aten.unsqueeze.default")
def _unsqueeze(n: Node):
    x = n.value("self")
    return _ops().unsqueeze(x, [n.axis(n.a["dim"], x.rank + 1)])


@converts("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def _squeeze(n: Node):
    x = n.value("self")
    dims = n.a.get("dim", n.a.get("dims"))
    if dims is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    else:
        dims = [dims] if isinstance(dims, int) else dims
        axes = [n.axis(d, x.rank) for d in dims]
        axes = [a for a in axes if x.rank and x.shape[a] == 1]  # torch keeps non-1 dims
    return _ops().squeeze(x, sorted(axes)) if axes else x


def _slice_axis(n: Node, x, axis: int, start, end, step: int):
    """x[start:end:step] along axis, with Python's clamping of ints; a symbolic bound is a narrow whose
    end is assumed within the dim (and checked at every call)."""
    R = _ops()
    dim = x.shape[axis]
    start = 0 if start is None else start
    end = symbolic.BIG if end is None else end
    if all(isinstance(v, int) for v in (start, end, dim)):
        start, end = min(start, symbolic.BIG), min(end, symbolic.BIG)
        return R.slice(x, [start], [end], [axis], [step])
    if step != 1:
        raise Unsupported(f"slice with symbolic bounds ({start}:{end}) and step {step}; only step 1 is supported")
    s, e = slice_bound(n.imp.at_most, start, dim), slice_bound(n.imp.at_most, end, dim)
    if not n.imp.at_most(e, dim):
        e = dim
    if not n.imp.at_most(s, e):
        raise Unsupported(f"slice {s}:{e} of axis {axis} is empty; rocmc has no empty tensors")
    if s == 0 and e == dim:
        return x
    return R.narrow(x, axis, s, symbolic.dim_sub(e, s))


@converts("aten.slice.Tensor")
def _slice(n: Node):
    x = n.value("self")
    axis = n.axis(n.a.get("dim", 0), x.rank, scalar=False)
    return _slice_axis(n, x, axis, n.a.get("start"), n.a.get("end"), int(n.a.get("step", 1)))


@converts("aten.select.int")
def _select(n: Node):
    R = _ops()
    x = n.value("self")
    axis, index = n.axis(n.a["dim"], x.rank, scalar=False), n.a["index"]
    if isinstance(index, int) and index < 0:
        index = symbolic.dim_add(x.shape[axis], index)
    if isinstance(index, int) and isinstance(x.shape[axis], int):
        part = R.slice(x, [index], [index + 1], [axis], [1])
    else:
        part = R.narrow(x, axis, index, 1)
    return R.squeeze(part, [axis])


@converts("aten.narrow.default")
def _narrow(n: Node):
    x = n.value("self")
    return _ops().narrow(x, n.axis(n.a["dim"], x.rank, scalar=False), n.a["start"], n.a["length"])


@converts("aten.cat.default", "aten.concat.default")
def _cat(n: Node):
    dt = n.out_dtype()
    values = [n.imp.tensor(v, dt, "tensors") for v in n.a["tensors"]]
    values = [v for v in values if not (v.rank == 1 and v.shape[0] == 0)]  # torch skips empty 1-d tensors
    return (
        _ops().concat(values, axis=n.axis(n.a.get("dim", 0), values[0].rank, scalar=False))
        if len(values) > 1
        else values[0]
    )


@converts(
    "aten.split_with_sizes.default",
    "aten.split.Tensor",
    "aten.split_with_sizes_copy.default",
    "aten.split_copy.Tensor",
    "aten.unbind.int",
)
def _split(n: Node):
    x = n.value("self")
    axis = n.axis(n.a.get("dim", 0), x.rank, scalar=False)
    dim = x.shape[axis]
    if "unbind" in n.name:
        if not isinstance(dim, int):
            raise Unsupported(f"unbind of the symbolic dim {dim}")
        return [_ops().squeeze(_slice_axis(n, x, axis, i, i + 1, 1), [axis]) for i in range(dim)]
    if "split_size" in n.a:
        size = n.a["split_size"]
        if not isinstance(dim, int) or not isinstance(size, int):
            raise Unsupported(f"split of dim {dim} into parts of {size}: needs static sizes")
        sizes = [min(size, dim - i) for i in range(0, dim, size)]
    else:
        sizes = n.size_list("split_sizes")
    outs, start = [], 0
    for size in sizes:
        end = symbolic.dim_add(start, size)
        outs.append(
            _slice_axis(n, x, axis, start, end, 1)
            if not isinstance(dim, int) or not isinstance(end, int)
            else _ops().slice(x, [start], [end], [axis], [1])
        )
        start = end
    return outs


@converts("aten.flip.default")
def _flip(n: Node):
    x = n.value("self")
    out = x
    for d in n.int_list("dims"):
        axis = n.axis(d, x.rank, "dims", scalar=False)
        if not isinstance(x.shape[axis], int):
            raise Unsupported(f"flip of the symbolic dim {x.shape[axis]}")
        out = _ops().slice(out, [-1], [-symbolic.BIG], [axis], [-1])
    return out


@converts("aten.constant_pad_nd.default")
def _pad(n: Node):
    x = n.value("self")
    pad = n.int_list("pad")
    widths = [(0, 0)] * x.rank
    for i in range(len(pad) // 2):
        widths[x.rank - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if any(w < 0 for pair in widths for w in pair):
        raise Unsupported(f"negative padding {pad} (cropping) is not supported")
    value = n.a.get("value", 0)
    return _ops().pad(x, widths, value=float(value) if x.dtype.is_float else int(value))


# ---- creation of positions ----------------------------------------------------------------------------


@converts("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(n: Node):
    R = _ops()
    start, end, step = n.a.get("start", 0), n.a["end"], n.a.get("step", 1)
    dt = n.out_dtype()
    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        return R.arange(n.graph, start, end, step, dtype=dt)
    if not all(is_size(v) for v in (start, end, step)) or not isinstance(step, int) or step <= 0:
        raise Unsupported(f"arange({start}, {end}, {step}) over symbolic sizes needs sizes and a positive int step")
    if not n.imp.at_most(start, end):
        raise Unsupported(f"arange({start}, {end}) is empty for every size; rocmc has no empty tensors")
    span = symbolic.dim_sub(end, start)
    count = span if step == 1 else symbolic.dim_floordiv(symbolic.dim_add(span, step - 1), step)
    r = R.arange(n.graph, 0, count, 1, dtype=dt)
    if step != 1:
        r = R.mul(r, n.imp.tensor(step, dt, "step"))
    if start != 0:
        r = R.add(r, n.imp.tensor(start, dt, "start"))
    return r


# ---- indexing ----------------------------------------------------------------------------------------


def _index_block(n: Node, x, indices):
    """Torch's advanced indexing by the index tensors `indices` (None: a whole dim): the given ones must
    be adjacent; returns (first indexed axis, index tensors broadcast together, stacked on a last dim)."""
    R = _ops()
    given = [i for i, t in enumerate(indices) if t is not None]
    if not given or given != list(range(given[0], given[-1] + 1)):
        raise Unsupported("index tensors that are not adjacent (separated by ':') are not supported")
    tensors = [indices[i] for i in given]
    for t in tensors:
        if t.dtype.name == "bool":
            raise Unsupported("boolean mask indices (data-dependent shapes) are not supported")
    from ..opdef import broadcast_shapes

    shape = broadcast_shapes("index", *(t.shape for t in tensors))
    stacked = [
        R.unsqueeze(
            R.broadcast_to(R.cast(t, "i64") if t.dtype.name != "i64" else t, shape)
            if tuple(t.shape) != tuple(shape)
            else (R.cast(t, "i64") if t.dtype.name != "i64" else t),
            [len(shape)],
        )
        for t in tensors
    ]
    return given[0], R.concat(stacked, axis=len(shape)) if len(stacked) > 1 else stacked[0], shape


def _moved(x, first: int, count: int) -> tuple:
    """The permutation that brings axes first..first+count-1 of x to the front."""
    return tuple(range(first, first + count)) + tuple(range(first)) + tuple(range(first + count, x.rank))


@converts("aten.index.Tensor")
def _index(n: Node):
    R = _ops()
    x = n.value("self")
    indices = list(n.a["indices"])
    given = [t for t in indices if t is not None]
    if len(given) == 1:
        axis = next(i for i, t in enumerate(indices) if t is not None)
        if given[0].dtype.name == "bool":
            raise Unsupported("boolean mask indices (data-dependent shapes) are not supported")
        return R.gather(x, given[0], axis=axis)
    first, idx, shape = _index_block(n, x, indices)
    if first == 0:
        return R.gather_nd(x, idx)
    # move the indexed block first, gather, and put the leading dims back in front of the result
    y = R.gather_nd(R.permute(x, _moved(x, first, len(given))), idx)
    lead, block = first, len(shape)
    order = list(range(block, block + lead)) + list(range(block)) + list(range(block + lead, y.rank))
    return R.permute(y, tuple(order))


@converts("aten.index_put.default")
def _index_put(n: Node):
    R = _ops()
    x = n.value("self")
    indices = list(n.a["indices"]) + [None] * (x.rank - len(n.a["indices"]))
    first, idx, shape = _index_block(n, x, indices)
    if first != 0:
        raise Unsupported("index_put with leading ':' dims is not supported")
    rest = x.shape[len([t for t in indices if t is not None]) :]
    values = R.broadcast_to(n.value("values", x.dtype.name), tuple(shape) + tuple(rest))
    reduction = "add" if n.a.get("accumulate") else "none"
    return R.scatter_nd(x, idx, values, reduction=reduction)


def _fitted(n: Node, x, index, axis: int):
    """torch's gather/scatter take an index smaller than x in the other dims; numpy's take_along_axis
    wants them equal: x is cut to the index there."""
    for d, (a, b) in enumerate(zip(x.shape, index.shape)):
        if d != axis and a != b:
            if not (isinstance(a, int) and isinstance(b, int)):
                raise Unsupported(f"index dim {d} is {b} and self's is {a}: only equal symbolic dims")
            x = _ops().slice(x, [0], [b], [d], [1])
    return x


@converts("aten.gather.default")
def _gather(n: Node):
    x, index = n.value("self"), n.value("index")
    axis = n.axis(n.a["dim"], x.rank)
    return _ops().take_along_axis(_fitted(n, x, index, axis), index, axis=axis)


@converts(
    "aten.scatter.src",
    "aten.scatter.value",
    "aten.scatter_add.default",
    "aten.scatter.reduce",
    "aten.scatter_reduce.two",
)
def _scatter(n: Node):
    R = _ops()
    x, index = n.value("self"), n.value("index")
    axis = n.axis(n.a["dim"], x.rank)
    if any(a != b for d, (a, b) in enumerate(zip(x.shape, index.shape)) if d != axis):
        raise Unsupported("scatter with an index smaller than self in another dim is not supported")
    src = n.a.get("src", n.a.get("value"))
    src = n.imp.tensor(src, x.dtype.name, "src")
    if src.shape != index.shape:
        src = R.broadcast_to(src, index.shape) if src.rank == 0 else _fitted(n, src, index, -1)
    reduce = "add" if "scatter_add" in n.name else n.a.get("reduce", "none")
    reduction = {
        "none": "none",
        "add": "add",
        "sum": "add",
        "multiply": "mul",
        "prod": "mul",
        "amax": "max",
        "amin": "min",
    }.get(reduce)
    if reduction is None or n.a.get("include_self") is False:
        raise Unsupported(f"scatter reduce={reduce!r} (include_self={n.a.get('include_self', True)}) is not supported")
    return R.scatter_elements(x, index, src, axis=axis, reduction=reduction)
