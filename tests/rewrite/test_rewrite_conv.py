"""CNN rewrites: batch norm folded into the conv before it (conv_bn), and the residual add and relu after a
2-D conv fused into it (conv_epilogue -> fused_conv2d). A ResNet basic block compiled with and without the
rewrites gives the float64 reference's results, with constant weights, with graph parameters (the folding is
then graph ops that IREE hoists into the module's initializer) and as exported from torch to ONNX; a conv
whose result is read elsewhere is left as it is."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.rewrite import rewrite

from helpers import TOL, compile_gpu, rand

N, CIN, H, W = 3, 6, 9, 11  # run-time batch of the symbolic dim "n"; odd spatial sizes


def _conv_weight(rng, cout, cin, k, dtype):
    return (rng.uniform(-1, 1, (cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(rocmc.dtype(dtype).np)


def _bn_arrays(rng, c, dtype):
    """Running mean, running variance (positive), weight, bias."""
    np_t = rocmc.dtype(dtype).np
    return [
        rng.uniform(-0.5, 0.5, c).astype(np_t),
        rng.uniform(0.5, 2.0, c).astype(np_t),
        rng.uniform(-1.5, 1.5, c).astype(np_t),
        rng.uniform(-0.5, 0.5, c).astype(np_t),
    ]


class Leaves:
    """Weights as graph constants, or as graph parameters whose arrays come at load time."""

    def __init__(self, g, as_parameters: bool):
        self.g, self.as_parameters, self.arrays = g, as_parameters, {}

    def __call__(self, name, array):
        if not self.as_parameters:
            return self.g.constant(name.replace(".", "_"), array)
        self.arrays[name] = array
        return self.g.parameter(name, array.shape, rocmc.dtype(array.dtype).name)


def _block(rng, dtype="f32", groups=1, cout=10, as_parameters=False):
    """ResNet's basic block with a downsampling shortcut: relu(bn2(conv2(relu(bn1(conv1(x))))) + bn(conv(x)))."""
    g = rocmc.Graph("block")
    leaf = Leaves(g, as_parameters)
    x = g.input("x", ("n", CIN, H, W), dtype)

    def conv_bn(name, v, cin, k, stride, padding, groups=1, bias=False):
        w = leaf(f"{name}.weight", _conv_weight(rng, cout, cin // groups, k, dtype))
        b = leaf(f"{name}.bias", rng.uniform(-0.5, 0.5, cout).astype(rocmc.dtype(dtype).np)) if bias else None
        y = ops.conv2d(v, w, b, stride=stride, padding=padding, groups=groups)
        stats = [
            leaf(f"{name}.bn.{k}", a) for k, a in zip(("mean", "var", "weight", "bias"), _bn_arrays(rng, cout, dtype))
        ]
        return ops.batch_norm(y, *stats, eps=1e-5)

    h = ops.relu(conv_bn("conv1", x, CIN, 3, 2, 1, groups=groups))
    main = conv_bn("conv2", h, cout, 3, 1, 1, bias=True)
    g.output(ops.relu(main + conv_bn("down", x, CIN, 1, 2, 0)))
    return g, leaf.arrays


def _compare(got, want, dtype):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)


def _records(art):
    return [(r["pattern"], r["op"], [op for _, op in r["replaced"]]) for r in art.metadata["rewrites"]]


BLOCK_REWRITES = [
    ("conv_epilogue", "fused_conv2d", ["conv2d", "batch_norm", "relu"]),
    ("conv_bn", "conv2d", ["conv2d", "batch_norm"]),
    ("conv_epilogue", "fused_conv2d", ["conv2d", "batch_norm", "add", "relu"]),
]


@pytest.mark.parametrize("dtype,groups", [("f32", 1), ("f32", 2), ("f16", 1)])
def test_resnet_block_with_and_without_rewrites(dtype, groups, rng):
    g, _ = _block(rng, dtype, groups, cout=10 if groups == 2 else 7)
    xs = rand(rng, (N, CIN, H, W), dtype, -1.0, 1.0)
    want = rocmc.evaluate(g, xs)
    art = rocmc.compile(g, "cpu")
    assert _records(art) == BLOCK_REWRITES
    assert "rewrite: fused_conv2d" in art.summary() and "rewrite: conv2d" in art.summary()
    compiled = art.ir("rewrite")
    assert "batch_norm(" not in compiled and "relu(" not in compiled and "add(" not in compiled
    _compare(rocmc.load(art)(xs), want, dtype)
    _compare(rocmc.load(rocmc.compile(g, "cpu", rewrite=False))(xs), want, dtype)


def test_folded_constants_are_new_and_the_old_ones_dropped(rng):
    g, _ = _block(rng)
    g2, _ = rewrite(g)
    # Every weight was folded at compile time: the rewritten graph holds only the folded constants.
    assert sorted(g2.constants) == [f"rewrite_c{i}" for i in range(6)]
    assert [n.op for n in g2.nodes if n.op != "constant"] == ["fused_conv2d", "conv2d", "fused_conv2d"]


def test_parameters_fold_as_graph_ops_hoisted_to_the_initializer(rng):
    seed = int(rng.integers(1 << 31))
    g, arrays = _block(np.random.default_rng(seed), as_parameters=True)
    same, _ = _block(np.random.default_rng(seed))  # the same weights, as constants
    xs = rand(rng, (N, CIN, H, W), "f32", -1.0, 1.0)
    art = rocmc.compile(g, "cpu")
    assert _records(art) == BLOCK_REWRITES
    got = rocmc.load(art, parameters=arrays)(xs)
    _compare(got, rocmc.evaluate(g, xs, parameters=arrays), "f32")
    np.testing.assert_allclose(got, rocmc.load(rocmc.compile(same, "cpu"))(xs), rtol=2e-5, atol=2e-5)
    # The module still reads the parameters by their names; the folding runs once, at load time.
    assert sorted(p["name"] for p in art.parameters) == sorted(arrays)
    main = [d for d in art.dispatches() if not d["name"].startswith("_initializer")]
    assert {op for d in main for op in d["ops"]} <= {"fused_conv2d", "conv2d"}
    assert any(d["name"].startswith("_initializer") for d in art.dispatches())


def test_external_constants_take_the_folded_weights(rng):
    g, _ = _block(rng, cout=24)
    xs = rand(rng, (N, CIN, H, W), "f32", -1.0, 1.0)
    art = rocmc.compile(g, "cpu", constants=2048)
    assert any(p["name"].startswith("rewrite_c") for p in art.parameters)
    _compare(rocmc.load(art)(xs), rocmc.evaluate(g, xs), "f32")


# ---- near misses -------------------------------------------------------------------------------


def _conv(g, rng, x, cout=4, **kw):
    return ops.conv2d(x, g.constant(None, _conv_weight(rng, cout, x.shape[1], 3, "f32")), padding=1, **kw)


def _ops_of(g):
    return [n.op for n in g.nodes if n.op not in ("constant", "parameter")]


def test_a_conv_read_elsewhere_is_not_fused(rng):
    g = rocmc.Graph()
    x = g.input("x", ("n", 3, 7, 5))
    y = _conv(g, rng, x)
    g.output(ops.relu(y), y * 2.0)  # the conv's result escapes through a second reader
    _, records = rewrite(g)
    assert records == []
    g = rocmc.Graph()
    x = g.input("x", ("n", 3, 7, 5))
    y = _conv(g, rng, x)
    g.output(ops.batch_norm(y, *(g.constant(None, a) for a in _bn_arrays(rng, 4, "f32"))), y)
    _, records = rewrite(g)
    assert records == []


def test_an_add_read_elsewhere_leaves_the_relu_out(rng):
    g = rocmc.Graph()
    x = g.input("x", ("n", 3, 7, 5))
    r = g.input("r", ("n", 4, 7, 5))
    s = _conv(g, rng, x) + r
    g.output(ops.relu(s), s)
    g2, records = rewrite(g)
    assert [r.pattern for r in records] == ["conv_epilogue"] and _ops_of(g2) == ["fused_conv2d", "relu"]
    node = next(n for n in g2.nodes if n.op == "fused_conv2d")
    assert node.attrs["activation"] == "none" and node.inputs[3] is g2.inputs[1]
    xs, rs = rand(rng, (2, 3, 7, 5)), rand(rng, (2, 4, 7, 5))
    for got, want in zip(rocmc.evaluate(g2, xs, rs), rocmc.evaluate(g, xs, rs)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_broadcast_residual_or_another_conv_is_not_an_epilogue(rng):
    g = rocmc.Graph()
    x = g.input("x", ("n", 3, 7, 5))
    g.output(ops.relu(_conv(g, rng, x) + g.constant(None, rand(rng, (1, 4, 1, 1)))))
    assert rewrite(g)[1] == []
    g = rocmc.Graph()
    x = g.input("x", ("n", 3, 7))
    w = g.constant(None, rand(rng, (4, 3, 3)))
    z, wt = g.input("z", (1, 3, 4, 4)), g.constant(None, rand(rng, (3, 2, 3, 3)))
    g.output(ops.relu(ops.conv1d(x, w, padding=1)), ops.relu(ops.conv_transpose2d(z, wt)))
    assert rewrite(g)[1] == []


def test_relu_spelled_as_maximum_and_residual_on_the_left(rng):
    g = rocmc.Graph()
    x = g.input("x", ("n", 3, 7, 5))
    r = g.input("r", ("n", 4, 4, 3))
    y = ops.maximum(r + _conv(g, rng, x, stride=2), g.constant(None, np.zeros((), np.float32)))
    g.output(y)
    g2, records = rewrite(g)
    assert [r.op for r in records] == ["fused_conv2d"] and _ops_of(g2) == ["fused_conv2d"]
    xs, rs = rand(rng, (2, 3, 7, 5)), rand(rng, (2, 4, 4, 3))
    np.testing.assert_allclose(rocmc.evaluate(g2, xs, rs), rocmc.evaluate(g, xs, rs), rtol=1e-12)


def test_conv1d_batch_norm_folds(rng):
    g = rocmc.Graph()
    x = g.input("x", ("n", 3, 13))
    y = ops.conv1d(x, g.constant(None, rand(rng, (5, 3, 3))), g.constant(None, rand(rng, (5,))), stride=2)
    g.output(ops.batch_norm(y, *(g.constant(None, a) for a in _bn_arrays(rng, 5, "f32")), eps=1e-3))
    g2, records = rewrite(g)
    assert [(r.pattern, r.op) for r in records] == [("conv_bn", "conv1d")] and _ops_of(g2) == ["conv1d"]
    xs = rand(rng, (2, 3, 13))
    np.testing.assert_allclose(rocmc.evaluate(g2, xs), rocmc.evaluate(g, xs), rtol=1e-5, atol=1e-5)


# ---- the op ------------------------------------------------------------------------------------


def test_fused_conv2d_builder_checks_and_reference(rng):
    g = rocmc.Graph()
    x = g.input("x", ("n", 4, 7, 6))
    w = g.constant("w", rand(rng, (8, 1, 3, 3)))
    r = g.input("r", ("n", 8, 4, 3))
    bad = rocmc.Graph()
    bx = bad.input("x", ("n", 4, 7, 6))
    wrong = r"fused_conv2d\(%0, %2, _, %1\): 'residual' is f32\[n,8,4,4\], expected the convolution's result type"
    with pytest.raises(rocmc.GraphError, match=wrong):
        ops.fused_conv2d(
            bx, rand(rng, (8, 1, 3, 3)), residual=bad.input("r", ("n", 8, 4, 4)), stride=2, padding=1, groups=4
        )
    with pytest.raises(rocmc.GraphError, match="activation='gelu'"):
        ops.fused_conv2d(bx, rand(rng, (8, 1, 3, 3)), stride=2, padding=1, groups=4, activation="gelu")
    with pytest.raises(rocmc.GraphError, match="expected a float tensor"):
        ops.fused_conv2d(bad.input("i", (1, 4, 7, 6), "i32"), np.ones((8, 1, 3, 3), np.int32), groups=4)
    y = ops.fused_conv2d(x, w, None, r, stride=2, padding=1, groups=4, activation="relu")
    assert y.shape == ("n", 8, 4, 3)
    g.output(y)
    xs, rs = rand(rng, (2, 4, 7, 6)), rand(rng, (2, 8, 4, 3))
    ref = rocmc.Graph()
    xr, rr = ref.input("x", ("n", 4, 7, 6)), ref.input("r", ("n", 8, 4, 3))
    ref.output(ops.relu(ops.conv2d(xr, ref.constant("w", g.constants["w"]), stride=2, padding=1, groups=4) + rr))
    np.testing.assert_allclose(rocmc.evaluate(g, xs, rs), rocmc.evaluate(ref, xs, rs), rtol=1e-12)
    # depthwise (groups = channels, multiplier 2) on the CPU: conv2d's depthwise form, then the epilogue
    art = rocmc.compile(g, "cpu")
    assert [c["impl"] for c in art.metadata["implementations"] if c["op"] == "fused_conv2d"] == ["depthwise"]
    np.testing.assert_allclose(rocmc.load(art)(xs, rs), rocmc.evaluate(g, xs, rs), rtol=2e-5, atol=2e-5)


def test_symbolic_spatial_dims_f16_and_gpu_targets(rng):
    # The residual is another conv's result of the same geometry: its dims are the same size expressions.
    g = rocmc.Graph()
    x = g.input("x", ("n", 4, "h", "w"), "f16")
    r = ops.conv2d(x, g.constant("w2", rand(rng, (6, 2, 3, 3), "f16")), stride=2, padding=1, groups=2)
    y = ops.conv2d(
        x,
        g.constant("w1", rand(rng, (6, 4, 3, 3), "f16")),
        g.constant("b", rand(rng, (6,), "f16")),
        stride=2,
        padding=1,
    )
    g.output(ops.relu(y + r))
    art = rocmc.compile(g, "cpu")
    assert [r["op"] for r in art.metadata["rewrites"]] == ["fused_conv2d"]
    xs = rand(rng, (2, 4, 9, 8), "f16", -1.0, 1.0)
    _compare(rocmc.load(art)(xs), rocmc.evaluate(g, xs), "f16")
    compile_gpu(g)


# ---- an ONNX export ----------------------------------------------------------------------------


def test_torch_resnet_block_export(rng, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    torch.manual_seed(int(rng.integers(1 << 31)))

    class Block(torch.nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            nn = torch.nn
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, 2, 1, bias=False, groups=2), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, 2, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            h = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(h)) + self.down(x))

    model = Block(CIN, 10)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(-1.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    model.eval()
    x = torch.rand(N, CIN, H, W) * 2 - 1
    path = tmp_path / "block.onnx"
    # Kept as exported in training-preserving mode: BatchNormalization nodes stay (the default export
    # folds them into the convs itself).
    torch.onnx.export(
        model,
        (x,),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["x"],
        dynamic_axes={"x": {0: "n"}},
        training=torch.onnx.TrainingMode.PRESERVE,
        do_constant_folding=False,
    )
    g = rocmc.import_onnx(str(path))
    assert g.inputs[0].shape[0] == "n" and sum(n.op == "batch_norm" for n in g.nodes) == 3
    art = rocmc.compile(g, "cpu")
    assert sorted((p, op) for p, op, _ in _records(art)) == sorted((p, op) for p, op, _ in BLOCK_REWRITES)
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(rocmc.load(art)(x.numpy()), want, rtol=1e-4, atol=1e-4)
