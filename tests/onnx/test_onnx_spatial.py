"""ONNX spatial converters (Conv/ConvTranspose/pools in 3-D, InstanceNormalization,
GroupNormalization-18/21, Resize-10..19, Upsample): small hand-built models, imported, compiled for
the CPU and compared with onnx.reference.ReferenceEvaluator on random inputs."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import rocmc  # noqa: E402

from helpers import CpuBatch, rand  # noqa: E402

FLOAT = TensorProto.FLOAT


def _model(node, inputs, inits=(), opset=19, extra_nodes=()):
    """One node (plus helper nodes before it) over float inputs {name: shape}; output 'y'."""
    graph = helper.make_graph(
        list(extra_nodes) + [node],
        "m",
        [helper.make_tensor_value_info(k, FLOAT, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info("y", FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _compare(m, feeds, rtol=1e-4, atol=1e-5, batched=None):
    """Import, compile for the CPU (or take the model's graph and compiled function from a CpuBatch: `batched`),
    run, and compare with ONNX's reference evaluator."""
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    graph, module = batched if batched is not None else (rocmc.import_onnx(m), None)
    got = (module or rocmc.load(rocmc.compile(graph, "cpu")))(**feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return graph


# ---- convolution and pooling ----------------------------------------------------------------------


def test_conv_3d_grouped_strided_with_symbolic_batch(rng):
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], pads=[1, 0, 2, 0, 1, 1], strides=[2, 1, 1], dilations=[1, 2, 1], group=2
    )
    w, b = rand(rng, (6, 2, 3, 3, 2)), rand(rng, (6,))
    m = _model(node, {"x": ["N", 4, 7, 9, 6]}, {"w": w, "b": b})
    g = _compare(m, {"x": rand(rng, (3, 4, 7, 9, 6))})
    assert g.inputs[0].shape[0] == "N" and [n.op for n in g.nodes if n.op != "constant"] == ["conv3d"]


def test_conv_transpose_3d_asymmetric_pads(rng):
    node = helper.make_node(
        "ConvTranspose", ["x", "w"], ["y"], strides=[2, 1, 2], pads=[1, 0, 1, 0, 2, 1], output_padding=[1, 0, 1]
    )
    m = _model(node, {"x": [1, 2, 3, 4, 4]}, {"w": rand(rng, (2, 3, 3, 3, 3))})
    _compare(m, {"x": rand(rng, (1, 2, 3, 4, 4))})


def _imported(cases, model_of):
    """A CpuBatch of the models of a parametrized test's cases (model_of(*case)), imported: the functions of one
    module, a compile a module, not a test."""
    return CpuBatch(lambda i: rocmc.import_onnx(model_of(*cases[i])), [(i,) for i in range(len(cases))])


POOLS_3D = [
    (
        "MaxPool",
        dict(kernel_shape=[3, 2, 3], strides=[2, 1, 2], pads=[1, 0, 1, 1, 1, 0], ceil_mode=1, dilations=[1, 2, 1]),
    ),
    (
        "AveragePool",
        dict(kernel_shape=[3, 3, 2], strides=[2, 2, 1], pads=[1, 1, 0, 1, 0, 1], ceil_mode=1, count_include_pad=0),
    ),
    ("AveragePool", dict(kernel_shape=[2, 3, 3], pads=[1, 1, 1, 1, 1, 1], count_include_pad=1)),
]


def _pool_3d_model(op, attrs):
    return _model(helper.make_node(op, ["x"], ["y"], **attrs), {"x": [2, 3, 7, 6, 9]})


POOL_3D_BATCH = _imported(POOLS_3D, _pool_3d_model)


@pytest.mark.parametrize("op,attrs", POOLS_3D)
def test_pool_3d(op, attrs, rng):
    batched = POOL_3D_BATCH(POOLS_3D.index((op, attrs)))
    _compare(_pool_3d_model(op, attrs), {"x": rand(rng, (2, 3, 7, 6, 9))}, batched=batched)


