"""Rows that live apart, on the GPU: a tiny Llama 3 (GQA) and Mistral (sliding window) compiled for cuda:sm_80
in f16 with four cache slots. Each row of a decode step runs at its own position, a row joins while the others
decode (its prefill writes only its own slot), a long prompt is prefilled in chunks; every row's tokens and
logits equal those it gets alone, and each decode step's logits equal a recompute of the whole sequence.

The compile step writes the module and the checkpoint it runs with (made by transformers) under
DIR/llm_rows/<family>/; the run step needs neither the compiler nor transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rocmc
from rocmc.llm.runtime import _SlotTable

from gpu_harness import Compiler, rel_l2
from helpers import greedy_alone

FAMILIES = ("llama3", "mistral")
B, SEQ = 4, 96


def _dir(gpu_step, family):
    return (gpu_step.out if isinstance(gpu_step, Compiler) else gpu_step.dir) / "llm_rows" / family


def _prepare(d, family):
    from llm_models import make_checkpoint

    make_checkpoint(family, d / "ckpt")
    cfg = json.loads((d / "ckpt" / "config.json").read_text())
    rocmc.llm.compile_hf(d / "ckpt", "cuda:sm_80", dtype="f16", max_seq_len=SEQ, max_batch=B).save(d / "m.vmfb")
    assert cfg["num_hidden_layers"] >= 2


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_rows_at_their_own_positions(gpu_step, family):
    d = _dir(gpu_step, family)
    if isinstance(gpu_step, Compiler):
        d.mkdir(parents=True, exist_ok=True)
        _prepare(d, family)
        return
    lm = rocmc.llm.load(d / "m.vmfb", d / "ckpt", device="cuda")
    rng = np.random.default_rng(5)
    vocab = lm.config.vocab_size
    prompts = [[int(t) for t in rng.integers(3, vocab, n)] for n in (5, 41, 17)]
    n_new = 16
    alone = [greedy_alone(lm, p, n_new) for p in prompts]
    # Together: rows 0 and 1 from the start (row 1 prefilled in chunks of 8), row 2 joining at step 5.
    slots = _SlotTable(lm.sizes, lm.config, chunk=8)
    got = [([], []) for _ in prompts]
    joins = {0: 0, 1: 0, 2: 5}
    step = np.zeros(B, np.int64)
    for i in range(n_new + 5):
        for r, at in joins.items():
            if at == i:
                for feeds in slots.prefill(r, prompts[r]):
                    nxt, _, _ = lm.module.prefill(**feeds)
                got[r][0].append(int(nxt[0]))
        for r in range(len(prompts)):
            if got[r][0]:
                step[r] = got[r][0][-1]
        nxt, logits = lm.module.decode(**slots.decode(step))
        for r in range(len(prompts)):
            if got[r][0] and len(got[r][0]) < n_new:
                got[r][0].append(int(nxt[r]))
                got[r][1].append(logits[r])
    for r, (toks, logits) in enumerate(got):
        want_toks, want_logits = alone[r]
        errs = [rel_l2(a, w) for a, w in zip(logits, want_logits[1:])]
        assert max(errs) < 2e-3, (r, errs)
        # tokens agree up to the first step whose top-2 logits are within f16 rounding
        for t, w, lg in zip(toks, want_toks, [None] + want_logits[1:]):
            if lg is not None and np.diff(np.sort(lg)[-2:])[0] < 0.05:
                break
            assert t == w
    # each decode step's logits against the whole sequence recomputed (f16 rounding)
    toks, logits = alone[1]
    for k in (1, 7, n_new - 1):
        full = lm.logits(prompts[1] + toks[:k])[0, -1]
        assert rel_l2(logits[k], full) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_rows_prefilled_in_one_call(gpu_step, family):
    """Prompts of 3, 17, 24 and 11 tokens prefilled in one call (4 x 24 tokens: the module's 96 positions; rows
    folded into the projections' rows, each row's attention at its own slot, the shorter rows padded by repeating
    their last token): every row's logits at every position equal the row prefilled alone (f16 rounding), and
    the decode step after gives each row the logits it gets alone."""
    d = _dir(gpu_step, family)
    if isinstance(gpu_step, Compiler):
        pytest.skip("the module is test_rows_at_their_own_positions's")
    lm = rocmc.llm.load(d / "m.vmfb", d / "ckpt", device="cuda")
    rng = np.random.default_rng(6)
    prompts = [[int(t) for t in rng.integers(3, lm.config.vocab_size, n)] for n in (3, 17, 24, 11)]
    # Alone first (each in slot 0 of fresh tables, which the batch's prefill then overwrites).
    alone = [greedy_alone(lm, ids, 2) for ids in prompts]
    every_alone = [lm.logits(ids)[0] for ids in prompts]
    slots = _SlotTable(lm.sizes, lm.config)
    ((call, feeds),) = slots.prefill_rows(list(enumerate(prompts)))
    _, _, every = lm.module.prefill(**feeds)
    step = np.zeros(B, np.int64)
    step[: len(prompts)] = [toks[0] for toks, _ in alone]  # each row's own first token (no near tie followed)
    _, logits = lm.module.decode(**slots.decode(step))
    for j, slot in enumerate(call):
        n = len(prompts[slot])
        assert rel_l2(every[j, :n], every_alone[slot]) < 2e-3, (slot, rel_l2(every[j, :n], every_alone[slot]))
        assert rel_l2(logits[slot], alone[slot][1][1]) < 2e-3


@pytest.mark.gpu
def test_the_engine_runs_on_a_thread_of_its_own(gpu_step):
    """rocmc serve loads the model on the main thread and steps its engine on another: IREE's CUDA driver makes
    its context current on the thread that created the device only (before rocmc.runtime.devices.bind_thread, a
    7B engine step there failed with CUDA_ERROR_INVALID_CONTEXT). Three requests on the engine's thread give the
    greedy tokens each gives alone on the main thread."""
    import threading

    from rocmc.llm.engine import Engine

    d = _dir(gpu_step, "llama3")
    if isinstance(gpu_step, Compiler):
        pytest.skip("the module is test_rows_at_their_own_positions[llama3]'s")
    lm = rocmc.llm.load(d / "m.vmfb", d / "ckpt", device="cuda")
    rng = np.random.default_rng(8)
    prompts = [[int(t) for t in rng.integers(3, lm.config.vocab_size, n)] for n in (7, 30, 12)]
    engine, got, errors = Engine(lm, prefill_chunk=8), {}, []
    reqs = [engine.submit(p, max_new_tokens=10, stop_tokens=()) for p in prompts]

    def run():
        try:
            for ev in engine.run():
                if ev.token is not None:
                    got.setdefault(ev.request.id, []).append(ev.token)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    assert not errors and not thread.is_alive(), errors
    for req, p in zip(reqs, prompts):
        want, logits = greedy_alone(lm, p, 10)
        for t, w, lg in zip(got[req.id], want, logits):
            if np.diff(np.sort(lg)[-2:])[0] < 0.05:
                break  # a top-2 tie within f16 rounding: from here the tokens may part
            assert t == w


@pytest.mark.gpu
def test_steps_issued_ahead_equal_steps_one_at_a_time(gpu_step):
    """generate with its steps issued ahead (decode$async, sample$async: held KV cache, caller storage, no wait on
    the step before, tokens in host memory) gives the tokens of steps run one at a time, greedy and sampled. The
    module of test_rows_at_their_own_positions (llama3)."""
    if isinstance(gpu_step, Compiler):
        return  # test_rows_at_their_own_positions compiles it
    d = _dir(gpu_step, "llama3")
    lm = rocmc.llm.load(d / "m.vmfb", d / "ckpt", device="cuda")
    assert lm.module.can_submit("decode") and lm.module.can_submit("sample")
    prompt = [1, 5, 9, 13, 2, 7]
    for kw in (
        dict(temperature=1.0, top_k=20, top_p=0.9, seed=7),
        dict(temperature=0.7, top_k=0, top_p=1.0, seed=3),
        dict(temperature=0.0),
    ):
        lm.pipeline = True
        ahead = lm.generate(list(prompt), 24, stop_tokens=(), **kw)
        lm.pipeline = False
        assert ahead == lm.generate(list(prompt), 24, stop_tokens=(), **kw), kw


@pytest.mark.gpu
def test_the_engine_draws_on_the_device_as_generate_does(gpu_step):
    """The engine draws sampled rows on the device (`sample` after each decode step, each row its own settings
    and key), its steps issued ahead: two sampled requests beside a greedy one get the tokens of the engine
    reading every step in turn, and the tokens `generate` draws for each alone with its seed. The module of
    test_rows_at_their_own_positions (llama3)."""
    from rocmc.llm.engine import Engine

    if isinstance(gpu_step, Compiler):
        return  # test_rows_at_their_own_positions compiles it
    d = _dir(gpu_step, "llama3")
    lm = rocmc.llm.load(d / "m.vmfb", d / "ckpt", device="cuda")
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(3, lm.config.vocab_size, n)] for n in (9, 21, 5)]
    settings = [
        dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=31),
        dict(do_sample=True, temperature=1.2, top_k=40, top_p=1.0, seed=8),
        dict(do_sample=False),
    ]
    runs = []
    for issue_ahead in (True, False):
        engine = Engine(lm, prefill_chunk=64, issue_ahead=issue_ahead)  # each prompt one chunk, as alone
        reqs = [engine.submit(p, max_new_tokens=20, stop_tokens=(), **s) for p, s in zip(prompts, settings)]
        list(engine.run())
        assert [r._path for r in reqs] == ["sample", "sample", "argmax"]
        runs.append([r.tokens for r in reqs])
    assert runs[0] == runs[1]
    for got, p, s in zip(runs[0][:2], prompts, settings):
        assert got == lm.generate([p], 20, stop_tokens=(), **s)[0], s
