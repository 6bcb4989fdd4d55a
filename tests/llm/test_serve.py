"""rocmc serve: the official `openai` client against a running server (uvicorn on 127.0.0.1) of a tiny checkpoint
on the CPU: completions and chat, whole and streamed, concurrent requests equal to each request alone,
cancellation, the refusals in the OpenAI error shape, /metrics, /health."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

import rocmc
from llm_models import llm_checkpoint  # noqa: F401

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from rocmc.serve import create_app  # noqa: E402

TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
KEY = "secret-key"


@pytest.fixture(scope="module")
def served(llm_checkpoint, tmp_path_factory):  # noqa: F811
    """(LanguageModel, base URL) of a server of the tiny llama checkpoint with a chat template, 4 slots."""
    d = tmp_path_factory.mktemp("served") / "tiny"
    shutil.copytree(llm_checkpoint("llama"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    lm = rocmc.llm.load_hf(d, "cpu", max_seq_len=64, max_batch=4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(lm, "tiny", api_key=KEY), host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(300):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started
    yield lm, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)
    assert not thread.is_alive()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1] + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _decode(lm, ids):
    """Text of ids as the server gives it, a token at a time (as `rocmc generate` streams it); ids past the
    tokenizer's vocabulary (the tiny model has more) have none."""
    dec = lm.tokenizer.stream()
    return "".join(dec.push(t) for t in ids if t < lm.tokenizer.vocab_size) + dec.flush()


def _alone(lm, ids, n):
    """The greedy tokens of `ids` alone, and why they ended."""
    toks = lm.generate([ids], n, do_sample=False)[0]
    return toks, "length" if len(toks) == n and toks[-1] not in lm.config.eos_token_ids else "stop"


def test_completions_whole_and_streamed_equal_generation_alone(served, client, rng):
    lm, _ = served
    ids = [int(t) for t in rng.integers(4, 250, size=9)]
    want, why = _alone(lm, ids, 8)
    got = client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0)
    c = got.choices[0]
    assert c.text == _decode(lm, want) and c.finish_reason == why
    assert got.usage.prompt_tokens == 9 and got.usage.completion_tokens == len(want)
    pieces = list(client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == c.text
    assert pieces[-1].choices[0].finish_reason == c.finish_reason
    text = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=6, temperature=0)
    assert text.choices[0].text == _decode(lm, _alone(lm, lm.tokenizer.encode("The quick brown fox"), 6)[0])


def test_chat_whole_and_streamed(served, client):
    lm, _ = served
    messages = [{"role": "user", "content": "Grüße aus München"}]
    want = _decode(lm, _alone(lm, lm.encode_chat(messages), 7)[0])
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=7, temperature=0)
    assert got.choices[0].message.role == "assistant" and got.choices[0].message.content == want
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=7,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens >= 1


def test_concurrent_requests_each_equal_alone(served, client, rng):
    """16 requests of different prompts and lengths at once (4 slots: most wait, join and leave a running batch)."""
    lm, _ = served
    prompts = [[int(t) for t in rng.integers(4, 250, size=int(n))] for n in rng.integers(2, 30, size=16)]
    limits = [int(n) for n in rng.integers(1, 12, size=16)]
    want = [_decode(lm, _alone(lm, p, n)[0]) for p, n in zip(prompts, limits)]

    def ask(i):
        return client.completions.create(model="tiny", prompt=prompts[i], max_tokens=limits[i], temperature=0)

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(ask, range(16)))
    assert [g.choices[0].text for g in got] == want


def test_presence_and_frequency_penalties_are_generate_s(served, client):
    """The penalties count the generated tokens only; the server's greedy choice under them is generate's
    (negative ones here: the tiny model repeats no token in 12, so they show by favouring repeats)."""
    lm, _ = served
    ids = [5, 17, 33, 41]
    want = lm.generate([ids], 12, do_sample=False, presence_penalty=-1.5, frequency_penalty=-2.0)[0]
    got = client.completions.create(
        model="tiny", prompt=ids, max_tokens=12, temperature=0, presence_penalty=-1.5, frequency_penalty=-2.0
    )
    assert got.choices[0].text == _decode(lm, want)
    assert want != lm.generate([ids], 12, do_sample=False)[0]


