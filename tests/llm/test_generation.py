"""LanguageModel.generate with transformers' settings, against transformers' generate on the tiny checkpoints
(tests/llm_models.py), and the host-side generation layer (rocmc.llm.generation) on its own."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import rocmc
from rocmc.llm import generation
from llm_models import PROMPT_IDS, _load, hf_logits, llm_checkpoint, save_tokenizer  # noqa: F401

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

P = list(PROMPT_IDS)


@pytest.fixture(scope="module")
def art(llm_checkpoint):  # noqa: F811
    """The llama model compiled once (max_batch 2, sample_k 64 of a 384-token vocabulary)."""
    return rocmc.llm.compile_hf(llm_checkpoint("llama"), "cpu", max_seq_len=64, max_batch=2)


@pytest.fixture(scope="module")
def lm(art, llm_checkpoint):  # noqa: F811
    return rocmc.llm.load(art, llm_checkpoint("llama"))


@pytest.fixture(scope="module")
def text_ckpt(llm_checkpoint, tmp_path_factory):  # noqa: F811
    """The llama checkpoint with a tokenizer covering all of the model's 384 ids (added word tokens fill the
    ids the small trained vocabulary leaves), so any generated text decodes."""
    d = tmp_path_factory.mktemp("text") / "llama"
    shutil.copytree(llm_checkpoint("llama"), d)
    save_tokenizer(letter_tokenizer(384), d, bos_template=True, config={"add_bos_token": True})
    return d


def letter_tokenizer(vocab_size: int):
    """A tokenizer whose every id decodes to plain text: <unk> <s> </s>, the ▁ of a space, printable ASCII
    characters, then two-letter pieces up to vocab_size (no merges: text encodes character by character)."""
    import string
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = ["<unk>", "<s>", "</s>", "\u2581", *string.ascii_letters, *string.digits, *string.punctuation]
    pieces += [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase][: vocab_size - len(pieces)]
    tk = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, [], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tk.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tk.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tk


def hf_generate(directory, prompts, **kw):
    """transformers' generate (end-of-sequence ids don't stop it): (new tokens per row, scores per step)."""
    model = _load(str(directory))
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        ids = torch.tensor(prompts)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            pad_token_id=0,
            return_dict_in_generate=True,
            output_scores=True,
            **kw,
        )
    finally:
        model.generation_config.eos_token_id = saved
    return out, model


def _new(out, prompt_len):
    return out.sequences[:, prompt_len:].tolist()


def test_greedy_and_repetition_penalty_equal_transformers(lm, llm_checkpoint):  # noqa: F811
    d = llm_checkpoint("llama")
    out, _ = hf_generate(d, [P], do_sample=False, max_new_tokens=16)
    assert lm.generate(P, 16, stop_tokens=()) == _new(out, len(P))[0]
    out_rp, _ = hf_generate(d, [P], do_sample=False, max_new_tokens=16, repetition_penalty=1.3)
    want = _new(out_rp, len(P))[0]
    assert want != _new(out, len(P))[0]  # the penalty changes this path
    assert lm.generate(P, 16, repetition_penalty=1.3, stop_tokens=()) == want
    # a temperature does not matter when do_sample=False
    assert lm.generate(P, 16, repetition_penalty=1.3, do_sample=False, temperature=0.5, stop_tokens=()) == want


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_logprobs_equal_transition_scores(lm, llm_checkpoint, penalty):  # noqa: F811
    d = llm_checkpoint("llama")
    out, model = hf_generate(d, [P], do_sample=False, max_new_tokens=12, repetition_penalty=penalty)
    want = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0].double().numpy()
    got = lm.generate(P, 12, repetition_penalty=penalty, stop_tokens=(), return_logprobs=True)
    assert isinstance(got, rocmc.llm.GenerationResult) and got.finish_reason == "length"
    assert got.tokens == _new(out, len(P))[0]
    np.testing.assert_allclose(got.logprobs, want, atol=1e-4)


def test_max_length_counts_the_prompt(lm, llm_checkpoint):  # noqa: F811
    out, _ = hf_generate(llm_checkpoint("llama"), [P], do_sample=False, max_length=13)
    got = lm.generate(P, max_length=13, stop_tokens=())
    assert len(got) == 5 and got == _new(out, len(P))[0]
    # max_new_tokens wins over max_length, as in transformers
    assert len(lm.generate(P, 3, max_length=13, stop_tokens=())) == 3
    # several prompts: the longest counts (one transformers batch)
    assert [len(r) for r in lm.generate([P, P[:3]], max_length=10, stop_tokens=())] == [2, 2]
    with pytest.raises(rocmc.InputError, match="max_length=5"):
        lm.generate(P, max_length=5)


def test_num_return_sequences(lm):
    greedy = [lm.generate(p, 6, stop_tokens=()) for p in (P, P[:4])]
    # top_k=1 samples the argmax: each prompt's copies are its greedy continuation, in transformers' order
    got = lm.generate([P, P[:4]], 6, do_sample=True, top_k=1, num_return_sequences=2, seed=5, stop_tokens=())
    assert got == [greedy[0], greedy[0], greedy[1], greedy[1]]
    drawn = lm.generate(P, 8, do_sample=True, top_k=0, temperature=1.5, num_return_sequences=3, seed=1, stop_tokens=())
    assert len(drawn) == 3 and len({tuple(r) for r in drawn}) > 1  # copies draw apart
    with pytest.raises(rocmc.InputError, match="num_return_sequences=2 needs do_sample=True"):
        lm.generate(P, 4, num_return_sequences=2)


def _allowed(directory, seq, temperature, top_k, top_p):
    """transformers' warpers over its own logits for the sequence so far: the processed scores."""
    scores = torch.tensor(hf_logits(directory, seq)[-1:])
    for w in (
        transformers.TemperatureLogitsWarper(temperature),
        transformers.TopKLogitsWarper(top_k),
        transformers.TopPLogitsWarper(top_p),
    ):
        scores = w(torch.tensor([seq]), scores)
    return scores[0].numpy()


