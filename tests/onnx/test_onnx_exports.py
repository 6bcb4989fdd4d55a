"""Models exported by the real tools import, compile for the CPU and match torch.

A fixed subset of tests/export_models.py's families x exporters x shapes (bench/onnx_exports.py runs
them all): each is made with transformers/torch at a tiny config, exported by torch's TorchScript or
dynamo ONNX exporter, imported, compiled, and compared with torch at 1e-4 relative, for a dynamic export
also at a second (batch, sequence) size. (tests/rewrite/test_rewrite.py checks what the rewrite stage recognises
in Llama exports, static and dynamic, and that a gfx942 build gets the hand-written kernels.)
"""

import numpy as np
import pytest

import rocmc

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx")

import export_models as zoo  # noqa: E402

SIZES = ((2, 7), (3, 12))

CASES = [
    ("llama", "torchscript", False),
    ("qwen2", "torchscript", True),
    ("gpt2", "torchscript", True),
    ("bert", "dynamo", True),
    ("phi", "dynamo", False),
    ("vit", "torchscript", True),
    ("whisper_encoder", "dynamo", False),
    ("mobilenet_v2", "torchscript", True),
    ("squeezenet", "dynamo", False),
]


def _rel(got, ref) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize(
    "family, exporter, dynamic", CASES, ids=[f"{f}-{e}-{'dynamic' if d else 'static'}" for f, e, d in CASES]
)
def test_export_matches_torch(family, exporter, dynamic, rng, tmp_path):
    model = zoo.build(family)
    example = zoo.FAMILIES[family].inputs(rng, *SIZES[0])
    zoo.export(model, family, exporter, dynamic, tmp_path / "model.onnx", example)
    graph = rocmc.import_onnx(tmp_path / "model.onnx")
    if dynamic:
        assert graph.symbols(), "a dynamic export keeps symbolic dims"
    module = rocmc.load(rocmc.compile(graph))
    for batch, seq in SIZES[: 2 if dynamic else 1]:
        inputs = example if (batch, seq) == SIZES[0] else zoo.FAMILIES[family].inputs(rng, batch, seq)
        got, ref = module(*inputs), zoo.run_torch(model, inputs)
        assert got.shape == ref.shape
        keep = zoo.valid_rows(family, inputs)
        err = _rel(got, ref) if keep is None else _rel(got[keep], ref[keep])
        assert err < 1e-4, f"{family} at batch {batch}, seq {seq}: relative error {err:.2e}"
