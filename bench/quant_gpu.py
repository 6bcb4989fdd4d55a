"""Quantized decode on a GPU: a 7B Llama as GPTQ 4-bit (groups of 128) against the same shape in f16, one row,
side by side in one process: tokens/s of a decode step after a 512-token prompt, each against its own byte bound
(what a step reads: the weights as stored on the device, packed integers, scales and zeros for the quantized
projections, plus the row's keys and values) at the device's copy bandwidth (bench/llm_gpu.py's measure); and
the 512-token prefill of each (median of 5, the prompt alone in a fresh slot), against f16's.

The checkpoints are made on the GPU machine from seeded random numbers: bench/llm_gpu.py's f16 one, and a GPTQ
one of the same config whose packed integers, zeros and scales are random (weights of the f16 one's spread).

    python -m bench.quant_gpu compile --dir out/quant --targets cuda:sm_80 [--batches 1,8]   # here
    python3 -m bench.quant_gpu run --dir out/quant --json out.json [--profile]      # GPU machine
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from bench.llm_gpu import (
    SHAPES,
    OnePrompt,
    copy_bandwidth,
    fill_slots,
    kernel_profile,
    read_tokens,
    time_decode,
    time_decode_ahead,
    write_checkpoint,
)

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq"}  # fmt: skip
MODULES = {"gptq4": {**GPTQ, "bits": 4}, "gptq8": {**GPTQ, "bits": 8}}
PROMPT, STEPS, PREFILLS = 512, 64, 5


def config(shape: str = "7b") -> dict:
    """The Llama config bench/llm_gpu.py compiles for `shape`."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPES[shape], "hidden_act": "silu",
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "torch_dtype": "float16", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False, "mlp_bias": False,
    }  # fmt: skip


