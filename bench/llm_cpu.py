"""rocmc.llm at real sizes on this machine: compiling from a config alone, and running a 1.1B model on the CPU.

    python bench/llm_cpu.py compile [--targets gfx942,cuda:sm_80] [--max-seq-len 4096]
        A Llama-2-7B-shaped config compiled from config.json alone (no weights), each target in a fresh
        process with the cache off: wall time, .vmfb size, peak RSS of the Python process (VmHWM) and of
        iree-compile (its child), whose sum bounds the process tree's peak.
    python bench/llm_cpu.py run [--dir /tmp/tinyllama] [--prompt-len 32] [--new 16]
        A TinyLlama-1.1B-shaped model with random f16 weights written as safetensors (seeded numpy), compiled
        for the CPU (f32, the weights converted once at load) and run: prefill latency, decode tokens/s.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
             "torch_dtype": "float16", "hidden_act": "silu"}
TINYLLAMA = {**LLAMA2_7B, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_key_value_heads": 4, "max_position_embeddings": 2048}


def vm_hwm_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def compile_one(target: str, max_seq_len: int) -> dict:
    import rocmc
    d = Path(tempfile.mkdtemp())
    (d / "config.json").write_text(json.dumps(LLAMA2_7B))
    t = time.perf_counter()
    art = rocmc.llm.compile_hf(d / "config.json", target, max_seq_len=max_seq_len, cache=False)
    return {"target": target, "seconds": round(time.perf_counter() - t, 1), "vmfb_mib": round(art.size / 2**20, 2),
            "python_peak_mb": round(vm_hwm_mb()), "functions": art.functions,
            "iree_compile_peak_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)}


def write_checkpoint(cfg: dict, d: Path, seed: int = 0) -> float:
    """Random f16 weights in Hugging Face naming, one safetensors file; returns the bytes written."""
    from rocmc.llm.config import LlmConfig, param_names
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    names = param_names(LlmConfig.from_json(cfg))
    header, offset = {}, 0
    for name, shape in names:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(d / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for name, shape in names:
            norm = name.endswith("norm.weight")
            a = (1.0 + 0.05 * rng.standard_normal(shape)) if norm else 0.02 * rng.standard_normal(shape)
            f.write(a.astype(np.float16).tobytes())
    return offset


def run(d: Path, prompt_len: int, new: int) -> dict:
    import rocmc
    if not (d / "model.safetensors").exists():
        t = time.perf_counter()
        nbytes = write_checkpoint(TINYLLAMA, d)
        print(f"wrote {nbytes / 2**30:.2f} GiB of f16 weights in {time.perf_counter() - t:.1f} s", flush=True)
    t = time.perf_counter()
    lm = rocmc.llm.load_hf(d, "cpu", max_seq_len=prompt_len + new + 16, cache=False)
    load_s = time.perf_counter() - t
    ids = [int(i) for i in np.random.default_rng(1).integers(3, 32000, size=prompt_len)]
    t = time.perf_counter()
    steps = []
    for _ in lm.stream(ids, new, stop_tokens=()):
        steps.append(time.perf_counter() - t)
        t = time.perf_counter()
    return {"compile_and_load_s": round(load_s, 1), "prefill_ms": round(steps[0] * 1e3, 1),
            "decode_ms_per_token_median": round(float(np.median(steps[1:])) * 1e3, 1),
            "decode_tokens_per_s": round(1 / float(np.median(steps[1:])), 2), "python_peak_mb": round(vm_hwm_mb()),
            "parameter_notes": len(lm.module.parameter_notes)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("compile", "run", "compile-one"))
    ap.add_argument("--targets", default="gfx942,cuda:sm_80")
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--dir", default="/tmp/rocmc-tinyllama")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=16)
    a = ap.parse_args()
    if a.mode == "compile-one":
        print(json.dumps(compile_one(a.targets, a.max_seq_len)))
    elif a.mode == "compile":
        for target in a.targets.split(","):
            out = subprocess.run([sys.executable, __file__, "compile-one", "--targets", target,
                                  "--max-seq-len", str(a.max_seq_len)], capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
            print(out.stdout.strip() or out.stderr[-2000:], flush=True)
    else:
        print(json.dumps(run(Path(a.dir), a.prompt_len, a.new)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
