"""torch.export programs through rocmc: every family of tests/export_models.py, imported with static shapes
and with dynamic batch (and sequence) Dims, compiled for the host CPU and run against the eager module at
two input sizes (one for static imports); the table says what imported, how close it is, and what the
rewrite stage recognised.

    python -m bench.torch_exports [--families llama,gpt2] [--shapes static,dynamic] [--out FILE.md] [-j JOBS]
"""

from __future__ import annotations

import argparse
import sys
import traceback

import numpy as np

from bench.onnx_exports import SIZES, against_torch, report, run_all
from tests import export_models as zoo

HEADER = """# torch.export programs through rocmc

Every family of `tests/export_models.py` (the same 16 as docs/onnx-exports.md), 2 layers / tiny widths, seeded
random weights, imported with `rocmc.import_torch` (torch.export, core ATen opset) with static shapes and with
dynamic batch (and sequence) `torch.export.Dim`s, compiled for the host CPU (rewrite stage on) and compared with
the eager module at (batch, seq) = (2, 7) and, for dynamic imports, also at (3, 12), on the positions the
attention mask keeps. The last column is what the rewrite stage recognised. torch 2.13.0, transformers 5.24.0;
{date}. Regenerate with `python -m bench.torch_exports --out docs/torch-exports.md -j 2`; CI compiles all but
three CNNs (`tests/torch/test_torch_import.py`).

How each model was exported and imported: `tests/export_models.py` builds the family's transformers (or
torch.nn) model and wraps it in a small `Wrapped` module whose `forward` takes the example inputs
positionally — `(input_ids, attention_mask)` for the text families, `pixels` for the vision ones, `features`
for Whisper's encoder — calls the model with keyword arguments (text: `input_ids=`, `attention_mask=`, plus
`use_cache=False` where the model's config has `use_cache`; vision: `pixel_values=`; Whisper:
`input_features=`) and returns one tensor
field of its output: `logits` for the causal LMs (Llama, Qwen2, Mistral, Gemma, Phi, GPT-2),
`last_hidden_state` for BERT, DistilBERT, T5's encoder, ViT, CLIP's vision tower and Whisper's encoder,
`pooler_output` for MobileNetV2, ResNet and ConvNeXt (SqueezeNet is plain torch.nn, unwrapped). The table's
call is `rocmc.import_torch(wrapped, tuple_of_tensors)` for static shapes and adds
`dynamic_shapes=export_models.torch_dynamic_shapes(family, wrapped)` for dynamic ones: one
`torch.export.Dim(name, min=1, max=64)` per axis name (`batch`, `seq`), shared by the inputs that have the
axis (for the text families, whose `forward` takes `*args`, nested in a 1-tuple). No `kwargs=` were passed.

The wrapper is not needed: `rocmc.import_torch` takes a transformers model as loaded
(`AutoModelForCausalLM.from_config(...)` or `.from_pretrained(dir)`), binds keyword arguments that hold no
tensor (`use_cache=False`) into the export as constants and drops outputs that are not tensors (the
`DynamicCache`, `None` fields), so a causal LM's graph returns its logits. That path is checked by
`tests/torch/test_torch_import.py::test_hf_causal_lm_as_loaded` (Llama from `from_config`, Qwen2 through
`save_pretrained`/`from_pretrained`, an unbounded `Dim("seq")`, odd lengths, against the float64 eager model),
not by this table.
"""


def run_case(family: str, dynamic: bool) -> dict:
    import torch
    import rocmc

    out = {"family": family, "dynamic": dynamic}
    rng = np.random.default_rng(0)
    try:
        model = zoo.build(family)
        example = zoo.FAMILIES[family].inputs(rng, *SIZES[0])
        shapes = zoo.torch_dynamic_shapes(family, model) if dynamic else None
        graph = rocmc.import_torch(model, tuple(torch.from_numpy(a) for a in example), dynamic_shapes=shapes)
        art = rocmc.compile(graph)
        out.update(against_torch(art, model, family, example, rng, dynamic))
    except Exception as e:  # noqa: BLE001 - the table reports every failure
        out["status"] = type(e).__name__
        out["why"] = str(e).splitlines()[:6] if str(e) else traceback.format_exc().splitlines()[-3:]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(zoo.FAMILIES))
    ap.add_argument("--shapes", default="static,dynamic")
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    cases = [(f, s == "dynamic") for f in a.families.split(",") for s in a.shapes.split(",")]
    results = run_all(run_case, cases, a.jobs, ("family", "shapes"))
    ok = sum(r["status"] == "ok" for r in results)
    report(
        a.out,
        HEADER,
        f"**{ok} of {len(results)} imports compile and match the eager module at 1e-4 relative**",
        results,
        ("family", "shapes"),
    )
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