def write_gptq(cfg: dict, d: Path, seed: int = 1, bits: int = 4) -> None:
    """A GPTQ checkpoint of `cfg`: 4-bit values round(N(8, 3)) clipped to [0, 15] about the symmetric zero 8 (v1
    stores 7), or 8-bit ones round(N(128, 48)) in [0, 255] about 128; scales giving weights of std ~0.02 with no
    per-group bias (uniform values and zeros drift the activations of 32 layers past f16's range). The layers share
    one draw of each packed tensor (drawing 6.5e9 values took 3 minutes): the speed is the same."""
    gptq = MODULES[f"gptq{bits}"]
    mid, top = 1 << (bits - 1), (1 << bits) - 1
    import rocmc
    from rocmc.llm.quant import _pack_words, write_safetensors

    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": gptq}))
    lc = rocmc.llm.config.LlmConfig.from_json({**cfg, "quantization_config": gptq})
    rng = np.random.default_rng(seed)
    out, drawn = {}, {}
    for name, shape in rocmc.llm.config.param_names(lc):
        kind = name.rsplit(".", 1)[1]
        if kind == "qweight":
            if (name.rsplit(".", 2)[1], shape) not in drawn:
                spread = rng.normal(mid, 3.0 * mid / 8, (shape[0] * 32 // bits, shape[1]))
                drawn[name.rsplit(".", 2)[1], shape] = _pack_words(
                    np.clip(np.round(spread), 0, top).astype(np.uint8), bits
                )
            out[name] = drawn[name.rsplit(".", 2)[1], shape]
        elif kind == "qzeros":
            word = sum((mid - 1) << (bits * i) for i in range(32 // bits))  # v1 stores zero - 1 in every field
            out[name] = np.full(shape, word, np.uint32).view(np.int32)
        elif kind == "g_idx":
            out[name] = (np.arange(shape[0]) // 128).astype(np.int32)
        elif kind == "scales":
            out[name] = np.full(shape, 0.02 / (3.0 * mid / 8), np.float16)
        else:
            x = rng.standard_normal(shape, dtype=np.float32) * (0.02 if len(shape) > 1 else 0.01)
            out[name] = (x + (1.0 if len(shape) == 1 else 0.0)).astype(np.float16)
    write_safetensors(d / "model.safetensors", out)


def compile_modules(directory: Path, target: str, cfg: dict, batches=(1,)) -> None:
    import rocmc

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    for name, c in (("f16", cfg), *((n, {**cfg, "quantization_config": q}) for n, q in MODULES.items())):
        lc = rocmc.llm.config.LlmConfig.from_json(c)
        for b in batches:
            t = time.perf_counter()
            art = rocmc.llm.compile_hf(lc, target, max_seq_len=1024, dtype="f16", max_batch=b)
            art.save(directory / module_name(name, b))
            print(name, b, f"{time.perf_counter() - t:.1f} s", art.call_structure()["decode"].describe(), flush=True)


def module_name(name: str, batch: int) -> str:
    return f"{name}.vmfb" if batch == 1 else f"{name}_b{batch}.vmfb"


def step_bytes(lm, positions) -> int:
    """What a decode step reads: the weights as the device holds them, and each row's keys and values."""
    from rocmc.llm.runtime import weight_bytes

    cfg = lm.config
    kv = 2 * cfg.num_hidden_layers * sum(positions) * cfg.kv_dim * 2
    return weight_bytes(cfg, "f16") + kv


def measure(name: str, module: Path, ckpt: Path, bandwidth: float, device: str = "cuda", profile: bool = False) -> dict:
    import rocmc

    t = time.perf_counter()
    lm = rocmc.llm.load(module, ckpt, device=device)
    load_s = time.perf_counter() - t
    rng = np.random.default_rng(5)
    rows = lm.sizes.max_batch  # every slot a prompt, PROMPT - 13 i tokens long
    prompts = [[int(x) for x in rng.integers(3, lm.config.vocab_size, PROMPT - 13 * i)] for i in range(rows)]
    prompt = prompts[0]
    run = OnePrompt(lm, prompt)  # the prompt alone into a fresh slot 0: a prefill as a user's first call makes it
    run.prefill()  # (the first call loads the module's kernels)
    pre = []
    for _ in range(PREFILLS):
        t = time.perf_counter()
        run.prefill()
        pre.append(time.perf_counter() - t)
    slots, nxt = fill_slots(lm, prompts)
    again = copy.deepcopy(slots)  # the same steps again, issued ahead (the cache rewritten with the same values)
    times, last, sync_tokens = time_decode(lm, slots, nxt, STEPS, keep=True)
    ahead, _, ahead_tokens = time_decode_ahead(lm, again, nxt, STEPS)
    step = statistics.median(times[4:])
    step_ahead = statistics.median(ahead[4:])
    bytes_ = step_bytes(lm, [len(p) + STEPS // 2 for p in prompts])
    out = {
        "rows": rows,
        "load_s": load_s,
        "prefill_ms": 1e3 * statistics.median(pre),  # PROMPT tokens, median of PREFILLS
        "step_ms": 1e3 * step,
        "tok_s": rows / step,
        "step_bytes": bytes_,
        "bound_tok_s": bandwidth / bytes_,
        "of_bound": bytes_ / bandwidth / step,
        # Steps issued one ahead (LanguageModel's loop): the host's time a step hidden behind the device's.
        "ahead_step_ms": 1e3 * step_ahead,
        "ahead_tok_s": rows / step_ahead,
        "ahead_of_bound": bytes_ / bandwidth / step_ahead,
        "ahead_tokens_equal": ahead_tokens == sync_tokens,
        "last_token": int(last[0]),
        "finite": bool(np.isfinite(lm.logits(prompt[:16])).all()),
    }
    if profile:  # a step's kernels (CUPTI through torch.profiler) and its timeline
        import torch

        state = {"nxt": last}

        def step_once():
            state["nxt"] = read_tokens(lm.module.decode(**slots.decode(state["nxt"]), output="device")[0])

        out["profile"] = kernel_profile(torch, step_once, 4)
        ahead_state = {"slots": again, "nxt": last}

        def eight_ahead():  # 8 steps issued ahead as one profiled call: GPU busy against wall time
            _, ahead_state["nxt"], _ = time_decode_ahead(lm, ahead_state["slots"], ahead_state["nxt"], 8)

        out["profile_ahead_8_steps"] = kernel_profile(torch, eight_ahead, 2)
        out["profile_prefill"] = kernel_profile(torch, run.prefill, 2)  # its kernels: the projections' share
    print(name, json.dumps(out), flush=True)
    lm.module.close()  # its device memory back before the next module loads
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--dir", required=True)
    c.add_argument("--targets", default="cuda:sm_80")
    c.add_argument("--batches", default="1", help="the modules' max_batch values, comma-separated")
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--json", required=True)
    r.add_argument("--ckpt", default="/tmp/quant_ckpt")
    r.add_argument("--modules", default="gptq4,gptq8,f16", help="which modules, in this order")
    r.add_argument("--profile", action="store_true", help="also profile a decode step's kernels (torch.profiler)")
    a = ap.parse_args()
    if a.cmd == "compile":
        for target in a.targets.split(","):
            compile_modules(Path(a.dir), target, config(), [int(b) for b in a.batches.split(",")])
        return 0
    cfg = json.loads((Path(a.dir) / "config.json").read_text())
    import torch

    bw = copy_bandwidth(torch, "cuda")["GBps"] * 1e9  # bench/llm_gpu.py's measure
    out = {"copy_bandwidth_GBs": bw / 1e9}
    writers = {"gptq4": lambda c, d: write_gptq(c, d, bits=4), "gptq8": lambda c, d: write_gptq(c, d, bits=8),
               "f16": write_checkpoint}  # fmt: skip
    # A module name is its checkpoint's (gptq4, gptq8, f16), a variant after "_" (gptq4_qm), "_bN" for N rows.
    files = {m.stem: m for m in Path(a.dir).glob("*.vmfb")}
    for kind in a.modules.split(","):
        t = time.perf_counter()
        writers[kind](cfg, Path(a.ckpt) / kind)
        out[kind + "_checkpoint_s"] = time.perf_counter() - t
        for name in sorted(n for n in files if n == kind or n.startswith(kind + "_")):
            profile = a.profile and name == kind
            out[name] = measure(name, files[name], Path(a.ckpt) / kind, bw, profile=profile)
            Path(a.json).write_text(json.dumps(out, indent=1))
        shutil.rmtree(Path(a.ckpt) / kind)  # the disk holds one checkpoint at a time
    for key in [k for k in out if k.startswith("gptq") and isinstance(out[k], dict)]:
        rows = out[key]["rows"]
        base = "f16" if rows == 1 else f"f16_b{rows}"
        if base in out:
            out[key + "_speedup"] = out[key]["tok_s"] / out[base]["tok_s"]
            out[key + "_ahead_speedup"] = out[key]["ahead_tok_s"] / out[base]["ahead_tok_s"]
            out[key + "_prefill_vs_f16"] = out[key]["prefill_ms"] / out[base]["prefill_ms"]
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, dict)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
