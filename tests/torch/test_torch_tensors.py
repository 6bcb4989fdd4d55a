"""torch tensors wherever rocmc takes numpy arrays: a compiled module's inputs, rocmc.evaluate, graph
constants and parameters given as arrays (rocmc.arrays.as_numpy). CPU tensors are read without a copy
(bf16 through its bits), tensors that require grad are detached, and a tensor rocmc can't take (on
another device, complex, quantized, sparse) is an InputError naming the argument."""

import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.arrays import as_numpy

torch = pytest.importorskip("torch")

from helpers import TOL, rand  # noqa: E402


def _graph(dtype="f32"):
    """y = x * w + b over a symbolic batch, with w a constant and b a named parameter."""
    g = rocmc.Graph("affine")
    x = g.input("x", ("n", 4), dtype)
    w = g.constant(
        "w", torch.tensor([0.5, -1.25, 2.0, 3.0], dtype={"f32": torch.float32, "bf16": torch.bfloat16}[dtype])
    )
    g.output(ops.add(ops.mul(x, w), g.parameter("b", (4,), dtype)))
    return g


@pytest.fixture(scope="module")
def affine_art():
    return rocmc.compile(_graph(), "cpu")


def test_module_takes_cpu_tensors(affine_art, rng):
    x, b = rand(rng, (3, 4)), rand(rng, (4,))
    mod = rocmc.load(affine_art, parameters={"b": torch.from_numpy(b)})
    want = x.astype(np.float64) * np.array([0.5, -1.25, 2.0, 3.0]) + b
    rtol, atol = TOL["f32"]
    np.testing.assert_allclose(mod(torch.from_numpy(x)), want, rtol=rtol, atol=atol)
    np.testing.assert_allclose(mod(x=torch.from_numpy(x)), want, rtol=rtol, atol=atol)
    # requires grad: detached; non-contiguous: a transposed view
    xg = torch.from_numpy(np.ascontiguousarray(x.T)).requires_grad_(True).T
    np.testing.assert_allclose(mod(xg), want, rtol=rtol, atol=atol)


def test_module_checks_tensors_as_arrays(affine_art, rng):
    mod = rocmc.load(affine_art, parameters={"b": rand(rng, (4,))})
    with pytest.raises(rocmc.InputError, match=r"input 'x': dtype float64 but the module expects f32"):
        mod(torch.from_numpy(rng.standard_normal((3, 4))))
    with pytest.raises(rocmc.InputError, match=r"input 'x': rank 1"):
        mod(torch.from_numpy(rand(rng, (4,))))


def test_bf16_tensors_without_a_copy(rng):
    t = torch.from_numpy(rand(rng, (3, 4))).to(torch.bfloat16)
    a = as_numpy(t, "input 'x'")
    assert a.dtype == ml_dtypes.bfloat16 and a.shape == (3, 4)
    np.testing.assert_array_equal(a.astype(np.float32), t.float().numpy())
    t[1, 2] = 7.5  # the array is a view of the tensor's memory
    assert float(a[1, 2]) == 7.5
    f = torch.from_numpy(rand(rng, (5,)))
    assert np.shares_memory(as_numpy(f, "x"), f.numpy())

    g = _graph("bf16")
    assert g.constants["w"].dtype == ml_dtypes.bfloat16
    x, b = rand(rng, (2, 4), "bf16"), rand(rng, (4,), "bf16")
    want = x.astype(np.float64) * np.array([0.5, -1.25, 2.0, 3.0]) + b.astype(np.float64)
    mod = rocmc.load(rocmc.compile(g, "cpu"), parameters={"b": torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)})
    got = mod(torch.from_numpy(x.view(np.int16)).view(torch.bfloat16))
    rtol, atol = TOL["bf16"]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


def test_evaluate_takes_tensors(rng):
    g = _graph()
    x, b = rand(rng, (5, 4)), rand(rng, (4,))
    want = x.astype(np.float64) * np.array([0.5, -1.25, 2.0, 3.0]) + b
    got = rocmc.evaluate(g, torch.from_numpy(x).requires_grad_(True), parameters={"b": torch.from_numpy(b)})
    np.testing.assert_allclose(got, want, rtol=1e-12)
    got = rocmc.evaluate(g, x=torch.from_numpy(x), parameters={"b": torch.nn.Parameter(torch.from_numpy(b))})
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_constant_from_a_tensor_is_a_copy(rng):
    w = torch.from_numpy(rand(rng, (4,))).requires_grad_(True)
    g = rocmc.Graph("c")
    g.output(ops.mul(g.input("x", (4,), "f32"), g.constant("w", w)))
    before = w.detach().numpy().copy()
    with torch.no_grad():
        w.mul_(2)  # the graph keeps the values it was given
    np.testing.assert_array_equal(g.constants["w"], before)
    x = rand(rng, (4,))
    np.testing.assert_allclose(rocmc.evaluate(g, torch.from_numpy(x)), x.astype(np.float64) * before, rtol=1e-12)


def _bad_tensors():
    yield "meta", torch.empty((3, 4), device="meta"), r"on device meta; expected a CPU tensor"
    yield "complex", torch.zeros((3, 4), dtype=torch.complex64), r"torch dtype torch.complex64, which rocmc lacks"
    with warnings.catch_warnings():  # torch deprecates making quantized tensors, not having them
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.ones(3, 4), 0.1, 0, torch.quint8)
    yield "quantized", quantized, r"a quantized torch tensor"
    yield "sparse", torch.eye(4)[:3].to_sparse(), r"layout torch.sparse_coo; expected a dense"
    if torch.cuda.is_available():
        yield "cuda", torch.ones((3, 4), device="cuda"), r"on device cuda:0; expected a CPU tensor"


@pytest.mark.parametrize("case", [c[0] for c in _bad_tensors()])
def test_tensors_rocmc_cannot_take_are_input_errors(case, affine_art, rng):
    bad, message = next((t, m) for name, t, m in _bad_tensors() if name == case)
    mod = rocmc.load(affine_art, parameters={"b": rand(rng, (4,))})
    with pytest.raises(rocmc.InputError, match=rf"^input 'x': .*{message}"):
        mod(bad)
    with pytest.raises(rocmc.InputError, match=rf"^input 'x': .*{message}"):
        rocmc.evaluate(_graph(), x=bad, parameters={"b": rand(rng, (4,))})
    with pytest.raises(rocmc.InputError, match=rf"^evaluate: parameter 'b': .*{message}"):
        rocmc.evaluate(_graph(), rand(rng, (3, 4)), parameters={"b": bad})
    with pytest.raises(rocmc.InputError, match=rf"^constant 'w': .*{message}"):
        rocmc.Graph("g").constant("w", bad)
    with pytest.raises(rocmc.InputError, match=rf"^parameter 'b': .*{message}"):
        rocmc.load(affine_art, parameters={"b": bad})


def test_rocmc_arrays_does_not_import_torch():
    code = (
        "import sys, numpy as np, rocmc, rocmc.arrays as a; x = np.ones(2); assert a.as_numpy(x, 'x') is x; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
