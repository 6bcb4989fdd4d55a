"""fused_linear = activation(linear(x, w, b)): the op against float64 through the generated lowering and
through the GEMM library's call with its epilogue (served by the numpy reference provider on the CPU),
the rewrite that puts it in place of relu/gelu-tanh after a linear layer (or GPT-2's x @ W + b), the
epilogue scalar of the calls compiled for ROCm and CUDA, and a GPT-2 MLP with and without the rewrite."""

import math
import re

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.externs import EPILOGUES
from rocmc.rewrite import rewrite

from helpers import TOL, check, rand

K, N = 24, 37
ROWS = ((2, 5), (1, 1), (3, 17))  # run-time values of the symbolic ("batch", "seq")


def _relu64(y):
    return np.maximum(y, 0.0)


def _gelu_tanh64(y):
    return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3)))


def _linear64(x, w, b=None):
    y = x.astype(np.float64) @ w.astype(np.float64).T
    return y if b is None else y + b.astype(np.float64)


def _compare(got, want, dtype):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(got).astype(np.float64), want, rtol=rtol, atol=atol)


def _two_layers(rng, dtype):
    """relu(x @ w1^T + b1) and gelu_tanh(x @ w2^T) of one x with symbolic leading dims, and the weights.
    b1 is an input: linear's generated lowering of a bf16 constant bias over symbolic rows does not
    build on the CPU (the same with linear alone)."""
    g = rocmc.Graph("fl")
    x = g.input("x", ("batch", "seq", K), dtype)
    b1 = g.input("b1", (N,), dtype)
    w1, w2 = rand(rng, (N, K), dtype, -0.5, 0.5), rand(rng, (N, K), dtype, -0.5, 0.5)
    g.output(ops.fused_linear(x, w1, b1, activation="relu"), ops.fused_linear(x, w2, activation="gelu_tanh"))
    return g, (w1, w2)


def _check_two_layers(rng, g, weights, art, dtype):
    w1, w2 = weights
    mod = rocmc.load(art)
    for shape in ROWS:
        xv, b1 = rand(rng, (*shape, K), dtype), rand(rng, (N,), dtype)
        y1, y2 = mod(xv, b1)
        _compare(y1, _relu64(_linear64(xv, w1, b1)), dtype)
        _compare(y2, _gelu_tanh64(_linear64(xv, w2)), dtype)
        e1, e2 = rocmc.evaluate(g, xv, b1)
        _compare(e1, _relu64(_linear64(xv, w1, b1)), dtype)
        _compare(e2, _gelu_tanh64(_linear64(xv, w2)), dtype)


# ---- the op ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_generated_lowering_against_float64(rng, dtype):
    g, weights = _two_layers(rng, dtype)
    art = rocmc.compile(g, "cpu")
    assert not art.metadata["externs"]
    _check_two_layers(rng, g, weights, art, dtype)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_library_call_with_its_epilogue_against_float64(rng, dtype):
    g, weights = _two_layers(rng, dtype)
    art = rocmc.compile(g, "cpu", impl={"fused_linear": "blas"})
    calls = art.metadata["externs"]
    assert [(c["op"], c["attrs"]["activation"]) for c in calls] == [
        ("fused_linear", "relu"),
        ("fused_linear", "gelu_tanh"),
    ]
    assert {c["import"] for c in calls} == {"blas.matmul" + ("" if dtype == "f32" else f".{dtype}")}
    _check_two_layers(rng, g, weights, art, dtype)


def test_bad_activation_and_integer_operands_are_refused():
    g = rocmc.Graph("bad")
    x = g.input("x", (4, K), "f32")
    with pytest.raises(rocmc.GraphError, match=r"fused_linear.*activation='gelu'.*'relu', 'gelu_tanh'"):
        ops.fused_linear(x, np.ones((N, K), np.float32), activation="gelu")
    xi = g.input("xi", (4, K), "i32")
    with pytest.raises(rocmc.GraphError, match=r"fused_linear.*i32, expected a float tensor"):
        ops.fused_linear(xi, np.ones((N, K), np.int32), activation="relu")
    with pytest.raises(rocmc.GraphError, match=r"inner dims differ"):
        ops.fused_linear(x, np.ones((N, K + 1), np.float32), activation="relu")


# ---- the rewrite -------------------------------------------------------------------------------------


def _records(graph):
    return [(r.pattern, r.op, sorted(op for _, op in r.replaced)) for r in rewrite(graph)[1]]


