"""rocmc.llm.engine: continuous batching on a tiny checkpoint (CPU). Requests that join and leave a running batch,
wait for a slot, prefill in chunks between decode steps or are cancelled get the tokens each gets alone."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import rocmc
from rocmc.llm.engine import Engine, QueueFull
from llm_models import PROMPT_IDS, llm_checkpoint  # noqa: F401


@pytest.fixture(scope="module")
def lm(llm_checkpoint):  # noqa: F811
    return rocmc.llm.load_hf(llm_checkpoint("llama"), "cpu", max_seq_len=64, max_batch=2)


def _prompts(rng, lengths):
    return [[int(t) for t in rng.integers(4, 250, size=n)] for n in lengths]


@contextlib.contextmanager
def _submissions(lm):
    """The names of the functions submitted to lm's module meanwhile (a list that grows)."""
    submitted, real = [], lm.module.submit

    def counted(function, *args, **kwargs):
        submitted.append(function)
        return real(function, *args, **kwargs)

    lm.module.submit = counted
    try:
        yield submitted
    finally:
        lm.module.submit = real


def _alone(lm, ids, n, **settings):
    return lm.generate([ids], n, stop_tokens=(), **settings)[0]


def test_requests_joining_a_running_batch_get_their_tokens_alone(lm, rng):
    """Five requests on two slots, submitted at different steps, with prompts of 3 to 30 tokens prefilled in
    chunks of 4 between the running rows' decode steps: each gets its greedy tokens alone, in order."""
    prompts = [list(PROMPT_IDS), *_prompts(rng, (30, 3, 17, 9))]
    limits = [12, 6, 9, 4, 7]
    engine = Engine(lm, prefill_chunk=4)
    reqs, got, beside = [], {}, 0
    plan = {0: [0], 1: [1], 3: [2], 5: [3, 4]}  # step -> requests submitted before it
    for step in range(200):
        for i in plan.get(step, []):
            reqs.append(engine.submit(prompts[i], max_new_tokens=limits[i], stop_tokens=()))
        events = engine.step()
        for ev in events:
            got.setdefault(ev.request.id, []).append(ev.token)
        # a step in which the 30-token prompt took one more chunk while request 0 decoded
        beside += len(reqs) > 1 and reqs[1].state == "prefill" and any(ev.request is reqs[0] for ev in events)
        if step > max(plan) and engine.idle:
            break
    assert engine.idle and all(r.done and r.finish_reason == "length" for r in reqs)
    for i, r in enumerate(reqs):
        assert got[r.id] == r.tokens == _alone(lm, prompts[i], limits[i])
    # Step 0 prefilled request 0 whole (no row decoded yet) and decoded it; request 1 joined at step 1, and steps
    # 1-8 each took one of its 8 chunks (one call a step) beside request 0's decode, the 8th ending its prefill:
    # after 7 of those steps it was still prefilling.
    assert beside == 7


def test_sampled_requests_follow_their_own_seed(lm, rng):
    """A sampled request's draws depend on its seed only: the same beside another request as alone; its
    log-probabilities come with it."""
    a, b = _prompts(rng, (7, 12))
    settings = dict(do_sample=True, temperature=0.9, top_k=0, top_p=1.0, seed=1234, return_logprobs=True)
    engine = Engine(lm)
    ra = engine.submit(a, max_new_tokens=8, stop_tokens=(), **settings)
    rb = engine.submit(b, max_new_tokens=5, stop_tokens=())
    list(engine.run())
    alone = _alone(lm, a, 8, **settings)
    assert ra.tokens == alone.tokens and np.allclose(ra.logprobs, alone.logprobs, rtol=1e-5)
    assert rb.tokens == _alone(lm, b, 5)


def test_rows_drawn_on_the_device_get_the_tokens_generate_draws_alone(lm, rng):
    """Sampled requests whose settings the `sample` function covers (top-k within the module's sample_k) are drawn
    on the device, each row with its own temperature, top-k, top-p and key: each gets the tokens `generate` draws
    for it alone with its seed, beside a greedy row and a row chosen on the host, steps issued ahead or read in
    turn; the draws run through `sample`'s stream-ordered form."""
    a, b, c = _prompts(rng, (7, 12, 5))
    drawn_a = dict(do_sample=True, temperature=0.9, top_k=20, top_p=0.95, seed=1234)
    drawn_b = dict(do_sample=True, temperature=1.3, top_k=40, top_p=1.0, seed=77)
    on_host = dict(do_sample=True, temperature=0.9, top_k=0, top_p=1.0, seed=5)  # top-k past sample_k: the host's
    want_a, want_b = _alone(lm, a, 9, **drawn_a), _alone(lm, b, 6, **drawn_b)
    greedy = _alone(lm, c, 8)
    for issue_ahead in (True, False):
        engine = Engine(lm, issue_ahead=issue_ahead)
        with _submissions(lm) as submitted:
            ra = engine.submit(a, max_new_tokens=9, stop_tokens=(), **drawn_a)
            rc = engine.submit(c, max_new_tokens=8, stop_tokens=())
            list(engine.run())
            rb = engine.submit(b, max_new_tokens=6, stop_tokens=(), **drawn_b)
            rh = engine.submit(c, max_new_tokens=4, stop_tokens=(), **on_host)
            list(engine.run())
        assert (ra._path, rb._path, rc._path, rh._path) == ("sample", "sample", "argmax", "host")
        assert ra.tokens == want_a and rb.tokens == want_b and rc.tokens == greedy
        assert rh.tokens == _alone(lm, c, 4, **on_host)
        # the seed is what draws: another seed's tokens differ (some of five: a tiny model's distribution is peaked)
        assert any(rb.tokens != _alone(lm, b, 6, **(drawn_b | {"seed": seed})) for seed in range(78, 83))
        # the two drawing requests' steps beside greedy rows went through sample's stream-ordered form
        assert (submitted.count("sample") >= 8) == issue_ahead


