"""Imported torch/transformers exports on an NVIDIA GPU: the rewrite stage's fused ops and hand-written kernels
running for real. Compile here, run there (the GPU machine has no compiler).

    python -m bench.onnx_gpu compile [--dir out/onnx_gpu]   # exports (dynamic batch and sequence), imports,
        # compiles for cuda:sm_80 with and without the rewrite stage; saves inputs at two sizes, torch's
        # outputs (float64 model on the CPU) and each artifact's dispatch list
    python -m bench.onnx_gpu run [--dir out/onnx_gpu]       # GPU machine: runs both modules, checks them against
        # the float64 outputs (rows the attention mask keeps)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

CASES = [("llama", "dynamo"), ("qwen2", "torchscript"), ("gpt2", "torchscript"), ("bert", "dynamo")]
SIZES = ((2, 7), (3, 40))
TARGET = "cuda:sm_80"


def compile_all(out: Path) -> None:
    import torch

    import rocmc
    from tests import export_models as zoo

    out.mkdir(parents=True, exist_ok=True)
    index = []
    for family, exporter in CASES:
        rng = np.random.default_rng(0)
        model = zoo.build(family)
        inputs = [zoo.FAMILIES[family].inputs(rng, b, s) for b, s in SIZES]
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "m.onnx"
            zoo.export(model, family, exporter, True, path, inputs[0])
            graph = rocmc.import_onnx(path)
        model64 = model.double()
        with torch.no_grad():  # the float64 reference: the same weights, every op in float64
            refs = [model64(*(torch.from_numpy(a) for a in ins)).numpy() for ins in inputs]
        entry = {"family": family, "exporter": exporter, "sizes": SIZES, "modules": {}}
        for rewrite in (True, False):
            art = rocmc.compile(graph, TARGET, rewrite=rewrite)
            name = f"{family}_{'fused' if rewrite else 'plain'}.vmfb"
            art.save(out / name)
            entry["modules"][name] = {
                "rewrite": rewrite,
                "rewrites": [r["op"] for r in art.metadata.get("rewrites", [])],
                "dispatches": [(d["kind"], d["impl"], ",".join(d["ops"])) for d in art.dispatches()],
            }
        arrays = {f"in{i}_{j}": a for i, ins in enumerate(inputs) for j, a in enumerate(ins)}
        arrays.update({f"ref{i}": r for i, r in enumerate(refs)})
        np.savez(out / f"{family}.npz", **arrays)
        index.append(entry)
        print(family, exporter, {n: len(m["rewrites"]) for n, m in entry["modules"].items()}, flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1))


def run_all(out: Path) -> int:
    import rocmc
    from tests import export_models as zoo

    bad = 0
    for entry in json.loads((out / "index.json").read_text()):
        data = np.load(out / f"{entry['family']}.npz")
        n_in = len(zoo.FAMILIES[entry["family"]].names)
        for name, info in entry["modules"].items():
            mod = rocmc.load(out / name)
            for i, _ in enumerate(entry["sizes"]):
                ins = [data[f"in{i}_{j}"] for j in range(n_in)]
                ref = data[f"ref{i}"]
                got = mod(*ins)
                keep = zoo.valid_rows(entry["family"], ins)
                g, r = (got, ref) if keep is None else (got[keep], ref[keep])
                err = float(np.abs(g - r).max() / np.abs(r).max())
                bad += err > 1e-4
                print(
                    f"{entry['family']:<6} {name:<18} size {entry['sizes'][i]}: rel. error vs float64 {err:.1e}",
                    flush=True,
                )
        fused = [k for k in entry["modules"] if entry["modules"][k]["rewrite"]][0]
        print(
            f"  {fused}: rewrites {sorted(set(entry['modules'][fused]['rewrites']))}; hand-written: "
            f"{sorted({d[2] for d in entry['modules'][fused]['dispatches'] if d[0] == 'hand-written'})}"
        )
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("compile", "run"))
    ap.add_argument("--dir", default=str(ROOT / "out" / "onnx_gpu"))
    a = ap.parse_args(argv)
    if a.mode == "compile":
        compile_all(Path(a.dir))
        return 0
    return run_all(Path(a.dir))


if __name__ == "__main__":
    sys.exit(main())
