"""A 7B-shaped Llama on an NVIDIA GPU: rocmc's compiled prefill/decode against transformers, same weights.

    python -m bench.llm_gpu compile [--dir out/llm_gpu] [--targets cuda:sm_80,gfx942]    # CPU machine
    python3 -m bench.llm_gpu run [--dir out/llm_gpu] [--ckpt /tmp/ckpt] [--json FILE]    # GPU machine

`compile` writes the config.json of Llama-2-7B's shape and compiles it with `rocmc.llm.compile_hf` for each
target in a fresh process, measuring the wall time, the peak RSS of the whole process tree (the Python
process and its iree-compile child, sampled from /proc) and the .vmfb size; the modules hold no weights.

`run` needs no compiler: it writes random f16 weights (seeded numpy) as a sharded safetensors checkpoint
in Hugging Face naming, measures the card's copy bandwidth (the weight-streaming bound of decode), then
loads the .vmfb with that checkpoint through `rocmc.llm.load`, checks its decode logits against a full
recompute and its greedy tokens against transformers, and times prefill and decode of both (512 prompt
tokens, 128 new). Every stage adds to the JSON as it ends, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

# Llama-2-7B's shape; "tiny" rehearses the whole run on a CPU in seconds.
SHAPES = {
    "7b": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
    },
    # TinyLlama-1.1B's shape (bench/llm_cpu.py runs it on the CPU)
    "tinyllama": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
    },
    "tiny": {
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
    },
}
PROMPT, NEW = 512, 128
MAX_SEQ_LEN = 1024
CHECKED_STEPS = (0, 1, 2, 4, 16, 64, 127)  # decode steps whose logits are recomputed from scratch


def config_json(shape: str) -> dict:
    return llama_config(SHAPES[shape])


def llama_config(sizes: dict) -> dict:
    """A Llama config.json with these sizes (hidden, intermediate, layers, heads, kv heads, vocab, positions)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **sizes,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float16",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
    }


def vmfb_name(target: str, max_batch: int = 1) -> str:
    return f"llama_{target.replace(':', '_')}" + (f"_b{max_batch}" if max_batch > 1 else "") + ".vmfb"


# ---- compile (CPU machine) -------------------------------------------------------------------------


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (shared pages counted in each)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
            for tid in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{tid}/children").read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1024


def measure_compile(
    d: Path, target: str, max_seq_len: int, max_batch: int = 1, dtype: str | None = None, impl: str | None = None
) -> dict:
    """One compile in a fresh process, its tree's RSS sampled every 10 ms from outside."""
    cmd = (
        [
            sys.executable,
            "-m",
            "bench.llm_gpu",
            "compile-one",
            "--dir",
            str(d),
            "--target",
            target,
            "--max-seq-len",
            str(max_seq_len),
            "--max-batch",
            str(max_batch),
        ]
        + (["--dtype", dtype] if dtype else [])
        + (["--impl", impl] if impl else [])
    )
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, stop = [0.0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss_mb(proc.pid))
            stop.wait(0.01)

    th = threading.Thread(target=sample)
    th.start()
    out, err = proc.communicate()
    stop.set()
    th.join()
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"compile for {target} failed:\n{err}")
    row = json.loads(out.strip().splitlines()[-1])
    row.update(target=target, max_batch=max_batch, process_wall_s=wall, tree_peak_rss_mb=peak[0])
    return row


def compile_one(
    d: Path, target: str, max_seq_len: int, max_batch: int = 1, dtype: str | None = None, impl: str | None = None
) -> None:
    import resource

    t = time.perf_counter()
    import rocmc

    imported = time.perf_counter() - t
    t = time.perf_counter()
    art = rocmc.llm.compile_hf(
        d / "config.json",
        target,
        max_seq_len=max_seq_len,
        max_batch=max_batch,
        dtype=dtype,
        cache=False,
        **({"impl": json.loads(impl)} if impl else {}),
    )
    compiled = time.perf_counter() - t
    path = art.save(d / vmfb_name(target, max_batch))
    from bench.compile_time import vm_hwm_mb

    hwm = vm_hwm_mb()
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds split the wall time between rocmc (graph, MLIR) and iree-compile, even on a busy machine.
    print(
        json.dumps(
            {
                "import_s": imported,
                "compile_hf_s": compiled,
                "vmfb_bytes": path.stat().st_size,
                "python_peak_rss_mb": hwm,
                "iree_compile_peak_rss_mb": kids.ru_maxrss / 1024,
                "python_cpu_s": me.ru_utime + me.ru_stime,
                "iree_compile_cpu_s": kids.ru_utime + kids.ru_stime,
            }
        )
    )