def test_a_module_without_sample_draws_on_the_host(llm_checkpoint, rng):  # noqa: F811
    """An artifact compiled without the `sample` function: the engine draws its sampled rows on the host (seeded
    by the request: the same tokens twice), beside a greedy row that still takes the decode's argmax."""
    d = llm_checkpoint("llama")
    art = rocmc.llm.compile_hf(d, "cpu", max_seq_len=64, max_batch=2, functions=("prefill", "decode"))
    lm = rocmc.llm.load(art, d)
    assert "sample" not in lm.module.functions
    a, c = _prompts(rng, (6, 9))
    settings = dict(do_sample=True, temperature=0.9, top_k=20, top_p=0.95, seed=3)
    runs = []
    for _ in range(2):
        engine = Engine(lm)
        ra = engine.submit(a, max_new_tokens=7, stop_tokens=(), **settings)
        rc = engine.submit(c, max_new_tokens=5, stop_tokens=())
        list(engine.run())
        assert (ra._path, rc._path) == ("host", "argmax")
        runs.append((ra.tokens, rc.tokens))
    assert runs[0] == runs[1] and len(runs[0][0]) == 7
    assert runs[0][1] == _alone(lm, c, 5)


def test_cancel_frees_the_slot_for_a_waiting_request(lm, rng):
    a, b, c = _prompts(rng, (5, 6, 7))
    engine = Engine(lm)
    ra, rb = engine.submit(a, max_new_tokens=40, stop_tokens=()), engine.submit(b, max_new_tokens=3, stop_tokens=())
    rc = engine.submit(c, max_new_tokens=4, stop_tokens=())
    engine.step()
    engine.step()
    assert rc.state == "waiting"
    engine.cancel(ra)
    events = engine.step()
    assert ra.done and ra.finish_reason == "cancelled" and any(e.request is ra and e.token is None for e in events)
    list(engine.run())
    assert rc.tokens == _alone(lm, c, 4) and rb.tokens == _alone(lm, b, 3)
    assert len(ra.tokens) < 40


def _schedule(lm, prompts, issue_ahead: bool, stop_token: int):
    """Requests joining at different rounds on two slots: greedy with token limits, one ending on a stop token,
    one cancelled while a step for it may be in flight, one sampled on the host (its rounds run one step at a
    time). Returns (each request's events' tokens, its finish reason), the submissions of decode issued ahead
    and the rounds that ran."""
    engine = Engine(lm, prefill_chunk=8, issue_ahead=issue_ahead)
    with _submissions(lm) as submitted:
        plan = {0: [0, 1], 2: [2], 4: [3], 9: [4], 12: [5]}  # round -> requests submitted before it
        limits = [14, 6, 9, 11, 5, 7]
        reqs, got = [], {}
        for step in range(300):
            for i in plan.get(step, []):
                stops = (stop_token,) if i == 3 else ()
                extra = dict(do_sample=True, temperature=0.8, top_k=0, top_p=1.0, seed=7) if i == 4 else {}
                reqs.append(engine.submit(prompts[i], max_new_tokens=limits[i], stop_tokens=stops, **extra))
            if step == 7:
                engine.cancel(reqs[2])
            for ev in engine.step():
                got.setdefault(ev.request.id, []).append(ev.token)
            if step > max(plan) and engine.idle:
                break
    assert engine.idle
    return [(got[r.id], r.finish_reason) for r in reqs], submitted, step


