"""The default suite's guard for tests/gpu: representative GPU test graphs (a hand-written kernel, a
cuDNN extern call, a GEMM library call) compile for cuda:sm_80 through the compile step, which writes
the module and its manifest entry. The full compile step is `pytest tests/gpu --gpu-compile DIR`."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("iree.compiler", reason="the compile step needs iree-base-compiler")

from gpu_harness import MANIFEST, Compiler  # noqa: E402
import test_gpu_extern  # noqa: E402
import test_gpu_gemm  # noqa: E402
import test_gpu_kernels  # noqa: E402

REPRESENTATIVE = {
    "kernel.layer_norm_f16_odd": test_gpu_kernels,
    "extern.fused_conv2d_block_f16": test_gpu_extern,
    "gemm.sdpa_gqa_causal_bf16": test_gpu_gemm,
}


def test_representative_gpu_test_graphs_compile_for_cuda(tmp_path):
    step = Compiler(tmp_path)
    for name, module in REPRESENTATIVE.items():
        step(next(c for c in module.CASES if c.name == name))
    step.write()
    manifest = json.loads((tmp_path / MANIFEST).read_text())["cases"]
    assert sorted(manifest) == sorted(REPRESENTATIVE)
    for name in REPRESENTATIVE:
        assert (tmp_path / f"{name}.vmfb").stat().st_size > 0
    assert manifest["kernel.layer_norm_f16_odd"]["kernels"]
    assert "dnn.fused_conv2d.f16" in manifest["extern.fused_conv2d_block_f16"]["imports"]
    assert manifest["gemm.sdpa_gqa_causal_bf16"]["inputs"]["77"][0] == [[2, 8, 77, 64], "bfloat16"]
