"""rocmc.llm against transformers: tiny random-init checkpoints of every family (tests/llm_models.py) compiled
for the CPU with their weights as parameters read from the checkpoint's own safetensors."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import rocmc
from rocmc.llm.runtime import _SlotTable
from helpers import greedy_alone
from llm_models import N_NEW, PROMPT_IDS, hf_greedy, hf_logits, llm_checkpoint  # noqa: F401

FAMILIES = ["llama", "llama3", "mistral", "qwen2", "gemma"]


@pytest.fixture(scope="module")
def models(llm_checkpoint):  # noqa: F811
    """family -> LanguageModel (f32, CPU), compiled once per module."""
    built = {}

    def get(family):
        if family not in built:
            built[family] = rocmc.llm.load_hf(llm_checkpoint(family), "cpu", max_seq_len=64, max_batch=2)
        return built[family]

    return get


def _rel(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_logits_and_greedy_match_transformers(models, llm_checkpoint, family):  # noqa: F811
    lm, d = models(family), llm_checkpoint(family)
    assert _rel(lm.logits(list(PROMPT_IDS))[0], hf_logits(d, PROMPT_IDS)) < 1e-4
    assert lm.generate(list(PROMPT_IDS), N_NEW, stop_tokens=()) == hf_greedy(d, PROMPT_IDS, N_NEW)


@pytest.mark.parametrize("family", ["llama3", "mistral"])
def test_decode_equals_full_recompute_at_every_step(models, family):
    """The KV cache path: each decode step's logits equal the logits of the whole sequence so far."""
    lm = models(family)
    toks, logits = greedy_alone(lm, list(PROMPT_IDS), 25)
    for k in range(1, 25):
        full = lm.logits(list(PROMPT_IDS) + toks[:k])[0, -1]
        assert _rel(logits[k], full) < 1e-5
        assert toks[k] == int(np.argmax(full))


@pytest.mark.parametrize("family", ["llama3", "mistral"])
def test_rows_live_apart(models, rng, family):
    """Rows at different positions, a row joining while another decodes (its prefill into its own slot), and a
    row whose prompt is prefilled in chunks: each row's tokens and logits are those it gets alone."""
    lm = models(family)
    b = lm.sizes.max_batch
    assert b >= 2
    first, second = list(PROMPT_IDS), [int(t) for t in rng.integers(4, 250, size=23)]
    want = {0: greedy_alone(lm, first, 12), 1: greedy_alone(lm, second, 8)}
    slots = _SlotTable(lm.sizes, lm.config, chunk=5)  # the second prompt prefills in 5 chunks
    for feeds in slots.prefill(0, first):
        nxt, _, _ = lm.module.prefill(**feeds)
    got = {0: ([int(nxt[0])], []), 1: ([], [])}
    step = np.zeros(b, np.int64)
    for i in range(11):
        if i == 4:  # row 1 joins at step 4: its prefill writes only its own slot
            for feeds in slots.prefill(1, second):
                nxt1, last1, _ = lm.module.prefill(**feeds)
            got[1][0].append(int(nxt1[0]))
        step[0] = got[0][0][-1]
        if got[1][0]:
            step[1] = got[1][0][-1]
        nxt, logits = lm.module.decode(**slots.decode(step))
        got[0][0].append(int(nxt[0]))
        got[0][1].append(logits[0])
        if i >= 4 and len(got[1][0]) < 8:
            got[1][0].append(int(nxt[1]))
            got[1][1].append(logits[1])
    for r in (0, 1):
        assert got[r][0] == want[r][0]
        n = len(got[r][1])
        assert max(_rel(a, w) for a, w in zip(got[r][1], want[r][1][-n:])) < 1e-5


def test_slots_refuse_what_does_not_fit(models):
    """A slot past max_batch, a prompt or a step past the cache: typed errors before any call."""
    lm = models("llama3")
    slots = _SlotTable(lm.sizes, lm.config)
    with pytest.raises(rocmc.InputError, match="slot 2 is outside the module's 2 slots"):
        next(slots.prefill(2, [5, 6]))
    with pytest.raises(rocmc.InputError, match="exceed the KV cache's 64 positions"):
        next(slots.prefill(0, [5] * 65))
    with pytest.raises(rocmc.InputError, match=r"slots \[0, 0\] name a slot twice"):
        next(slots.prefill_rows([(0, [5]), (0, [6])]))
    for feeds in slots.prefill(1, [5] * 64):
        lm.module.prefill(**feeds)
    with pytest.raises(rocmc.InputError, match="slot 1 holds 64 positions; 1 more exceed"):
        slots.decode([7, 7])
    slots.release(1)  # an ended row's slot is empty again
    assert slots.decode([7, 7])["positions"].tolist() == [[0], [0]] and not slots.active.any()
    assert next(slots.prefill(1, [5, 6]))["positions"].tolist() == [[0, 1]]