def compile_all(a) -> None:
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config_json(a.shape), indent=1))
    rows = []
    for target, batch in [(t, int(b)) for t in a.targets.split(",") for b in a.batches.split(",")]:
        for run in range(a.repeat):
            row = measure_compile(d, target, a.max_seq_len, batch, a.dtype, a.impl) | {
                "run": run,
                "max_seq_len": a.max_seq_len,
                "load_avg": os.getloadavg()[0],
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    (d / "compile.json").write_text(
        json.dumps(
            {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shape": a.shape, "rows": rows}, indent=1
        )
    )


# ---- run (GPU machine) -----------------------------------------------------------------------------


class Log:
    """Progress lines with the time since start, and the results JSON rewritten after every stage."""

    def __init__(self, path: Path):
        self.t0, self.path, self.res = time.perf_counter(), path, {}

    def __call__(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f}s] {msg}", flush=True)

    def put(self, key: str, value) -> None:
        self.res[key] = value
        self.path.write_text(json.dumps(self.res, indent=1, default=float))
        self(f"{key}: {json.dumps(value, default=float)[:600]}")


def hf_param_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """A Llama checkpoint's tensors in transformers' names, written independently of rocmc's own table."""
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    out = [("model.embed_tokens.weight", (v, h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (f, h)),
            (p + "mlp.up_proj.weight", (f, h)),
            (p + "mlp.down_proj.weight", (h, f)),
        ]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]


def random_tensor(shape, gen: np.random.Generator) -> np.ndarray:
    """N(0, 0.02) for matrices, 1 + N(0, 0.01) for norm weights; f16."""
    x = gen.standard_normal(shape, dtype=np.float32)
    x *= 0.02 if len(shape) > 1 else 0.01
    if len(shape) == 1:
        x += 1.0
    return x.astype(np.float16)


def write_checkpoint(cfg: dict, d: Path, seed: int = 0, shard_bytes: int = 3 << 30) -> dict:
    """config.json + model-0000k-of-0000n.safetensors + index; each tensor has its own generator spawned
    from default_rng(seed), so threads fill a shard in parallel and the weights depend on the seed alone.
    A checkpoint already written for this config and seed (its stamp file) is reused."""
    from safetensors.numpy import save_file

    stamp = d / "rocmc-bench-stamp.json"
    want = json.dumps({"config": cfg, "seed": seed, "shard_bytes": shard_bytes}, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == want:
        return json.loads((d / "rocmc-bench-weights.json").read_text()) | {"reused": True}
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    names = hf_param_shapes(cfg)
    gens = np.random.default_rng(seed).spawn(len(names))
    shards, cur, size = [], [], 0
    for (name, shape), g in zip(names, gens):
        nbytes = int(np.prod(shape)) * 2
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape, g))
        size += nbytes
    shards.append(cur)
    weight_map, total, gen_s, write_s = {}, 0, 0.0, 0.0
    with ThreadPoolExecutor(os.cpu_count() or 4) as pool:
        for k, shard in enumerate(shards):
            fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            t = time.perf_counter()
            arrays = dict(zip([n for n, _, _ in shard], pool.map(lambda e: random_tensor(e[1], e[2]), shard)))
            gen_s += time.perf_counter() - t
            t = time.perf_counter()
            save_file(arrays, str(d / fname), metadata={"format": "pt"})
            write_s += time.perf_counter() - t
            total += sum(a.nbytes for a in arrays.values())
            weight_map.update({n: fname for n in arrays})
            del arrays
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    out = {"weight_bytes": total, "tensors": len(names), "shards": len(shards), "generate_s": gen_s, "write_s": write_s}
    (d / "rocmc-bench-weights.json").write_text(json.dumps(out))
    stamp.write_text(want)
    return out


def copy_bandwidth(torch, dev: str, gib: int = 4, reps: int = 10) -> dict:
    """A device-to-device copy of `gib` GiB: (bytes read + written) / median time."""
    n = gib << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    a.random_()
    b = torch.empty_like(a)
    times = []
    for _ in range(reps + 2):
        t = timer(torch, dev)
        b.copy_(a)
        times.append(t())
    assert torch.equal(a[: 1 << 20], b[: 1 << 20]) and torch.equal(a[-(1 << 20) :], b[-(1 << 20) :])
    med = statistics.median(times[2:])
    del a, b
    return {"bytes_moved": 2 * n, "median_s": med, "GBps": 2 * n / med / 1e9, "min_s": min(times[2:])}


def timer(torch, dev: str):
    """Start a wall clock now; the returned function synchronises the device and gives the seconds."""
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()

    def stop():
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t

    return stop


