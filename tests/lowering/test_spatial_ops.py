"""Spatial ops against float64 references: 3-D conv, transposed conv and pools, dilated average
pooling, instance/group norm and resize/interpolate. The compiled CPU module is checked against
rocmc's reference, and the reference itself against torch in float64 (an independent definition),
on random inputs with odd sizes and a symbolic batch dim."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.inspect import describe, format_description

from helpers import CpuBatch, check, rand

torch = pytest.importorskip("torch")
F = torch.nn.functional

SIZES = {"n": 3, "h": 11, "w": 8, "d": 5}  # run-time values of symbolic dims


def _concrete(shape):
    return tuple(SIZES.get(d, d) for d in shape)


def _graph(build, shapes, dtype="f32"):
    g = rocmc.Graph("t")
    xs = [g.input(f"in{i}", s, dtype) for i, s in enumerate(shapes)]
    g.output(build(*xs))
    return g


def _run(rng, build, torch_fn, shapes, dtype="f32", compiled=True, batched=None):
    """Build a graph over inputs of `shapes` (or take it and its compiled function from a CpuBatch: `batched`);
    compare its reference with torch (float64) and, when `compiled`, the CPU module with the reference."""
    g, module = batched if batched is not None else (_graph(build, shapes, dtype), None)
    data = [rand(rng, _concrete(s), dtype) for s in shapes]
    want = rocmc.evaluate(g, *data)
    if torch_fn is not None:
        expected = torch_fn(*[torch.tensor(a.astype(np.float64)) for a in data]).numpy()
        np.testing.assert_allclose(want, expected, rtol=1e-12, atol=1e-12)
    if compiled:
        check(g, *data, impl="generated", module=module)
    return g


# A parametrized test's graphs are the functions of one module (helpers.CpuBatch): a compile a module, not a test.
def _batch(build, cases):
    return CpuBatch(build, [(i,) for i in range(len(cases))], impl="generated")


# ---- 3-D convolution and transposed convolution -----------------------------------------------

CONV3D = [
    # x, weight, keywords (torch's)
    (("n", 4, 7, 9, 6), (6, 4, 3, 3, 2), dict(stride=(2, 1, 1), padding=(1, 0, 2), dilation=(1, 2, 1))),
    (("n", 4, "d", 6, 7), (6, 2, 3, 3, 3), dict(padding=1, groups=2)),
    (("n", 3, 5, 4, 3), (2, 3, 1, 1, 1), dict()),
]


def _conv3d_graph(i):
    xs, ws, kw = CONV3D[i]
    return _graph(lambda x, w, b: ops.conv3d(x, w, b, **kw), [xs, ws, (ws[0],)])


CONV3D_BATCH = _batch(_conv3d_graph, CONV3D)


@pytest.mark.parametrize("xs,ws,kw", CONV3D)
def test_conv3d(xs, ws, kw, rng):
    batched = CONV3D_BATCH(CONV3D.index((xs, ws, kw)))
    _run(rng, None, lambda x, w, b: F.conv3d(x, w, b, **kw), [xs, ws, (ws[0],)], batched=batched)


def test_conv3d_asymmetric_padding(rng):
    pads = ((1, 0), (0, 2), (2, 1))
    torch_pad = (2, 1, 0, 2, 1, 0)  # F.pad: last dim first
    _run(
        rng,
        lambda x, w: ops.conv3d(x, w, padding=pads, stride=2),
        lambda x, w: F.conv3d(F.pad(x, torch_pad), w, stride=2),
        [("n", 3, 6, 7, 5), (4, 3, 3, 2, 3)],
    )


def test_conv3d_f16_accumulates_in_f32(rng):
    _run(rng, lambda x, w: ops.conv3d(x, w, padding=1), None, [("n", 8, 5, 6, 4), (4, 8, 3, 3, 3)], dtype="f16")


CONV_T3D = [
    (("n", 4, 3, 5, 4), (4, 3, 3, 3, 3), dict(stride=2, padding=1, output_padding=(1, 0, 1))),
    (("n", 4, 3, 5, 4), (4, 3, 2, 3, 3), dict(stride=(1, 2, 1), groups=2, dilation=(2, 1, 1), padding=(0, 1, 1))),
]


@pytest.mark.parametrize("xs,ws,kw", CONV_T3D)
def test_conv_transpose3d(xs, ws, kw, rng):
    c_out = ws[1] * kw.get("groups", 1)
    _run(
        rng,
        lambda x, w, b: ops.conv_transpose3d(x, w, b, **kw),
        lambda x, w, b: F.conv_transpose3d(x, w, b, **kw),
        [xs, ws, (c_out,)],
    )


# ---- pooling ------------------------------------------------------------------------------------


def test_max_pool3d_ceil_dilated_symbolic_depth(rng):
    kw = dict(kernel_size=3, stride=2, padding=1, dilation=(1, 2, 1), ceil_mode=True)
    _run(rng, lambda x: ops.max_pool3d(x, **kw), lambda x: F.max_pool3d(x, **kw), [("n", 3, "d", 10, 7)])


@pytest.mark.parametrize("include", [True, False])
def test_avg_pool3d(include, rng):
    kw = dict(kernel_size=(3, 2, 3), stride=(2, 1, 2), padding=(1, 1, 0), ceil_mode=True, count_include_pad=include)
    _run(rng, lambda x: ops.avg_pool3d(x, **kw), lambda x: F.avg_pool3d(x, **kw), [("n", 3, 9, 10, 7)])


def _dilated_avg(x, k, s, p, d, include):
    """Average pooling with dilation from first principles: each window's taps are summed and
    divided by the taps inside the input (or inside the padded input with include)."""
    n, c, h, w = x.shape
    xp = np.pad(x, [(0, 0), (0, 0), (p, p), (p, p)])
    inside = np.pad(np.ones((h, w)), p) if not include else np.ones((h + 2 * p, w + 2 * p))
    oh, ow = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            rows, cols = i * s + d * np.arange(k), j * s + d * np.arange(k)
            y[:, :, i, j] = xp[:, :, rows][:, :, :, cols].sum(axis=(2, 3)) / inside[np.ix_(rows, cols)].sum()
    return y


@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("h", [9, "h"])
def test_avg_pool2d_dilated_with_padding_beyond_half_the_kernel(include, h, rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 3, h, 10), "f32")
    g.output(ops.avg_pool2d(x, 3, stride=2, padding=3, dilation=2, count_include_pad=include))
    data = rand(rng, _concrete(("n", 3, h, 10)))
    np.testing.assert_allclose(
        rocmc.evaluate(g, data), _dilated_avg(data.astype(np.float64), 3, 2, 3, 2, include), rtol=1e-12
    )
    check(g, data)


@pytest.mark.parametrize("dtype", ["u8", "i32"])
def test_max_pool_of_integers(dtype, rng):
    kw = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)
    _run(rng, lambda x: ops.max_pool2d(x, **kw), None, [("n", 3, 9, 10)], dtype=dtype)
    _run(rng, lambda x: ops.max_pool3d(x, **kw), None, [("n", 2, 5, 6, 7)], dtype=dtype)


def test_pool_padding_limits():
    g = rocmc.Graph("t")
    x = g.input("x", (1, 2, 9, 9), "f32")
    with pytest.raises(rocmc.GraphError, match="max_pool2d.*half the kernel"):
        ops.max_pool2d(x, 3, padding=2)
    with pytest.raises(rocmc.GraphError, match="avg_pool2d.*dilated kernel's reach"):
        ops.avg_pool2d(x, 3, padding=3)
    with pytest.raises(rocmc.GraphError, match="max_pool3d.*rank 5"):
        ops.max_pool3d(x, 3)


# ---- instance and group norm --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_group_norm(dtype, rng):
    _run(
        rng,
        lambda x, w, b: ops.group_norm(x, 3, w, b, eps=1e-3),
        lambda x, w, b: F.group_norm(x, 3, w, b, eps=1e-3),
        [("n", 6, "h", 5), (6,), (6,)],
        dtype=dtype,
    )


def test_instance_norm_3d(rng):
    _run(
        rng,
        lambda x, w, b: ops.instance_norm(x, w, b),
        lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
        [("n", 4, 3, 5, 7), (4,), (4,)],
    )


def test_norm_argument_errors():
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 6, 5), "f32")
    with pytest.raises(rocmc.GraphError, match="group_norm: num_groups=4"):
        ops.group_norm(x, 4)
    with pytest.raises(rocmc.GraphError, match=r"instance_norm: 'weight' .* expected f32\[6\]"):
        ops.instance_norm(x, np.ones(5, np.float32))


# ---- resize / interpolate -----------------------------------------------------------------------

INTERPOLATE = [
    dict(scale_factor=2, mode="nearest"),
    dict(size=(7, 5), mode="nearest"),
    dict(size=(7, 5), mode="nearest-exact"),
    dict(size=(7, 13), mode="bilinear"),
    dict(size=(4, 3), mode="bilinear", align_corners=True),
    dict(scale_factor=(1.5, 0.5), mode="bilinear"),
    dict(size=(9, 7), mode="bicubic"),
    dict(size=(9, 7), mode="bicubic", align_corners=True),
    dict(size=(3, 4), mode="bilinear", antialias=True),
    dict(size=(3, 4), mode="bicubic", antialias=True),
]


INTERPOLATE_BATCH = _batch(
    lambda i: _graph(lambda x: ops.interpolate(x, **INTERPOLATE[i]), [("n", 3, 6, 9)]), INTERPOLATE
)


@pytest.mark.parametrize("kw", INTERPOLATE, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_interpolate_2d(kw, rng):
    batched = INTERPOLATE_BATCH(INTERPOLATE.index(kw))
    _run(rng, None, lambda x: F.interpolate(x, **kw), [("n", 3, 6, 9)], batched=batched)


def test_interpolate_trilinear(rng):
    kw = dict(size=(3, 7, 5), mode="trilinear")
    _run(rng, lambda x: ops.interpolate(x, **kw), lambda x: F.interpolate(x, **kw), [("n", 2, 4, 5, 3)])


def _resize_1d(x, out, taps):
    """A 1-D resize of the last dim of x from explicit (index, weight) lists per output position."""
    y = np.zeros(x.shape[:-1] + (out,))
    for o, pairs in enumerate(taps):
        for i, w in pairs:
            y[..., o] += w * x[..., min(max(i, 0), x.shape[-1] - 1)]
    return y


def test_resize_asymmetric_linear_matches_hand_computed_taps(rng):
    # x_orig = o / 1.5: taps floor(x), floor(x)+1 with weights 1-frac, frac.
    out = 7
    taps = [
        [
            (int(np.floor(o / 1.5)), 1 - (o / 1.5 - np.floor(o / 1.5))),
            (int(np.floor(o / 1.5)) + 1, o / 1.5 - np.floor(o / 1.5)),
        ]
        for o in range(out)
    ]
    _run(
        rng,
        lambda x: ops.resize(x, scales=[1.5], axes=[2], mode="linear", coordinate_transformation_mode="asymmetric"),
        lambda x: torch.tensor(_resize_1d(x.numpy(), out, taps)),
        [("n", 3, 5)],
    )


NEAREST_MODES = [
    # asymmetric: x_orig = o / scale; scale 2 puts ties at the half positions, 2.5 none.
    ("round_prefer_floor", 2.0, [0, 0, 1, 1, 2, 2, 3, 3]),
    ("round_prefer_ceil", 2.0, [0, 1, 1, 2, 2, 3, 3, 3]),
    ("floor", 2.5, [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]),
    ("ceil", 2.5, [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]),
]


def _nearest_graph(i):
    rounding, scale, _ = NEAREST_MODES[i]
    return _graph(
        lambda x: ops.resize(
            x,
            scales=[scale],
            axes=[2],
            mode="nearest",
            nearest_mode=rounding,
            coordinate_transformation_mode="asymmetric",
        ),
        [("n", 2, 4)],
    )


NEAREST_BATCH = _batch(_nearest_graph, NEAREST_MODES)


@pytest.mark.parametrize("rounding,scale,expect", NEAREST_MODES)
def test_resize_nearest_modes(rounding, scale, expect, rng):
    batched = NEAREST_BATCH(NEAREST_MODES.index((rounding, scale, expect)))
    _run(rng, None, lambda x: x[..., expect], [("n", 2, 4)], batched=batched)


def test_resize_tf_crop_and_resize_extrapolates(rng):
    g = _run(
        rng,
        lambda x: ops.resize(
            x,
            sizes=[5, 4],
            axes=[2, 3],
            mode="linear",
            roi=[0.4, -0.2, 1.2, 0.9],
            coordinate_transformation_mode="tf_crop_and_resize",
            extrapolation_value=10.0,
        ),
        None,
        [("n", 2, 6, 7)],
    )
    y = rocmc.evaluate(g, rand(rng, (2, 2, 6, 7)))
    assert (y[:, :, -1] == 10.0).all() and (y[:, :, :, 0] == 10.0).all()  # beyond the input's last row / first col
    assert (np.abs(y[:, :, :-1, 1:]) <= 2.0).all()


RESIZE_OPTIONS = [
    ("cubic", dict(exclude_outside=True, cubic_coeff_a=-0.5, coordinate_transformation_mode="half_pixel")),
    ("linear", dict(coordinate_transformation_mode="half_pixel_symmetric")),
    ("nearest", dict(coordinate_transformation_mode="pytorch_half_pixel", nearest_mode="round_prefer_ceil")),
    ("linear", dict(keep_aspect_ratio_policy="not_larger")),
    ("cubic", dict(keep_aspect_ratio_policy="not_smaller", antialias=True)),
]


def _resize_options_graph(i):
    mode, extra = RESIZE_OPTIONS[i]
    return _graph(lambda x: ops.resize(x, sizes=[4, 11], axes=[3, 2], mode=mode, **extra), [("n", 3, 7, 5)])


RESIZE_OPTIONS_BATCH = _batch(_resize_options_graph, RESIZE_OPTIONS)


@pytest.mark.parametrize("mode,extra", RESIZE_OPTIONS)
def test_resize_onnx_options_compile_like_the_reference(mode, extra, rng):
    batched = RESIZE_OPTIONS_BATCH(RESIZE_OPTIONS.index((mode, extra)))
    _run(rng, None, None, [("n", 3, 7, 5)], batched=batched)


def test_resize_nearest_keeps_integer_dtype(rng):
    _run(rng, lambda x: ops.resize(x, scales=[1.0, 1.0, 2.0, 0.5], mode="nearest"), None, [("n", 3, 5, 6)], dtype="i32")


def test_resize_errors():
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 3, "h", 6), "f32")
    with pytest.raises(rocmc.GraphError, match="dim 2 of 'x'.*symbolic"):
        ops.interpolate(x, scale_factor=2)
    with pytest.raises(rocmc.GraphError, match="antialias applies to linear and cubic"):
        ops.resize(x, scales=[2.0], axes=[3], antialias=True)
    with pytest.raises(rocmc.GraphError, match="'area' is not supported"):
        ops.interpolate(x, size=(3, 3), mode="area")
    with pytest.raises(rocmc.GraphError, match="exactly one of sizes and scales"):
        ops.resize(x, axes=[3])
    i = g.input("i", (2, 4), "i32")
    with pytest.raises(rocmc.GraphError, match="linear interpolation needs a float tensor"):
        ops.resize(i, sizes=[8], axes=[1], mode="linear")


# ---- GPU targets ----------------------------------------------------------------------------------


def test_gfx942_compiles_conv3d_resize_group_norm(rng):
    """conv3d and resize have no library or kernel implementation: the generated lowering is chosen
    on gfx942 (conv2d goes to MIOpen), inspect shows it, and the module compiles."""
    g = rocmc.Graph("spatial")
    x = g.input("x", ("n", 4, 5, 6, 7), "f16")
    y = ops.conv3d(x, rand(rng, (8, 4, 3, 3, 3), "f16"), padding=1)
    y = ops.group_norm(y, 2, rand(rng, (8,), "f16"), rand(rng, (8,), "f16"))
    y = ops.interpolate(y, scale_factor=2, mode="trilinear")
    z = ops.conv2d(ops.reshape(y, ("n", 8 * 10, 12, 14)), rand(rng, (4, 80, 3, 3), "f16"))
    g.output(z)
    art = rocmc.compile(g, "gfx942")
    chosen = {c["op"]: c["impl"] for c in art.implementations}
    assert chosen["conv3d"] == chosen["resize"] == "generated"
    assert chosen["conv2d"] == "dnn" and "layer_norm" in chosen  # group_norm runs as a layer norm
    text = format_description(describe(art))
    assert any("conv3d" in line and line.rstrip().endswith("generated") for line in text.splitlines())