@pytest.mark.parametrize("top_k,host", [(5, False), (100, True)])
def test_sampling_is_seeded_and_inside_the_allowed_set(lm, llm_checkpoint, top_k, host):  # noqa: F811
    """top_k 5 fits the compiled sample_k (64): drawn on the device; 100 does not: drawn on the host."""
    d = llm_checkpoint("llama")
    settings = dict(temperature=0.7, top_k=top_k, top_p=0.95, stop_tokens=())
    assert lm.generation_config(**settings).path(lm.sizes.sample_k, lm.config.vocab_size) == (
        "host" if host else "sample"
    )
    a = lm.generate(P, 10, seed=11, **settings)
    assert a == lm.generate(P, 10, seed=11, **settings)
    assert a != lm.generate(P, 10, seed=12, **settings) or a != lm.generate(P, 10, seed=13, **settings)
    for i, tok in enumerate(a):
        scores = _allowed(d, P + a[:i], 0.7, top_k, 1.0 if not host else 0.95)
        assert np.isfinite(scores[tok]), f"step {i}: token {tok} outside the top-{top_k} set"
    if host:  # the log-probabilities of the draw: transformers' processed scores, normalized
        r = lm.generate(P, 10, seed=11, return_logprobs=True, **settings)
        assert r.tokens == a  # asking for logprobs does not change the host path's draw
        for i, (tok, lp) in enumerate(zip(r.tokens, r.logprobs)):
            scores = torch.tensor(_allowed(d, P + a[:i], 0.7, top_k, 0.95))
            assert abs(lp - float(torch.log_softmax(scores.double(), -1)[tok])) < 1e-4


def test_whole_vocabulary_sampling_runs_on_the_host(lm):
    cfg = lm.generation_config(do_sample=True, top_k=0)
    assert cfg.path(lm.sizes.sample_k, lm.config.vocab_size) == "host"
    assert lm.generation_config(do_sample=True, top_k=0).path(lm.config.vocab_size, lm.config.vocab_size) == "sample"
    a = lm.generate(P, 12, do_sample=True, top_k=0, seed=3, stop_tokens=())
    assert a == lm.generate(P, 12, do_sample=True, top_k=0, seed=3, stop_tokens=())
    # the backward-compatible form: a temperature samples (on the device, among sample_k)
    b = lm.generate(P, 12, temperature=0.8, top_p=0.9, seed=1, stop_tokens=())
    assert b == lm.generate(P, 12, temperature=0.8, top_p=0.9, seed=1, stop_tokens=())