def device_memory(torch, dev: str) -> dict:
    if not dev.startswith("cuda"):
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"used_mb": (total - free) / 2**20, "total_mb": total / 2**20}


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def leading_agreement(x, y) -> int:
    n = 0
    for p, q in zip(x, y):
        if p != q:
            break
        n += 1
    return n


def margin(logits) -> float:
    """Top-1 minus top-2 logit: how near a tie the greedy choice was."""
    top = np.sort(np.asarray(logits, np.float64))[-2:]
    return float(top[1] - top[0])


class OnePrompt:
    """One prompt in cache slot 0, driven as the runtime drives a row: its prefill (in chunks), then decode
    steps (tokens and last logits on the host; every position's logits stay on the device)."""

    def __init__(self, lm, prompt: list):
        from rocmc.llm.runtime import _SlotTable

        self.lm, self.prompt, self.slots_of = lm, prompt, _SlotTable

    def prefill(self) -> tuple:
        self.slots = self.slots_of(self.lm.sizes, self.lm.config)
        for feeds in self.slots.prefill(0, self.prompt):
            out = self.lm.module.prefill(**feeds, output="device")
        return out[0].to_host(), out[1].to_host()

    def decode(self, nxt) -> tuple:
        return self.lm.module.decode(**self.decode_feeds(nxt))

    def decode_feeds(self, nxt) -> dict:
        return self.slots.decode(np.resize(np.asarray(nxt), self.lm.sizes.max_batch))


def run_rocmc(log: Log, torch, a, ckpt: Path, prompt: list) -> dict:
    """Load, generate once recording every step's logits, time prefill and decode, then recompute the
    checked steps' logits over the whole sequence."""
    before = device_memory(torch, a.torch_device)
    t = time.perf_counter()
    import rocmc

    lm = rocmc.llm.load(Path(a.dir) / vmfb_name(a.target), ckpt, device=a.device)
    load_s = time.perf_counter() - t
    compiler = sorted(m for m in sys.modules if m.startswith("iree.compiler"))
    loaded = device_memory(torch, a.torch_device)
    log.put(
        "rocmc_load",
        {
            "load_s": load_s,
            "iree_compiler_modules_imported": compiler,
            "parameter_notes": [str(n) for n in lm.module.parameter_notes],
            "mem_before": before,
            "mem_after_load": loaded,
            "load_used_mb": loaded.get("used_mb", 0) - before.get("used_mb", 0),
        },
    )

    # Pass 1 (also the warm-up): every step's token and logits.
    run = OnePrompt(lm, prompt)
    t = time.perf_counter()
    nxt, logits = run.prefill()
    first_prefill_s = time.perf_counter() - t
    tokens, step_logits = [int(nxt[0])], [logits[0].copy()]
    for _ in range(NEW - 1):
        nxt, logits = run.decode(nxt)
        tokens.append(int(nxt[0]))
        step_logits.append(logits[0].copy())
    after_gen = device_memory(torch, a.torch_device)
    log.put(
        "rocmc_first_pass",
        {
            "first_prefill_s": first_prefill_s,
            "tokens_head": tokens[:16],
            "mem_after_generate": after_gen,
            "used_mb_vs_before_load": after_gen.get("used_mb", 0) - before.get("used_mb", 0),
        },
    )

    # Prefill: the module call alone (inputs prepared), median of 5.
    pre = []
    for _ in range(5):
        t = time.perf_counter()
        nxt, _ = run.prefill()
        pre.append(time.perf_counter() - t)
    # Decode: the stream generator as a user drives it, each yield timed; two passes, the second reported; then
    # the same with each step's tokens read before the next step is issued (lm.pipeline = False), the loop of
    # earlier versions.
    passes = []
    for pipeline in (True, True, False, False):
        lm.pipeline = pipeline
        stamps, toks = [time.perf_counter()], []
        for tok in lm.stream(prompt, NEW, stop_tokens=()):
            stamps.append(time.perf_counter())
            toks.append(tok)
        passes.append((np.diff(stamps), toks))
    lm.pipeline = True
    unpiped, unpiped_tokens = passes[3]
    steps, stream_tokens = passes[1]
    # The module's decode call alone, inputs prepared before the clock starts.
    nxt, _ = run.prefill()
    calls = []
    for _ in range(NEW - 1):
        f = run.decode_feeds(nxt)
        t = time.perf_counter()
        nxt, _ = lm.module.decode(**f)
        calls.append(time.perf_counter() - t)
    dec_med = statistics.median(steps[1:])
    timing = {
        "prefill_ms_median": 1e3 * statistics.median(pre),
        "prefill_ms_all": [1e3 * x for x in pre],
        "stream_first_token_ms": 1e3 * steps[0],
        "decode_step_ms_median": 1e3 * dec_med,
        "decode_step_ms_p10_p90": [1e3 * float(np.percentile(steps[1:], q)) for q in (10, 90)],
        "decode_tok_s": 1 / dec_med,
        "decode_tok_s_mean": (NEW - 1) / float(np.sum(steps[1:])),
        "stream_total_s": float(np.sum(steps)),
        "decode_call_ms_median": 1e3 * statistics.median(calls),
        "decode_call_ms_first_last": [1e3 * calls[0], 1e3 * calls[-1]],
        "stream_tokens_equal_first_pass": stream_tokens == tokens,
        "stream_passes_equal": passes[0][1] == passes[1][1],
        "decode_tok_s_one_at_a_time": 1 / statistics.median(unpiped[1:]),
        "one_at_a_time_tokens_equal": unpiped_tokens == stream_tokens,
    }
    log.put("rocmc_timing", timing)
    if a.profile:
        log.put("rocmc_profile", profile_rocmc(torch, lm, prompt, _trace_path(a, "decode_b1")))

    # The decode logits against the whole sequence recomputed by the `logits` function (writes the cache).
    checks = []
    for k in CHECKED_STEPS:
        full = lm.logits(prompt + tokens[:k])[0, -1]
        checks.append(
            {
                "step": k,
                "rel_l2": rel_l2(step_logits[k], full),
                "argmax_equal": int(np.argmax(full)) == tokens[k],
                "margin": margin(full),
            }
        )
    log.put("rocmc_recompute", checks)
    full = lm.logits(prompt + tokens)[0, PROMPT - 1 : PROMPT - 1 + NEW]
    lm.module.close()
    del lm
    gc.collect()
    return {"tokens": tokens, "step_logits": step_logits, "full_logits": full}