def test_chunked_prefill_equals_one_call(models):
    """A prompt prefilled in chunks (each attending to the slot's earlier positions) gives every position's
    logits of one call."""
    lm = models("mistral")  # sliding-window layers: the chunks' window masks too
    slots = _SlotTable(lm.sizes, lm.config, chunk=4)
    parts = [lm.module.prefill(**f)[2][0] for f in slots.prefill(1, list(PROMPT_IDS))]
    assert len(parts) == -(-len(PROMPT_IDS) // 4)
    whole = lm.logits(list(PROMPT_IDS))[0]
    assert _rel(np.concatenate(parts), whole) < 1e-5


@pytest.mark.parametrize("family", ["llama3", "mistral"])
def test_rows_prefilled_in_one_call_equal_each_alone(models, rng, family):
    """Prompts of different lengths prefilled together (one call, each row padded to the longest by repeating
    its last token; then a second round in chunks): every row's logits at every position, its first token and
    its cache (the decode steps after) equal the row's prefilled alone."""
    lm = models(family)  # mistral: sliding-window layers, whose window masks are per row too
    short, long = [int(t) for t in rng.integers(4, 250, size=3)], list(PROMPT_IDS)
    # Alone first: each in slot 0 of fresh tables (the module's cache is one state, which the calls below overwrite).
    alone = {slot: lm.logits(ids)[0] for slot, ids in ((0, short), (1, long))}
    second = {slot: greedy_alone(lm, ids, 2)[0][1] for slot, ids in ((0, short), (1, long))}
    slots = _SlotTable(lm.sizes, lm.config)
    (call, feeds), *more = slots.prefill_rows([(0, short), (1, long)])
    assert not more and call == [1, 0] and feeds["tokens"].shape == (2, len(long))  # the longest row first
    assert feeds["tokens"][1, 3:].tolist() == [short[-1]] * (len(long) - 3)
    assert feeds["positions"][1].tolist() == [0, 1] + [2] * (len(long) - 2)
    nxt, last, every = lm.module.prefill(**feeds)
    for j, slot in enumerate(call):
        n = len(alone[slot])
        assert _rel(every[j, :n], alone[slot]) < 1e-5 and _rel(last[j], alone[slot][-1]) < 1e-5
        assert int(nxt[j]) == int(np.argmax(alone[slot][-1]))
    step = np.zeros(lm.sizes.max_batch, np.int64)
    step[call] = nxt
    toks = lm.module.decode(**slots.decode(step))[0]
    assert [int(toks[0]), int(toks[1])] == [second[0], second[1]]
    # At most 6 tokens a call: the long row in chunks of 6, each a call (2 x 6 > 6), the short row a call of its
    # own; every position's logits as alone.
    slots = _SlotTable(lm.sizes, lm.config, chunk=6)
    rows = [(0, short), (1, long)]
    calls = list(slots.prefill_rows(rows))
    assert len(calls) == -(-len(long) // 6) + 1 and [c for c, _ in calls[:2]] == [[1], [0]]
    got: dict = {0: [], 1: []}
    for call, feeds in calls:
        every = lm.module.prefill(**feeds)[2]
        for j, slot in enumerate(call):
            begin, end = feeds["positions"][j, [0, -1]]
            got[slot].append(every[j, : end + 1 - begin])
    for slot, ids in rows:
        assert _rel(np.concatenate(got[slot]), alone[slot]) < 1e-5


def test_batch_of_prompts_of_different_lengths(models, rng):
    """Each row of a batch continues as it does alone (every row in its own cache slot, at its own position)."""
    lm = models("mistral")
    prompts = [list(PROMPT_IDS), [int(t) for t in rng.integers(4, 250, size=3)]]
    both = lm.generate(prompts, 20, stop_tokens=())
    assert both == [lm.generate(p, 20, stop_tokens=()) for p in prompts]


def test_stream_and_stop_tokens(models, llm_checkpoint):  # noqa: F811
    lm = models("llama")
    want = hf_greedy(llm_checkpoint("llama"), PROMPT_IDS, 12)
    assert list(lm.stream(list(PROMPT_IDS), 12, stop_tokens=())) == want
    stop = want[5]
    got = lm.generate(list(PROMPT_IDS), 12, stop_tokens=[stop])
    assert got == want[: want.index(stop) + 1]


def test_text_in_text_out(models):
    lm = models("llama")  # the llama checkpoint carries a tokenizer.json (306 of the model's 384 ids)
    ids = lm.tokenizer.encode("the cat sat")
    new = lm.generate(ids, 3, stop_tokens=())
    assert max(new) < lm.tokenizer.vocab_size  # this prompt's greedy path stays in the tokenizer's ids
    text = lm.generate("the cat sat", 3, stop_tokens=())
    assert isinstance(text, str) and text == lm.tokenizer.decode(new)
    assert "".join(lm.text_stream("the cat sat", 3, stop_tokens=())) == text


def test_saved_artifact_with_checkpoint_needs_no_compile(llm_checkpoint, tmp_path):  # noqa: F811
    d = llm_checkpoint("qwen2", sharded=True)
    # the sizes of the `models` fixture: the compile cache holds this module when qwen2's other tests ran first
    art = rocmc.llm.compile_hf(d / "config.json", "cpu", max_seq_len=64, max_batch=2)
    assert not any(p["from"] == "constant" and p["name"].startswith("model.") for p in art.parameters)
    assert art.size < 2 << 20  # weights stay in the checkpoint
    art.save(tmp_path / "m.vmfb")
    lm = rocmc.llm.load(tmp_path / "m.vmfb", d)
    assert lm.generate(list(PROMPT_IDS), 10, stop_tokens=()) == hf_greedy(d, PROMPT_IDS, 10)
    assert "used as stored" in lm.summary()  # an f32 checkpoint for the f32 CPU model
    assert "per decode call:" not in lm.summary()  # a loaded artifact has no stages to count from
    f16 = rocmc.llm.load(rocmc.llm.compile_hf(d, "cpu", max_seq_len=48, dtype="f16"), d)
    assert "converted at load" in f16.summary() and "f32 -> f16" in f16.summary()
    assert re.search(r"per decode call: \d+ dispatches, .* host waits", f16.summary())
    # a compiled artifact's summary (f16's: its stage dumps, one more compile, are made already; art's would be
    # another) names the joined projections and the KV cache state
    text = f16.artifact.summary()
    assert "model.layers.0.self_attn.qkv_proj.weight" in text and "kv_cache" in text
    assert "joined at load: 4 projections" in lm.summary()  # q/k/v and gate/up of 2 layers


def test_bad_inputs(models, llm_checkpoint, tmp_path):  # noqa: F811
    lm = models("llama")
    with pytest.raises(rocmc.InputError, match="empty"):
        lm.generate([], 4)
    with pytest.raises(rocmc.InputError, match="outside the vocabulary"):
        lm.generate([1, 999999], 4)
    with pytest.raises(rocmc.InputError, match="exceeds the cache"):
        lm.generate(list(PROMPT_IDS), 100)
    with pytest.raises(rocmc.InputError, match="max_batch"):  # stream() runs one batch; generate() chunks
        next(lm.stream([[1], [2], [3]], 2))


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_bad_checkpoints(llm_checkpoint, tmp_path):  # noqa: F811
    src = llm_checkpoint("llama")
    art = rocmc.llm.compile_hf(src, "cpu", max_seq_len=32)
    # a missing tensor, named
    d = _copy(src, tmp_path / "missing")
    from safetensors.numpy import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(rocmc.InputError, match="model.layers.1.mlp.up_proj.weight"):
        rocmc.llm.load(art, d)
    # a tensor of the wrong shape, named
    d = _copy(src, tmp_path / "shape")
    tensors = load_file(d / "model.safetensors")
    tensors["model.norm.weight"] = np.ones(7, np.float32)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(rocmc.InputError, match="model.norm.weight"):
        rocmc.llm.load(art, d)
    # a truncated file
    d = _copy(src, tmp_path / "truncated")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(rocmc.ArtifactError, match="model.safetensors"):
        rocmc.llm.load(art, d)
    # an unsupported architecture, named
    d = _copy(src, tmp_path / "arch")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "falcon", ["FalconForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(rocmc.ModelImportError, match="FalconForCausalLM"):
        rocmc.llm.compile_hf(d, "cpu")
    with pytest.raises(rocmc.InputError, match="not a directory"):
        rocmc.llm.load(art, tmp_path / "nowhere")


def test_cache_is_updated_in_place(llm_checkpoint):  # noqa: F811
    """A decode step writes its positions into the cache: no copy of the cache in the stream phase (on the CPU,
    IREE copies out the one layer's keys or values that attention reads; on a GPU nothing is copied:
    tests/llm/test_call_structure.py). The cache is the caller's buffer (held states: the module's functions
    are issued stream-ordered), not a global of the module."""
    art = rocmc.llm.compile_hf(llm_checkpoint("llama3"), "cpu", max_seq_len=128, functions=("decode",))
    cache = next(s for s in art.metadata["states"] if s["name"] == "kv_cache")
    nbytes = int(np.prod(cache["shape"])) * 4
    stream = art.ir("stream")
    import re

    copies = [int(n) for n in re.findall(r"stream\.cmd\.copy [^\n]*?, %c(\d+) :", stream)]
    layers = json.loads((llm_checkpoint("llama3") / "config.json").read_text())["num_hidden_layers"]
    assert all(c <= nbytes // (2 * layers) for c in copies), copies
    assert "!stream.resource<external>{%c" + str(nbytes) + "}" in stream
    assert "!stream.resource<variable>{%c" + str(nbytes) + "}" not in stream
    assert art.metadata["held_states"] == ["kv_cache"]  # decode, the only function


def test_sampling_runs_in_the_module_and_follows_its_seed(models):
    lm = models("llama3")
    a = lm.generate(list(PROMPT_IDS), 12, temperature=1.0, top_k=20, top_p=0.9, seed=7, stop_tokens=())
    assert a == lm.generate(list(PROMPT_IDS), 12, temperature=1.0, top_k=20, top_p=0.9, seed=7, stop_tokens=())
    assert a != lm.generate(list(PROMPT_IDS), 12, temperature=1.0, top_k=20, top_p=0.9, seed=8, stop_tokens=())
    # top_k=1 is greedy whatever the temperature
    assert lm.generate(list(PROMPT_IDS), 8, temperature=2.0, top_k=1, seed=3, stop_tokens=()) == lm.generate(
        list(PROMPT_IDS), 8, stop_tokens=()
    )
    for bad in (
        dict(temperature=-1.0),
        dict(temperature=1.0, top_k=-1),
        dict(do_sample=True, temperature=0.0),
        dict(temperature=1.0, top_p=0.0),
        dict(temperature=1.0, seed=-1),
    ):
        with pytest.raises(rocmc.InputError):
            lm.generate(list(PROMPT_IDS), 2, **bad)


def test_sample_function_against_its_reference(models, rng):
    """The module's draw equals the float64 reference's for the same key (the same noise bits)."""
    from rocmc.llm.model import Shape, build

    lm = models("qwen2")
    g = build(lm.config, Shape(max_seq_len=64, max_batch=2, dtype="f32", sample_k=16), ("sample",))["sample"]
    m = rocmc.load(rocmc.compile(g, "cpu"))
    for _ in range(5):
        feeds = dict(
            logits=rng.standard_normal((2, lm.config.vocab_size)).astype(np.float32) * 3,
            temperature=np.array([0.7, 0.0], np.float32),
            top_k=np.array([16, 5], np.int64),
            top_p=np.array([0.8, 1.0], np.float32),
            key=rng.integers(0, 1 << 62, size=2),
        )
        got = m(**feeds)
        assert list(got) == list(rocmc.evaluate(g, **feeds))
        assert got[1] == np.argmax(feeds["logits"][1])


def test_generate_command_streams_tokens(llm_checkpoint, capsys):  # noqa: F811
    from rocmc.cli import main

    d = llm_checkpoint("llama")
    prompt = ", ".join(map(str, PROMPT_IDS))
    assert main(["generate", str(d), "--ids", "-p", prompt, "-n", "6", "--max-seq-len", "32"]) == 0
    out = [int(t) for t in capsys.readouterr().out.split()]
    want = hf_greedy(d, PROMPT_IDS, 6)
    assert out == want[: len(out)] and len(out) >= 1
    assert main(["generate", str(d), "-p", "the cat", "-n", "3", "--max-seq-len", "32"]) == 0
    assert capsys.readouterr().out.strip() != ""
    assert main(["generate", str(d), "--ids", "-p", "1, x", "-n", "2"]) == 2
    assert "not a list of token ids" in capsys.readouterr().err


def test_an_artifact_with_separate_projections_asks_to_be_compiled_again(llm_checkpoint):  # noqa: F811
    """An artifact of an earlier rocmc names q/k/v and gate/up separately: a clear error, not 'another model'."""
    from types import SimpleNamespace

    from rocmc.llm.config import load_config, param_names
    from rocmc.llm.runtime import _check_artifact

    cfg = load_config(llm_checkpoint("llama"))
    old = SimpleNamespace(parameters=[{"name": n, "shape": list(s)} for n, s in param_names(cfg)])
    with pytest.raises(rocmc.ModelImportError, match="compiled by an earlier rocmc.*compile it again"):
        _check_artifact(old, cfg)
