"""Quantized decode on a GPU: a 7B Llama as GPTQ 4-bit (groups of 128) against the same shape in f16, one row,
side by side in one process: tokens/s of a decode step after a 512-token prompt, each against its own byte bound
(what a step reads: the weights as stored on the device, packed integers, scales and zeros for the quantized
projections, plus the row's keys and values) at the device's copy bandwidth (bench/llm_gpu.py's measure).

The checkpoints are made on the GPU machine from seeded random numbers: bench/llm_gpu.py's f16 one, and a GPTQ
one of the same config whose packed integers, zeros and scales are random (weights of the f16 one's spread).

    python -m bench.quant_gpu compile --dir out/quant --targets cuda:sm_80          # here (both modules)
    python3 -m bench.quant_gpu run --dir out/quant --json out.json                  # GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.llm_gpu import SHAPES, fill_slots, time_decode, write_checkpoint

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq"}  # fmt: skip
PROMPT, STEPS = 512, 64


def config(shape: str = "7b") -> dict:
    """The Llama config bench/llm_gpu.py compiles for `shape`."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPES[shape], "hidden_act": "silu",
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "torch_dtype": "float16", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False, "mlp_bias": False,
    }  # fmt: skip


def write_gptq(cfg: dict, d: Path, seed: int = 1) -> None:
    """A GPTQ 4-bit checkpoint of `cfg`: values round(N(8, 3)) clipped to [0, 15] about the symmetric zero 8 (v1
    stores 7), scales giving weights of std ~0.02 with no per-group bias (uniform values and zeros drift the
    activations of 32 layers past f16's range)."""
    import rocmc
    from rocmc.llm.quant import _pack_words, write_safetensors

    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": GPTQ}))
    lc = rocmc.llm.config.LlmConfig.from_json({**cfg, "quantization_config": GPTQ})
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in rocmc.llm.config.param_names(lc):
        kind = name.rsplit(".", 1)[1]
        if kind == "qweight":
            values = np.clip(np.round(rng.normal(8.0, 3.0, (shape[0] * 8, shape[1]))), 0, 15).astype(np.uint8)
            out[name] = _pack_words(values, 4)
        elif kind == "qzeros":
            out[name] = np.full(shape, 0x77777777, np.int32)
        elif kind == "g_idx":
            out[name] = (np.arange(shape[0]) // 128).astype(np.int32)
        elif kind == "scales":
            out[name] = np.full(shape, 0.02 / 3.0, np.float16)
        else:
            x = rng.standard_normal(shape, dtype=np.float32) * (0.02 if len(shape) > 1 else 0.01)
            out[name] = (x + (1.0 if len(shape) == 1 else 0.0)).astype(np.float16)
    write_safetensors(d / "model.safetensors", out)


def compile_modules(directory: Path, target: str, cfg: dict) -> None:
    import rocmc

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    for name, c in (("f16", cfg), ("gptq4", {**cfg, "quantization_config": GPTQ})):
        lc = rocmc.llm.config.LlmConfig.from_json(c)
        t = time.perf_counter()
        art = rocmc.llm.compile_hf(lc, target, max_seq_len=1024, dtype="f16")
        art.save(directory / f"{name}.vmfb")
        print(name, f"{time.perf_counter() - t:.1f} s", art.call_structure()["decode"].describe(), flush=True)


def step_bytes(lm, position: int) -> int:
    """What a decode step reads: the weights as the device holds them, and the row's keys and values."""
    from rocmc.llm.runtime import weight_bytes

    cfg = lm.config
    kv = 2 * cfg.num_hidden_layers * position * cfg.kv_dim * 2
    return weight_bytes(cfg, "f16") + kv


def measure(name: str, module: Path, ckpt: Path, bandwidth: float, device: str = "cuda") -> dict:
    import rocmc

    t = time.perf_counter()
    lm = rocmc.llm.load(module, ckpt, device=device)
    load_s = time.perf_counter() - t
    rng = np.random.default_rng(5)
    prompt = [int(x) for x in rng.integers(3, lm.config.vocab_size, PROMPT)]
    times, last = time_decode(lm, *fill_slots(lm, [prompt]), STEPS)
    step = statistics.median(times[4:])
    bytes_ = step_bytes(lm, PROMPT + STEPS // 2)
    out = {
        "load_s": load_s,
        "step_ms": 1e3 * step,
        "tok_s": 1 / step,
        "step_bytes": bytes_,
        "bound_tok_s": bandwidth / bytes_,
        "of_bound": bytes_ / bandwidth / step,
        "last_token": int(last[0]),
        "finite": bool(np.isfinite(lm.logits(prompt[:16])).all()),
    }
    print(name, json.dumps(out), flush=True)
    del lm
    return out


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth (bytes/s) of a 1 GiB buffer, as bench/llm_gpu.py measures it."""
    import torch

    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * a.numel() * 20 / (time.perf_counter() - t)


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--dir", required=True)
    c.add_argument("--targets", default="cuda:sm_80")
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--json", required=True)
    r.add_argument("--ckpt", default="/tmp/quant_ckpt")
    a = ap.parse_args()
    if a.cmd == "compile":
        for target in a.targets.split(","):
            compile_modules(Path(a.dir), target, config())
        return 0
    cfg = json.loads((Path(a.dir) / "config.json").read_text())
    bw = copy_bandwidth()
    out = {"copy_bandwidth_GBs": bw / 1e9}
    for name, write in (("gptq4", write_gptq), ("f16", write_checkpoint)):
        t = time.perf_counter()
        write(cfg, Path(a.ckpt) / name)
        out[name + "_checkpoint_s"] = time.perf_counter() - t
        out[name] = measure(name, Path(a.dir) / f"{name}.vmfb", Path(a.ckpt) / name, bw)
        Path(a.json).write_text(json.dumps(out, indent=1))
    out["speedup"] = out["gptq4"]["tok_s"] / out["f16"]["tok_s"]
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("copy_bandwidth_GBs", "speedup")}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