BATCH_STEPS = 40  # decode steps timed per batch size


def fill_slots(lm, prompts: list) -> tuple:
    """Prompt r prefilled into slot r of a fresh slot table: (the table, each row's greedy next token)."""
    from rocmc.llm.runtime import _SlotTable

    slots = _SlotTable(lm.sizes, lm.config)
    nxt = np.zeros(lm.sizes.max_batch, np.int64)
    for r, p in enumerate(prompts):
        for feeds in slots.prefill(r, p):
            out = lm.module.prefill(**feeds, output="device")
        nxt[r] = out[0].to_host()[0]
    return slots, nxt


def read_tokens(result) -> np.ndarray:
    """A decode step's tokens on the host, read as LanguageModel reads them (rocmc.runtime.module.host_copy)."""
    from rocmc.dtypes import ALL
    from rocmc.runtime.module import host_copy

    return host_copy(result, ALL["i64"])


def time_decode(lm, slots, nxt, steps: int, keep: bool = False) -> tuple:
    """`steps` decode steps of the filled slots, each timed alone: (the seconds of each, the last tokens; with
    `keep`, every step's tokens too)."""
    times, tokens = [], []
    for _ in range(steps):
        f = slots.decode(nxt)
        t = time.perf_counter()
        nxt = read_tokens(lm.module.decode(**f, output="device")[0])
        times.append(time.perf_counter() - t)
        tokens.append(nxt.tolist())
    return (times, nxt, tokens) if keep else (times, nxt)


def time_decode_ahead(lm, slots, nxt, steps: int) -> tuple:
    """`steps` decode steps of the filled slots issued one ahead, as LanguageModel's loop issues them: step n + 1
    is submitted (its tokens the device output of step n) before step n's tokens are read. (the seconds between
    consecutive token reads, the last tokens, every step's tokens)."""
    from rocmc.runtime.module import reshaped

    b = lm.sizes.max_batch
    sub = lm.module.submit("decode", **slots.decode(nxt))
    times, tokens, t = [], [], time.perf_counter()
    for n in range(steps):
        after = None
        if n + 1 < steps:
            after = lm.module.submit(
                "decode", tokens=reshaped(sub.outputs[0], (b, 1)), positions=slots.decode_positions()
            )
        nxt = sub.output(0)
        now = time.perf_counter()
        times.append(now - t)
        t = now
        tokens.append(nxt.tolist())
        sub = after
    return times, nxt, tokens


