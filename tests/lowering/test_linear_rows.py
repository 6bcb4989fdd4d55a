"""The ops of a transformer's projections with their epilogues: fused_linear with a residual (activation(linear + r)),
gated_linear (act(x @ gate^T + b) * (x @ up^T + b), gate and up joined in one weight) and rms_norm_linear (either
of an RMS-normalized x), against float64 through the generated lowering (symbolic rows, odd sizes); their bad
input; and where the linear kernels take them on GPU targets (compiled here; tests/gpu runs them), which one
(linear_vec for 1 and 2 rows, linear_rows for 3 to 32, linear_mm for more or a symbolic number), where not and
why."""

import math

import numpy as np
import pytest

import rocmc
from rocmc import ops

from helpers import TOL, CpuBatch, rand

K, N = 37, 13
ROWS = ((2, 5), (1, 1), (3, 7))  # run-time values of the symbolic ("batch", "seq")


def _act64(name, y):
    if name == "silu":
        return y / (1.0 + np.exp(-y))
    if name == "relu":
        return np.maximum(y, 0.0)
    if name == "gelu_tanh":
        return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3)))
    return y


def _compare(got, want, dtype):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(got).astype(np.float64), want, rtol=rtol, atol=atol)


def _graph(dtype, act, gate_act, lead=("batch", "seq")):
    g = rocmc.Graph("proj")
    x = g.input("x", (*lead, K), dtype)
    w = g.input("w", (2 * N, K), dtype)
    b = g.input("b", (2 * N,), dtype)
    r = g.input("r", (*lead, 2 * N), dtype)
    g.output(ops.fused_linear(x, w, b, r, activation=act), ops.gated_linear(x, w, b, activation=gate_act))
    return g


DTYPES = ["f32", "f16", "bf16"]
ACTS = [("none", "silu"), ("gelu_tanh", "gelu_tanh"), ("relu", "silu")]
# A parametrized test's graphs are the functions of one module (helpers.CpuBatch): a compile a module, not a test.
# Keys in the order the tests run (the last parametrize decorator's values outermost).
PROJECTION_BATCH = CpuBatch(_graph, [(d, act, gate) for act, gate in ACTS for d in DTYPES])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act,gate_act", ACTS)
def test_residual_and_gated_projections_against_float64(rng, dtype, act, gate_act):
    g, mod = PROJECTION_BATCH(dtype, act, gate_act)
    for shape in ROWS:
        x, w = rand(rng, (*shape, K), dtype), rand(rng, (2 * N, K), dtype, -0.4, 0.4)
        b, r = rand(rng, (2 * N,), dtype), rand(rng, (*shape, 2 * N), dtype)
        y = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
        want = (_act64(act, y + r.astype(np.float64)), _act64(gate_act, y[..., :N]) * y[..., N:])
        for got in (mod(x, w, b, r), rocmc.evaluate(g, x, w, b, r)):
            for o, ref in zip(got, want):
                _compare(o, ref, dtype)


