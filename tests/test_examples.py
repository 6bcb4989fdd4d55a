"""The example models run end to end on the CPU and match the float64 reference; they compile for gfx942."""

import runpy
from pathlib import Path

import numpy as np
import pytest

import rocmc

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def build(name, **kw):
    return runpy.run_path(str(EXAMPLES / name), run_name="example")["build_graph"](**kw)


@pytest.mark.parametrize("dtype,tol", [("f32", 1e-4), ("f16", 2e-2)])
def test_llama_block_on_cpu(dtype, tol, rng):
    g = build("llama_block.py", hidden=256, heads=4, kv_heads=2, max_seq=64, dtype=dtype)
    x = rng.standard_normal((1, 19, 256)).astype(rocmc.dtype(dtype).np)
    y = rocmc.load(rocmc.compile(g, "cpu"))(x)
    ref = rocmc.evaluate(g, x)
    assert y.shape == ref.shape == (1, 19, 256)
    assert np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max() < tol


def test_llama_block_compiles_for_gfx942():
    g = build("llama_block.py", hidden=256, heads=4, kv_heads=2, max_seq=64, dtype="f16")
    art = rocmc.compile(g, "gfx942")
    ops_in_dispatches = {op for d in art.dispatches() for op in d["ops"]}
    # its x @ W products of constant weights are linear layers after the rewrite stage (skip connections fused)
    assert {"rms_norm", "linear", "fused_linear", "sdpa", "rope"} <= ops_in_dispatches


def test_resnet_block_on_cpu(rng):
    g = build("resnet_block.py", channels=8, size=23)
    x = rng.standard_normal((2, 3, 23, 23)).astype(np.float32)
    y = rocmc.load(rocmc.compile(g, "cpu"))(x)
    ref = rocmc.evaluate(g, x)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_resnet_block_compiles_for_gfx942():
    assert rocmc.compile(build("resnet_block.py", channels=8, size=23), "gfx942").vmfb
