"""Resize (ONNX Resize-10..19, Upsample) and interpolate (torch.nn.functional.interpolate).

One op, `resize`, holds a normalized description: per dim the output size (None where the dim is
left alone) and the scale the coordinate transform uses, plus the mode and its options. Both
builders reduce their arguments (axes, sizes or scales, keep_aspect_ratio_policy, torch's
align_corners) to that one form.

Every mode is separable: along each resized dim, output position o reads a few input positions
(`taps`) with weights, and tf_crop_and_resize replaces positions that map outside the input by
`extrapolation_value`. `axis_taps` computes those tables in float64 from the ONNX definition; the
reference applies them dim after dim, the lowering gathers with them. Resized dims must therefore
be static (the tables are compile-time constants); other dims (a batch) may be symbolic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...errors import GraphError
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, normalize_axis, reference

__all__ = ["resize", "interpolate"]

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")
ATTRS = (
    "sizes",
    "scales",
    "mode",
    "coordinate_transformation_mode",
    "nearest_mode",
    "cubic_coeff_a",
    "exclude_outside",
    "extrapolation_value",
    "roi",
    "antialias",
)


# ---- the per-dim tables --------------------------------------------------------------------------


@dataclass
class Taps:
    """Along one dim: output position o is sum_t weight[o, t] * x[index[o, t]], or the
    extrapolation value where outside[o]."""

    index: np.ndarray  # int64 [out, taps], inside [0, in)
    weight: np.ndarray  # float64 [out, taps]
    outside: np.ndarray  # bool [out]


def source_coordinates(size: int, out: int, scale: float, mode: str, roi) -> np.ndarray:
    """Where each output position lies in input coordinates (ONNX coordinate_transformation_mode).
    `out` is the integer output size; the continuous one, scale * size, is what the transforms use."""
    y = np.arange(out, dtype=np.float64)
    length = scale * size
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return np.full(out, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - out / length)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "align_corners":
        return np.zeros(out) if length == 1 else y * (size - 1) / (length - 1)
    if mode == "asymmetric":
        return y / scale
    start, end = roi
    if length == 1:
        return np.full(out, (end - start) * (size - 1) / 2 + start * (size - 1))
    return y * (end - start) * (size - 1) / (length - 1) + start * (size - 1)


def _round(x: np.ndarray, nearest_mode: str) -> np.ndarray:
    """The nearest input position; ties go as nearest_mode says."""
    return {
        "round_prefer_floor": lambda: np.ceil(x - 0.5),
        "round_prefer_ceil": lambda: np.floor(x + 0.5),
        "floor": lambda: np.floor(x),
        "ceil": lambda: np.ceil(x),
    }[nearest_mode]().astype(np.int64)


def _keys(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with parameter a, at distances t."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _filter(x: np.ndarray, attrs: dict, scale: float):
    """First tap and weights of a linear or cubic filter at positions x. With antialias, a
    downscale widens the filter by 1/scale (and weights are renormalized)."""
    support, kernel = (
        (1, lambda t: np.maximum(1 - np.abs(t), 0.0))
        if attrs["mode"] == "linear"
        else (2, lambda t: _keys(t, attrs["cubic_coeff_a"]))
    )
    stretch = min(scale, 1.0) if attrs["antialias"] else 1.0
    reach = math.floor(support / stretch - 1e-12) if stretch < 1 else support - 1
    base = np.floor(x).astype(np.int64)
    offsets = np.arange(-reach, reach + 2)
    index = base[:, None] + offsets[None, :]
    weight = kernel((index - x[:, None]) * stretch)
    if stretch < 1:
        weight = weight / weight.sum(axis=1, keepdims=True)
    return index, weight


def axis_taps(size: int, out: int, scale: float, attrs: dict, roi=(0.0, 1.0)) -> Taps:
    """The tables of one resized dim (see Taps)."""
    x = source_coordinates(size, out, scale, attrs["coordinate_transformation_mode"], roi)
    if attrs["mode"] == "nearest":
        index, weight = _round(x, attrs["nearest_mode"])[:, None], np.ones((out, 1))
    else:
        index, weight = _filter(x, attrs, scale)
        if attrs["exclude_outside"]:
            weight = np.where((index < 0) | (index >= size), 0.0, weight)
            total = weight.sum(axis=1, keepdims=True)
            weight = weight / np.where(total == 0, 1.0, total)
    outside = np.zeros(out, bool)
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        outside = (x < 0) | (x > size - 1)
    return Taps(np.clip(index, 0, size - 1), weight, outside)


def resized_dims(attrs: dict) -> list:
    return [i for i, s in enumerate(attrs["sizes"]) if s is not None]


def dim_taps(attrs: dict, shape, i: int) -> Taps:
    roi = attrs["roi"][i] if attrs["roi"] is not None else (0.0, 1.0)
    return axis_taps(shape[i], attrs["sizes"][i], attrs["scales"][i], attrs, roi)


# ---- shape rule and reference --------------------------------------------------------------------


def _check_attrs(node, x: TensorType, a: dict) -> None:
    where = node.describe()
    for key, allowed in (
        ("mode", MODES),
        ("coordinate_transformation_mode", COORDINATE_MODES),
        ("nearest_mode", NEAREST_MODES),
    ):
        if a.get(key) not in allowed:
            raise GraphError(f"{where}: {key}={a.get(key)!r}, expected one of {', '.join(allowed)}")
    sizes, scales = a.get("sizes"), a.get("scales")
    if not (isinstance(sizes, list) and isinstance(scales, list) and len(sizes) == len(scales) == x.rank):
        raise GraphError(f"{where}: sizes={sizes!r}, scales={scales!r}, expected one entry per dim of 'x' ({x})")
    for i, (s, f) in enumerate(zip(sizes, scales)):
        if s is None:
            continue
        if not (isinstance(s, int) and s >= 1 and isinstance(f, float) and f > 0 and math.isfinite(f)):
            raise GraphError(f"{where}: dim {i}: size {s!r} and scale {f!r}, expected an int >= 1 and a float > 0")
        if not isinstance(x.shape[i], int):
            raise GraphError(f"{where}: dim {i} of 'x' ({x}) is symbolic; a resized dim must be static")
    if a["mode"] != "nearest" and not x.dtype.is_float:
        raise GraphError(f"{where}: 'x' has dtype {x.dtype}; {a['mode']} interpolation needs a float tensor")
    if a.get("antialias") and a["mode"] == "nearest":
        raise GraphError(f"{where}: antialias applies to linear and cubic modes, not nearest")
    roi = a.get("roi")
    if a["coordinate_transformation_mode"] == "tf_crop_and_resize":
        if not (isinstance(roi, list) and len(roi) == x.rank and all(len(r) == 2 for r in roi)):
            raise GraphError(f"{where}: tf_crop_and_resize needs roi as one (start, end) pair per dim, got {roi!r}")


@defop("resize", attrs=ATTRS)
def _resize_infer(node, types, attrs):
    x = types[0]
    _check_attrs(node, x, attrs)
    return x.with_shape(tuple(d if s is None else s for d, s in zip(x.shape, attrs["sizes"])))


@reference("resize")
def _resize_ref(node, ins, attrs):
    """Dim after dim: gather the taps, weigh them, then put the extrapolation value where the
    source position lies outside the input."""
    y = ins[0].astype(np.float64)
    for i in resized_dims(attrs):
        taps = dim_taps(attrs, ins[0].shape, i)
        gathered = np.take(y, taps.index, axis=i)  # dims: ..., out, taps, ...
        w = taps.weight.reshape((1,) * i + taps.weight.shape + (1,) * (y.ndim - i - 1))
        y = (gathered * w).sum(axis=i + 1)
        mask = taps.outside.reshape((1,) * i + (-1,) + (1,) * (y.ndim - i - 1))
        y = np.where(mask, attrs["extrapolation_value"], y)
    return [y if ins[0].dtype.kind == "f" else y.astype(ins[0].dtype)]


# ---- builders ------------------------------------------------------------------------------------


def _axes(op: str, axes, rank: int) -> list:
    if axes is None:
        return list(range(rank))
    out = []
    for a in axes:
        out.append(normalize_axis(op, a, rank, "axes", scalar_axis=False))
    if len(set(out)) != len(out):
        raise GraphError(f"{op}: axes={list(axes)!r} repeats a dim")
    return out


def _numbers(op: str, arg: str, v, n: int, kind) -> list:
    vals = list(v) if isinstance(v, (list, tuple, np.ndarray)) else [v] * n
    if len(vals) != n or not all(
        isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) for x in vals
    ):
        raise GraphError(f"{op}: {arg}={v!r}, expected {n} numbers (one per resized dim)")
    return [kind(x) for x in vals]


def _static_size(op: str, x, i: int) -> int:
    d = x.shape[i]
    if not isinstance(d, int):
        raise GraphError(f"{op}: dim {i} of 'x' ({x.type}) is symbolic; a resized dim must be static")
    return d


def _plan(op: str, x, axes, sizes, scales, policy):
    """Per dim of x: (output size or None, scale) from ONNX's sizes/scales/axes/keep_aspect_ratio_policy."""
    if (sizes is None) == (scales is None):
        raise GraphError(f"{op}: give exactly one of sizes and scales")
    if policy not in ASPECT_POLICIES:
        raise GraphError(f"{op}: keep_aspect_ratio_policy={policy!r}, expected one of {', '.join(ASPECT_POLICIES)}")
    out, scale = [None] * x.rank, [1.0] * x.rank
    if scales is not None:
        for i, f in zip(axes, _numbers(op, "scales", scales, len(axes), float)):
            if not (f > 0 and math.isfinite(f)):
                raise GraphError(f"{op}: scales={list(scales)!r}, expected finite numbers > 0")
            size = _static_size(op, x, i) if f != 1.0 else x.shape[i]
            if f != 1.0:
                out[i], scale[i] = int(math.floor(size * f)), f
        return out, scale
    want = _numbers(op, "sizes", sizes, len(axes), int)
    if any(s < 1 for s in want):
        raise GraphError(f"{op}: sizes={list(sizes)!r}, expected ints >= 1")
    ratios = {i: s / _static_size(op, x, i) for i, s in zip(axes, want)}
    if policy != "stretch":
        common = (min if policy == "not_larger" else max)(ratios.values())
        ratios = {i: common for i in ratios}
        want = [int(common * x.shape[i] + 0.5) for i in axes]
    for (i, r), s in zip(ratios.items(), want):
        if s != x.shape[i] or r != 1.0:
            out[i], scale[i] = s, r
    return out, scale