@pytest.mark.parametrize("include", [0, 1])
def test_average_pool_dilated_with_pads_beyond_half_the_kernel(include, rng):
    node = helper.make_node(
        "AveragePool",
        ["x"],
        ["y"],
        kernel_shape=[3, 3],
        dilations=[2, 2],
        pads=[3, 2, 3, 4],
        strides=[1, 2],
        count_include_pad=include,
    )
    m = _model(node, {"x": [2, 3, 9, 10]})
    _compare(m, {"x": rand(rng, (2, 3, 9, 10))})


def test_average_pool_padding_beyond_the_kernel_is_refused():
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[3, 3, 3, 3], count_include_pad=0)
    with pytest.raises(rocmc.ModelImportError, match=r"reach beyond the dilated kernel .* count_include_pad=0"):
        rocmc.import_onnx(_model(node, {"x": [1, 1, 5, 5]}))


# ---- normalization --------------------------------------------------------------------------------


def test_instance_normalization_3d(rng):
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)
    m = _model(node, {"x": [2, 4, 3, 5, 6]}, {"s": rand(rng, (4,)), "b": rand(rng, (4,))})
    _compare(m, {"x": rand(rng, (2, 4, 3, 5, 6))})


@pytest.mark.parametrize("opset,params", [(18, 3), (21, 6)])
def test_group_normalization_scale_per_group_then_per_channel(opset, params, rng):
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-4)
    m = _model(node, {"x": [2, 6, 5, 7]}, {"s": rand(rng, (params,)), "b": rand(rng, (params,))}, opset=opset)
    _compare(m, {"x": rand(rng, (2, 6, 5, 7))})


# ---- resize and upsample --------------------------------------------------------------------------

EMPTY = np.zeros(0, np.float32)


RESIZES_11 = [
    (dict(mode="nearest"), [1, 1, 2.5, 1.5], None),
    (dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="ceil"), None, [2, 3, 11, 4]),
    (dict(mode="linear", coordinate_transformation_mode="align_corners"), None, [2, 3, 4, 9]),
    (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), [1, 1, 0.6, 1.7], None),
    (dict(mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5), None, [2, 3, 9, 3]),
    (dict(mode="cubic", coordinate_transformation_mode="asymmetric"), [1, 1, 1.3, 2.0], None),
]


def _resize_11_model(attrs, scales, sizes):
    inits = {"roi": EMPTY, "scales": np.asarray(scales, np.float32) if scales else EMPTY}
    if sizes:
        inits["sizes"] = np.asarray(sizes, np.int64)
    node = helper.make_node("Resize", ["x", "roi", "scales"] + (["sizes"] if sizes else []), ["y"], **attrs)
    return _model(node, {"x": [2, 3, 5, 7]}, inits, opset=13)


RESIZE_11_BATCH = _imported(RESIZES_11, _resize_11_model)


@pytest.mark.parametrize("attrs,scales,sizes", RESIZES_11)
def test_resize_11(attrs, scales, sizes, rng):
    batched = RESIZE_11_BATCH(RESIZES_11.index((attrs, scales, sizes)))
    _compare(_resize_11_model(attrs, scales, sizes), {"x": rand(rng, (2, 3, 5, 7))}, batched=batched)


RESIZES_19 = [
    (dict(mode="linear", axes=[3, 2], keep_aspect_ratio_policy="not_larger"), [4, 12]),
    (dict(mode="linear", axes=[2, 3], coordinate_transformation_mode="half_pixel_symmetric"), [8, 3]),
    (dict(mode="cubic", axes=[2, 3], antialias=1), [3, 4]),
    (dict(mode="nearest", axes=[2], keep_aspect_ratio_policy="not_smaller"), [9]),
]


def _resize_19_model(attrs, sizes):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)
    return _model(node, {"x": [1, 2, 6, 7]}, {"sizes": np.asarray(sizes, np.int64)}, opset=19)


