"""ONNX converters of spatial ops: Conv, ConvTranspose (1-D to 3-D), MaxPool, AveragePool (2-D, 3-D,
and 1-D through 2-D), GlobalAveragePool/GlobalMaxPool, InstanceNormalization, GroupNormalization
(opset 18's per-group and opset 21's per-channel scale and bias), Resize (opsets 10 to 19) and
Upsample.

Every converter builds rocmc ops (rocmc.ops), so shape rules and errors are those of the ops.
Attribute values ONNX only knows at run time (Resize's scales or sizes, roi) must be known at
import time: rocmc's resize computes its tap tables when compiling.
"""

from __future__ import annotations

import numpy as np

from ..graph import Value
from ..ops.conv import pool_pad_limit
from .importer import converts
from .values import Node, Unsupported, _axis, _ops, _static

# ---- convolution and pooling ----------------------------------------------------------------

SPATIAL_RANKS = (1, 2, 3)


def _spatial_pads(n: Node, x_shape, kernel, strides, dilations) -> list:
    """Per spatial dim (lo, hi) padding from `pads` or `auto_pad` (SAME_* needs static sizes)."""
    k = len(kernel)
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = n.attr("pads", [0] * (2 * k))
        return [(int(pads[i]), int(pads[i + k])) for i in range(k)]
    if auto == "VALID":
        return [(0, 0)] * k
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={auto!r}")
    out = []
    for size, kk, s, d in zip(_static(x_shape[2:], f"auto_pad={auto}"), kernel, strides, dilations):
        total = max(0, (-(-size // s) - 1) * s + (kk - 1) * d + 1 - size)
        small = total // 2
        out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    return out


def _window(n: Node, x: Value, kernel) -> tuple:
    k = len(kernel)
    strides = [int(s) for s in n.attr("strides", [1] * k)]
    dilations = [int(d) for d in n.attr("dilations", [1] * k)]
    return strides, dilations, _spatial_pads(n, x.shape, kernel, strides, dilations)


def _pairs_or_ints(pads):
    return [p[0] for p in pads] if all(lo == hi for lo, hi in pads) else [list(p) for p in pads]


def _spatial_rank(k: int, what: str) -> int:
    if k not in SPATIAL_RANKS:
        raise Unsupported(f"{k}-D {what} (rocmc has 1-D, 2-D and 3-D)")
    return k


@converts("Conv")
def _conv(n: Node):
    return conv_nd(n, n.value(0), n.value(1), n.value(2))


def conv_nd(n: Node, x: Value, w: Value, bias: Value | None) -> Value:
    """Conv's convolution of x and w (+ bias) with node n's window attributes (ConvInteger's and
    QLinearConv's too)."""
    R = _ops()
    kernel = n.attr("kernel_shape") or list(w.shape[2:])
    k = _spatial_rank(len(kernel), "convolution")
    strides, dilations, pads = _window(n, x, kernel)
    fn = {1: R.conv1d, 2: R.conv2d, 3: R.conv3d}[k]
    return fn(
        x, w, bias, stride=strides, padding=_pairs_or_ints(pads), dilation=dilations, groups=int(n.attr("group", 1))
    )


@converts("ConvTranspose")
def _conv_transpose(n: Node):
    R = _ops()
    x, w, bias = n.value(0), n.value(1), n.value(2)
    kernel = [int(k) for k in (n.attr("kernel_shape") or w.shape[2:])]
    k = _spatial_rank(len(kernel), "transposed convolution")
    strides = [int(s) for s in n.attr("strides", [1] * k)]
    dilations = [int(d) for d in n.attr("dilations", [1] * k)]
    out_pad = [int(p) for p in n.attr("output_padding", [0] * k)]
    groups = int(n.attr("group", 1))
    full = [
        s * (i - 1) + op + (kk - 1) * d + 1
        for i, s, op, kk, d in zip(_static(x.shape[2:], "ConvTranspose"), strides, out_pad, kernel, dilations)
    ]
    output_shape = n.attr("output_shape")
    auto = n.attr("auto_pad", "NOTSET")
    if output_shape:
        output_shape = [int(v) for v in output_shape][-k:]
        totals = [f - o for f, o in zip(full, output_shape)]
        upper = auto == "SAME_UPPER"
        pads = [((t // 2, t - t // 2) if upper else (t - t // 2, t // 2)) if t >= 0 else (0, 0) for t in totals]
        # A requested size beyond the full result extends it at the end, as output_padding does.
        out_pad = [op - min(t, 0) for op, t in zip(out_pad, totals)]
        full = [f - min(t, 0) for f, t in zip(full, totals)]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        totals = [f - i * s for f, i, s in zip(full, x.shape[2:], strides)]
        pads = [((t // 2, t - t // 2) if auto == "SAME_UPPER" else (t - t // 2, t // 2)) for t in totals]
    elif auto == "VALID":
        pads = [(0, 0)] * k
    else:
        p = n.attr("pads", [0] * (2 * k))
        pads = [(int(p[i]), int(p[i + k])) for i in range(k)]
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        raise Unsupported(f"output_shape {output_shape} needs negative padding {pads}")
    fn = {1: R.conv_transpose1d, 2: R.conv_transpose2d, 3: R.conv_transpose3d}[k]
    if all(lo == hi for lo, hi in pads):
        return fn(
            x,
            w,
            bias,
            stride=strides,
            padding=[lo for lo, _ in pads],
            output_padding=out_pad,
            groups=groups,
            dilation=dilations,
        )
    # Asymmetric padding: the unpadded result, cropped (padding a transposed conv removes border rows).
    y = fn(x, w, bias, stride=strides, padding=[0] * k, output_padding=out_pad, groups=groups, dilation=dilations)
    axes = list(range(2, 2 + k))
    return R.slice(y, [lo for lo, _ in pads], [f - hi for f, (_, hi) in zip(full, pads)], axes, [1] * k)


def _pool_fn(n: Node, nsp: int):
    """The rocmc pool for this node and spatial rank (1-D pools run as 2-D ones)."""
    R = _ops()
    ceil = bool(n.attr("ceil_mode", 0))
    if n.proto.op_type == "MaxPool":
        fn = R.max_pool3d if nsp == 3 else R.max_pool2d
        return lambda v, k, s, p, d: fn(v, kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
    fn = R.avg_pool3d if nsp == 3 else R.avg_pool2d
    include = bool(n.attr("count_include_pad", 0))
    return lambda v, k, s, p, d: fn(
        v, kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil, count_include_pad=include
    )


def _pad_limit(n: Node, k: int, d: int) -> int:
    """The padding rocmc's pools take (ops.conv.pool_pad_limit's rule)."""
    return pool_pad_limit("max" if n.proto.op_type == "MaxPool" else "avg", k, d)


@converts("MaxPool", "AveragePool")
def _pool(n: Node):
    R = _ops()
    x = n.value(0)
    kernel = [int(k) for k in n.attr("kernel_shape")]
    nsp = _spatial_rank(len(kernel), "pooling")
    strides, dilations, pads = _window(n, x, kernel)
    ceil = bool(n.attr("ceil_mode", 0))
    if n.proto.op_type == "MaxPool":
        n.reject_outputs(1, "the Indices output is not supported")
        if n.attr("storage_order", 0):
            raise Unsupported("storage_order=1 is not supported")
    pool = _pool_fn(n, nsp)
    beyond = any(p > _pad_limit(n, k, d) for (lo, hi), k, d in zip(pads, kernel, dilations) for p in (lo, hi))
    if beyond:
        # More padding than rocmc's pool takes. Without ceil_mode an explicit pad of the pool's
        # identity is the same computation, unless the padding must stay out of the divisor.
        if ceil or (n.proto.op_type == "AveragePool" and not n.attr("count_include_pad", 0)):
            raise Unsupported(
                f"pads {pads} reach beyond the dilated kernel {kernel} (dilations {dilations})"
                + (" with ceil_mode=1" if ceil else " with count_include_pad=0")
            )
        fill = float("-inf") if n.proto.op_type == "MaxPool" else 0.0
        x = R.pad(x, [(0, 0), (0, 0)] + [tuple(p) for p in pads], mode="constant", value=fill)
        pads = [(0, 0)] * nsp
    if nsp == 1:
        return R.squeeze(
            pool(
                R.unsqueeze(x, 2), [1, kernel[0]], [1, strides[0]], _pairs_or_ints([(0, 0)] + pads), [1, dilations[0]]
            ),
            2,
        )
    return pool(x, kernel, strides, _pairs_or_ints(pads), dilations)


@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(n: Node):
    R = _ops()
    x = n.value(0)
    fn = R.mean if n.proto.op_type == "GlobalAveragePool" else R.max
    return fn(x, axis=tuple(range(2, x.rank)), keepdims=True)


# ---- normalization -------------------------------------------------------------------------------


@converts("InstanceNormalization")
def _instance_norm(n: Node):
    return _ops().instance_norm(n.value(0), n.value(1), n.value(2), eps=float(n.attr("epsilon", 1e-5)))


def _per_channel(R, v: Value, groups: int, channels: int) -> Value:
    """Opset 18's per-group scale or bias [G] repeated for the channels of each group: [C]."""
    if v.shape != (groups,):
        raise Unsupported(f"GroupNormalization-18 scale/bias of shape {list(v.shape)}, expected [{groups}]")
    return R.reshape(R.broadcast_to(R.reshape(v, (groups, 1)), (groups, channels // groups)), (channels,))


@converts("GroupNormalization")
def _group_norm(n: Node):
    R = _ops()
    x, scale, bias = n.value(0), n.value(1), n.value(2)
    groups = int(n.attr("num_groups"))
    if n.version < 21 and isinstance(x.shape[1], int) and x.shape[1] % groups == 0:
        scale, bias = (_per_channel(R, v, groups, x.shape[1]) for v in (scale, bias))
    return R.group_norm(x, groups, scale, bias, eps=float(n.attr("epsilon", 1e-5)))


# ---- resize --------------------------------------------------------------------------------------


def _floats(n: Node, i: int, what: str):
    """An optional float input known at import time; an empty tensor counts as absent."""
    k = n.known(i, what)
    if k is None or np.asarray(k).size == 0:
        return None
    return [float(v) for v in np.asarray(k, dtype=np.float64).reshape(-1)]


def _sizes(n: Node, i: int, x: Value, axes: list):
    """Resize's sizes for `axes`; an entry equal to x's own symbolic dim (a batch carried through
    Shape/Concat) leaves that dim alone. Returns (sizes, axes) of the dims that get a size."""
    k = n.known(i, "sizes")
    if k is None or np.asarray(k).size == 0:
        return None, axes
    values = np.asarray(k).reshape(-1).tolist()
    if len(values) != len(axes):
        raise Unsupported(f"sizes has {len(values)} entries, expected {len(axes)} (one per axis)")
    kept = [(int(v), a) for v, a in zip(values, axes) if not (isinstance(v, str) and v == x.shape[a])]
    symbolic = [v for v, a in zip(values, axes) if isinstance(v, str) and v != x.shape[a]]
    if symbolic:
        raise Unsupported(
            f"sizes {values} depend on symbolic dims ({', '.join(symbolic)}); rocmc needs integers for resized dims"
        )
    return [v for v, _ in kept], [a for _, a in kept]


def _resize_args(n: Node, x: Value) -> dict:
    """The keyword arguments of rocmc's resize for a Resize node of any opset from 10."""
    if n.version < 11:  # Resize-10: (X, scales); the asymmetric, flooring Upsample semantics
        return {
            "scales": _floats(n, 1, "scales"),
            "coordinate_transformation_mode": "asymmetric",
            "nearest_mode": "floor",
            "axes": list(range(x.rank)),
        }
    axes = [_axis(n, int(a), x.rank, "axes", scalar_axis=False) for a in n.attr("axes", list(range(x.rank)))]
    scales = _floats(n, 2, "scales")
    sizes, size_axes = (None, axes) if scales is not None else _sizes(n, 3, x, axes)
    if scales is None and sizes is None:
        raise Unsupported("Resize without scales or sizes")
    coord = n.attr("coordinate_transformation_mode", "half_pixel")
    roi = _floats(n, 1, "roi") if coord == "tf_crop_and_resize" else None
    if roi is not None and size_axes != axes:
        roi = [roi[axes.index(a)] for a in size_axes] + [roi[len(axes) + axes.index(a)] for a in size_axes]
    return {
        "scales": scales,
        "sizes": sizes,
        "axes": size_axes,
        "roi": roi,
        "coordinate_transformation_mode": coord,
        "nearest_mode": n.attr("nearest_mode", "round_prefer_floor"),
        "cubic_coeff_a": float(n.attr("cubic_coeff_a", -0.75)),
        "exclude_outside": bool(n.attr("exclude_outside", 0)),
        "extrapolation_value": float(n.attr("extrapolation_value", 0.0)),
        "keep_aspect_ratio_policy": n.attr("keep_aspect_ratio_policy", "stretch"),
        "antialias": bool(n.attr("antialias", 0)),
    }


@converts("Resize")
def _resize(n: Node):
    x = n.value(0)
    mode = n.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise Unsupported(f"mode={mode!r} (rocmc has nearest, linear and cubic)")
    return _ops().resize(x, mode=mode, **_resize_args(n, x))


@converts("Upsample")
def _upsample(n: Node):
    """Upsample-7 (scales attribute) and -9 (scales input): output[i] = input[floor(i / scale)] for
    nearest, asymmetric coordinates for linear."""
    x = n.value(0)
    mode = n.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise Unsupported(f"mode={mode!r} (rocmc has nearest and linear)")
    scales = n.attr("scales") if n.version < 9 else _floats(n, 1, "scales")
    if not scales:
        raise Unsupported("Upsample without scales")
    return _ops().resize(
        x,
        scales=[float(s) for s in scales],
        mode="nearest" if mode == "nearest" else "linear",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    )