def _choice(op: str, arg: str, v, allowed) -> str:
    if v not in allowed:
        raise GraphError(f"{op}: {arg}={v!r}, expected one of {', '.join(map(repr, allowed))}")
    return v


@builder
def resize(
    x,
    sizes=None,
    scales=None,
    mode="nearest",
    coordinate_transformation_mode="half_pixel",
    nearest_mode="round_prefer_floor",
    cubic_coeff_a=-0.75,
    exclude_outside=False,
    extrapolation_value=0.0,
    roi=None,
    axes=None,
    keep_aspect_ratio_policy="stretch",
    antialias=False,
):
    """ONNX Resize: `sizes` or `scales` for the dims in `axes` (all dims by default); `roi` is one
    (start, end) pair per dim in `axes`, used by tf_crop_and_resize. antialias widens linear and
    cubic filters when downscaling."""
    op = "resize"
    g = graph_of(op, x)
    x = as_value(op, "x", x, g)
    dims = _axes(op, axes, x.rank)
    out, scale = _plan(op, x, dims, sizes, scales, keep_aspect_ratio_policy)
    attrs = {
        "sizes": out,
        "scales": scale,
        "mode": _choice(op, "mode", mode, MODES),
        "coordinate_transformation_mode": _choice(
            op, "coordinate_transformation_mode", coordinate_transformation_mode, COORDINATE_MODES
        ),
        "nearest_mode": _choice(op, "nearest_mode", nearest_mode, NEAREST_MODES),
        "cubic_coeff_a": _numbers(op, "cubic_coeff_a", cubic_coeff_a, 1, float)[0],
        "exclude_outside": bool(exclude_outside),
        "extrapolation_value": _numbers(op, "extrapolation_value", extrapolation_value, 1, float)[0],
        "roi": None,
        "antialias": bool(antialias),
    }
    if coordinate_transformation_mode == "tf_crop_and_resize":
        if roi is None:
            raise GraphError(f"{op}: coordinate_transformation_mode='tf_crop_and_resize' needs roi")
        flat = _numbers(op, "roi", roi, 2 * len(dims), float)
        pairs = [[0.0, 1.0] for _ in range(x.rank)]
        for k, i in enumerate(dims):
            pairs[i] = [flat[k], flat[len(dims) + k]]
        attrs["roi"] = pairs
        # A dim the roi crops is resized even when its size stays.
        for i in dims:
            if attrs["sizes"][i] is None and pairs[i] != [0.0, 1.0]:
                attrs["sizes"][i] = _static_size(op, x, i)
    return g.apply(op, [x], attrs)[0]


