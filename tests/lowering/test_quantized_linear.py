"""quantized_linear: 4- and 8-bit weights with per-group scales and zeros (and act-order's permutation of x)
against float64 through the generated lowering, with symbolic rows and odd sizes; the packed layout; the bad
input; and that on the GPU targets the dequantization is fused into the product's dispatch (compiled here)."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.frontend.ops.quant import dequantize, pack, unpack

from helpers import TOL, CpuBatch, rand

N = 37  # odd output features


def _graph(dtype, bits, k, groups, bias, perm, lead=("batch", "seq")):
    g = rocmc.Graph("qlinear")
    x = g.input("x", (*lead, k), dtype)
    w = g.input("w", (N, k * bits // 8), "u8")
    s = g.input("s", (N, groups), "f16")
    z = g.input("z", (N, groups), "f16")
    b = g.input("b", (N,), dtype) if bias else None
    p = g.input("p", (k,), "i64") if perm else None
    g.output(ops.quantized_linear(x, w, s, z, b, p, bits=bits))
    return g


def _weights(rng, bits, k, groups):
    q = rng.integers(0, 1 << bits, (N, k))
    s = rng.uniform(0.005, 0.05, (N, groups)).astype(np.float16)
    z = rng.integers(0, 1 << bits, (N, groups)).astype(np.float16)
    return pack(q, bits), s, z


LAYERS = [(4, 96, 3, True, True), (4, 64, 1, False, False), (8, 40, 5, True, False)]
# The parametrization's graphs as the functions of one module (helpers.CpuBatch): one compile, not one a test.
LAYER_BATCH = CpuBatch(_graph, [(d, *layer) for layer in LAYERS for d in ("f32", "f16")])


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("bits,k,groups,bias,perm", LAYERS)
def test_against_float64(rng, dtype, bits, k, groups, bias, perm):
    g, mod = LAYER_BATCH(dtype, bits, k, groups, bias, perm)
    for lead in ((1, 1), (2, 7), (3, 5)):
        w, s, z = _weights(rng, bits, k, groups)
        x = rand(rng, (*lead, k), dtype)
        args, xs = [x, w, s, z], x.astype(np.float64)
        b = rand(rng, (N,), dtype) if bias else None
        p = rng.permutation(k) if perm else None
        args += [a for a in (b, p) if a is not None]
        want = (xs if p is None else xs[..., p]) @ dequantize(w, s, z, bits).T
        if b is not None:
            want = want + b.astype(np.float64)
        for got in (mod(*args), rocmc.evaluate(g, *args)):
            rtol, atol = TOL[dtype]
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol * 10)


def test_the_packed_layout(rng):
    """Two 4-bit values a byte, the even feature in the low nibble; 8-bit values a byte each."""
    q = rng.integers(0, 16, (3, 10))
    w = pack(q, 4)
    assert w.shape == (3, 5) and w[0, 0] == q[0, 0] | (q[0, 1] << 4)
    assert np.array_equal(unpack(w, 4), q) and np.array_equal(unpack(pack(q * 13, 8), 8), q * 13)
    with pytest.raises(rocmc.GraphError, match=r"must lie in \[0, 16\)"):
        pack(q + 16, 4)
    with pytest.raises(rocmc.GraphError, match="do not fill whole bytes"):
        pack(q[:, :7], 4)


@pytest.mark.parametrize("target", ["cuda:sm_80", "gfx942"])
@pytest.mark.parametrize("lead", [(1,), ("rows",)])
def test_the_dequantization_is_in_the_product_s_dispatch(target, lead):
    """The packed weight is what the generated product reads: the product's dispatch dequantizes it, no
    dequantized weight is stored (on the CPU IREE 3.13 keeps it a dispatch of its own, a buffer of the call).
    Symbolic rows on a GPU are contracted as (1, rows, k) (linalg.py's _folded), which IREE 3.13 plans with
    the f32 result rounded to f16 by a dispatch of its own, over the result (rows x N)."""
    g = _graph("f16", 4, 4096, 32, True, False, lead)
    names = [d["name"] for d in rocmc.compile(g, target, impl={"quantized_linear": "generated"}).dispatches()]
    products = [n for n in names if f"{N}x32x128" in n]
    assert len(products) == 1 and ("matmul_like" in products[0] or "matvec_like" in products[0]), names
    assert all(n in products or f"elementwise_Dx{N}_" in n for n in names), names


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"bits": 3}, "bits=3, expected 4 or 8"),
        ({"w": ((N, 40), "u8")}, "pack into 48 bytes a row, not 40"),
        ({"w": ((N, 48), "i32")}, "expected a static u8"),
        ({"s": ((N, 5), "f16"), "z": ((N, 5), "f16")}, "5 groups of 96 input features"),
        ({"z": ((N, 3), "f32")}, "'zeros' is f32[37,3], expected the scales' type"),
        ({"s": ((N + 1, 3), "f16")}, "'scales' is f16[38,3], expected (37, groups)"),
        ({"b": ((N + 1,), "f32")}, "'bias' is f32[38], expected [37] f32"),
        ({"p": ((95,), "i64")}, "'perm' is i64[95], expected an integer [96]"),
        ({"p": ((96,), "f32")}, "'perm' is f32[96], expected an integer [96]"),
    ],
)
def test_bad_input_is_a_typed_error_naming_the_argument(change, needle):
    spec = {"w": ((N, 48), "u8"), "s": ((N, 3), "f16"), "z": ((N, 3), "f16"), "b": ((N,), "f32")}
    spec["p"] = ((96,), "i64")
    spec.update({k: v for k, v in change.items() if k != "bits"})
    g = rocmc.Graph("bad")
    x = g.input("x", (2, 96), "f32")
    ins = {k: g.input(k, *v) for k, v in spec.items()}
    with pytest.raises(rocmc.GraphError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        ops.quantized_linear(x, ins["w"], ins["s"], ins["z"], ins["b"], ins["p"], bits=change.get("bits", 4))


def _fused_graph(dtype, bits, k, groups, n, lead, norm, gate, residual, perm=False):
    g = rocmc.Graph("qfused")
    x = g.input("x", (*lead, k), dtype)
    w = g.input("w", (n, k * bits // 8), "u8")
    s, z = g.input("s", (n, groups), dtype), g.input("z", (n, groups), dtype)
    b = g.input("b", (n,), dtype)
    p = g.input("p", (k,), "i64") if perm else None
    r = g.input("r", (*lead, n // 2 if gate != "none" else n), dtype) if residual else None
    nw = g.input("nw", (k,), dtype) if norm else None
    g.output(ops.quantized_linear(x, w, s, z, b, p, bits=bits, norm=nw, eps=1e-5, gate=gate, residual=r))
    return g


FUSED_FORMS = [
    (True, "silu", False, False),
    (True, "none", False, True),
    (False, "none", True, False),
    (True, "gelu_tanh", False, True),
]


def _fused_form_graph(norm, gate, residual, perm):
    return _fused_graph("f32", 4, 64, 2, 2 * N, ("batch", "seq"), norm, gate, residual, perm)


FUSED_BATCH = CpuBatch(_fused_form_graph, FUSED_FORMS)


@pytest.mark.parametrize("norm,gate,residual,perm", FUSED_FORMS)
def test_fused_forms_against_float64(rng, norm, gate, residual, perm):
    """norm (RMSNorm of x first, before act-order's permutation), gate (act(gate) * up of the joined rows) and
    residual, as the separate ops compute them, symbolic rows."""
    k, groups, n, bits = 64, 2, 2 * N, 4
    g, mod = FUSED_BATCH(norm, gate, residual, perm)
    for lead in ((1, 1), (2, 5)):
        q = rng.integers(0, 16, (n, k))
        s = rng.uniform(0.01, 0.05, (n, groups)).astype(np.float32)
        z = rng.integers(0, 16, (n, groups)).astype(np.float32)
        x, b = rand(rng, (*lead, k), "f32"), rand(rng, (n,), "f32")
        p = rng.permutation(k) if perm else None
        r = rand(rng, (*lead, n // 2 if gate != "none" else n), "f32") if residual else None
        nw = rng.uniform(0.5, 1.5, (k,)).astype(np.float32) if norm else None
        h = x.astype(np.float64)
        if norm:
            h = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + 1e-5) * nw
        if perm:
            h = h[..., p]
        y = h @ ((q - np.repeat(z, k // groups, -1)) * np.repeat(s, k // groups, -1)).T.astype(np.float64) + b
        if gate == "silu":
            y = y[..., :N] / (1 + np.exp(-y[..., :N])) * y[..., N:]
        elif gate == "gelu_tanh":
            a = y[..., :N]
            y = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3))) * y[..., N:]
        if residual:
            y = y + r
        args = [x, pack(q, bits), s, z, b] + [a for a in (p, r, nw) if a is not None]
        for got in (mod(*args), rocmc.evaluate(g, *args)):
            np.testing.assert_allclose(np.asarray(got, np.float64), y, rtol=1e-4, atol=1e-4)


def _symbols(art):
    return [k["symbol"] for k in art.metadata["kernels"]]


# gfx90a chooses as gfx942 does (both MFMA: kernel/linear.py's matrix_problem); its code objects are checked in
# test_kernels.py.
@pytest.mark.parametrize("target", ["cuda:sm_80", "gfx942"])
def test_the_kernels_take_a_few_static_rows(target):
    """linear_q (vector units) for one or two rows with the norm, gate or residual in the dispatch; linear_qm
    (matrix units) for 3 to 32 rows, after rms_norm's kernel; act-order's permutation after the norm."""
    for lead, norm, gate, residual, perm, want in [
        ((1, 1), True, "silu", False, False, ["linear_q_f16"]),
        ((2,), False, "none", True, False, ["linear_q_f16"]),
        ((1,), True, "none", False, True, ["rms_norm_f16_short", "linear_q_f16"]),
        ((3,), True, "silu", False, False, ["rms_norm_f16_short", "linear_qm_f16"]),
        ((32,), False, "none", True, False, ["linear_qm_f16"]),
        # more rows, or a symbolic number: linear_qmm on CUDA; on ROCm IREE's code unless asked for (kernel/quant.py)
        ((33,), False, "none", True, False, ["linear_qmm_f16"] if target.startswith("cuda") else []),
        (
            ("t",),
            True,
            "silu",
            False,
            True,
            ["rms_norm_f16_short", "linear_qmm_f16"] if target.startswith("cuda") else [],
        ),
    ]:
        art = rocmc.compile(_fused_graph("f16", 4, 256, 2, 96, lead, norm, gate, residual, perm), target)
        assert _symbols(art) == want, (lead, art.summary())
    art = rocmc.compile(_fused_graph("bf16", 8, 256, 1, 96, (4,), True, "gelu_tanh", False), target)
    assert _symbols(art) == ["rms_norm_bf16_short", "linear_qm_bf16"]


def test_hopper_modules_take_the_warpgroup_kernel_for_a_prefill():
    """cuda:sm_90: a prefill's quantized projections take linear_qwgmma (sm_90a) where in-features and the group
    size are multiples of 64, linear_qmm otherwise; a few rows keep linear_q / linear_qm."""
    for bits, k, groups, lead, want, arch in [
        (4, 256, 2, ("t",), "linear_qwgmma_f16", "sm_90a"),  # groups of 128
        (8, 256, 4, (33,), "linear_qwgmma_f16", "sm_90a"),  # groups of 64
        (4, 256, 8, ("t",), "linear_qmm_f16", "sm_80"),  # groups of 32: linear_qmm's chunk, not linear_qwgmma's
        (4, 256, 2, (2,), "linear_q_f16", "sm_80"),
    ]:
        art = rocmc.compile(_fused_graph("f16", bits, 256, groups, k, lead, False, "none", False), "cuda:sm_90")
        assert [(c["symbol"], c["arch"]) for c in art.metadata["kernels"]] == [(want, arch)], (bits, groups, lead)


def test_without_matrix_instructions_one_or_two_rows_take_the_vector_kernel():
    for lead, want in [((1,), ["linear_q_f16"]), ((2,), ["linear_q_f16"]), ((3,), [])]:
        art = rocmc.compile(_fused_graph("f16", 4, 256, 2, 96, lead, True, "silu", False), "gfx1100")
        assert _symbols(art) == want, art.summary()
    assert "3 rows of x; the kernel takes 1 to 2 (gfx1100: the kernel uses the MFMA instructions" in art.summary()
    art = rocmc.compile(_fused_graph("f16", 4, 256, 2, 96, ("t",), False, "none", False), "gfx1100")
    assert "a symbolic number of rows of x: linear_qmm needs gfx1100" in art.summary(), art.summary()


def test_what_the_kernel_passes_over():
    for dtype, bits, k, groups, lead, why in [
        ("f16", 8, 240, 15, (33,), "in-features 240 in groups of 16: linear_qmm takes multiples of 32 for both"),
        ("f16", 8, 240, 15, ("t",), "in-features 240 in groups of 16: linear_qmm takes multiples of 32 for both"),
        ("f32", 4, 256, 2, (1,), "x is f32; the kernels take f16, bf16"),
        ("f16", 4, 256, 16, (1,), "groups of 16 values; the kernels take multiples of 32"),
        ("f16", 8, 120, 15, (1,), "groups of 8 values; the kernels take multiples of 16"),
    ]:
        art = rocmc.compile(_fused_graph(dtype, bits, k, groups, 96, lead, True, "silu", False), "cuda:sm_80")
        assert not _symbols(art) and why in art.summary(), art.summary()


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"gate": "relu"}, "gate='relu', expected one of 'none', 'silu', 'gelu_tanh'"),
        ({"gate": "silu", "residual": ((2, 18), "f32"), "w": ((36, 48), "u8")}, "'residual' with gate='silu'"),
        ({"residual": ((2, 36), "f32")}, "'residual' is f32[2,36], expected the result's type f32[2,37]"),
        ({"norm": ((95,), "f32")}, "'norm' is f32[95], expected [96] f32"),
        ({"gate": "silu"}, "'weight' has 37 rows, expected an even count with a gate"),
    ],
)
def test_bad_fused_operands_are_typed_errors(kw, needle):
    g = rocmc.Graph("bad")
    x = g.input("x", (2, 96), "f32")
    n = kw["w"][0][0] if "w" in kw else N
    w, s, z = g.input("w", (n, 48), "u8"), g.input("s", (n, 3), "f32"), g.input("z", (n, 3), "f32")
    kw = {k: g.input(k, *v) if isinstance(v, tuple) else v for k, v in kw.items() if k != "w"}
    with pytest.raises(rocmc.GraphError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        ops.quantized_linear(x, w, s, z, **kw)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_float8_e4m3fn_weights_against_float64(rng, dtype):
    """format="e4m3fn": every byte but NaN's (S.1111.111) decoded as float8 e4m3fn, subnormals and both zeros
    included, scaled by its group's float32 scale; no zero points."""
    import ml_dtypes

    g = rocmc.Graph("fp8")
    x = g.input("x", ("rows", 256), dtype)
    w, s = g.input("w", (N, 256), "u8"), g.input("s", (N, 2), "f32")
    g.output(ops.quantized_linear(x, w, s, None, bits=8, format="e4m3fn"))
    mod = rocmc.load(rocmc.compile(g, "cpu"))
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    wv = np.resize(rng.permutation(codes), (N, 256)).astype(np.uint8)  # every code at least once
    sv = rng.uniform(0.001, 0.01, (N, 2)).astype(np.float32)
    xv = rand(rng, (3, 256), dtype)
    want = xv.astype(np.float64) @ (wv.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * np.repeat(sv, 128, 1)).T
    for got in (mod(xv, wv, sv), rocmc.evaluate(g, xv, wv, sv)):
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol * 10)


def test_a_bad_weight_format_is_a_typed_error():
    g = rocmc.Graph("bad")
    x = g.input("x", (2, 64), "f32")
    w, s = g.input("w", (N, 32), "u8"), g.input("s", (N, 1), "f32")
    with pytest.raises(rocmc.GraphError, match="format='e4m3fn' with bits=4: expected 'uint', or 'e4m3fn' of 8 bits"):
        ops.quantized_linear(x, w, s, bits=4, format="e4m3fn")
    with pytest.raises(rocmc.GraphError, match="format='e5m2'"):
        ops.quantized_linear(x, g.input("w8", (N, 64), "u8"), s, bits=8, format="e5m2")


def _fp8_graph(dtype, groups, lead=("rows",), k=256, bias=True, weight="input"):
    g = rocmc.Graph("fp8")
    x = g.input("x", (*lead, k), dtype)
    w = g.parameter("w", (N, k), "u8") if weight == "parameter" else g.input("w", (N, k), "u8")
    s = g.input("s", (N, groups), "f32")
    b = g.input("b", (N,), dtype) if bias else None
    g.output(ops.quantized_linear(x, w, s, None, b, bits=8, format="e4m3fn"))
    return g


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_float8_products_quantize_x_by_row(rng, dtype):
    """impl "fp8" (asked for on the CPU; the default on gfx942): x / (max|x_row| / 240) rounded to e4m3fnuz, the
    e4m3fn weight bytes as e4m3fnuz of half their value (-0 made +0), products summed in f32, then scaled back:
    equal to that arithmetic emulated with ml_dtypes, every weight code but NaN's, a row of zeros; within the
    activations' rounding of the weight-only result; a NaN weight code makes its output NaN."""
    import ml_dtypes

    g = _fp8_graph(dtype, 1)
    art = rocmc.compile(g, "cpu", impl={"quantized_linear": "fp8"})
    assert "fp8" in art.summary()
    mod = rocmc.load(art)
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    wv = np.resize(rng.permutation(codes), (N, 256)).astype(np.uint8)
    sv = rng.uniform(0.001, 0.01, (N, 1)).astype(np.float32)
    bv = rand(rng, (N,), dtype)
    for rows in (1, 6):
        xv = rand(rng, (rows, 256), dtype) * 4
        xv[rows // 2] = 0
        got = np.asarray(mod(xv, wv, sv, bv), np.float64)
        xf = xv.astype(np.float32)
        amax = np.abs(xf).max(1, keepdims=True)
        sx = np.where(amax == 0, np.float32(1), amax / np.float32(240)).astype(np.float32)
        xq = (xf / sx).astype(ml_dtypes.float8_e4m3fnuz).astype(np.float64)
        wf = wv.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        emulated = (xq @ wf.T) * sx * sv.T + bv.astype(np.float64)
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(got, emulated, rtol=rtol, atol=atol * 10 * np.abs(emulated).max())
        weight_only = xv.astype(np.float64) @ (wf * sv).T + bv.astype(np.float64)
        assert np.linalg.norm(got - weight_only) / np.linalg.norm(weight_only) < 0.05
    wv[3, 7] = 0x7F  # e4m3fn's NaN
    got = np.asarray(mod(xv, wv, sv, bv), np.float64)
    assert np.isnan(got[:, 3]).all() and not np.isnan(np.delete(got, 3, axis=1)).any()


def test_float8_products_on_gfx942_take_its_float8_matrix_instructions(tmp_path):
    """On gfx942 (compiled here, never run: no AMD GPU) e4m3fn weights with a scale a row take the fp8
    implementation by default: the contraction is IREE's matmul of e4m3fnuz operands planned on
    MFMA_F32_16x16x32_F8E4M3FNUZ, symbolic rows included, and weights held by the module (a parameter) are
    converted once, in an initializer. Block scales, and gfx90a (no e4m3fnuz matrix instructions), keep the
    dequantizing product, with the reason in the summary."""
    for lead in ((64,), ("rows",), (1, "seq")):
        art = rocmc.compile(_fp8_graph("f16", 1, lead, weight="parameter"), "gfx942")
        names = [d["name"] for d in art.dispatches()]
        assert any("matmul_like" in n and "f8E4M3FNUZxf8E4M3FNUZxf32" in n for n in names), names
        assert [n for n in names if "i8xf8E4M3FNUZ" in n and n.startswith("_initializer")], names
        art.dump_ir(tmp_path / str(len(lead)))
        configured = (tmp_path / str(len(lead)) / "09.executable-configurations.mlir").read_text()
        assert "MFMA_F32_16x16x32_F8E4M3FNUZ" in configured
    art = rocmc.compile(_fp8_graph("f16", 2), "gfx942")
    assert "2 scales a weight row" in art.summary() and not any("f8E4M3FNUZ" in d["name"] for d in art.dispatches())
    art = rocmc.compile(_fp8_graph("f16", 1), "gfx90a")
    assert "gfx90a's matrix units take no e4m3fnuz" in art.summary()
