"""Convolution family: conv1d/2d/3d, transposed conv1d/2d/3d, max/avg pooling (2-D and 3-D), batch
norm (inference), local response norm and dropout (identity at inference). Layout NCW / NCHW / NCDHW.

Builders follow torch.nn.functional's keywords and normalize every attribute: stride and dilation
become one int per spatial dim, padding one [lo, hi] pair per spatial dim (ONNX pads may be
asymmetric), so the shape rules, references and lowerings only ever see that one form. Channel and
dims must be static; batch and spatial dims may be symbolic.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import GraphError
from ...symbolic import call_dim
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, is_int, reference

__all__ = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool2d",
    "avg_pool3d",
    "batch_norm",
    "local_response_norm",
    "lrn",
    "dropout",
]

CONV_ATTRS = ("stride", "padding", "dilation", "groups")
CONV_T_ATTRS = ("stride", "padding", "output_padding", "groups", "dilation")
MAX_POOL_ATTRS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
AVG_POOL_ATTRS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "count_include_pad")
SPATIAL_NAMES = {1: "L", 2: "H, W", 3: "D, H, W"}


def spatial_rank(op: str) -> int:
    """The number of spatial dims an op of the family works on: its name ends in 'Nd'."""
    return int(op[-2])


# ---- attribute normalization (builders) ----------------------------------------------------------


def _ints(op: str, arg: str, v, n: int, least: int) -> list:
    """An int or a sequence of n ints, each >= least, as a list of n Python ints."""
    vals = [v] * n if is_int(v) else list(v) if isinstance(v, (list, tuple)) else None
    if vals is None or len(vals) != n or not all(is_int(x) and x >= least for x in vals):
        raise GraphError(f"{op}: {arg}={v!r}, expected an int >= {least} or {n} such ints")
    return [int(x) for x in vals]


def _same_pads(op: str, kernel, dilation, stride) -> list:
    """torch's padding='same': total d*(k-1) per dim, the odd element on the high side."""
    if any(s != 1 for s in stride):
        raise GraphError(f"{op}: padding='same' needs stride 1, got stride={stride}")
    total = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return [[t // 2, t - t // 2] for t in total]


def _padding(op: str, padding, n: int, kernel=None, dilation=None, stride=None) -> list:
    """int | n ints | n (lo, hi) pairs | 'valid' | 'same' -> n [lo, hi] pairs."""
    if isinstance(padding, str):
        if padding == "valid":
            return [[0, 0] for _ in range(n)]
        if padding == "same" and kernel is not None:
            return _same_pads(op, kernel, dilation, stride)
        allowed = "'valid', 'same'" if kernel is not None else "'valid'"
        raise GraphError(f"{op}: padding={padding!r}, expected {allowed}, an int, {n} ints or {n} (lo, hi) pairs")
    if isinstance(padding, (list, tuple)) and len(padding) == n and all(isinstance(p, (list, tuple)) for p in padding):
        pairs = [_ints(op, "padding", list(p), 2, 0) if len(p) == 2 else None for p in padding]
        if None in pairs:
            raise GraphError(f"{op}: padding={padding!r}, expected {n} (lo, hi) pairs")
        return pairs
    return [[p, p] for p in _ints(op, "padding", padding, n, 0)]


# ---- shape rules --------------------------------------------------------------------------------


def _check_int_list(node, attrs, key, n, least):
    v = attrs.get(key)
    if not (isinstance(v, list) and len(v) == n and all(is_int(x) and x >= least for x in v)):
        raise GraphError(f"{node.describe()}: attribute {key}={v!r}, expected {n} ints >= {least}")


def _check_pairs(node, attrs, n):
    v = attrs.get("padding")
    if not (
        isinstance(v, list)
        and len(v) == n
        and all(isinstance(p, list) and len(p) == 2 and all(is_int(x) and x >= 0 for x in p) for p in v)
    ):
        raise GraphError(f"{node.describe()}: attribute padding={v!r}, expected {n} [lo, hi] pairs of ints >= 0")


def _check_bool(node, attrs, key):
    if not isinstance(attrs.get(key), bool):
        raise GraphError(f"{node.describe()}: attribute {key}={attrs.get(key)!r}, expected a bool")


def _check_input(node, types, nsp: int, what="x", kinds=("float",)):
    """x: a float tensor (or of `kinds`) (N, C, *spatial) with a static channel dim."""
    x = types[0]
    if x.rank != nsp + 2:
        raise GraphError(
            f"{node.describe()}: {what!r} has rank {x.rank} ({x}), expected rank {nsp + 2} (N, C, {SPATIAL_NAMES[nsp]})"
        )
    if x.dtype.kind not in kinds:
        raise GraphError(f"{node.describe()}: {what!r} has dtype {x.dtype}, expected a {' or '.join(kinds)} tensor")
    if not isinstance(x.shape[1], int):
        raise GraphError(f"{node.describe()}: {what!r} has shape {x}; the channel dim (1) must be static")


def _check_operand(node, types, i, arg, shape):
    t = types[i]
    if t.dtype != types[0].dtype:
        raise GraphError(f"{node.describe()}: {arg!r} has dtype {t.dtype}, expected {types[0].dtype} like 'x'")
    if t.shape != tuple(shape):
        raise GraphError(
            f"{node.describe()}: {arg!r} has shape [{','.join(map(str, t.shape))}], "
            f"expected [{','.join(map(str, shape))}]"
        )


def _window_fits(node, size, pads, eff_kernel, axis):
    """Checked when the size is static; for a symbolic size it is the caller's promise."""
    if isinstance(size, int) and eff_kernel > size + sum(pads):
        raise GraphError(
            f"{node.describe()}: kernel of effective size {eff_kernel} is larger than the "
            f"padded input ({size + sum(pads)}) along spatial dim {axis} (input size {size})"
        )


def _conv_common(node, types, attrs, nsp, transposed):
    _check_input(node, types, nsp)
    for key in ("stride", "dilation"):
        _check_int_list(node, attrs, key, nsp, 1)
    _check_pairs(node, attrs, nsp)
    g = attrs.get("groups")
    if not (is_int(g) and g >= 1):
        raise GraphError(f"{node.describe()}: attribute groups={g!r}, expected an int >= 1")
    x, w = types[0], types[1]
    if w.rank != nsp + 2 or not w.is_static:
        raise GraphError(
            f"{node.describe()}: 'weight' has shape {w}, expected a static rank-{nsp + 2} tensor "
            f"({'C_in, C_out/groups' if transposed else 'C_out, C_in/groups'}, kernel...)"
        )
    _check_operand(node, types, 1, "weight", w.shape)
    c_in = x.shape[1]
    if c_in % g:
        raise GraphError(f"{node.describe()}: input channels {c_in} are not divisible by groups={g}")
    if transposed:
        want_c, c_out = w.shape[0], w.shape[1] * g
        expect = f"weight dim 0 ({w.shape[0]}) = C_in"
    else:
        want_c, c_out = w.shape[1] * g, w.shape[0]
        expect = f"weight dim 1 * groups ({w.shape[1]}*{g}) = C_in"
        if c_out % g:
            raise GraphError(
                f"{node.describe()}: output channels {c_out} (weight dim 0) are not divisible by groups={g}"
            )
    if want_c != c_in:
        raise GraphError(f"{node.describe()}: 'x' has {c_in} channels but {expect}; expected them equal")
    if types[2] is not None:
        _check_operand(node, types, 2, "bias", (c_out,))
    return x, w, c_out


@defop("conv1d", attrs=CONV_ATTRS)
@defop("conv2d", attrs=CONV_ATTRS)
@defop("conv3d", attrs=CONV_ATTRS)
def _conv_infer(node, types, attrs):
    nsp = spatial_rank(node.op)
    x, w, c_out = _conv_common(node, types, attrs, nsp, transposed=False)
    out = []
    for i in range(nsp):
        size, k, pads, d = x.shape[2 + i], w.shape[2 + i], attrs["padding"][i], attrs["dilation"][i]
        _window_fits(node, size, pads, d * (k - 1) + 1, i)
        out.append(call_dim("conv", size, k, attrs["stride"][i], *pads, d))
    return TensorType((x.shape[0], c_out, *out), x.dtype)


@defop("conv_transpose1d", attrs=CONV_T_ATTRS)
@defop("conv_transpose2d", attrs=CONV_T_ATTRS)
@defop("conv_transpose3d", attrs=CONV_T_ATTRS)
def _conv_transpose_infer(node, types, attrs):
    nsp = spatial_rank(node.op)
    x, w, c_out = _conv_common(node, types, attrs, nsp, transposed=True)
    _check_int_list(node, attrs, "output_padding", nsp, 0)
    out = []
    for i in range(nsp):
        s, d, op = attrs["stride"][i], attrs["dilation"][i], attrs["output_padding"][i]
        if op >= max(s, d):
            raise GraphError(
                f"{node.describe()}: output_padding={attrs['output_padding']} must be smaller than "
                f"stride or dilation along spatial dim {i} (stride {s}, dilation {d})"
            )
        size = call_dim("conv_transpose", x.shape[2 + i], w.shape[2 + i], s, *attrs["padding"][i], d, op)
        if isinstance(size, int) and size < 1:
            raise GraphError(f"{node.describe()}: padding={attrs['padding']} leaves no output along spatial dim {i}")
        out.append(size)
    return TensorType((x.shape[0], c_out, *out), x.dtype)


def pool_pad_limit(op: str, kernel: int, dilation: int) -> int:
    """The most padding a pool takes on one side. Max pooling follows torch (half the kernel: a
    window never lies wholly in the padding). Average pooling takes up to the dilated kernel's reach
    (ONNX allows that), so that count_include_pad=False needs no explicit padding of its own."""
    return kernel // 2 if op.startswith("max") else dilation * (kernel - 1)


@defop("max_pool2d", attrs=MAX_POOL_ATTRS)
@defop("max_pool3d", attrs=MAX_POOL_ATTRS)
@defop("avg_pool2d", attrs=AVG_POOL_ATTRS)
@defop("avg_pool3d", attrs=AVG_POOL_ATTRS)
def _pool_infer(node, types, attrs):
    nsp = spatial_rank(node.op)
    # A max is exact in any ordered type; an average needs floats.
    _check_input(node, types, nsp, kinds=("float", "int") if node.op.startswith("max") else ("float",))
    for key in ("kernel_size", "stride", "dilation"):
        _check_int_list(node, attrs, key, nsp, 1)
    _check_pairs(node, attrs, nsp)
    _check_bool(node, attrs, "ceil_mode")
    if node.op.startswith("avg"):
        _check_bool(node, attrs, "count_include_pad")
    x = types[0]
    out = []
    for i in range(nsp):
        k, pads, d = attrs["kernel_size"][i], attrs["padding"][i], attrs["dilation"][i]
        limit = pool_pad_limit(node.op, k, d)
        if max(pads) > limit:
            raise GraphError(
                f"{node.describe()}: padding={attrs['padding']} exceeds {limit} along spatial dim {i} "
                f"(kernel_size={attrs['kernel_size']}, dilation={attrs['dilation']}); expected at most "
                + ("half the kernel" if node.op.startswith("max") else "the dilated kernel's reach")
            )
        size = x.shape[2 + i]
        _window_fits(node, size, pads, d * (k - 1) + 1, i)
        out.append(call_dim("pool", size, k, attrs["stride"][i], *pads, d, ceil=attrs["ceil_mode"]))
    return TensorType((*x.shape[:2], *out), x.dtype)


@defop("batch_norm", attrs=("eps",))
def _batch_norm_infer(node, types, attrs):
    x = types[0]
    if x.rank < 2 or not x.dtype.is_float:
        raise GraphError(f"{node.describe()}: 'x' is {x}, expected a float tensor of rank >= 2 (N, C, ...)")
    if not isinstance(x.shape[1], int):
        raise GraphError(f"{node.describe()}: 'x' has a symbolic channel dim ({x}); expected a static one")
    for i, arg in enumerate(("running_mean", "running_var", "weight", "bias"), start=1):
        t = types[i]
        if t is None:
            continue
        if not t.dtype.is_float or t.shape != (x.shape[1],):
            raise GraphError(
                f"{node.describe()}: {arg!r} is {t}, expected a float tensor of shape [{x.shape[1]}] "
                f"(one value per channel)"
            )
    if not isinstance(attrs.get("eps"), float) or attrs["eps"] < 0:
        raise GraphError(f"{node.describe()}: attribute eps={attrs.get('eps')!r}, expected a float >= 0")
    return x


@defop("lrn", attrs=("size", "alpha", "beta", "k"))
def _lrn_infer(node, types, attrs):
    x = types[0]
    if x.rank < 3 or not x.dtype.is_float:
        raise GraphError(f"{node.describe()}: 'x' is {x}, expected a float tensor of rank >= 3 (N, C, ...)")
    if not isinstance(x.shape[1], int):
        raise GraphError(f"{node.describe()}: 'x' has a symbolic channel dim ({x}); expected a static one")
    if not (is_int(attrs.get("size")) and attrs["size"] >= 1):
        raise GraphError(f"{node.describe()}: attribute size={attrs.get('size')!r}, expected an int >= 1")
    for key in ("alpha", "beta", "k"):
        if not isinstance(attrs.get(key), float):
            raise GraphError(f"{node.describe()}: attribute {key}={attrs.get(key)!r}, expected a float")
    return x


@defop("dropout", attrs=("p",))
def _dropout_infer(node, types, attrs):
    p = attrs.get("p")
    if not isinstance(p, float) or not 0.0 <= p < 1.0:
        raise GraphError(f"{node.describe()}: attribute p={p!r}, expected a float in [0, 1)")
    return types[0]


# ---- float64 references: direct definitions with loops over kernel offsets ------------------------


def _window(start, step, count):
    return slice(start, start + step * (count - 1) + 1, step)


@reference("conv1d", "conv2d", "conv3d")
def _conv_ref(node, ins, attrs):
    x, w, b = ins
    g, stride, dil = attrs["groups"], attrs["stride"], attrs["dilation"]
    xp = np.pad(x, [(0, 0), (0, 0)] + [tuple(p) for p in attrs["padding"]])
    n, c = x.shape[:2]
    f, kernel = w.shape[0], w.shape[2:]
    out = [
        call_dim("conv", n, k, s, *p, d) for n, k, s, p, d in zip(x.shape[2:], kernel, stride, attrs["padding"], dil)
    ]
    xg = xp.reshape(n, g, c // g, *xp.shape[2:])
    wg = w.reshape(g, f // g, c // g, *kernel)
    y = np.zeros((n, g, f // g, *out))
    for offs in np.ndindex(*kernel):
        # y[n, g, f, o] += x[n, g, c, o*stride + k*dilation] * w[g, f, c, k]
        patch = xg[(slice(None),) * 3 + tuple(_window(k * d, s, o) for k, d, s, o in zip(offs, dil, stride, out))]
        y += np.einsum("ngc...,gfc->ngf...", patch, wg[(slice(None),) * 3 + offs])
    y = y.reshape(n, f, *out)
    return [y if b is None else y + b.reshape(f, *[1] * len(out))]


@reference("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
def _conv_transpose_ref(node, ins, attrs):
    """The adjoint of conv: every input element scatters input * kernel into the output,
    y[n, g, f, i*stride + k*dilation - pad_lo] += x[n, g, c, i] * w[g, c, f, k]."""
    x, w, b = ins
    g, stride, dil, pads = attrs["groups"], attrs["stride"], attrs["dilation"], attrs["padding"]
    n, c, *size = x.shape
    fg, kernel = w.shape[1], w.shape[2:]
    full = [
        (s - 1) * st + d * (k - 1) + 1 + op
        for s, st, d, k, op in zip(size, stride, dil, kernel, attrs["output_padding"])
    ]
    y = np.zeros((n, g, fg, *full))
    xg = x.reshape(n, g, c // g, *size)
    wg = w.reshape(g, c // g, fg, *kernel)
    for offs in np.ndindex(*kernel):
        target = (slice(None),) * 3 + tuple(_window(k * d, s, m) for k, d, s, m in zip(offs, dil, stride, size))
        y[target] += np.einsum("ngc...,gcf->ngf...", xg, wg[(slice(None),) * 3 + offs])
    out = [
        call_dim("conv_transpose", n, k, s, *p, d, op)
        for n, k, s, p, d, op in zip(size, kernel, stride, pads, dil, attrs["output_padding"])
    ]
    y = y[(slice(None),) * 3 + tuple(slice(p[0], p[0] + o) for p, o in zip(pads, out))]
    y = y.reshape(n, g * fg, *out)
    return [y if b is None else y + b.reshape(-1, *[1] * len(out))]


def pool_taps(size: int, k: int, s: int, pads, d: int, n_out: int):
    """Per output position along one dim: the input indices its window reads (inside the input)
    and how many of its taps lie in the padded input (the divisor with count_include_pad)."""
    rows = []
    for o in range(n_out):
        taps = o * s - pads[0] + d * np.arange(k)
        rows.append((taps[(taps >= 0) & (taps < size)], int(((taps >= -pads[0]) & (taps < size + pads[1])).sum())))
    return rows


def _pool_windows(attrs, size):
    windows = []
    for i in range(len(size)):
        k, s, pads, d = attrs["kernel_size"][i], attrs["stride"][i], attrs["padding"][i], attrs["dilation"][i]
        windows.append(
            pool_taps(size[i], k, s, pads, d, call_dim("pool", size[i], k, s, *pads, d, ceil=attrs["ceil_mode"]))
        )
    return windows


@reference("max_pool2d", "max_pool3d", "avg_pool2d", "avg_pool3d")
def _pool_ref(node, ins, attrs):
    """Each output position reduces the input elements its window covers; padding never wins a max,
    and an average divides by the taps inside the input, or inside the padded input with
    count_include_pad."""
    x = ins[0]
    dims = _pool_windows(attrs, x.shape[2:])
    y = np.empty((*x.shape[:2], *(len(rows) for rows in dims)))
    for pos in np.ndindex(*y.shape[2:]):
        taps = [dims[i][p] for i, p in enumerate(pos)]
        idx = np.ix_(np.arange(x.shape[0]), np.arange(x.shape[1]), *(t[0] for t in taps))
        patch = x[idx].reshape(*x.shape[:2], -1)
        if node.op.startswith("max"):
            y[(slice(None), slice(None)) + pos] = patch.max(axis=2) if patch.shape[2] else -np.inf
            continue
        count = np.prod([t[1] for t in taps]) if attrs["count_include_pad"] else patch.shape[2]
        y[(slice(None), slice(None)) + pos] = patch.sum(axis=2) / count
    return [y]


@reference("batch_norm")
def _batch_norm_ref(node, ins, attrs):
    x, mean, var, w, b = ins
    shape = (-1,) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + attrs["eps"])
    if w is not None:
        y = y * w.reshape(shape)
    if b is not None:
        y = y + b.reshape(shape)
    return [y]


@reference("lrn")
def _lrn_ref(node, ins, attrs):
    """torch: y[c] = x[c] / (k + alpha/size * sum of x^2 over channels c-size//2 .. c+(size-1)//2)^beta."""
    x = ins[0]
    size, c = attrs["size"], x.shape[1]
    y = np.empty_like(x)
    for ch in range(c):
        lo, hi = max(ch - size // 2, 0), min(ch + (size - 1) // 2, c - 1)
        s = (x[:, lo : hi + 1] ** 2).sum(axis=1)
        y[:, ch] = x[:, ch] / (attrs["k"] + attrs["alpha"] / size * s) ** attrs["beta"]
    return [y]


@reference("dropout")
def _dropout_ref(node, ins, attrs):
    return [ins[0]]


# ---- builders -----------------------------------------------------------------------------------


def _operands(op, x, weight, bias):
    g = graph_of(op, x)
    xv = as_value(op, "x", x, g)
    wv = as_value(op, "weight", weight, g, like=xv)
    bv = None if bias is None else as_value(op, "bias", bias, g, like=xv)
    return g, [xv, wv, bv]


def conv_attrs(op, nsp, w, stride, padding, dilation, groups) -> dict:
    """A convolution's attributes in their one normalized form, from the builder's keywords (`w`: the
    weight Value, whose kernel padding='same' reads)."""
    stride, dilation = _ints(op, "stride", stride, nsp, 1), _ints(op, "dilation", dilation, nsp, 1)
    kernel = list(w.shape[2:]) if w.rank == nsp + 2 else None
    if padding == "same" and kernel is None:
        raise GraphError(f"{op}: 'weight' has rank {w.rank}, expected rank {nsp + 2}")
    pads = _padding(op, padding, nsp, kernel or [1] * nsp, dilation, stride)
    if not (is_int(groups) and groups >= 1):
        raise GraphError(f"{op}: groups={groups!r}, expected an int >= 1")
    return {"stride": stride, "padding": pads, "dilation": dilation, "groups": int(groups)}


def _conv(op, nsp, x, weight, bias, stride, padding, dilation, groups):
    g, operands = _operands(op, x, weight, bias)
    return g.apply(op, operands, conv_attrs(op, nsp, operands[1], stride, padding, dilation, groups))[0]


@builder
def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1D convolution (cross-correlation) of x (N, C_in, L) with weight (C_out, C_in/groups, k)."""
    return _conv("conv1d", 1, x, weight, bias, stride, padding, dilation, groups)


@builder
def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2D convolution (cross-correlation) of x (N, C_in, H, W) with weight (C_out, C_in/groups, kh, kw)."""
    return _conv("conv2d", 2, x, weight, bias, stride, padding, dilation, groups)


def _conv_transpose(op, nsp, x, weight, bias, stride, padding, output_padding, groups, dilation):
    g, operands = _operands(op, x, weight, bias)
    if not (is_int(groups) and groups >= 1):
        raise GraphError(f"{op}: groups={groups!r}, expected an int >= 1")
    attrs = {
        "stride": _ints(op, "stride", stride, nsp, 1),
        "padding": _padding(op, padding, nsp),
        "output_padding": _ints(op, "output_padding", output_padding, nsp, 0),
        "groups": int(groups),
        "dilation": _ints(op, "dilation", dilation, nsp, 1),
    }
    return g.apply(op, operands, attrs)[0]


@builder
def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3D convolution (cross-correlation) of x (N, C_in, D, H, W) with weight (C_out, C_in/groups, kd, kh, kw)."""
    return _conv("conv3d", 3, x, weight, bias, stride, padding, dilation, groups)


@builder
def conv_transpose1d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Transposed 1D convolution of x (N, C_in, L) with weight (C_in, C_out/groups, k)."""
    return _conv_transpose("conv_transpose1d", 1, x, weight, bias, stride, padding, output_padding, groups, dilation)


@builder
def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Transposed 2D convolution of x (N, C_in, H, W) with weight (C_in, C_out/groups, kh, kw)."""
    return _conv_transpose("conv_transpose2d", 2, x, weight, bias, stride, padding, output_padding, groups, dilation)


@builder
def conv_transpose3d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Transposed 3D convolution of x (N, C_in, D, H, W) with weight (C_in, C_out/groups, kd, kh, kw)."""
    return _conv_transpose("conv_transpose3d", 3, x, weight, bias, stride, padding, output_padding, groups, dilation)


def _flag(op, arg, v) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise GraphError(f"{op}: {arg}={v!r}, expected a bool")
    return bool(v)


def _pool(op, x, kernel_size, stride, padding, dilation, ceil_mode, **extra):
    nsp = spatial_rank(op)
    g = graph_of(op, x)
    xv = as_value(op, "x", x, g)
    kernel = _ints(op, "kernel_size", kernel_size, nsp, 1)
    attrs = {
        "kernel_size": kernel,
        "stride": kernel if stride is None else _ints(op, "stride", stride, nsp, 1),
        "padding": _padding(op, padding, nsp),
        "dilation": _ints(op, "dilation", dilation, nsp, 1),
        "ceil_mode": _flag(op, "ceil_mode", ceil_mode),
        **{k: _flag(op, k, v) for k, v in extra.items()},
    }
    return g.apply(op, [xv], attrs)[0]


@builder
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Max over (dilated) windows of x (N, C, H, W); padding never wins (it is -inf)."""
    return _pool("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)


@builder
def max_pool3d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Max over (dilated) windows of x (N, C, D, H, W); padding never wins (it is -inf)."""
    return _pool("max_pool3d", x, kernel_size, stride, padding, dilation, ceil_mode)


@builder
def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, dilation=1):
    """Mean over (dilated) windows of x (N, C, H, W); count_include_pad counts padded zeros in the
    divisor. `dilation` goes beyond torch (ONNX AveragePool has it)."""
    return _pool(
        "avg_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad=count_include_pad
    )


@builder
def avg_pool3d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, dilation=1):
    """Mean over (dilated) windows of x (N, C, D, H, W); count_include_pad counts padded zeros in the
    divisor."""
    return _pool(
        "avg_pool3d", x, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad=count_include_pad
    )


def _float_attr(op, arg, v):
    number = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
    if not number or not math.isfinite(v):
        raise GraphError(f"{op}: {arg}={v!r}, expected a finite number")
    return float(v)


@builder
def batch_norm(x, running_mean, running_var, weight=None, bias=None, eps=1e-5):
    """Inference batch norm over channel axis 1: (x - mean) / sqrt(var + eps) * weight + bias."""
    g = graph_of("batch_norm", x)
    xv = as_value("batch_norm", "x", x, g)
    args = {"running_mean": running_mean, "running_var": running_var, "weight": weight, "bias": bias}
    operands = [xv] + [None if v is None else as_value("batch_norm", k, v, g, like=xv) for k, v in args.items()]
    return g.apply("batch_norm", operands, {"eps": _float_attr("batch_norm", "eps", eps)})[0]


@builder
def local_response_norm(x, size, alpha=1e-4, beta=0.75, k=1.0):
    """Cross-channel LRN with torch's semantics (alpha is divided by size)."""
    g = graph_of("lrn", x)
    if not (is_int(size) and size >= 1):
        raise GraphError(f"lrn: size={size!r}, expected an int >= 1")
    attrs = {
        "size": int(size),
        "alpha": _float_attr("lrn", "alpha", alpha),
        "beta": _float_attr("lrn", "beta", beta),
        "k": _float_attr("lrn", "k", k),
    }
    return g.apply("lrn", [as_value("lrn", "x", x, g)], attrs)[0]


lrn = local_response_norm


@builder
def dropout(x, p=0.5, training=False):
    """Dropout at inference: the identity. Training mode is not supported."""
    g = graph_of("dropout", x)
    if training is not False:
        raise GraphError(f"dropout: training={training!r}; only inference (training=False) is supported")
    p = _float_attr("dropout", "p", p)
    if not 0.0 <= p < 1.0:
        raise GraphError(f"dropout: p={p!r}, expected a probability in [0, 1)")
    return g.apply("dropout", [as_value("dropout", "x", x, g)], {"p": p})[0]