def test_decode_steps_issued_ahead_give_the_tokens_of_steps_read_in_turn(lm, rng):
    """The engine issues a decode step before the tokens of the one before are read (its tokens that step's
    output on the device): rows joining, ending on a stop token or their limit, cancelled, and sampled on the
    host get the events of an engine that reads every step before issuing the next, and the greedy ones
    their tokens alone."""
    prompts = _prompts(rng, (5, 19, 3, 11, 7, 4))
    alone = _alone(lm, prompts[3], 11)
    stop = alone[4]  # request 3 ends on its 5th token (or earlier, where that token came before)
    ahead, submitted, rounds = _schedule(lm, prompts, True, stop)
    read_in_turn, none, rounds_in_turn = _schedule(lm, prompts, False, stop)
    assert none == [] and submitted.count("decode") >= 12  # the steps were issued ahead
    assert (
        [f for _, f in ahead]
        == [f for _, f in read_in_turn]
        == ["length", "length", "cancelled", "stop", "length", "length"]
    )
    for i in (0, 1, 3, 4, 5):
        assert ahead[i] == read_in_turn[i]
    for i in (0, 1, 5):
        assert ahead[i][0] == _alone(lm, prompts[i], len(ahead[i][0]))
    assert ahead[3][0] == alone[: alone.index(stop) + 1]
    # cancelled at a round: its tokens until then (a joining row's wait may shift that round's place in its run)
    want = _alone(lm, prompts[2], 9)
    for got in (ahead[2][0], read_in_turn[2][0]):
        assert got[-1] is None and got[:-1] == want[: len(got) - 1]
    assert rounds <= rounds_in_turn + 4  # a joining row waits a round at most


def test_what_the_engine_refuses(lm):
    engine = Engine(lm, max_waiting=1)
    with pytest.raises(rocmc.InputError, match="the prompt is empty"):
        engine.submit([], max_new_tokens=2)
    with pytest.raises(rocmc.InputError, match=r"prompt token 99999 is outside the vocabulary \[0, 384\)"):
        engine.submit([5, 99999], max_new_tokens=2)
    with pytest.raises(rocmc.InputError, match="prompt of 60 tokens \\+ max_new_tokens=10 exceeds the cache of 64"):
        engine.submit([5] * 60, max_new_tokens=10)
    with pytest.raises(rocmc.InputError, match=r"top_logprobs=3: expected an int in \[0, 20\], with return_logprobs"):
        engine.submit([5, 6], max_new_tokens=2, top_logprobs=3)
    engine.submit([5, 6], max_new_tokens=2)
    with pytest.raises(QueueFull, match="1 requests are waiting already"):
        engine.submit([5, 6], max_new_tokens=2)
    # a limit not given is capped at the cache
    r = Engine(lm).submit([5] * 60, stop_tokens=())
    assert r._tracker.max_new == 4


def test_a_prefill_chunk_that_is_not_a_positive_int_is_refused(lm):
    for bad in (0, -3, 2.5, True):
        with pytest.raises(rocmc.InputError, match="prefill_chunk"):
            Engine(lm, prefill_chunk=bad)


def test_serving_memory_refuses_a_cache_that_does_not_fit(lm, monkeypatch):
    """The KV cache and weights against the device's free memory: said when they fit; refused with the numbers
    and what would fit when they do not; unchecked (and said so) where the driver can't tell."""
    from rocmc.llm.runtime import SERVING_WORKSPACE, kv_cache_bytes, serving_memory
    from rocmc.runtime import devices

    cfg, sizes = lm.config, lm.sizes
    cache = kv_cache_bytes(cfg, sizes.max_seq_len, sizes.max_batch, sizes.dtype)
    weights = sum(int(np.prod(s)) for _, s in rocmc.llm.config.param_names(cfg)) * 4  # f32 on the CPU
    line = serving_memory(cfg, sizes, "local-task")  # this machine's /proc/meminfo
    assert f"{sizes.max_batch} slots x {sizes.max_seq_len} positions {cache / 2**20:.1f} MiB" in line
    assert f"weights {weights / 2**20:.1f} MiB" in line and "MiB free on local-task" in line
    # Room for the weights, the workspace and 1.5 slots' cache: 2 slots are refused, 1 slot would fit.
    free = weights + SERVING_WORKSPACE + cache * 3 // 4
    monkeypatch.setattr(devices, "memory", lambda device: (free, 2 * free))
    with pytest.raises(rocmc.InputError, match=r"at most 1 slots of 64 positions fit \(--max-batch\), or 48 positions"):
        serving_memory(cfg, sizes, "cuda:1")
    monkeypatch.setattr(devices, "memory", lambda device: (weights, 2 * weights))
    with pytest.raises(rocmc.InputError, match="on hip: the weights alone do not fit"):
        serving_memory(cfg, sizes, "hip")
    monkeypatch.setattr(devices, "memory", lambda device: None)
    assert "does not report its free memory: not checked" in serving_memory(cfg, sizes, "cuda")


def test_device_memory_is_the_host_s_for_the_cpu_drivers():
    from rocmc.runtime.devices import memory

    free, total = memory("local-task")
    assert 0 < free <= total
    with pytest.raises(rocmc.DeviceError, match="unknown device 'tpu'"):
        memory("tpu")