def _rms64(x, g, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g.astype(np.float64)


def _normed_graph(dtype, gate):
    rows = 2 * N if gate != "none" else N
    g = rocmc.Graph("normed")
    x = g.input("x", ("batch", "seq", K), dtype)
    nw, w = g.input("nw", (K,), dtype), g.input("w", (rows, K), dtype)
    b = g.input("b", (rows,), dtype)
    g.output(ops.rms_norm_linear(x, nw, w, b, eps=1e-5, gate=gate))
    return g


GATES = ["none", "silu", "gelu_tanh"]
NORMED_BATCH = CpuBatch.grid(_normed_graph, DTYPES, GATES)


@NORMED_BATCH.parametrize("dtype,gate")
def test_rms_norm_linear_against_float64(rng, dtype, gate):
    rows = 2 * N if gate != "none" else N
    g, mod = NORMED_BATCH(dtype, gate)
    for shape in ROWS:
        x = rand(rng, (*shape, K), dtype)
        nw, w, b = rand(rng, (K,), dtype, 0.5, 1.5), rand(rng, (rows, K), dtype, -0.4, 0.4), rand(rng, (rows,), dtype)
        xn = _rms64(x, nw, 1e-5)
        # The compiled module rounds the normalized x to the dtype before the product, as rms_norm's output is: in
        # bf16 that rounding alone can move a small up-projection by 0.005 and a gated output by 0.04, so its
        # reference rounds it too; the float64 reference (evaluate) does not.
        for got, x64 in ((mod(x, nw, w, b), xn.astype(rocmc.dtype(dtype).np)), (rocmc.evaluate(g, x, nw, w, b), xn)):
            y = x64.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
            _compare(got, y if gate == "none" else _act64(gate, y[..., :N]) * y[..., N:], dtype)


def test_bad_normed_projection_operands_are_refused():
    g = rocmc.Graph("bad")
    x = g.input("x", (4, K), "f16")
    w, nw = np.ones((2 * N, K), np.float16), np.ones(K, np.float16)
    with pytest.raises(rocmc.GraphError, match=r"rms_norm_linear.*'norm_weight' is f16\[36\], expected shape \[37\]"):
        ops.rms_norm_linear(x, np.ones(K - 1, np.float16), w)
    with pytest.raises(rocmc.GraphError, match=r"rms_norm_linear.*gate='relu', expected one of 'none', 'silu'"):
        ops.rms_norm_linear(x, nw, w, gate="relu")
    with pytest.raises(rocmc.GraphError, match=r"rms_norm_linear.*eps=-1.0, expected a number >= 0"):
        ops.rms_norm_linear(x, nw, w, eps=-1.0)
    with pytest.raises(rocmc.GraphError, match=r"rms_norm_linear.*'weight' has 27 rows, expected a static even"):
        ops.rms_norm_linear(x, nw, np.ones((27, K), np.float16), gate="silu")


def test_bad_projection_operands_are_refused():
    g = rocmc.Graph("bad")
    x = g.input("x", (4, K), "f16")
    with pytest.raises(rocmc.GraphError, match=r"gated_linear.*'weight' has 27 rows, expected a static even count"):
        ops.gated_linear(x, np.ones((27, K), np.float16))
    with pytest.raises(rocmc.GraphError, match=r"gated_linear.*activation='relu'.*'silu', 'gelu_tanh'"):
        ops.gated_linear(x, np.ones((26, K), np.float16), activation="relu")
    with pytest.raises(rocmc.GraphError, match=r"fused_linear.*'residual' is f16\[4,12\].*f16\[4,13\]"):
        ops.fused_linear(x, np.ones((N, K), np.float16), residual=np.ones((4, 12), np.float16))
    with pytest.raises(rocmc.GraphError, match=r"'bias' has shape .*expected \[26\]"):
        ops.gated_linear(x, np.ones((26, K), np.float16), np.ones(13, np.float16))


def _rows_graph(rows, dtype="f16", gated=True, k=64, n=48, normed=False):
    g = rocmc.Graph("rows")
    x = g.input("x", (*rows, k), dtype)
    w = g.input("w", (2 * n if gated else n, k), dtype)
    if normed:
        nw = g.input("nw", (k,), dtype)
        g.output(ops.rms_norm_linear(x, nw, w, eps=1e-6, gate="silu" if gated else "none"))
    elif gated:
        g.output(ops.gated_linear(x, w, activation="silu"))
    else:
        g.output(ops.fused_linear(x, w, residual=g.input("r", (*rows, n), dtype)))
    return g


def _symbols(art):
    return [k["symbol"] for k in art.metadata["kernels"]]


# gfx90a chooses as gfx942 does (both MFMA); its code objects are checked in test_kernels.py.
@pytest.mark.parametrize("target", ["cuda:sm_80", "gfx942"])
def test_kernels_take_a_few_static_rows(target):
    for gated in (True, False):
        for normed in (False, True):
            # From 3 rows rms_norm_linear is rms_norm's kernel, then linear_rows; below, linear_vec normalizes x.
            for rows, symbols in [
                ((3, 1), ["rms_norm_f16_short", "linear_rows_f16"] if normed else ["linear_rows_f16"]),
                ((1, 1), ["linear_vec_f16"]),
                ((2,), ["linear_vec_f16"]),
                # More rows, or a symbolic number: the tiled GEMM, after the norm's kernel.
                ((33,), ["rms_norm_f16_short", "linear_mm_f16"] if normed else ["linear_mm_f16"]),
                (("n", 1), ["rms_norm_f16_short", "linear_mm_f16"] if normed else ["linear_mm_f16"]),
            ]:
                g = _rows_graph(rows, gated=gated, normed=normed)
                op = g.nodes[-1].op
                art = rocmc.compile(g, target, impl={op: "kernel"})
                assert _symbols(art) == symbols, (rows, gated, normed)
                if "linear_mm_f16" in symbols:  # the default on NVIDIA; on ROCm asked for by name, and it says so
                    art = rocmc.compile(g, target)
                    if target.startswith("cuda"):
                        assert _symbols(art) == symbols, (rows, gated, normed)
                    else:
                        assert "linear_mm" not in _symbols(art), (rows, gated, normed)
                        assert "its AMD code has not run on an AMD GPU" in art.summary()
    assert _symbols(rocmc.compile(_rows_graph((32,), "bf16"), target)) == ["linear_rows_bf16"]


def test_hopper_modules_take_the_warpgroup_kernel_for_many_rows():
    """cuda:sm_90: a prefill's projections (more rows than linear_rows takes, or a symbolic number) take
    linear_wgmma, built for sm_90a, its tiles in dynamic shared memory the export declares; a few rows keep the
    kernels every NVIDIA GPU runs; cuda:sm_80 keeps linear_mm."""
    for rows, want in [(("n", 1), "linear_wgmma_f16"), ((33,), "linear_wgmma_f16"), ((3, 1), "linear_rows_f16")]:
        art = rocmc.compile(_rows_graph(rows, gated=True), "cuda:sm_90")
        assert _symbols(art) == [want], rows
        (kernel,) = art.metadata["kernels"]
        assert kernel["arch"] == ("sm_90a" if want.startswith("linear_wgmma") else "sm_80"), kernel
    art = rocmc.compile(_rows_graph(("n", 1), normed=True), "cuda:sm_90")
    assert _symbols(art) == ["rms_norm_f16_short", "linear_wgmma_f16"]
    assert "linear_wgmma_f16" in art.summary() and "[sm_90a]" in art.summary()
    assert "hand-written kernels written for Hopper are sm_90a PTX" in art.metadata["compile_note"]
    assert "workgroup_local_memory = 98304 : index" in art.ir("input")
    assert _symbols(rocmc.compile(_rows_graph(("n", 1), gated=True), "cuda:sm_80")) == ["linear_mm_f16"]


def test_what_the_kernels_pass_over():
    for rows, dtype, target, why in [
        ((4,), "f32", "cuda:sm_80", "x is f32; the kernels take f16, bf16"),
        (("n",), "f32", "cuda:sm_80", "x is f32; the kernels take f16, bf16"),
        ((4,), "f16", "gfx1100", "gfx1100: the kernel uses the MFMA instructions"),
        (("n", 1), "f16", "gfx1100", "gfx1100: the kernel uses the MFMA instructions"),
    ]:
        art = rocmc.compile(_rows_graph(rows, dtype), target)
        assert not _symbols(art) and why in art.summary(), art.summary()
    # linear_vec needs no matrix instructions: one row takes it on gfx11 too.
    assert _symbols(rocmc.compile(_rows_graph((1,), normed=True), "gfx1100")) == ["linear_vec_f16"]
    g = rocmc.Graph("mixed")
    x = g.input("x", (1, 64), "f16")
    g.output(ops.rms_norm_linear(x, g.input("nw", (64,), "f32"), g.input("w", (48, 64), "f16")))
    art = rocmc.compile(g, "cuda:sm_80")
    assert not _symbols(art) and "norm_weight is f32, x f16: the kernel takes them in one dtype" in art.summary()


def test_library_gemm_passes_over_a_residual(rng):
    g = _rows_graph((5,), "f32", gated=False)
    art = rocmc.compile(g, "cpu", impl={"fused_linear": "blas"})
    assert not art.metadata["externs"] and "a residual operand" in art.summary()
    x, w, r = rand(rng, (5, 64), "f32"), rand(rng, (48, 64), "f32"), rand(rng, (5, 48), "f32")
    _compare(rocmc.load(art)(x, w, r), x.astype(np.float64) @ w.T.astype(np.float64) + r, "f32")
