"""quantized_linear: 4- and 8-bit weights with per-group scales and zeros (and act-order's permutation of x)
against float64 through the generated lowering, with symbolic rows and odd sizes; the packed layout; the bad
input; and that on the GPU targets the dequantization is fused into the product's dispatch (compiled here)."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.frontend.ops.quant import dequantize, pack, unpack

from helpers import TOL, rand

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


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize(
    "bits,k,groups,bias,perm", [(4, 96, 3, True, True), (4, 64, 1, False, False), (8, 40, 5, True, False)]
)
def test_against_float64(rng, dtype, bits, k, groups, bias, perm):
    g = _graph(dtype, bits, k, groups, bias, perm)
    mod = rocmc.load(rocmc.compile(g, "cpu"))
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
    """The packed weight is what the product reads: one dispatch, no dequantized weight stored (on the CPU
    IREE 3.13 keeps it a dispatch of its own, a buffer of the call)."""
    g = _graph("f16", 4, 4096, 32, True, False, lead)
    names = [d["name"] for d in rocmc.compile(g, target).dispatches()]
    assert len(names) == 1 and f"{N}x32x128" in names[0], names


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
