"""Convolution family against float64 references: conv1d/2d, transposed conv, pools, batch norm,
LRN and dropout (symbolic batch, odd sizes, groups, stride/dilation/asymmetric padding, half types)."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.lowering import registry
from rocmc.lowering.target import Target

from helpers import GPU_TARGETS, CpuBatch, check, compile_gpu, rand

N = 3  # value of the symbolic batch dim "n" at run time
SIZES = {"n": N, "h": 11, "w": 8, "l": 13}  # run-time values of symbolic dims


def _graph(dtype, *shapes):
    g = rocmc.Graph("t")
    return g, [g.input(f"in{i}", s, dtype) for i, s in enumerate(shapes)]


def _data(rng, dtype, *shapes):
    return [rand(rng, tuple(SIZES.get(d, d) for d in s), dtype) for s in shapes]


def _built(build, dtype, *shapes):
    g, xs = _graph(dtype, *shapes)
    g.output(build(*xs))
    return g


def _run(rng, build, dtype, *shapes):
    return check(_built(build, dtype, *shapes), *_data(rng, dtype, *shapes), impl="generated")


# A parametrized test's graphs are the functions of one module (helpers.CpuBatch): a compile a module, not a test.
# Keys in the order the tests run (the last parametrize decorator's values outermost).
def _batch(build, keys):
    return CpuBatch(build, keys, impl="generated")


# ---- convolution --------------------------------------------------------------------------------

CONV2D = [
    # x shape, weight shape, keyword arguments
    (("n", 5, 17, 19), (4, 5, 3, 3), dict(stride=2, padding=1)),
    (("n", 6, 9, 11), (4, 6, 3, 2), dict(stride=(2, 1), padding=((1, 0), (2, 1)), dilation=(1, 2))),
    (("n", 6, 9, 11), (4, 3, 3, 3), dict(padding=1, groups=2)),
    (("n", 4, 10, 7), (8, 1, 3, 3), dict(stride=(1, 2), padding=(1, 2), groups=4)),  # depthwise, multiplier 2
    (("n", 3, 8, 9), (5, 3, 4, 2), dict(padding="same", dilation=(2, 1))),
    (("n", 3, 6, 7), (2, 3, 1, 1), dict(padding="valid")),
]


def _conv2d_shapes(i, bias):
    xs, ws, _ = CONV2D[i]
    return (xs, ws, (ws[0],)) if bias else (xs, ws)


def _conv2d_graph(i, bias):
    kw = CONV2D[i][2]
    if bias:
        return _built(lambda x, w, b: ops.conv2d(x, w, b, **kw), "f32", *_conv2d_shapes(i, bias))
    return _built(lambda x, w: ops.conv2d(x, w, **kw), "f32", *_conv2d_shapes(i, bias))


CONV2D_BATCH = _batch(_conv2d_graph, [(i, bias) for i in range(len(CONV2D)) for bias in (True, False)])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs,ws,kw", CONV2D)
def test_conv2d(xs, ws, kw, bias, rng):
    i = CONV2D.index((xs, ws, kw))
    g, module = CONV2D_BATCH(i, bias)
    check(g, *_data(rng, "f32", *_conv2d_shapes(i, bias)), module=module)


CONV1D = [
    (("n", 5, 23), (4, 5, 3), dict(stride=2, padding=(1,), dilation=2)),
    (("n", 6, 13), (6, 2, 3), dict(stride=2, padding=((2, 0),), groups=3)),
    (("n", 3, 11), (2, 3, 4), dict(padding="same")),
]


def _conv1d_graph(i):
    xs, ws, kw = CONV1D[i]
    return _built(lambda x, w, b: ops.conv1d(x, w, b, **kw), "f32", xs, ws, (ws[0],))


CONV1D_BATCH = _batch(_conv1d_graph, [(i,) for i in range(len(CONV1D))])


@pytest.mark.parametrize("xs,ws,kw", CONV1D)
def test_conv1d(xs, ws, kw, rng):
    g, module = CONV1D_BATCH(CONV1D.index((xs, ws, kw)))
    check(g, *_data(rng, "f32", xs, ws, (ws[0],)), module=module)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_conv_half_accumulates_in_f32(dtype, rng):
    # 144 taps per output: with f16/bf16 accumulation this would miss the tolerance.
    _run(rng, lambda x, w, b: ops.conv2d(x, w, b, padding=1, groups=2), dtype, ("n", 32, 9, 7), (8, 16, 3, 3), (8,))
    _run(rng, lambda x, w: ops.conv1d(x, w, stride=2, groups=3), dtype, ("n", 6, 15), (9, 2, 3))


CONV_T2D = [
    (("n", 4, 5, 6), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    (
        ("n", 4, 5, 6),
        (4, 3, 3, 2),
        dict(stride=(2, 3), padding=(0, 2), output_padding=(1, 0), groups=2, dilation=(1, 2)),
    ),
    (("n", 3, 7, 4), (3, 2, 2, 3), dict(padding=((0, 1), (2, 0)))),
    (("n", 2, 5, 5), (2, 3, 3, 3), dict(stride=3, padding=3, output_padding=2)),  # padding > kernel reach: crops
]


def _conv_t2d_shapes(i):
    xs, ws, kw = CONV_T2D[i]
    return xs, ws, (ws[1] * kw.get("groups", 1),)


def _conv_t2d_graph(i):
    kw = CONV_T2D[i][2]
    return _built(lambda x, w, b: ops.conv_transpose2d(x, w, b, **kw), "f32", *_conv_t2d_shapes(i))


CONV_T2D_BATCH = _batch(_conv_t2d_graph, [(i,) for i in range(len(CONV_T2D))])


@pytest.mark.parametrize("xs,ws,kw", CONV_T2D)
def test_conv_transpose2d(xs, ws, kw, rng):
    i = CONV_T2D.index((xs, ws, kw))
    g, module = CONV_T2D_BATCH(i)
    check(g, *_data(rng, "f32", *_conv_t2d_shapes(i)), module=module)


def test_conv_transpose1d(rng):
    _run(
        rng,
        lambda x, w: ops.conv_transpose1d(x, w, stride=3, padding=4, output_padding=2, dilation=3),
        "f32",
        ("n", 4, 7),
        (4, 3, 3),
    )
    _run(rng, lambda x, w, b: ops.conv_transpose1d(x, w, b, stride=2, groups=2), "f32", ("n", 4, 9), (4, 3, 4), (6,))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_conv_transpose_half(dtype, rng):
    _run(
        rng,
        lambda x, w, b: ops.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2),
        dtype,
        ("n", 16, 5, 4),
        (16, 3, 3, 3),
        (6,),
    )


def test_symbolic_spatial_dims(rng):
    shapes = [("n", 4, "h", "w"), (6, 4, 3, 2), (4, 2, 3, 3), (4, 3, 3, 3), ("n", 6, "l"), (6, 2, 3), (6,), (4,)]
    g, (x, w, wg, wt, s, w1, c, m) = _graph("f32", *shapes)
    y = ops.conv2d(x, w, c, stride=(2, 1), padding=((1, 0), (2, 1)), dilation=(1, 2))
    assert y.shape == ("n", 6, "conv(h,3,2,1,0,1)", "conv(w,2,1,2,1,2)")
    g.output(
        y,
        ops.conv2d(x, wg, groups=2, padding="same"),
        ops.conv_transpose2d(x, wt, c, stride=(2, 3), padding=(3, 1), output_padding=(1, 2), groups=2),
        ops.conv1d(s, w1, groups=3, stride=2),
        ops.conv_transpose1d(s, w1, stride=2, padding=3),
        ops.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        ops.max_pool2d(x, (2, 3), dilation=(2, 1)),
        ops.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        ops.avg_pool2d(x, (3, 2), (2, 1), padding=((1, 0), (0, 1)), ceil_mode=True, count_include_pad=False),
        ops.batch_norm(x, m, ops.exp(m), m, m),
        ops.lrn(x, 3),
    )
    check(g, *_data(rng, "f32", *shapes), impl="generated")


def test_conv_lowers_to_named_linalg_ops():
    g, (x, w, wg, wt) = _graph("f32", ("n", 4, 9, 9), (4, 4, 3, 3), (4, 2, 3, 3), (4, 1, 2, 2))
    g.output(ops.conv2d(x, w, padding=1), ops.conv2d(x, wg, groups=2), ops.conv_transpose2d(x, wt, stride=2, groups=2))
    text = rocmc.compile(g, "cpu").ir("input")
    assert text.count("linalg.conv_2d_nchw_fchw") == 1
    assert text.count("linalg.conv_2d_ngchw_gfchw") == 2
    assert "tensor.pad" in text and "tensor.expand_shape" in text


# ---- pooling ------------------------------------------------------------------------------------

MAX_POOL = [
    (("n", 3, 17, 19), dict(kernel_size=3, stride=2, padding=1)),
    (("n", 3, 10, 11), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (("n", 2, 13, 8), dict(kernel_size=(3, 2), stride=(2, 1), padding=((1, 0), (1, 1)), dilation=(2, 1))),
    (("n", 2, 9, 7), dict(kernel_size=2, ceil_mode=True)),
]


def _max_pool_graph(i):
    xs, kw = MAX_POOL[i]
    return _built(lambda x: ops.max_pool2d(x, **kw), "f32", xs)


MAX_POOL_BATCH = _batch(_max_pool_graph, [(i,) for i in range(len(MAX_POOL))])


@pytest.mark.parametrize("xs,kw", MAX_POOL)
def test_max_pool2d(xs, kw, rng):
    g, module = MAX_POOL_BATCH(MAX_POOL.index((xs, kw)))
    check(g, *_data(rng, "f32", xs), module=module)


AVG_POOL_SHAPES = (("n", 3, 10, 13), ("n", 2, 7, 8))


def _avg_pool_graph(count_include_pad, ceil_mode, which):
    if which == 0:
        return _built(
            lambda x: ops.avg_pool2d(x, 3, 2, padding=1, ceil_mode=ceil_mode, count_include_pad=count_include_pad),
            "f32",
            AVG_POOL_SHAPES[0],
        )
    return _built(
        lambda x: ops.avg_pool2d(
            x, (3, 2), (1, 2), padding=((1, 0), (0, 1)), ceil_mode=ceil_mode, count_include_pad=count_include_pad
        ),
        "f32",
        AVG_POOL_SHAPES[1],
    )


AVG_POOL_BATCH = _batch(_avg_pool_graph, [(c, m, w) for c in (True, False) for m in (False, True) for w in (0, 1)])


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d(count_include_pad, ceil_mode, rng):
    for which, shape in enumerate(AVG_POOL_SHAPES):
        g, module = AVG_POOL_BATCH(count_include_pad, ceil_mode, which)
        check(g, *_data(rng, "f32", shape), module=module)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_pools_half(dtype, rng):
    g, (x,) = _graph(dtype, ("n", 4, 11, 9))
    g.output(
        ops.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        ops.avg_pool2d(x, 5, 2, padding=2, ceil_mode=True, count_include_pad=False),
    )
    check(g, *_data(rng, dtype, ("n", 4, 11, 9)), impl="generated")


def test_avg_pool_divisor_at_edges():
    # All ones: each output is (elements inside) / divisor. With ceil_mode the last window starts at
    # 3 and reaches the padded end (5): 1 element inside, a divisor of 2 along that dim.
    g, (x,) = _graph("f32", (1, 1, 4, 4))
    g.output(
        ops.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        ops.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
    )
    inc, exc = check(g, np.ones((1, 1, 4, 4), np.float32), impl="generated")
    np.testing.assert_allclose(inc[0, 0], np.outer([2 / 3, 1, 1 / 2], [2 / 3, 1, 1 / 2]), rtol=1e-6)
    np.testing.assert_allclose(exc, np.ones((1, 1, 3, 3)), rtol=1e-6)


# ceil_mode keeps a last partial window only if it starts inside the input or the low padding
# (torch's and ONNX's rule): (size, kernel, stride, padding, output size in ceil mode).
CEIL_LAST_WINDOW = [
    (2, 3, 3, 1, 1),  # a second window would start at 3 = size + padding: dropped
    (5, 2, 2, 1, 3),  # a fourth window would start at 6 = size + padding: dropped
    (4, 3, 2, 1, 3),  # the third starts at 4 < 5: kept, half in the padding
    (6, 3, 2, 0, 3),  # the third starts at 4 and overhangs the input by one: kept
]


@pytest.mark.parametrize("size,k,s,p,n_out", CEIL_LAST_WINDOW)
def test_pool_ceil_mode_last_window(size, k, s, p, n_out, rng):
    g, (x,) = _graph("f32", ("n", 2, size, size + 1))
    pools = [
        ops.max_pool2d(x, k, s, p, ceil_mode=True),
        ops.avg_pool2d(x, k, s, p, ceil_mode=True),
        ops.avg_pool2d(x, k, s, p, ceil_mode=True, count_include_pad=False),
    ]
    for y in pools:
        assert y.shape[2] == n_out
    g.output(*pools)
    a = rand(rng, (3, 2, size, size + 1))
    for y in check(g, a, impl="generated"):
        assert y.shape[2] == n_out


def test_avg_pool_ceil_last_window_starts_on_pad(rng):
    # One 3x3 window over a 2x2 input padded by 1: its sum over a divisor of 9 (the padding counts).
    # A second window would start on the padding and is dropped, so the output is 1x1.
    a = rand(rng, (1, 3, 2, 2))
    for shape in [(1, 3, 2, 2), ("n", 3, "h", "w")]:
        g, (x,) = _graph("f32", shape)
        g.output(ops.avg_pool2d(x, 3, 3, 1, ceil_mode=True), ops.max_pool2d(x, 3, 3, 1, ceil_mode=True))
        avg, top = check(g, a, impl="generated")
        np.testing.assert_allclose(avg, a.sum(axis=(2, 3), keepdims=True) / 9, rtol=1e-5)
        np.testing.assert_array_equal(top, a.max(axis=(2, 3), keepdims=True))


def _single_window(x):
    # A single window per output that leaves trailing input elements unread (4 = 3 + 1, stride 3).
    return [
        ops.max_pool2d(x, 3, 3),
        ops.avg_pool2d(x, 3, 3, count_include_pad=False),
        ops.avg_pool2d(x, (3, 2), (3, 3), padding=((1, 0), (0, 1))),
    ]


def test_single_window_pool_and_conv_with_unread_tail(rng):
    g, (x, w, s, w1) = _graph("f32", (2, 3, 4, 4), (5, 3, 3, 3), (2, 3, 4), (5, 3, 3))
    g.output(
        *_single_window(x),
        ops.conv2d(x, w, stride=3),
        ops.conv1d(s, w1, stride=3),
        ops.conv2d(x, w, stride=(3, 1), padding=((0, 0), (1, 1))),
    )
    got = check(g, *_data(rng, "f32", (2, 3, 4, 4), (5, 3, 3, 3), (2, 3, 4), (5, 3, 3)), impl="generated")
    assert [y.shape for y in got[:4]] == [(2, 3, 1, 1), (2, 3, 1, 1), (2, 3, 1, 2), (2, 5, 1, 1)]


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_single_window_and_ceil_pools_compile_for_gpu(dtype):
    g, (x, y, w) = _graph(dtype, (2, 3, 4, 4), (1, 3, 2, 2), (5, 3, 3, 3))
    g.output(
        *_single_window(x),
        ops.avg_pool2d(y, 3, 3, 1, ceil_mode=True),
        ops.max_pool2d(y, 3, 3, 1, ceil_mode=True),
        ops.conv2d(x, w, stride=3),
    )
    compile_gpu(g, impl="generated")


# ---- normalization and dropout ------------------------------------------------------------------


BATCH_NORM = [(("n", 5, 7, 3), True, 1e-5), (("n", 6, 9), False, 0.1), (("n", 3), True, 1e-3)]


def _batch_norm_graph(dtype, shape, affine, eps):
    c = shape[1]
    g, (x, mean, var, w, b) = _graph(dtype, shape, (c,), (c,), (c,), (c,))
    g.output(ops.batch_norm(x, mean, var, w if affine else None, b if affine else None, eps=eps))
    return g


BATCH_NORM_BATCH = _batch(_batch_norm_graph, [(d, *case) for case in BATCH_NORM for d in ("f32", "f16", "bf16")])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,affine,eps", BATCH_NORM)
def test_batch_norm(dtype, shape, affine, eps, rng):
    c = shape[1]
    g, module = BATCH_NORM_BATCH(dtype, shape, affine, eps)
    xv, m, wv, bv = _data(rng, dtype, shape, (c,), (c,), (c,))
    check(g, xv, m, rand(rng, (c,), dtype, 0.2, 3.0), wv, bv, module=module)


LRN = [(("n", 7, 5, 3), 3), (("n", 9, 4), 4), (("n", 2, 3, 3), 5)]


def _lrn_graph(dtype, shape, size):
    return _built(lambda x: ops.local_response_norm(x, size, alpha=0.3, beta=0.6, k=1.5), dtype, shape)


LRN_BATCH = _batch(_lrn_graph, [(d, *case) for case in LRN for d in ("f32", "f16", "bf16")])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,size", LRN)
def test_local_response_norm(dtype, shape, size, rng):
    g, module = LRN_BATCH(dtype, shape, size)
    check(g, *_data(rng, dtype, shape), module=module)


def test_lrn_alias_and_defaults(rng):
    g, (x,) = _graph("f32", (1, 4, 3))
    y = ops.lrn(x, 2)
    assert g.nodes[-1].op == "lrn" and g.nodes[-1].attrs == {"size": 2, "alpha": 1e-4, "beta": 0.75, "k": 1.0}
    g.output(y)
    check(g, rand(rng, (1, 4, 3)), impl="generated")


def test_dropout_is_identity_at_inference(rng):
    g, (x,) = _graph("f16", ("n", 4, 5))
    y = ops.dropout(x, 0.25)
    g.output(ops.relu(y))
    assert g.nodes[0].op == "dropout" and g.nodes[0].attrs == {"p": 0.25}
    check(g, *_data(rng, "f16", ("n", 4, 5)), impl="generated")


# ---- normalized attributes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "padding,want",
    [
        (2, [[2, 2], [2, 2]]),
        ((1, 0), [[1, 1], [0, 0]]),
        (((0, 1), (2, 3)), [[0, 1], [2, 3]]),
        ("valid", [[0, 0], [0, 0]]),
        ("same", [[1, 2], [0, 0]]),
    ],
)
def test_conv_attributes_are_normalized(padding, want):
    g, (x, w) = _graph("f32", ("n", 2, 9, 9), (3, 2, 4, 1))
    ops.conv2d(x, w, padding=padding, dilation=(1, 2))
    assert g.nodes[-1].attrs == {"stride": [1, 1], "padding": want, "dilation": [1, 2], "groups": 1}


def test_pool_and_transpose_attributes_are_normalized():
    g, (x, w) = _graph("f32", ("n", 2, 9, 9), (2, 3, 2, 2))
    ops.max_pool2d(x, (3, 2))
    assert g.nodes[-1].attrs == {
        "kernel_size": [3, 2],
        "stride": [3, 2],
        "padding": [[0, 0], [0, 0]],
        "ceil_mode": False,
        "dilation": [1, 1],
    }
    y = ops.avg_pool2d(x, 3, 1, padding=(1, 0), count_include_pad=False)
    assert g.nodes[-1].attrs == {
        "kernel_size": [3, 3],
        "stride": [1, 1],
        "padding": [[1, 1], [0, 0]],
        "dilation": [1, 1],
        "ceil_mode": False,
        "count_include_pad": False,
    }
    assert y.shape == ("n", 2, 9, 7)
    y = ops.conv_transpose2d(x, w, stride=2, padding=((1, 0), (0, 0)), output_padding=(1, 0))
    assert g.nodes[-1].attrs == {
        "stride": [2, 2],
        "padding": [[1, 0], [0, 0]],
        "output_padding": [1, 0],
        "groups": 1,
        "dilation": [1, 1],
    }
    assert y.shape == ("n", 3, 18, 18)


# ---- GPU targets (compile-only: no GPU on this machine) ------------------------------------------


@pytest.mark.parametrize(
    "dtype,image,seq,t_stride",
    [
        ("f32", ("n", 8, 17, 19), ("n", 6, 21), 2),
        ("f16", ("n", 8, 17, 19), ("n", 6, 21), 2),
        ("f16", ("n", 8, "h", "w"), ("n", 6, "l"), 1),
    ],
)
def test_compile_gpu(dtype, image, seq, t_stride):
    g, (x, w, wg, wt, c, s, w1, wt1) = _graph(
        dtype, image, (4, 8, 3, 3), (8, 2, 3, 3), (8, 2, 3, 3), (8,), seq, (6, 2, 3), (6, 2, 4)
    )
    g.output(
        ops.conv2d(x, w, padding=((1, 0), (1, 2)), stride=2),
        ops.conv2d(x, wg, c, groups=4, dilation=2),
        ops.conv_transpose2d(x, wt, stride=t_stride, padding=1, output_padding=t_stride - 1, groups=2),
        ops.conv1d(s, w1, groups=3, stride=2),
        ops.conv_transpose1d(s, wt1, stride=t_stride, groups=3),
        ops.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        ops.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        ops.batch_norm(x, c, ops.abs(c), c, c),
        ops.lrn(x, 3),
        ops.dropout(x, 0.1),
    )
    compile_gpu(g, impl="generated")


def test_strided_half_transposed_conv_with_symbolic_sizes_is_cpu_only(rng):
    # IREE 3.13's GPU codegen fails on it; the registry says so instead of a compiler crash.
    g, (x, w) = _graph("bf16", ("n", 8, "h", "w"), (8, 2, 3, 3))
    g.output(ops.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1))
    generated = registry.REGISTRY["conv_transpose2d"]["generated"]
    for target in GPU_TARGETS:
        assert "symbolic spatial dims" in generated.supports(g.nodes[-1], Target.parse(target))
    check(g, *_data(rng, "bf16", ("n", 8, "h", "w"), (8, 2, 3, 3)), impl="generated")


# ---- bad input ----------------------------------------------------------------------------------


def _err(fn, *match):
    with pytest.raises(rocmc.GraphError) as e:
        fn()
    for m in match:
        assert m in str(e.value), str(e.value)


def test_conv_bad_inputs():
    g, (x, w, w1, wt, b) = _graph("f32", ("n", 6, 5, 5), (4, 3, 3, 3), (4, 5, 3), (6, 2, 3, 3), (5,))
    _err(lambda: ops.conv2d(x, w), "conv2d(", "6 channels", "weight dim 1 * groups")
    _err(lambda: ops.conv2d(x, w, groups=4), "not divisible by groups=4")
    _err(lambda: ops.conv2d(x, ops.cast(w, "f16"), groups=2), "'weight' has dtype f16")
    _err(lambda: ops.conv2d(x, w, b, groups=2), "'bias' has shape [5], expected [4]")
    _err(lambda: ops.conv2d(x, w, groups=2, dilation=3), "larger than the padded input", "(5)")
    _err(lambda: ops.conv2d(x, w, padding="full", groups=2), "padding='full'", "'valid', 'same'")
    _err(lambda: ops.conv2d(x, w, padding="same", stride=2, groups=2), "needs stride 1")
    _err(lambda: ops.conv2d(x, w, padding=(1, 2, 3), groups=2), "padding=(1, 2, 3)")
    _err(lambda: ops.conv2d(x, w, stride=0, groups=2), "stride=0", "int >= 1")
    _err(lambda: ops.conv1d(x, w1), "'x' has rank 4", "expected rank 3")
    _err(lambda: ops.conv2d(x, w, groups=2, padding=-1), "padding=-1")
    _err(lambda: ops.conv_transpose2d(x, wt, padding="same"), "padding='same'")
    _err(lambda: ops.conv_transpose2d(x, wt, stride=2, output_padding=2), "output_padding=[2, 2]", "smaller than")
    _err(lambda: ops.conv_transpose2d(x, wt, groups=4), "not divisible by groups=4")
    _err(lambda: ops.conv_transpose2d(x, w), "weight dim 0 (4) = C_in")
    g2, (xs, ws) = _graph("f32", ("n", "c", 5, 5), (2, 2, 1, 1))
    _err(lambda: ops.conv2d(xs, ws), "the channel dim (1) must be static")


def test_pool_norm_dropout_bad_inputs():
    g, (x, v) = _graph("f32", ("n", 3, 4, 4), (4,))
    _err(lambda: ops.max_pool2d(x, 3, padding=2), "max_pool2d(", "at most half the kernel")
    _err(lambda: ops.max_pool2d(x, 5), "larger than the padded input")
    _err(lambda: ops.avg_pool2d(x, 2, padding="same"), "padding='same'", "'valid'")
    _err(lambda: ops.avg_pool2d(x, (2, 2, 2)), "kernel_size=(2, 2, 2)")
    _err(lambda: ops.avg_pool2d(x, 2, count_include_pad=1), "count_include_pad=1")
    _err(lambda: ops.batch_norm(x, v, v), "'running_mean'", "shape [3]")
    _err(lambda: ops.local_response_norm(x, 0), "size=0")
    _err(lambda: ops.dropout(x, 0.5, training=True), "dropout", "training=True")
    _err(lambda: ops.dropout(x, 1.0), "p=1.0", "[0, 1)")
    _err(lambda: ops.conv2d(x, x, bogus=1), "conv2d", "bogus")
