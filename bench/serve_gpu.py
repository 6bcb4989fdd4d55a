"""`rocmc serve` on a GPU through HTTP: the command itself as a user starts it (a compiled module and a
checkpoint), driven by C concurrent streaming clients speaking the OpenAI API, for C in --concurrency.

A fixed mix of requests (prompt lengths 64-1024 as token ids, outputs 32-256 tokens, greedy, `ignore_eos` so
every request makes its full count) is sent by C clients at once, each sending its next request when its last
one ends. Per C: output tokens/s, time to first token and inter-token latency (p50, p99) as the clients see
them (from sending a request to its first streamed token; between its streamed tokens), and one request alone
for the time to first token without load. Each prefill chunk size in --chunks is served by its own server.
After the servers stop, the same module's raw batched decode step (every slot filled, steps timed alone, as
bench/llm_gpu.py's batches) is measured in this process; the server's /metrics give the decode steps that ran
no prefill chunk (between admissions): their rows per second against the raw full batch's.

The checkpoint is bench/llm_gpu.py's seeded random weights, with a word-level tokenizer of one word per id
(so that every token streams as text of its own).

    python -m bench.llm_gpu compile --dir out/srv --targets cuda:sm_80 --batches 32 --max-seq-len 1280  # here
    python3 -m bench.serve_gpu --dir out/srv --ckpt /tmp/ck --json out.json                             # GPU
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.engine_gpu import arguments, mix, pct, raw_step_ms
from bench.llm_gpu import vmfb_name, write_checkpoint

MODEL = "bench"


def write_tokenizer(d: Path, vocab: int) -> None:
    """tokenizer.json: a word-level tokenizer whose id i is the word "w{i}" (tokens decode to text each)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(d / "tokenizer.json"))


async def one(client, url: str, ids: list, n: int) -> dict:
    """A streamed completion; the times of its token-bearing events."""
    body = {"model": MODEL, "prompt": ids, "max_tokens": n, "temperature": 0, "stream": True, "ignore_eos": True}
    sent, times = time.perf_counter(), []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.perf_counter())
    return {"sent": sent, "times": times, "want": n}


async def drive(url: str, requests: list, clients: int) -> dict:
    import httpx

    todo = list(requests)
    done: list = []
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker():
            while todo:
                ids, n = todo.pop(0)
                done.append(await one(client, url, ids, n))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    ttft = [d["times"][0] - d["sent"] for d in done if d["times"]]
    itl = [b - a for d in done for a, b in zip(d["times"], d["times"][1:])]
    tokens = sum(len(d["times"]) for d in done)
    return {
        "clients": clients,
        "requests": len(done),
        "output_tokens": tokens,
        "tokens_as_asked": tokens == sum(d["want"] for d in done),
        "wall_s": wall,
        "output_tok_s": tokens / wall,
        "ttft_s_p50_p99": [pct(ttft, 50), pct(ttft, 99)],
        "itl_s_p50_p99": [pct(itl, 50), pct(itl, 99)],
    }


def steps(url: str) -> dict:
    """The server's step counters (/metrics): {(name, kind): value}."""
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("rocmc_step"):
            key, value = line.rsplit(" ", 1)
            name, kind = key.split("{kind=")
            out[name, kind.strip('"}')] = float(value)
    return out


def decode_share(before: dict, after: dict) -> dict:
    """The decode steps that ran no prefill chunk during a run (between admissions): count, mean time and rows."""
    n, sec, rows = (after[f"rocmc_{k}_total", "decode"] - before[f"rocmc_{k}_total", "decode"]
                    for k in ("steps", "step_seconds", "step_rows"))  # fmt: skip
    total = sum(after[k] - before[k] for k in after if k[0] == "rocmc_steps_total")
    return {
        "decode_only_steps": int(n),
        "all_steps": int(total),
        "decode_only_step_ms_mean": 1e3 * sec / n if n else None,
        "decode_only_rows_mean": rows / n if n else None,
        "decode_only_rows_per_s": rows / sec if sec else None,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(module: Path, ckpt: Path, device: str, chunk: int, log: Path):
    """`rocmc serve` in its own process; returns (process, URL) once /health answers 200."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "rocmc.cli", "serve", str(ckpt), "--module", str(module), "--device", device]
    cmd += ["--port", str(port), "--max-waiting", "1024", "--prefill-chunk", str(chunk), "--model-name", MODEL]
    out = open(log, "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"rocmc serve exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError("rocmc serve did not become healthy in 300 s")


def stop(proc) -> float:
    t = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    return time.perf_counter() - t


def main() -> int:
    ap = arguments("1,8,32,64", 96)
    ap.add_argument("--longest", type=int, default=1024, help="the longest prompt of the mix")
    ap.add_argument("--chunks", default="512,128", help="prefill chunk sizes, a server each")
    a = ap.parse_args()
    cfg = json.loads((Path(a.dir) / "config.json").read_text())
    ckpt = Path(a.ckpt)
    write_checkpoint(cfg, ckpt)
    write_tokenizer(ckpt, cfg["vocab_size"])
    module = Path(a.dir) / vmfb_name(a.target, a.max_batch)
    requests = mix(a.requests, cfg["vocab_size"], longest=a.longest)
    out = {"max_batch": a.max_batch, "requests": len(requests), "servers": []}
    for chunk in [int(c) for c in a.chunks.split(",")]:
        log = Path(a.json).with_suffix(f".serve{chunk}.log")
        t = time.perf_counter()
        proc, url = serve(module, ckpt, a.device, chunk, log)
        server = {"prefill_chunk": chunk, "start_s": time.perf_counter() - t, "runs": []}
        try:
            for c in [int(x) for x in a.concurrency.split(",")]:
                before = steps(url)
                res = asyncio.run(drive(url, requests if c > 1 else requests[:8], c))
                res.update(decode_share(before, steps(url)))
                server["runs"].append(res)
                print(json.dumps({"prefill_chunk": chunk, **res}), flush=True)
            server["alone"] = asyncio.run(drive(url, requests[:1], 1))  # warm: after the loads
        finally:
            server["stop_s"] = stop(proc)
            server["log_head"] = log.read_text().splitlines()[:3]
        out["servers"].append(server)
        Path(a.json).write_text(json.dumps(out, indent=1))
    import rocmc

    lm = rocmc.llm.load(module, ckpt, device=a.device)
    raw = out["raw_full_batch_step_ms"] = raw_step_ms(lm, cfg["vocab_size"])
    for server in out["servers"]:  # decode throughput between admissions against the raw full batch's
        for res in server["runs"]:
            per_s = res["decode_only_rows_per_s"]
            res["decode_only_vs_raw"] = per_s / (a.max_batch / (raw / 1e3)) if per_s else None
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("max_batch", "raw_full_batch_step_ms")}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
