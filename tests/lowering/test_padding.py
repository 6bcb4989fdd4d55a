"""Symbolic contraction sizes are padded to a tile multiple (rocmc/lowering/codegen/padding.py: 64 on
GPUs, 16 on the CPU), and GPU modules pick the sdpa form at run time by the score matrix's size
(attention.py). The numbers are the GPU's
(tests/gpu on an NVIDIA GPU, BENCHMARKS.md); here: the CPU semantics of the same graphs against
float64, the "decomposed" sdpa implementation on the CPU, and the shape of the GPU modules' IR.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import rocmc
from rocmc import ops, symbolic

from helpers import check, compile_gpu, rand

CUDA = "cuda:sm_80"


def _matmul(shapes, dtype="f16", **kw):
    g = rocmc.Graph("mm")
    ins = [g.input(f"x{i}", sh, dtype) for i, sh in enumerate(shapes)]
    g.output(ops.matmul(*ins, **kw))
    return g


def _linear(rows=("b", "s"), dtype="f32"):
    g = rocmc.Graph("lin")
    x = g.input("x", (*rows, 96), dtype)
    g.output(ops.linear(x, g.input("w", (80, 96), dtype), g.input("b", (80,), dtype)))
    return g


def _sdpa(s="s", skv="s", causal=False, mask=None, dtype="f16"):
    g = rocmc.Graph("sdpa")
    q = g.input("q", (1, 4, s, 32), dtype)
    k = g.input("k", (1, 2, skv, 32), dtype)
    v = g.input("v", (1, 2, skv, 32), dtype)
    m = g.input("mask", (s, skv), "bool" if mask == "bool" else dtype) if mask else None
    g.output(ops.sdpa(q, k, v, mask=m, is_causal=causal))
    return g


# These tests are about IREE's generated contractions and attention (GEMMs of this size would call the
# GEMM library on GPU targets by default).
GENERATED = {"matmul": "generated", "linear": "generated", "sdpa": "generated"}


def _input_ir(g, **kw) -> str:
    return rocmc.compile(g, CUDA, **{"impl": GENERATED, **kw}).ir("input")


@pytest.mark.parametrize(
    "shapes,kw,padded",
    [
        (((1, "s", 64), (64, 48)), {}, 1),  # M
        ((("s", "t"), ("t", "u")), {}, 2),  # M, N and K (both operands)
        ((("t", "s"), (40, "t")), {"transpose_a": True, "transpose_b": True}, 2),
        (((3, 7, 64), (64, 48)), {}, 0),  # static: left alone
    ],
)
def test_symbolic_contraction_sizes_are_padded_and_hinted_on_gpus(shapes, kw, padded):
    ir = _input_ir(_matmul(shapes, **kw))
    assert ir.count("tensor.pad") == padded
    assert ir.count("udiv = 64") >= padded
    if padded:
        assert "tensor.extract_slice" in ir and "flow.tensor.tie_shape" in ir
    rng = np.random.default_rng(5)
    sizes = {"s": 37, "t": 29, "u": 53}
    check(_matmul(shapes, **kw), *[rand(rng, tuple(sizes.get(d, d) for d in sh), "f16") for sh in shapes])


def test_linear_pads_the_last_symbolic_row_dim_and_keeps_the_bias():
    ir = _input_ir(_linear())
    assert ir.count("tensor.pad") == 1 and "udiv = 64" in ir
    rng = np.random.default_rng(6)
    check(_linear(), rand(rng, (2, 37, 96)), rand(rng, (80, 96)), rand(rng, (80,)))


def test_cpu_modules_pad_to_16_and_compile_with_data_tiling():
    art = rocmc.compile(_matmul(((1, "s", 64), (64, 48))), "cpu")
    ir = art.ir("input")
    assert ir.count("tensor.pad") == 1 and "udiv = 16" in ir
    assert "--iree-opt-data-tiling" in art.metadata["compile_flags"] and "compile_note" not in art.metadata


def _functions(ir: str) -> dict:
    """func name -> body text."""
    parts = re.split(r"^func\.func @(\w+)", ir, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_gpu_sdpa_with_symbolic_keys_has_a_long_form_chosen_at_run_time():
    art = rocmc.compile(_sdpa(causal=True), CUDA)
    fns = _functions(art.ir("input"))
    assert "iree_linalg_ext.attention" not in fns["main"] and "iree_linalg_ext.attention" in fns["main_long"]
    long = art.metadata["long_form"]
    assert long["function"] == "main_long" and long["scores"] == [[1, 4, "s", "s"]] and long["limit"] == 1 << 28
    assert {"main", "main_long"} <= set(re.findall(r"@(main\w*)\(", art.ir("vm")))
    # a static key length keeps the fused op alone, in one function
    art = rocmc.compile(_sdpa(s=64, skv=64), CUDA)
    assert "long_form" not in art.metadata and "tensor.pad" not in art.ir("input")
    assert list(_functions(art.ir("input"))) == ["main"]


def test_long_form_choice_follows_the_score_count():
    from rocmc.runtime.module import _long_form, _too_long

    long = _long_form({"function": "main_long", "scores": [[1, 4, "s", "t"]], "limit": 1000})
    assert not _too_long(long, {"s": 10, "t": 25}) and _too_long(long, {"s": 10, "t": 26})


@pytest.mark.parametrize("mask", [None, "bool", "add"])
def test_padded_keys_are_masked_out(mask):
    """Padded keys must be dropped in both branches: the mask operand exists and compares with skv."""
    ir = _input_ir(_sdpa(mask=mask))
    assert ir.count("arith.cmpi ult") >= 2  # the key guard, once per function
    if mask == "add":
        assert "0xFC00" in ir  # the user mask padded with -inf (f16)


@pytest.mark.parametrize(
    "causal,mask,dtype", [(True, None, "f16"), (False, "bool", "f32"), (False, "add", "f16"), (False, None, "bf16")]
)
def test_decomposed_implementation_matches_float64(causal, mask, dtype):
    rng = np.random.default_rng(7)
    s, skv = 37, 37
    ins = [rand(rng, (1, 4, s, 32), dtype), rand(rng, (1, 2, skv, 32), dtype), rand(rng, (1, 2, skv, 32), dtype)]
    if mask == "bool":
        keep = rng.random((s, skv)) < 0.7
        keep[:, 0] = True
        ins.append(keep)
    elif mask == "add":
        ins.append(rand(rng, (s, skv), dtype))
    g = _sdpa(causal=causal, mask=mask, dtype=dtype)
    check(g, *ins, impl={"sdpa": "decomposed"})
    compile_gpu(g, impl={"sdpa": "decomposed"})
    art = rocmc.compile(g, CUDA, impl={"sdpa": "decomposed"})
    assert [i["impl"] for i in art.implementations if i["op"] == "sdpa"] == ["decomposed"]
    assert "iree_linalg_ext.attention" not in art.ir("input") and "long_form" not in art.metadata


def test_a_divisibility_the_graph_assumes_is_a_hint_to_iree(rng):
    """An input dim the graph assumes divisible by a constant (torch.export's Dim 8*k) reaches IREE as
    `util.assume.int ... udiv = 8` on the size tied to the input, after the check that asserts it."""
    g = _linear()
    g.assume(symbolic.Constraint("input dim s (torch.export dim 8*k)", "divisible", symbolic.Sym("s"), symbolic.Int(8)))
    ir = _input_ir(g)
    assert "udiv = 8" in ir and "flow.tensor.tie_shape %arg0" in ir
    check(g, rand(rng, (2, 16, 96)), rand(rng, (80, 96)), rand(rng, (80,)))
    with pytest.raises(rocmc.InputError, match="not divisible by 8"):
        rocmc.load(rocmc.compile(g, "cpu"))(rand(rng, (2, 12, 96)), rand(rng, (80, 96)), rand(rng, (80,)))