def test_log_probabilities_with_the_most_likely_alternatives(served, client):
    """Greedy: each chosen token is the most likely one, so its log-probability is its alternatives' first."""
    lm, _ = served
    got = client.completions.create(model="tiny", prompt=[5, 17, 33], max_tokens=5, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for chosen, alts in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(alts) <= 3 and max(alts.values()) == pytest.approx(chosen) and chosen <= 0
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.top_logprobs[0].logprob == pytest.approx(c.logprob) for c in content)
    r = httpx.post(
        served[1] + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
    )
    assert r.status_code == 400 and "'top_logprobs' needs 'logprobs': true" in r.json()["error"]["message"]


def test_sampling_with_a_seed_repeats_and_n_choices_differ(client):
    kw = dict(model="tiny", prompt=[5, 17, 33], max_tokens=10, temperature=1.0, seed=7, n=3, logprobs=0)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1
    lps = a.choices[0].logprobs.token_logprobs
    assert lps and all(lp <= 0 for lp in lps)


def test_several_prompts_in_one_request(served, client, rng):
    """OpenAI's list forms of `prompt`: choice p * n + j is prompt p's j-th, each prompt's greedy text its own."""
    lm, _ = served
    prompts = [[int(t) for t in rng.integers(4, 250, size=int(n))] for n in (3, 11, 6)]
    want = [_decode(lm, _alone(lm, p, 5)[0]) for p in prompts]
    got = client.completions.create(model="tiny", prompt=prompts, max_tokens=5, temperature=0)
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert [c.text for c in got.choices] == want
    assert got.usage.prompt_tokens == sum(len(p) for p in prompts)
    texts = ["hello world", "the cat"]
    enc = [lm.tokenizer.encode(t) for t in texts]
    kw = dict(model="tiny", max_tokens=4, temperature=1.0, seed=3, n=2)
    got = client.completions.create(prompt=texts, **kw)
    assert len(got.choices) == 4 and got.usage.prompt_tokens == 2 * sum(len(e) for e in enc)
    # Each choice as the same prompt's choice of the same index gives it alone (its seed: the request's + index).
    alone = [client.completions.create(prompt=enc[i // 2], **{**kw, "seed": 3 + i - i % 2}) for i in (0, 2)]
    assert [c.text for c in got.choices] == [c.text for a in alone for c in a.choices]


def _running(url) -> float:
    metrics = httpx.get(url + "/metrics").text
    return float(next(ln for ln in metrics.splitlines() if ln.startswith("rocmc_running_requests ")).split()[1])


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_frees_its_slot(served, stream):
    """A client gone mid-answer (streamed: it closes the stream; whole: it stops waiting) ends its request at the
    next step. Each decode step is slowed to 50 ms here, so the request's 55 tokens would hold the slot ~3 s."""
    lm, url = served
    real, real_submit = lm.module.decode, lm.module.submit

    def slow(**kw):
        time.sleep(0.05)
        return real(**kw)

    def slow_submit(function, *args, **kw):  # the engine issues its greedy steps ahead
        time.sleep(0.05 if function == "decode" else 0)
        return real_submit(function, *args, **kw)

    lm.module.decode, lm.module.submit = slow, slow_submit
    try:
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 55, "temperature": 0, "stream": stream}
        headers = {"Authorization": f"Bearer {KEY}"}
        if stream:
            with httpx.stream("POST", url + "/v1/completions", headers=headers, json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        break  # the first token: close the connection
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url + "/v1/completions", headers=headers, json=body, timeout=0.5)
        left = time.perf_counter()
        while _running(url) != 0 and time.perf_counter() - left < 10:
            time.sleep(0.02)
        assert _running(url) == 0 and time.perf_counter() - left < 1.0
    finally:
        lm.module.decode, lm.module.submit = real, real_submit


@pytest.mark.parametrize(
    "body,status,needle",
    [
        ({"model": "other", "prompt": "hi"}, 404, "model 'other' does not exist"),
        (
            {"model": "tiny", "prompt": "hi", "temperature": 3},
            400,
            "'temperature' is 3: expected a value in [0.0, 2.0]",
        ),
        (
            {"model": "tiny", "prompt": [5] * 60, "max_tokens": 10},
            400,
            "the prompt's 60 tokens and max_tokens=10 exceed",
        ),
        ({"model": "tiny", "prompt": "hi", "tools": [{"type": "function"}]}, 400, "'tools' is not supported"),
        ({"model": "tiny", "prompt": "hi", "logprobs": 6}, 400, "'logprobs' is 6: expected a value in [0, 5]"),
        ({"model": "tiny", "prompt": "hi", "presence_penalty": 2.5}, 400, "'presence_penalty' is 2.5: expected a"),
        ({"model": "tiny", "prompt": [5, 9999]}, 400, "the prompt: token 9999 is outside the vocabulary"),
        ({"model": "tiny", "prompt": [[5], [6, 9999]]}, 400, "prompt 1: token 9999 is outside the vocabulary"),
        ({"model": "tiny", "prompt": [[5, 6], []]}, 400, "prompt 1 is empty"),
        ({"model": "tiny", "prompt": {"a": 1}}, 400, "'prompt' must be a string, a list of token ids, or a list"),
        ({"model": "tiny", "prompt": ["a", [5]]}, 400, "'prompt' must be a string, a list of token ids, or a list"),
        ({"model": "tiny", "prompt": "hi", "ignore_eos": 1}, 400, "'ignore_eos' is 1: expected true or false"),
        ({"model": "tiny", "prompt": "hi", "n": 2, "temperature": 0}, 400, "'n' > 1 needs sampling"),
    ],
)
def test_refusals_are_openai_errors(served, body, status, needle):
    _, url = served
    r = httpx.post(url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, json=body)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text


def test_malformed_json_a_missing_key_health_and_metrics(served):
    _, url = served
    r = httpx.post(url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": []})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url + "/health").status_code == 200
    models = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    body = {"model": "tiny", "prompt": [5, 6], "max_tokens": 4, "temperature": 0}
    assert httpx.post(url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, json=body).status_code == 200
    text = httpx.get(url + "/metrics").text
    samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert all(len(ln.rsplit(" ", 1)) == 2 and np.isfinite(float(ln.rsplit(" ", 1)[1])) for ln in samples)
    names = {ln.split("{")[0].split(" ")[0] for ln in samples}
    assert {"rocmc_requests_total", "rocmc_time_to_first_token_seconds_bucket", "rocmc_waiting_requests"} <= names
    # The request's decode steps (no prefill beside them: between admissions) counted, with their rows and time.
    steps = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in samples if ln.startswith("rocmc_step")}
    assert steps['rocmc_steps_total{kind="decode"}'] > 0 and steps['rocmc_step_seconds_total{kind="decode"}'] > 0
    assert steps['rocmc_step_rows_total{kind="decode"}'] >= steps['rocmc_steps_total{kind="decode"}']


def test_the_command_serves_and_stops_on_sigterm(served, tmp_path):
    """`rocmc serve` as a user runs it: up (its KV cache said), a completion, then SIGTERM: it exits cleanly."""
    import os
    import signal
    import subprocess
    import sys

    lm, _ = served
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "rocmc.cli", "serve", str(lm.checkpoint), "--port", str(port), "--max-batch", "4"]
    proc = subprocess.Popen(
        cmd + ["--max-seq-len", "64", "--model-name", "tiny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None
            time.sleep(0.2)
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": [5, 6], "max_tokens": 3}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down (requests in flight finished, the engine's thread stopped), then ends the process
        # by the signal it caught, as an unhandled SIGTERM would.
        assert proc.wait(60) in (0, -signal.SIGTERM)
        assert "Finished server process" in proc.stderr.read()
        assert "KV cache of 4 slots x 64 positions" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_the_command_refuses_a_cache_past_the_device_s_memory(served):
    """Checked before anything compiles: the numbers, and how many slots would fit."""
    import subprocess
    import sys

    lm, _ = served
    cmd = [sys.executable, "-m", "rocmc.cli", "serve", str(lm.checkpoint), "--max-batch", str(1 << 40)]
    proc = subprocess.run(cmd + ["--max-seq-len", "64"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"KV cache of {1 << 40} slots x 64 positions" in proc.stderr and "MiB free of" in proc.stderr
    assert "slots of 64 positions fit (--max-batch)" in proc.stderr


def test_ignore_eos_generates_past_the_stop_tokens():
    """vLLM's `ignore_eos`: no stop token (a benchmark's fixed output lengths)."""
    from rocmc.serve import api

    def parse(**more):
        body = {"model": "m", "prompt": [1, 2], **more}
        return api.parse(body, chat=False, model="m", encode=None, vocab=10, context=32).settings

    assert parse(ignore_eos=True)["stop_tokens"] == () and "stop_tokens" not in parse()