def _linear_then(activation, rng, extra_output=False):
    g = rocmc.Graph("act")
    x = g.input("x", ("n", K), "f32")
    y = ops.linear(x, rand(rng, (N, K)), rand(rng, (N,)))
    g.output(activation(y), *([y] if extra_output else []))
    return g


def test_relu_and_tanh_gelu_after_a_linear_become_fused_linear(rng):
    for act, name in ((ops.relu, "relu"), (lambda y: ops.gelu(y, approximate="tanh"), "gelu")):
        g = _linear_then(act, rng)
        assert _records(g) == [("linear_activation", "fused_linear", sorted(["linear", name]))]
        (node,) = [n for n in rewrite(g)[0].nodes if n.op == "fused_linear"]
        assert node.attrs["activation"] == ("relu" if name == "relu" else "gelu_tanh")


def test_erf_gelu_and_a_linear_read_elsewhere_are_left_alone(rng):
    assert _records(_linear_then(lambda y: ops.gelu(y, approximate="none"), rng)) == []
    assert _records(_linear_then(ops.relu, rng, extra_output=True)) == []


def _matmul_graph(w_kind, rng, transpose_b=False, bias_shape=(N,), rows="n"):
    """relu(x @ W + b) with W a constant or a parameter, stored (K, N), or (N, K) with transpose_b."""
    g = rocmc.Graph("mm")
    x = g.input("x", (rows, K), "f32")
    shape = (N, K) if transpose_b else (K, N)
    w = g.constant("w", rand(rng, shape)) if w_kind == "constant" else g.parameter("w", shape, "f32")
    g.output(ops.relu(ops.matmul(x, w, transpose_b=transpose_b) + rand(rng, bias_shape)))
    return g


def test_matmul_plus_bias_fuses_where_the_weight_needs_no_transpose_per_call(rng):
    fused = ("linear_activation", "fused_linear", ["add", "matmul", "relu"])
    assert _records(_matmul_graph("constant", rng)) == [fused]  # W^T computed here
    assert _records(_matmul_graph("parameter", rng, transpose_b=True)) == [fused]  # W is linear's weight
    assert _records(_matmul_graph("constant", rng, bias_shape=(1, N))) == [fused]
    assert _records(_matmul_graph("parameter", rng)) == []  # a transpose per call
    # Not a per-column bias: an addend of the product's shape is a residual, added in the GEMM's epilogue (the
    # relu after it stays an op of its own).
    residual = ("linear_residual", "fused_linear", ["add", "matmul"])
    assert _records(_matmul_graph("constant", rng, bias_shape=(7, N), rows=7)) == [residual]
    # A parameter stored (K, N) alone: left as it is (a transpose per call); a constant one: linear.
    g = rocmc.Graph("mm")
    x = g.input("x", ("n", K), "f32")
    g.output(ops.matmul(x, g.parameter("w", (K, N), "f32")), ops.matmul(x, rand(rng, (K, N))))
    assert _records(g) == [("constant_linear", "linear", ["matmul"])]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_a_transformer_blocks_matmuls_of_constant_weights_become_linear_layers(dtype, rng):
    """A block written with x @ W (constant W stored (in, out), as examples/llama_block.py is): each product
    becomes a linear of W^T (transposed at compile time), a skip connection added after it that GEMM's epilogue
    (fused_linear with the residual); against float64, rows symbolic."""
    g = rocmc.Graph("blk")
    x = g.input("x", (1, "s", K), dtype)
    w = {n: rand(rng, shape, dtype, -0.3, 0.3) for n, shape in (("q", (K, K)), ("o", (K, K)), ("up", (K, N)))}
    w["down"] = rand(rng, (N, K), dtype, -0.3, 0.3)
    bias = rand(rng, (N,), dtype)
    h = x + ops.matmul(ops.matmul(x, g.constant("q", w["q"])), g.constant("o", w["o"]))
    g.output(h + ops.matmul(ops.silu(ops.matmul(h, g.constant("up", w["up"])) + bias), g.constant("down", w["down"])))
    records = sorted(_records(g))
    assert records == sorted(
        [
            ("constant_linear", "linear", ["matmul"]),  # q
            ("linear_residual", "fused_linear", ["add", "matmul"]),  # o + x
            ("constant_linear", "linear", ["add", "matmul"]),  # up + bias
            ("linear_residual", "fused_linear", ["add", "matmul"]),  # down + h
        ]
    )
    tol = {"f32": (1e-4, 1e-4), "f16": (2e-2, 2e-2)}[dtype]
    check(g, rand(rng, (1, 9, K), dtype, -1, 1), tol=tol)


