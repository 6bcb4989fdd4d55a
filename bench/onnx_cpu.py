"""CPU latency of imported ONNX models: rocmc (rocmc.import_onnx, llvm-cpu, local-task) vs ONNX Runtime.

    python -m bench.onnx_cpu [--models mobilenet_v2,resnet50,bert,gpt2] [--threads 2] [--repeats 20]
                             [--baseline-impl conv2d=generated]

Each model is built in torch with seeded random weights, exported with torch.onnx.export (TorchScript
exporter, opset 17), imported by rocmc, compiled for the host CPU and checked against torch. Both
systems then run the same ONNX file in this one process with the same number of threads (ONNX
Runtime's intra-op pool; IREE's local-task workers, set with --task_topology_group_count before
rocmc opens the device): batch 1, warm-up calls, then the median of `repeats` calls, each on inputs
neither system has seen. Prints a markdown table. --baseline-impl adds a column for rocmc compiled
with those implementation overrides (e.g. the grouped conv instead of the depthwise form), timed in
the same run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

SEED = 0
SEQ = 128
WARMUP = 3


@dataclass
class Model:
    name: str
    module: object  # torch.nn.Module in eval mode
    inputs: Callable[[np.random.Generator], dict]  # fresh inputs, by ONNX input name
    output: str  # the output compared and timed


def _image(rng):
    return {"x": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)}


def _tokens(vocab: int):
    return lambda rng: {"input_ids": rng.integers(0, vocab, (1, SEQ), dtype=np.int64)}


def _last_hidden(model):
    """A transformers model as a module that returns only last_hidden_state (one ONNX output)."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).last_hidden_state

    return LastHidden().eval()


def _bert():
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(SEED)
    cfg = BertConfig(
        hidden_size=768,
        num_hidden_layers=4,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
        attn_implementation="eager",
    )
    return Model("bert", _last_hidden(BertModel(cfg, add_pooling_layer=False).eval()), _tokens(cfg.vocab_size), "y")


def _gpt2():
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(SEED)
    cfg = GPT2Config(n_embd=768, n_layer=4, n_head=12, n_positions=1024, attn_implementation="eager")
    return Model("gpt2", _last_hidden(GPT2Model(cfg).eval()), _tokens(cfg.vocab_size), "y")


def _vision(name: str):
    def build():
        from bench import torch_models

        return Model(name, torch_models.build(name, SEED), _image, "y")

    return build


MODELS = {"mobilenet_v2": _vision("mobilenet_v2"), "resnet50": _vision("resnet50"), "bert": _bert, "gpt2": _gpt2}


def export(model: Model, rng, path: Path) -> None:
    import torch

    example = {k: torch.from_numpy(v) for k, v in model.inputs(rng).items()}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is asked for
        torch.onnx.export(
            model.module,
            tuple(example.values()),
            str(path),
            input_names=list(example),
            output_names=[model.output],
            opset_version=17,
            dynamo=False,
        )


def torch_output(model: Model, feed: dict) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model.module(*(torch.from_numpy(v) for v in feed.values())).numpy()


def rel_error(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def median_ms(call: Callable[[dict], object], feeds: list) -> float:
    """Warm up on the first feeds, then time one call per fresh feed."""
    for feed in feeds[:WARMUP]:
        call(feed)
    times = []
    for feed in feeds[WARMUP:]:
        t = time.perf_counter()
        call(feed)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def rocmc_call(path: Path, name: str, impl=None):
    """Import, compile for the host CPU and load: a call on a feed {input name: array}."""
    import rocmc

    art = rocmc.compile(rocmc.import_onnx(path, name=name), "cpu", impl=impl)
    mod = rocmc.load(art, device="local-task")
    return lambda feed: mod(**feed)


def ort_call(path: Path, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return lambda feed: sess.run(None, feed)[0]


def bench(name: str, threads: int, repeats: int, work: Path, baseline: dict | None = None) -> dict:
    model = MODELS[name]()
    rng = np.random.default_rng(SEED)
    path = work / f"{name}.onnx"
    export(model, rng, path)
    systems = {"rocmc": rocmc_call(path, name), "ort": ort_call(path, threads)}
    if baseline:
        systems = {"base": rocmc_call(path, name, baseline), **systems}
    check = model.inputs(rng)
    want = torch_output(model, check)
    row = {"model": name}
    for key, call in systems.items():
        row[f"{key}_err"] = rel_error(call(check), want)
    for key, call in systems.items():  # one block per system: thread pools never overlap
        row[f"{key}_ms"] = median_ms(call, [model.inputs(rng) for _ in range(WARMUP + repeats)])
    return row


def table(rows: list, baseline: str | None) -> str:
    base = [f"rocmc ({baseline}) ms"] if baseline else []
    head = ["model", *base, "rocmc ms", "ORT ms", "rocmc / ORT", "rocmc rel. err", "ORT rel. err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"]] + ([f"{r['base_ms']:.2f}"] if baseline else [])
        cells += [
            f"{r['rocmc_ms']:.2f}",
            f"{r['ort_ms']:.2f}",
            f"{r['rocmc_ms'] / r['ort_ms']:.2f}",
            f"{r['rocmc_err']:.1e}",
            f"{r['ort_err']:.1e}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_impl(text: str) -> dict:
    """'conv2d=generated,conv1d=generated' -> {op: implementation}."""
    pairs = [p.split("=", 1) for p in text.split(",") if p]
    if not all(len(p) == 2 and all(p) for p in pairs):
        raise ValueError(f"expected op=implementation[,op=implementation...], got {text!r}")
    return dict(pairs)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--threads", type=int, default=2, help="threads for both systems")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per system (after warm-up)")
    ap.add_argument(
        "--baseline-impl", default="", help="also time rocmc with these implementation overrides, e.g. conv2d=generated"
    )
    a = ap.parse_args(argv)
    try:
        baseline = parse_impl(a.baseline_impl) or None
    except ValueError as e:
        ap.error(f"--baseline-impl: {e}")
    names = [m for m in a.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    import torch

    torch.set_num_threads(a.threads)
    import iree.runtime as rt

    rt.flags.parse_flags(f"--task_topology_group_count={a.threads}")  # before rocmc opens the device
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnx_cpu_") as tmp:
        for name in names:
            rows.append(bench(name, a.threads, a.repeats, Path(tmp), baseline))
            print(
                f"{name}: " + ", ".join(f"{k} {v:.3g}" for k, v in rows[-1].items() if k != "model"),
                file=sys.stderr,
                flush=True,
            )
    print(f"{a.threads} threads, batch 1, median of {a.repeats} calls after {WARMUP} warm-up calls\n")
    print(table(rows, a.baseline_impl or None))


if __name__ == "__main__":
    main()