_TORCH_MODES = {
    "nearest": ("nearest", "asymmetric", "floor"),
    "nearest-exact": ("nearest", "half_pixel", "round_prefer_ceil"),
    "linear": ("linear", None, None),
    "bilinear": ("linear", None, None),
    "trilinear": ("linear", None, None),
    "bicubic": ("cubic", None, None),
}


@builder
def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None, antialias=False):
    """torch.nn.functional.interpolate over the spatial dims of x (N, C, *spatial): modes nearest,
    nearest-exact, linear/bilinear/trilinear (N-D linear) and bicubic (a = -0.75). A given
    scale_factor is the one the coordinate transform uses (torch's recompute_scale_factor=None).
    torch's antialias is ONNX's with the taps outside the input excluded, and a = -0.5 for bicubic."""
    op = "interpolate"
    g = graph_of(op, x)
    x = as_value(op, "x", x, g)
    if x.rank < 3:
        raise GraphError(f"{op}: 'x' is {x.type}, expected rank >= 3 (N, C, *spatial)")
    if mode not in _TORCH_MODES:
        raise GraphError(
            f"{op}: mode={mode!r}, expected one of {', '.join(map(repr, _TORCH_MODES))} ('area' is not supported)"
        )
    kind, coord, rounding = _TORCH_MODES[mode]
    if kind == "nearest" and align_corners is not None:
        raise GraphError(f"{op}: align_corners applies to linear and cubic modes, not {mode!r}")
    if coord is None:
        coord = "align_corners" if align_corners else "half_pixel"
    n = x.rank - 2
    sizes = None if size is None else _numbers(op, "size", size, n, int)
    scales = None if scale_factor is None else _numbers(op, "scale_factor", scale_factor, n, float)
    return resize(
        x,
        sizes=sizes,
        scales=scales,
        mode=kind,
        coordinate_transformation_mode=coord,
        nearest_mode=rounding or "round_prefer_floor",
        axes=list(range(2, x.rank)),
        antialias=antialias,
        exclude_outside=bool(antialias),
        cubic_coeff_a=-0.5 if antialias else -0.75,
    )