# ---- the library calls compiled for the GPUs -----------------------------------------------------------


def _call_scalars(text: str, name: str) -> list:
    """The i64 scalars each `call @name(...)` of the module's input IR passes."""
    consts = dict(re.findall(r"(%\w+) = arith\.constant (-?\d+) : i64", text))
    calls = re.findall(rf"func\.call @{re.escape(name)}\(([^)]*)\)", text)
    return [[int(consts[a]) for a in (s.strip() for s in args.split(",")) if a in consts] for args in calls]


@pytest.mark.parametrize("target", ["gfx942", "cuda:sm_80"])
def test_gpu_compiles_call_the_library_with_the_epilogue(target):
    g = rocmc.Graph("mlp")
    x = g.input("x", ("seq", 256), "f16")
    h = ops.gelu(ops.linear(x, np.full((512, 256), 0.01, np.float16), np.zeros(512, np.float16)), approximate="tanh")
    g.output(ops.relu(ops.linear(h, np.full((128, 512), 0.01, np.float16))))
    art = rocmc.compile(g, target, libraries=["blas"])
    assert [(c["op"], c["import"]) for c in art.metadata["externs"]] == [("fused_linear", "blas.matmul.f16")] * 2
    # (transpose_a, transpose_b, epilogue, alpha's f64 bits): linear's call with the epilogue set
    one = int(np.float64(1.0).view(np.int64))
    assert _call_scalars(art.ir("input"), "blas.matmul.f16") == [
        [0, 1, EPILOGUES.index("gelu_tanh"), one],
        [0, 1, EPILOGUES.index("relu"), one],
    ]


# ---- a GPT-2 MLP as torch exports it ----------------------------------------------------------------


def _gpt2_mlp(rng, leaf, dtype="f32", d=64, hidden=256):
    """GPT-2's MLP as its ONNX exports spell it: rows flattened for Conv1D's x @ W + b, restored, GELU
    with tanh written out, c_proj the same way."""
    g = rocmc.Graph("mlp")
    x = g.input("x", ("batch", "seq", d), dtype)

    def conv1d(v, name, cin, cout):
        flat = ops.reshape(v, [-1, cin])
        w = leaf(g, f"{name}.weight", (rng.uniform(-1, 1, (cin, cout)) / np.sqrt(cin)).astype(rocmc.dtype(dtype).np))
        y = ops.matmul(flat, w) + g.constant(f"{name}_bias", rand(rng, (cout,), dtype, -0.5, 0.5))
        return ops.reshape(y, ["batch", "seq", cout])

    h = conv1d(x, "c_fc", d, hidden)
    c = lambda v: g.constant(None, np.asarray(v, rocmc.dtype(dtype).np))  # noqa: E731
    inner = c(math.sqrt(2.0 / math.pi)) * (h + c(0.044715) * ops.pow(h, c(3.0)))
    g.output(conv1d(c(0.5) * h * (c(1.0) + ops.tanh(inner)), "c_proj", hidden, d))
    return g


def _constant(g, name, array):
    return g.constant(name.replace(".", "_"), array)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_gpt2_mlp_with_and_without_the_rewrite(rng, dtype):
    g = _gpt2_mlp(rng, _constant, dtype)
    art = rocmc.compile(g, "cpu")
    # c_fc with its GELU: fused_linear; c_proj (x @ W + b of a constant W): a linear layer of W^T.
    want = [("linear_activation", "fused_linear"), ("constant_linear", "linear")]
    assert [(r["pattern"], r["op"]) for r in art.metadata["rewrites"]] == want
    assert {"tanh", "matmul", "add", "reshape"} <= {op for _, op in art.metadata["rewrites"][0]["replaced"]}
    plain = rocmc.load(rocmc.compile(g, "cpu", rewrite=False))
    mod = rocmc.load(art)
    for shape in ((2, 5), (1, 9)):
        xv = rand(rng, (*shape, 64), dtype, -1.0, 1.0)
        want = rocmc.evaluate(g, xv)
        _compare(mod(xv), want, dtype)
        _compare(mod(xv), np.asarray(plain(xv), np.float64), dtype)


def test_gpt2_mlp_with_parameter_weights_keeps_its_matmuls(rng):
    g = _gpt2_mlp(rng, lambda g, name, a: g.parameter(name, a.shape, "f32"))
    assert [r.pattern for r in rewrite(g)[1]] == ["gelu"]