RESIZE_19_BATCH = _imported(RESIZES_19, _resize_19_model)


@pytest.mark.parametrize("attrs,sizes", RESIZES_19)
def test_resize_19_axes_policy_antialias(attrs, sizes, rng):
    batched = RESIZE_19_BATCH(RESIZES_19.index((attrs, sizes)))
    _compare(_resize_19_model(attrs, sizes), {"x": rand(rng, (1, 2, 6, 7))}, batched=batched)


def test_resize_tf_crop_and_resize_with_extrapolation(rng):
    node = helper.make_node(
        "Resize",
        ["x", "roi", "", "sizes"],
        ["y"],
        mode="linear",
        axes=[2, 3],
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=7.5,
    )
    inits = {"roi": np.asarray([0.4, -0.2, 1.2, 0.9], np.float32), "sizes": np.asarray([5, 6], np.int64)}
    m = _model(node, {"x": [2, 3, 6, 7]}, inits, opset=18)
    _compare(m, {"x": rand(rng, (2, 3, 6, 7))})


def test_resize_trilinear_with_symbolic_batch_from_shape(rng):
    # sizes = Concat(Shape(x)[:2], [6, 8, 4]): the batch entry is the symbol itself.
    extra = [
        helper.make_node("Shape", ["x"], ["s"], end=2),
        helper.make_node("Concat", ["s", "tail"], ["sizes"], axis=0),
    ]
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear")
    m = _model(node, {"x": ["N", 2, 3, 5, 4]}, {"tail": np.asarray([6, 8, 4], np.int64)}, opset=18, extra_nodes=extra)
    g = _compare(m, {"x": rand(rng, (3, 2, 3, 5, 4))})
    assert g.outputs[0].shape == ("N", 2, 6, 8, 4)


def test_resize_10_and_upsample_9_are_asymmetric_nearest(rng):
    scales = {"scales": np.asarray([1, 1, 2, 3], np.float32)}
    x = {"x": rand(rng, (2, 3, 4, 5))}
    upsample = _model(
        helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest"), {"x": [2, 3, 4, 5]}, scales, opset=9
    )
    _compare(upsample, x)
    # ONNX's reference evaluator reads Resize-10's second input as roi: compare with Upsample's result.
    resize = _model(
        helper.make_node("Resize", ["x", "scales"], ["y"], mode="nearest"), {"x": [2, 3, 4, 5]}, scales, opset=10
    )
    got = rocmc.load(rocmc.compile(rocmc.import_onnx(resize), "cpu"))(**x)
    np.testing.assert_array_equal(got, ReferenceEvaluator(upsample).run(None, x)[0])


def test_upsample_7_linear_is_asymmetric(rng):
    m = _model(
        helper.make_node("Upsample", ["x"], ["y"], mode="linear", scales=[1.0, 1.0, 2.0, 1.5]),
        {"x": [1, 2, 3, 4]},
        opset=7,
    )
    x = rand(rng, (1, 2, 3, 4))
    got = rocmc.load(rocmc.compile(rocmc.import_onnx(m), "cpu"))(x)
    # The same resize in Resize-13's spelling, which ONNX's reference evaluator runs.
    same = _model(
        helper.make_node(
            "Resize", ["x", "", "scales"], ["y"], mode="linear", coordinate_transformation_mode="asymmetric"
        ),
        {"x": [1, 2, 3, 4]},
        {"scales": np.asarray([1, 1, 2, 1.5], np.float32)},
        opset=13,
    )
    np.testing.assert_allclose(got, ReferenceEvaluator(same).run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_resize_needs_scales_known_at_import():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    graph = helper.make_graph(
        [node],
        "m",
        [helper.make_tensor_value_info("x", FLOAT, [1, 1, 2, 2]), helper.make_tensor_value_info("scales", FLOAT, [4])],
        [helper.make_tensor_value_info("y", FLOAT, None)],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(rocmc.ModelImportError, match="scales.*must be known at import time"):
        rocmc.import_onnx(m)