def run_batch(log: Log, torch, a, ckpt: Path, cfg: dict, n: int, weight_bytes: int, bw: dict | None) -> None:
    """n rows at different positions (prompts of PROMPT, PROMPT - 13, ... tokens, each prefilled into its
    slot), then BATCH_STEPS decode steps of all n: tokens/s against the byte bound of a step (the weights
    once plus every row's keys and values up to its position), and a profiled step's timeline."""
    import rocmc

    lm = rocmc.llm.load(Path(a.dir) / vmfb_name(a.target, n), ckpt, device=a.device)
    rng = np.random.default_rng(2)
    lens = [PROMPT - 13 * i for i in range(n)]
    prompts = [[int(x) for x in rng.integers(3, cfg["vocab_size"], m)] for m in lens]
    t = time.perf_counter()
    slots, nxt = fill_slots(lm, prompts)
    prefill_s = time.perf_counter() - t
    again = copy.deepcopy(slots)
    steps, last, sync_tokens = time_decode(lm, slots, nxt, BATCH_STEPS, keep=True)
    ahead, _, ahead_tokens = time_decode_ahead(lm, again, nxt, BATCH_STEPS)
    nxt = last
    med = statistics.median(steps[4:])
    med_ahead = statistics.median(ahead[4:])
    h, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    per_position = 2 * L * cfg["num_key_value_heads"] * h // cfg["num_attention_heads"] * 2  # K and V, f16
    kv_needed = per_position * sum(m + BATCH_STEPS // 2 for m in lens)  # mid-run positions of every row
    kv_slots = per_position * n * lm.sizes.max_seq_len  # what today's decode reads (every slot whole)
    res = {
        "rows": n,
        "prompt_lens": [lens[0], lens[-1]],
        "prefill_all_rows_s": prefill_s,
        "step_ms_median": 1e3 * med,
        "tok_s": n / med,
        "ahead_step_ms_median": 1e3 * med_ahead,  # steps issued one ahead (LanguageModel's loop)
        "ahead_tok_s": n / med_ahead,
        "ahead_tokens_equal": ahead_tokens == sync_tokens,
        "kv_bytes_needed_mid_run": kv_needed,
        "kv_bytes_read_whole_slots": kv_slots,
    }
    if bw:
        bound = (weight_bytes + kv_needed) / (bw["GBps"] * 1e9)
        res |= {"byte_bound_ms": 1e3 * bound, "of_byte_bound": bound / med, "ahead_of_byte_bound": bound / med_ahead}
    if a.profile:

        def step():
            nonlocal nxt
            nxt = read_tokens(lm.module.decode(**slots.decode(nxt), output="device")[0])

        res["profile"] = kernel_profile(torch, step, 4, trace=_trace_path(a, f"decode_b{n}"))
    log.put(f"batch_{n}", res)
    lm.module.close()


def _trace_path(a, name: str) -> Path | None:
    """Where `--trace DIR` asks a profile's Chrome trace to go (bench/gaps.py reads it)."""
    return Path(a.trace) / f"{name}.json" if getattr(a, "trace", None) else None


def profile_rocmc(torch, lm, prompt: list, trace: Path | None = None) -> dict:
    """Kernel time against wall time of decode steps and of a prefill: CUPTI (through torch.profiler)
    records every kernel of the process, IREE's included."""
    run = OnePrompt(lm, prompt)
    state = {"nxt": run.prefill()[0]}

    def decode():
        state["nxt"] = run.decode(state["nxt"])[0]

    try:
        return {
            "decode": kernel_profile(torch, decode, 8, trace=trace),
            "prefill": kernel_profile(torch, run.prefill, 2),
        }
    except Exception:
        return {"error": traceback.format_exc()}


def kernel_profile(torch, fn, calls: int, trace: Path | None = None) -> dict:
    """Per call: wall time, the sum of kernel (and copy) times, the time the GPU was busy, the kernels that
    took most of it, and each call's timeline (`timeline`); with `trace`, the profile's Chrome trace and the
    analysis of its gaps (bench/gaps.py) too."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    fn()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(calls):
            with record_function("rocmc_call"):
                fn()
        wall = time.perf_counter() - t
    gaps = None
    if trace is not None:
        from bench import gaps as gaps_mod

        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
        gaps = gaps_mod.analyse(json.loads(trace.read_text()), "rocmc_call")
    events = list(prof.events())
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == DeviceType.CUDA)
    busy = _union(spans)
    by_name: dict = {}
    for s0, s1, name in spans:
        n, t_us = by_name.get(name, (0, 0.0))
        by_name[name] = (n + 1, t_us + s1 - s0)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:15]
    return {
        "calls": calls,
        "wall_ms_per_call": 1e3 * wall / calls,
        "kernels_per_call": len(spans) / calls,
        "kernel_ms_per_call": sum(s1 - s0 for s0, s1, _ in spans) / 1e3 / calls,
        "gpu_busy_ms_per_call": busy / 1e3 / calls,
        "top": [{"name": k[:120], "per_call": n / calls, "ms_per_call": t_us / 1e3 / calls} for k, (n, t_us) in top],
        "timeline": timeline(events, spans, DeviceType),
    } | ({"gaps": gaps} if gaps is not None else {})


def _union(spans) -> float:
    """The length of the union of (start, end, ...) intervals sorted by start: overlapping ones count once."""
    busy, end = 0.0, -1.0
    for s0, s1, *_ in spans:
        if s1 > end:
            busy += s1 - max(s0, end)
            end = s1
    return busy


def timeline(events, spans, device_type) -> dict:
    """What bounds a call, from its profile (medians over the calls, ms): `call` (the call's wall time on the
    host), `host_issue` (from the call's start to the end of its last kernel launch: recording and issuing),
    `launches` (driver launch calls seen: IREE's cuLaunchKernel), `gpu_busy`, `gpu_span` (first kernel start
    to last kernel end; copies excluded), `gpu_idle_in_span` (gaps between kernels), `gpu_before` (call
    start to first kernel) and `after_issue` (last launch to last kernel end: GPU work left once the host has
    issued everything). host_issue close to call with idle gaps: issue-bound; a long after_issue: GPU-bound."""
    calls = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name == "rocmc_call" and e.device_type != device_type.CUDA
    )
    launches = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type != device_type.CUDA and "LaunchKernel" in e.name
    )
    rows = []
    for c0, c1 in calls:
        # kernels only: the inputs' and results' copies sit at the call's ends, outside the span of its work
        ks = [k for k in spans if c0 <= k[0] <= c1 and not k[2].startswith(("Memcpy", "Memset"))]
        ls = [x for x in launches if c0 <= x[0] <= c1]
        if not ks:
            continue
        g0, g1 = ks[0][0], max(k[1] for k in ks)
        last_launch = max((x[1] for x in ls), default=c0)
        busy = _union(ks)
        rows.append(
            {
                "call": c1 - c0,
                "host_issue": last_launch - c0,
                "launches": len(ls),
                "gpu_busy": busy,
                "gpu_span": g1 - g0,
                "gpu_idle_in_span": g1 - g0 - busy,
                "gpu_before": g0 - c0,
                "after_issue": max(0.0, g1 - last_launch),
            }
        )
    if not rows:
        return {}
    return {k: (statistics.median(r[k] for r in rows) / (1 if k == "launches" else 1e3)) for k in rows[0]}


def run_transformers(log: Log, torch, a, ckpt: Path, prompt: list, ours: dict | None) -> None:
    from transformers import LlamaForCausalLM

    dev = a.torch_device
    before = device_memory(torch, dev)
    t = time.perf_counter()
    # Straight to the device where accelerate is installed (the GPU machine), else loaded then moved.
    if importlib.util.find_spec("accelerate"):
        model = LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.float16, device_map=dev)
    else:
        model = LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.float16).to(dev)
    model.eval()
    load_s = time.perf_counter() - t
    model.generation_config.eos_token_id = None  # 128 tokens always, as rocmc with stop_tokens=()
    model.generation_config.pad_token_id = 0
    loaded = device_memory(torch, dev)
    ids = torch.tensor([prompt], device=dev)
    with torch.inference_mode():
        logits = model(ids).logits[0, -1].float().cpu().numpy()
        first = model.generate(ids, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)[0, len(prompt) :].tolist()
        pre = []
        for _ in range(5):
            stop = timer(torch, dev)
            model(ids, logits_to_keep=1)
            pre.append(stop())
        gens = []
        for _ in range(3):
            stop = timer(torch, dev)
            out = model.generate(ids, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)
            gens.append(stop())
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.startswith("cuda") else None
    total, prefill = statistics.median(gens), statistics.median(pre)
    log.put(
        "transformers",
        {
            "attn_implementation": model.config._attn_implementation,
            "load_s": load_s,
            "mem_before": before,
            "mem_after_load": loaded,
            "load_used_mb": loaded.get("used_mb", 0) - before.get("used_mb", 0),
            "torch_peak_allocated_mb": peak,
            "prefill_ms_median": 1e3 * prefill,
            "prefill_ms_all": [1e3 * x for x in pre],
            "generate_s_all": gens,
            "decode_tok_s": (NEW - 1) / (total - prefill),
            "tokens_head": first[:16],
            "generate_repeatable": out[0, len(prompt) :].tolist() == first,
        },
    )
    if ours is not None:
        log.put("rocmc_vs_transformers", agreement(ours, first, logits))
        log.put("teacher_forced", teacher_forced(torch, model, LlamaForCausalLM, ckpt, dev, prompt, ours))
    del model
    gc.collect()


def forced_logits(torch, model, dev: str, seq: list):
    """The logits that predict the NEW generated tokens of `seq` (prompt + generated), f32 on the host."""
    with torch.inference_mode():
        out = model(torch.tensor([seq], device=dev)).logits[0, PROMPT - 1 : PROMPT - 1 + NEW]
        return out.float().cpu().numpy()


def teacher_forced(torch, model, cls, ckpt: Path, dev: str, prompt: list, ours: dict) -> dict:
    """rocmc's generated sequence scored by every implementation at each of its NEW positions, against
    transformers in f32 (TF32 off): how far each f16 path is from exact, and how often its greedy choice
    agrees (overall, and where the reference's top-2 margin is not a near-tie)."""
    seq = prompt + ours["tokens"]
    got = {
        "transformers_f16": forced_logits(torch, model, dev, seq),
        "rocmc_decode_f16": np.stack(ours["step_logits"]),
        "rocmc_full_f16": ours["full_logits"],
    }
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref_model = cls.from_pretrained(ckpt, dtype=torch.float32).to(dev).eval()
    ref = forced_logits(torch, ref_model, dev, seq)
    del ref_model
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 0.05
    res = {"positions": NEW, "positions_margin_gt_0.05": int(clear.sum())}
    for name, x in got.items():
        rel = [rel_l2(x[i], ref[i]) for i in range(NEW)]
        same = np.argmax(x, axis=1) == np.argmax(ref, axis=1)
        res[name] = {
            "rel_l2_median": float(np.median(rel)),
            "rel_l2_max": float(np.max(rel)),
            "argmax_agree": int(same.sum()),
            "argmax_agree_clear": int(same[clear].sum()),
        }
    return res


def agreement(ours: dict, theirs: list, last_logits) -> dict:
    """rocmc's greedy tokens and prompt logits against transformers' (both f16 on the same card)."""
    agree = leading_agreement(ours["tokens"], theirs)
    diverge = None
    if agree < NEW:  # how near a tie rocmc's choice was where the two first part
        diverge = {
            "step": agree,
            "rocmc_token": ours["tokens"][agree],
            "transformers_token": theirs[agree],
            "rocmc_margin": margin(ours["step_logits"][agree]),
        }
    return {
        "prefill_logits_rel_l2": rel_l2(ours["step_logits"][0], last_logits),
        "prefill_argmax_equal": int(np.argmax(last_logits)) == ours["tokens"][0],
        "leading_tokens_agree": agree,
        "tokens_equal_total": sum(x == y for x, y in zip(ours["tokens"], theirs)),
        "first_divergence": diverge,
    }


def environment(torch, a) -> dict:
    import importlib.metadata as md

    env = {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    for pkg in ("transformers", "safetensors", "numpy", "iree-base-runtime"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            env[pkg] = None
    if a.torch_device.startswith("cuda"):
        env["card"] = torch.cuda.get_device_name()
        try:
            env["nvidia_smi"] = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
            ).stdout.strip()
        except FileNotFoundError:
            pass
    return env


def run(a) -> int:
    import torch

    log = Log(Path(a.json))
    cfg = json.loads((Path(a.dir) / "config.json").read_text())
    log.put("env", environment(torch, a))
    ckpt = Path(a.ckpt)
    if a.iree_flags:  # runtime options of IREE's HAL, e.g. --cuda_use_streams=false (CUDA graphs)
        from iree import runtime as rt

        rt.flags.parse_flags(*a.iree_flags.split())
        log.put("iree_flags", a.iree_flags)
    t = time.perf_counter()
    w = write_checkpoint(cfg, ckpt)
    log.put("weights", w | {"total_s": time.perf_counter() - t})
    # The streaming bound: every weight read once per token (the embedding is only gathered, but the KV
    # cache read at these lengths is about as large; both are noted beside the bound).
    bw = copy_bandwidth(torch, a.torch_device) if a.torch_device.startswith("cuda") else None
    if bw:
        bound = w["weight_bytes"] / (bw["GBps"] * 1e9)
        h, L = cfg["hidden_size"], cfg["num_hidden_layers"]
        kv_dim = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
        log.put(
            "bound",
            bw
            | {
                "weight_bytes": w["weight_bytes"],
                "bound_ms_per_token": 1e3 * bound,
                "bound_tok_s": 1 / bound,
                "embedding_bytes": cfg["vocab_size"] * h * 2,
                "kv_read_bytes_at_576": 2 * L * (PROMPT + NEW // 2) * kv_dim * 2,
            },
        )
        torch.cuda.empty_cache()
    prompt = [int(x) for x in np.random.default_rng(1).integers(3, cfg["vocab_size"], PROMPT)]
    ours = None
    try:
        ours = run_rocmc(log, torch, a, ckpt, prompt)
    except Exception:
        log.put("rocmc_error", traceback.format_exc())
    gc.collect()
    log.put("mem_after_rocmc_closed", device_memory(torch, a.torch_device))
    for n in [int(b) for b in a.batches.split(",") if b]:
        try:
            run_batch(log, torch, a, ckpt, cfg, n, w["weight_bytes"], bw)
        except Exception:
            log.put(f"batch_{n}_error", traceback.format_exc())
        gc.collect()
    try:
        if not a.skip_transformers:
            run_transformers(log, torch, a, ckpt, prompt, ours)
    except Exception:
        log.put("transformers_error", traceback.format_exc())
    summary(log)
    return 0 if ours is not None and "transformers_error" not in log.res else 1


def summary(log: Log) -> None:
    r = log.res
    b, rt, hf = r.get("bound", {}), r.get("rocmc_timing", {}), r.get("transformers", {})
    vs = r.get("rocmc_vs_transformers", {})
    if rt:
        line = f"rocmc decode {rt['decode_tok_s']:.1f} tok/s, prefill {rt['prefill_ms_median']:.1f} ms"
        if b:
            line += f" ({100 * rt['decode_tok_s'] / b['bound_tok_s']:.0f}% of the bound {b['bound_tok_s']:.1f} tok/s)"
        log(line)
    if hf:
        log(f"transformers decode {hf['decode_tok_s']:.1f} tok/s, prefill {hf['prefill_ms_median']:.1f} ms")
    if vs:
        log(f"leading tokens agree: {vs['leading_tokens_agree']}/{NEW}")
    for key in sorted(k for k in r if k.startswith("batch_") and not k.endswith("_error")):
        bt = r[key]
        share = f" ({100 * bt['of_byte_bound']:.0f}% of its byte bound)" if "of_byte_bound" in bt else ""
        log(f"rocmc decode, {bt['rows']} rows: {bt['tok_s']:.1f} tok/s, {bt['step_ms_median']:.2f} ms a step{share}")
    tl = r.get("rocmc_profile", {}).get("decode", {}).get("timeline")
    if tl:
        log(
            "decode step timeline (ms): call {call:.2f}, host issue {host_issue:.2f} ({launches:.0f} launches), "
            "GPU busy {gpu_busy:.2f} of a {gpu_span:.2f} span (idle {gpu_idle_in_span:.2f}), "
            "GPU work after the last launch {after_issue:.2f}".format(**tl)
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--dir", default="out/llm_gpu")
    c.add_argument("--targets", default="cuda:sm_80,gfx942")
    c.add_argument("--shape", default="7b", choices=SHAPES)
    c.add_argument("--repeat", type=int, default=1)
    c.add_argument("--max-seq-len", type=int, default=MAX_SEQ_LEN, help="positions of the KV cache")
    c.add_argument("--batches", default="1", help="max_batch of each module, e.g. 1,8,32")
    c.add_argument("--dtype", default=None, help="compute and cache dtype (default: the checkpoint's, f16)")
    c.add_argument("--impl", default=None, help='implementations asked for, as JSON: {"op": "name"}')
    o = sub.add_parser("compile-one")
    o.add_argument("--dir", required=True)
    o.add_argument("--target", required=True)
    o.add_argument("--max-seq-len", type=int, default=MAX_SEQ_LEN)
    o.add_argument("--max-batch", type=int, default=1)
    o.add_argument("--dtype", default=None)
    o.add_argument("--impl", default=None)
    r = sub.add_parser("run")
    r.add_argument("--dir", default="out/llm_gpu")
    r.add_argument("--ckpt", default="/tmp/llm_gpu_ckpt")
    r.add_argument("--json", default="out/llm_gpu/llm_gpu.json")
    r.add_argument("--target", default="cuda:sm_80", help="the compiled module to load")
    r.add_argument("--device", default="cuda", help="rocmc device (local-task to rehearse on a CPU)")
    r.add_argument("--torch-device", default="cuda")
    r.add_argument("--profile", action="store_true", help="also profile rocmc's kernels (torch.profiler)")
    r.add_argument("--trace", default=None, help="with --profile: write the profiles' Chrome traces here")
    r.add_argument("--iree-flags", default="", help="IREE runtime flags set before the device is made")
    r.add_argument("--skip-transformers", action="store_true", help="rocmc only")
    r.add_argument("--batches", default="", help="also decode batches of these sizes (modules compiled with --batches)")
    a = ap.parse_args()
    if a.cmd == "compile":
        compile_all(a)
    elif a.cmd == "compile-one":
        compile_one(Path(a.dir), a.target, a.max_seq_len, a.max_batch, a.dtype, a.impl)
    else:
        return run(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
