"""Real exports through rocmc: every family of tests/export_models.py, both of torch's ONNX exporters,
static and dynamic shapes. Each case is exported, imported, compiled for the host CPU and run at two
input sizes (the exported one and another, for dynamic exports) against torch; the table says what
imported, how close it is, and which nodes the rewrite stage recognised.

    python -m bench.onnx_exports [--families llama,gpt2] [--exporters dynamo] [--out FILE.md] [-j JOBS]
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import sys
import tempfile
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from tests import export_models as zoo

SIZES = ((2, 7), (3, 12))
HEADER = """# Real exports through rocmc

Every family of `tests/export_models.py` (transformers' Llama, Qwen2, Mistral, Gemma, Phi, GPT-2, BERT,
DistilBERT, T5 encoder, ViT, CLIP vision, Whisper encoder, MobileNetV2, ResNet, ConvNeXt; SqueezeNet in plain
torch.nn), 2 layers / tiny widths, seeded random weights, exported by both of torch's ONNX exporters
(TorchScript, opset 17; dynamo, opset 18) with static shapes and with dynamic batch (and sequence) axes. Each
export is imported, compiled for the host CPU (rewrite stage on) and compared with torch at (batch, seq) = (2, 7)
and, for dynamic exports, also at (3, 12); text models have one left-padded row, and only the positions the
attention mask keeps are compared (a fully padded query row is whatever the exporter's mask arithmetic makes of
it: torch and ONNX Runtime differ there, and rocmc matches ONNX Runtime). The last column is what the rewrite
stage recognised (`art.summary()`). torch 2.13.0, transformers 5.24.0, onnxscript 0.7.2; {date}.
Regenerate with `python -m bench.onnx_exports --out docs/onnx-exports.md -j 2`;
CI runs a fixed subset in `tests/onnx/test_onnx_exports.py`.
"""  # (batch, seq): the export's, then another for dynamic exports


def rel_error(got, ref) -> float:
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def run_case(family: str, exporter: str, dynamic: bool) -> dict:
    import rocmc

    out = {"family": family, "exporter": exporter, "dynamic": dynamic}
    rng = np.random.default_rng(0)
    try:
        model = zoo.build(family)
        example = zoo.FAMILIES[family].inputs(rng, *SIZES[0])
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "model.onnx"
            try:
                zoo.export(model, family, exporter, dynamic, path, example)
            except Exception as e:  # noqa: BLE001 - torch's exporter failing is reported, not rocmc's failure
                out["status"] = "torch export failed"
                out["why"] = [_plain(line) for line in str(e).splitlines() if "Error" in line][-1:]
                return out
            graph = rocmc.import_onnx(path)
        art = rocmc.compile(graph)
        out.update(against_torch(art, model, family, example, rng, dynamic))
    except Exception as e:  # noqa: BLE001 - the table reports every failure
        out["status"] = type(e).__name__
        out["why"] = str(e).splitlines()[:6] if str(e) else traceback.format_exc().splitlines()[-3:]
    return out


def against_torch(art, model, family: str, example, rng, dynamic: bool) -> dict:
    """The compiled module against the eager model at the example's size (and another one when the
    import is dynamic), on the rows the attention mask keeps: {error, status, rewrites}."""
    import rocmc

    module = rocmc.load(art)
    errors = []
    for batch, seq in SIZES[: 2 if dynamic else 1]:
        inputs = example if (batch, seq) == SIZES[0] else zoo.FAMILIES[family].inputs(rng, batch, seq)
        got, ref = module(*inputs), zoo.run_torch(model, inputs)
        got = got[0] if isinstance(got, tuple) else got
        keep = zoo.valid_rows(family, inputs)
        errors.append(rel_error(got, ref) if keep is None else rel_error(got[keep], ref[keep]))
    error = max(errors)
    return {"error": error, "status": "ok" if error < 1e-4 else "mismatch", "rewrites": rewrites_of(art)}


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def rewrites_of(art) -> str:
    counts: dict = {}
    for r in art.metadata.get("rewrites", []) if hasattr(art, "metadata") else []:
        counts[r.get("op", "?")] = counts.get(r.get("op", "?"), 0) + 1
    return ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(zoo.FAMILIES))
    ap.add_argument("--exporters", default=",".join(zoo.EXPORTERS))
    ap.add_argument("--shapes", default="static,dynamic")
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    cases = [
        (f, e, s == "dynamic")
        for f in a.families.split(",")
        for e in a.exporters.split(",")
        for s in a.shapes.split(",")
    ]
    results = run_all(run_case, cases, a.jobs, ("family", "exporter", "shapes"))
    ok = sum(r["status"] == "ok" for r in results)
    exported = sum(r["status"] != "torch export failed" for r in results)
    report(
        a.out,
        HEADER,
        f"**{ok} of the {exported} exports torch made import, compile and match torch at 1e-4 "
        f"relative** ({len(results) - exported} of {len(results)} cases failed in torch's exporter)",
        results,
        ("family", "exporter", "shapes"),
    )
    return 0 if ok == exported else 1


def _column(r: dict, key: str) -> str:
    return ("dynamic" if r["dynamic"] else "static") if key == "shapes" else str(r[key])


def run_all(run_case, cases, jobs: int, keys) -> list:
    """run_case(*case) for every case in `jobs` fresh interpreters (torch's threads do not survive a
    fork), printing each outcome as it comes."""
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = []
        for r in pool.map(run_case, *zip(*cases)):
            print(f"{' '.join(_column(r, k) for k in keys)}: {r['status']}", flush=True)
            results.append(r)
    return results


def report(out, header: str, summary: str, results, keys) -> None:
    """The results as a markdown table under `summary`, printed and, with `out`, written after `header`."""
    lines = [
        summary,
        "",
        "| " + " | ".join(keys) + " | status | max rel. error | recognised by the rewrite stage |",
        "|---" * (len(keys) + 3) + "|",
    ]
    for r in results:
        err = f"{r['error']:.1e}" if "error" in r else ""
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {' / '.join(r.get('why', []))[:300]}"
        lines.append("| " + " | ".join([_column(r, k) for k in keys] + [status, err, r.get("rewrites", "")]) + " |")
    text = "\n".join(lines)
    print(text)
    if out:
        import datetime

        Path(out).write_text(header.format(date=datetime.date.today().isoformat()) + "\n" + text + "\n")


if __name__ == "__main__":
    sys.exit(main())