def test_generation_config_json_gives_the_defaults(art, llm_checkpoint, tmp_path):  # noqa: F811
    d = tmp_path / "llama"
    shutil.copytree(llm_checkpoint("llama"), d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen.update(do_sample=False, repetition_penalty=1.3, max_new_tokens=7)
    (d / "generation_config.json").write_text(json.dumps(gen))
    lm = rocmc.llm.load(art, d)
    out, _ = hf_generate(d, [P])  # transformers reads the same file
    got = lm.generate(P, stop_tokens=())
    assert len(got) == 7 and got == _new(out, len(P))[0]
    assert len(lm.generate(P, 3, stop_tokens=())) == 3  # the caller's settings win
    # sampling settings from the file; a caller's do_sample=False overrides them
    gen.update(do_sample=True, top_k=1, temperature=0.6, top_p=0.8)
    del gen["repetition_penalty"]
    (d / "generation_config.json").write_text(json.dumps(gen))
    cfg = rocmc.llm.load(art, d).generation_config()
    assert (cfg.do_sample, cfg.top_k, cfg.temperature, cfg.top_p, cfg.max_new_tokens) == (True, 1, 0.6, 0.8, 7)
    assert not rocmc.llm.load(art, d).generation_config(do_sample=False).do_sample
    gen["top_k"] = -3
    (d / "generation_config.json").write_text(json.dumps(gen))
    with pytest.raises(rocmc.InputError, match="generation_config.json: top_k=-3"):
        rocmc.llm.load(art, d).generate(P)


def test_resolve_defaults_and_validation():
    r = generation.resolve
    assert r({}) == generation.GenerationConfig()  # transformers' defaults: greedy
    assert r({}).new_tokens(8, 64) == generation.DEFAULT_MAX_NEW_TOKENS
    assert r({}).new_tokens(50, 64) == 14  # a default length is capped at the cache
    assert r({"temperature": 0.8}).do_sample and not r({"temperature": 0.0}).do_sample
    assert not r({"temperature": 0.8, "do_sample": False}).do_sample
    assert r({}, {"do_sample": True, "top_k": 0}).top_k == 0
    assert r({"max_length": 30}, {"max_new_tokens": 5}).new_tokens(8, 64) == 22
    for bad, name in (
        (dict(top_p=0.0), "top_p"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(do_sample=True, temperature=0), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(seed=-1), "seed"),
        (dict(max_new_tokens=-2), "max_new_tokens"),
        (dict(stop_strings=[""]), "stop_strings"),
        (dict(top_q=1), "top_q"),
    ):
        with pytest.raises(rocmc.InputError, match=name):
            r(bad)


def test_processors_follow_transformers(rng):
    logits = rng.standard_normal((3, 50)) * 3
    ids = torch.tensor([[1, 4, 4, 9], [0, 2, 3, 3], [7, 7, 7, 7]])
    hist = ids.tolist()
    t = torch.tensor(logits)
    want = transformers.RepetitionPenaltyLogitsProcessor(1.7)(ids, t.clone()).numpy()
    np.testing.assert_allclose(generation.apply_repetition_penalty(logits, hist, 1.7), want, rtol=1e-12)
    for warper, mine in (
        (transformers.TopKLogitsWarper(7), lambda x: generation.apply_top_k(x, 7)),
        (transformers.TopPLogitsWarper(0.8), lambda x: generation.apply_top_p(x, 0.8)),
        (transformers.TemperatureLogitsWarper(0.6), lambda x: generation.apply_temperature(x, 0.6)),
    ):
        want = warper(ids, t.clone()).numpy()
        np.testing.assert_allclose(mine(logits), want, rtol=1e-12)


def test_stop_tracker():
    t = generation.StopTracker(3, 4, frozenset({9}))
    assert t.push([1, 9, 2]) == [1, 9, 2]
    assert t.push([9, 5, 3]) == [9, None, 3]
    assert t.push([4, 4, 4]) == [None, None, 4]
    assert not t.all_done and t.push([1, 1, 1]) == [None, None, 1] and t.all_done
    assert t.tokens == [[1, 9], [9], [2, 3, 4, 1]] and t.finish_reason == ["stop", "stop", "length"]
    with pytest.raises(rocmc.InputError, match="tokenizer"):
        generation.StopTracker(1, 4, stop_strings=("x",))


def test_stop_strings_equal_transformers(art, text_ckpt):
    lm = rocmc.llm.load(art, text_ckpt)
    tok = transformers.AutoTokenizer.from_pretrained(text_ckpt)
    ids = lm.tokenizer.encode("the cat sat")
    assert ids == tok("the cat sat")["input_ids"]
    full = lm.generate(ids, 20, stop_tokens=())
    text = lm.tokenizer.decode(full)
    # a stop string that appears first in the middle of the continuation
    start = next(i for i in range(len(text) // 3, len(text) - 3) if text[i : i + 3].isalnum())
    stop = text[start : start + 3]
    got = lm.generate(ids, 20, stop_strings=[stop], stop_tokens=(), return_logprobs=True)
    out, _ = hf_generate(text_ckpt, [ids], do_sample=False, max_new_tokens=20, stop_strings=[stop], tokenizer=tok)
    assert got.tokens == _new(out, len(ids))[0] and len(got.tokens) < 20 and got.finish_reason == "stop"
    assert stop in lm.tokenizer.decode(got.tokens) and stop not in lm.tokenizer.decode(got.tokens[:-1])
    # text in, text out: the text of the kept tokens
    assert lm.generate("the cat sat", 20, stop_strings=stop, stop_tokens=()) == lm.tokenizer.decode(got.tokens)


def test_more_prompts_than_max_batch_run_in_chunks(lm, rng):
    prompts = [[int(t) for t in rng.integers(3, 380, size=n)] for n in (5, 2, 7, 3, 4)]
    for settings in (dict(), dict(repetition_penalty=1.2)):
        got = lm.generate(prompts, 6, stop_tokens=(), **settings)
        assert got == [lm.generate(p, 6, stop_tokens=(), **settings) for p in prompts]
    a = lm.generate(prompts, 5, do_sample=True, top_k=0, seed=4, stop_tokens=())
    assert len(a) == 5 and a == lm.generate(prompts, 5, do_sample=True, top_k=0, seed=4, stop_tokens=())
    with pytest.raises(rocmc.InputError, match="generate\\(\\) runs more prompts in chunks"):
        list(lm.stream(prompts, 2))


def test_prompt_kinds(lm):
    want = lm.generate([P, P[::-1]], 4, stop_tokens=())
    assert lm.generate(np.array([P, P[::-1]]), 4, stop_tokens=()) == want
    assert lm.generate(torch.tensor([P, P[::-1]]), 4, stop_tokens=()) == want
    assert lm.generate(torch.tensor(P), 4, stop_tokens=()) == want[0]
    assert lm.generate([torch.tensor(P), np.array(P[::-1])], 4, stop_tokens=()) == want
    with pytest.raises(rocmc.InputError, match="prompt"):
        lm.generate(np.zeros((1, 2, 3), np.int64), 2)


def test_too_long_prompt_names_the_flag_and_the_keyword(lm):
    with pytest.raises(rocmc.InputError) as e:
        lm.generate(P * 7, 10)
    assert "max_seq_len=" in str(e.value) and "--max-seq-len" in str(e.value) and "--truncate" in str(e.value)


def test_cli_truncate_keeps_the_end_of_the_prompt(llm_checkpoint, capsys):  # noqa: F811
    from rocmc.cli import main

    d = llm_checkpoint("llama")
    long = (P * 5)[:37]
    args = ["generate", str(d), "--ids", "-p", ", ".join(map(str, long)), "-n", "4", "--max-seq-len", "32"]
    assert main(args) == 2
    assert "--max-seq-len" in capsys.readouterr().err
    assert main(args + ["--truncate"]) == 0
    out = [int(t) for t in capsys.readouterr().out.split()]
    want, _ = hf_generate(d, [long[-28:]], do_sample=False, max_new_tokens=4)
    eos = 2
    w = _new(want, 28)[0]
    assert out == w[: w.index(eos) + 1] if eos in w else out == w


def test_cli_checks_the_checkpoint_before_compiling(llm_checkpoint, tmp_path, capsys, monkeypatch):  # noqa: F811
    from safetensors.numpy import load_file, save_file
    from rocmc.cli import main
    import rocmc.llm.runtime as runtime

    def no_compile(*a, **k):
        raise AssertionError("compiled before the checkpoint was checked")

    monkeypatch.setattr(runtime, "compile_hf", no_compile)
    d = tmp_path / "ck"
    shutil.copytree(llm_checkpoint("llama"), d)
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    assert main(["generate", str(d), "--ids", "-p", "1, 2"]) == 2
    err = capsys.readouterr().err
    assert "model.layers.1.mlp.up_proj.weight" in err and "model.safetensors" in err
    shutil.rmtree(d)
    shutil.copytree(llm_checkpoint("llama"), d)
    (d / "tokenizer.json").unlink()
    assert main(["generate", str(d), "-p", "the cat"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err
    (d / "config.json").write_text("{not json")
    assert main(["generate", str(d), "--ids", "-p", "1, 2"]) == 2
    assert "config.json" in capsys.readouterr().err


def test_presence_and_frequency_penalties_as_openai_defines_them(rng):
    """logit[t] - presence * (count[t] > 0) - frequency * count[t], over the generated ids only."""
    logits = rng.standard_normal((2, 30)) * 3
    generated = [[4, 4, 9, 4], []]
    want = logits.copy()
    want[0, 4] -= 0.5 + 1.25 * 3
    want[0, 9] -= 0.5 + 1.25 * 1
    got = generation.apply_count_penalties(logits, generated, 0.5, 1.25)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    cfg = generation.resolve({"presence_penalty": 0.5, "frequency_penalty": 1.25})
    # process counts `generated`, not the prompt in the histories
    np.testing.assert_allclose(generation.process(logits, [[1, 2, 4, 4, 9, 4], [3]], cfg, generated), want, rtol=1e-12)
    assert cfg.path(64, 30) == "host"
    with pytest.raises(rocmc.InputError, match=r"presence_penalty=3: expected a number in \[-2, 2\]"):
        generation.resolve({"presence_penalty": 3})


@pytest.mark.parametrize(
    "settings",
    [{}, dict(do_sample=True, temperature=0.9, top_k=20, top_p=0.9, seed=4)],
    ids=["greedy", "device-sampling"],
)
def test_steps_issued_ahead_equal_steps_read_one_at_a_time(lm, monkeypatch, settings):
    """Decode steps issued before the tokens of the one before are read (its tokens passed on the device) give
    the tokens of steps issued one at a time; rows of different lengths, and a stop that ends one row early."""
    prompts = [P, P[:5]]
    calls = []
    submit = lm.module.submit
    monkeypatch.setattr(lm.module, "submit", lambda f, *a, **k: calls.append(f) or submit(f, *a, **k))
    ahead = lm.generate(prompts, 9, stop_tokens=(), **settings)
    assert calls.count("decode") == 8 and calls.count("sample") == (8 if settings else 0)
    first = ahead[1][3]
    stopped = lm.generate(prompts, 9, stop_tokens=(first,), **settings)
    streamed = list(lm.stream(P, 6, stop_tokens=(), **settings))
    early = next(iter(lm.stream(P, 6, stop_tokens=(), **settings)))  # left with a step issued and unread
    lm.pipeline = False
    try:
        calls.clear()
        assert lm.generate(prompts, 9, stop_tokens=(), **settings) == ahead and not calls
        assert lm.generate(prompts, 9, stop_tokens=(first,), **settings) == stopped
        assert list(lm.stream(P, 6, stop_tokens=(), **settings)) == streamed
    finally:
        lm.pipeline = True
    assert early == streamed[0] and stopped[1][-1] == first and len(stopped[1]) <= 4
