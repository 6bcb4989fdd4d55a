"""rocmc.llm.config and rocmc.llm.tokenizer against transformers' own reading of the same files."""

import json
import math
import sys

import numpy as np
import pytest

from rocmc import ModelImportError
from rocmc.llm.config import (
    KV_CACHE_BUDGET,
    LlmConfig,
    default_max_seq_len,
    kv_cache_bytes,
    load_config,
    param_names,
    rope_inv_freq,
    rope_tables,
)
from rocmc.llm.tokenizer import StreamDecoder, Tokenizer

from llm_models import (
    FAMILIES,
    N_NEW,
    PROMPT_IDS,
    SEEDS,
    build_model,
    greedy_with_gaps,
    hf_config,
    hf_greedy,
    hf_logits,
    is_decisive,
    llm_checkpoint,  # noqa: F401 - a fixture
    save_tokenizer,
    train_tokenizer,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

LLAMA31_ROPE = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)
TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
NON_ASCII = [
    "naïve café, crème brûlée",
    "Grüße aus München 日本語のテキスト",
    "emoji 😀🚀 and ünïcödé ✓",
    "plain ascii",
]


def saved_config(tmp_path, hf_cfg) -> dict:
    hf_cfg.save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


def llama_json(**overrides) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **TINY, **overrides}


# ---- parsing what transformers writes ----------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_config_written_by_transformers(tmp_path, family):
    hf = hf_config(family)
    saved_config(tmp_path, hf)
    cfg = load_config(tmp_path)
    rope = hf.rope_parameters
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (
        hf.vocab_size,
        hf.hidden_size,
        hf.intermediate_size,
        hf.num_hidden_layers,
    )
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (
        hf.num_attention_heads,
        hf.num_key_value_heads,
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
    )
    assert (cfg.rms_norm_eps, cfg.max_position_embeddings, cfg.tie_word_embeddings) == (
        hf.rms_norm_eps,
        hf.max_position_embeddings,
        hf.tie_word_embeddings,
    )
    assert (cfg.rope_type, cfg.rope_theta) == (rope["rope_type"], rope["rope_theta"])
    assert cfg.sliding_window == getattr(hf, "sliding_window", None)
    eos = hf.eos_token_id
    assert cfg.eos_token_ids == tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
    assert cfg.bos_token_id == hf.bos_token_id
    assert cfg.hidden_act == hf.hidden_act


@pytest.mark.parametrize(
    "family, expected",
    [
        ("llama", dict(attention_bias=False, o_proj_bias=False, embed_scale=1.0, norm_offset=0.0, hidden_act="silu")),
        ("mistral", dict(attention_bias=False, o_proj_bias=False, layer_types=("sliding_attention",) * 2)),
        ("qwen2", dict(attention_bias=True, o_proj_bias=False, layer_types=("full_attention",) * 2)),
        ("gemma", dict(attention_bias=False, embed_scale=8.0, norm_offset=1.0, hidden_act="gelu_pytorch_tanh")),
    ],
)
def test_family_specifics(tmp_path, family, expected):
    cfg = LlmConfig.from_json(saved_config(tmp_path, hf_config(family)))
    assert {k: getattr(cfg, k) for k in expected} == expected


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "gemma"])
def test_missing_keys_take_the_family_defaults(family):
    """A config.json with only the sizes reads like transformers' config class reads it."""
    raw = {
        "model_type": family,
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 32,
    }
    hf = transformers.AutoConfig.for_model(**raw)
    cfg = LlmConfig.from_json(raw)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.max_position_embeddings) == (
        head_dim,
        hf.num_key_value_heads,
        hf.max_position_embeddings,
    )
    assert (cfg.tie_word_embeddings, cfg.bos_token_id, cfg.pad_token_id) == (
        hf.tie_word_embeddings,
        hf.bos_token_id,
        hf.pad_token_id,
    )
    assert cfg.sliding_window == getattr(hf, "sliding_window", None)
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"]


def test_old_and_new_rope_keys_agree(tmp_path):
    new = LlmConfig.from_json(saved_config(tmp_path, transformers.LlamaConfig(**TINY, rope_parameters=LLAMA31_ROPE)))
    old_scaling = {k: v for k, v in LLAMA31_ROPE.items() if k != "rope_theta"}
    old = LlmConfig.from_json(
        llama_json(rope_theta=500000.0, rope_scaling=old_scaling, head_dim=16, bos_token_id=1, eos_token_id=2)
    )
    assert old == new
    assert old.rope_original_max_position_embeddings == 8192


def test_old_style_llama2_config_by_hand(tmp_path):
    """A Llama-2 era config.json: torch_dtype, rope_theta, rope_scaling with "type", no head_dim."""
    raw = llama_json(
        torch_dtype="float16",
        rope_theta=20000.0,
        rope_scaling={"type": "linear", "factor": 4.0},
        pretraining_tp=2,
        eos_token_id=2,
        bos_token_id=1,
    )
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = load_config(tmp_path / "config.json")
    assert (cfg.dtype, cfg.rope_type, cfg.rope_theta, cfg.rope_factor, cfg.head_dim) == (
        "float16",
        "linear",
        20000.0,
        4.0,
        16,
    )
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    hf_inv = transformers.LlamaForCausalLM(hf).model.rotary_emb.inv_freq.double().numpy()
    np.testing.assert_allclose(rope_inv_freq(cfg), hf_inv, rtol=1e-6)


def test_qwen2_sliding_layers_follow_max_window_layers(tmp_path):
    hf = transformers.Qwen2Config(
        **{**TINY, "num_hidden_layers": 3}, use_sliding_window=True, sliding_window=8, max_window_layers=1
    )
    cfg = LlmConfig.from_json(saved_config(tmp_path, hf))
    assert cfg.layer_types == tuple(hf.layer_types) == ("full_attention", "sliding_attention", "sliding_attention")
    assert [cfg.attention_window(i) for i in range(3)] == [None, 8, 8]


def test_generation_config_sets_generation_ids(tmp_path, rng):
    eos = [int(i) for i in rng.choice(np.arange(3, 256), size=2, replace=False)]
    (tmp_path / "config.json").write_text(json.dumps(llama_json(eos_token_id=2, bos_token_id=1)))
    assert load_config(tmp_path).eos_token_ids == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": 0}))
    cfg = load_config(tmp_path)
    assert (cfg.eos_token_ids, cfg.pad_token_id, cfg.bos_token_id) == (tuple(eos), 0, 1)
    assert LlmConfig.from_json(tmp_path).eos_token_ids == (2,)  # the model config alone


# ---- rejected configs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(model_type="gpt2", architectures=None), "'model_type' = 'gpt2'"),
        (dict(model_type="gemma2", architectures=None), "'model_type' = 'gemma2'"),
        (dict(architectures=["MistralForCausalLM"]), "does not match model_type 'llama'"),
        (dict(architectures=["LlamaForSequenceClassification"]), "'architectures'"),
        (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "'rope_scaling.rope_type' = 'dynamic'"),
        (
            dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
            "'rope_parameters.rope_type' = 'yarn'",
        ),
        (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4}), "'rope_parameters.factor' = None"),
        (dict(rope_parameters={"full_attention": {"rope_type": "default"}}), "per layer type"),
        (dict(partial_rotary_factor=0.5), "'partial_rotary_factor' = 0.5"),
        (dict(hidden_act="gelu"), "'hidden_act' = 'gelu'"),
        (dict(attn_logit_softcapping=50.0), "'attn_logit_softcapping' = 50.0"),
        (dict(use_qk_norm=True), "'use_qk_norm' = True"),
        (dict(quantization_config={"quant_method": "bitsandbytes"}), "quantization_config.quant_method = 'bitsand"),
        (dict(quantization_config={"quant_method": "awq", "bits": 8}), "quantization_config.bits = 8: supported: 4"),
        (dict(quantization_config={"quant_method": "gptq", "bits": 3}), "quantization_config.bits = 3"),
        (dict(quantization_config={"quant_method": "gptq", "bits": 4, "dynamic": {"x": {}}}), ".dynamic = "),
        (dict(sliding_window=4096), "'sliding_window' = 4096"),
        (dict(num_key_value_heads=3), "'num_key_value_heads' = 3: must divide num_attention_heads = 4"),
        (dict(head_dim=15), "'head_dim' = 15: must be even"),
        (dict(hidden_size="64"), "'hidden_size' = '64'"),
        (dict(num_hidden_layers=0), "'num_hidden_layers' = 0"),
        (dict(vocab_size=True), "'vocab_size' = True"),
        (dict(rms_norm_eps=-1e-6), "'rms_norm_eps' = -1e-06"),
        (dict(tie_word_embeddings="yes"), "'tie_word_embeddings' = 'yes'"),
        (dict(torch_dtype="float8_e4m3fn"), "'torch_dtype' = 'float8_e4m3fn'"),
        (dict(eos_token_id=[2, -1]), "'eos_token_id' = -1"),
        (dict(vocab_size=None), "missing field 'vocab_size'"),
    ],
)
def test_unsupported_or_malformed_llama_config(change, match):
    raw = {k: v for k, v in llama_json(**change).items() if v is not None}
    with pytest.raises(ModelImportError, match=match.replace("(", r"\(").replace("[", r"\[")):
        LlmConfig.from_json(raw)


@pytest.mark.parametrize(
    "family, change, match",
    [
        ("mistral", dict(mlp_bias=True), "'mlp_bias' = True"),
        ("mistral", dict(attention_bias=True), "'attention_bias' = True"),
        ("qwen2", dict(use_sliding_window=False, layer_types=["sliding_attention", "full_attention"]), "'layer_types'"),
        ("qwen2", dict(layer_types=["full_attention"]), "'layer_types'"),
        ("gemma", dict(use_bidirectional_attention=True), "'use_bidirectional_attention' = True"),
        ("gemma", dict(hidden_activation="relu"), "'hidden_activation' = 'relu'"),
    ],
)
def test_family_specific_rejections(tmp_path, family, change, match):
    raw = {**saved_config(tmp_path, hf_config(family)), **change}
    with pytest.raises(ModelImportError, match=match):
        LlmConfig.from_json(raw)


def test_unreadable_config_files(tmp_path):
    with pytest.raises(ModelImportError, match="no such file"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelImportError, match="cannot read JSON"):
        load_config(tmp_path)


# ---- parameters --------------------------------------------------------------------------------------


def checkpoint_tensors(directory) -> dict:
    shapes = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safetensors.safe_open(str(f), "np") as st:
            shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
    return shapes


@pytest.mark.parametrize("family", FAMILIES)
def test_param_names_are_the_checkpoint_tensors(llm_checkpoint, family):
    directory = llm_checkpoint(family)
    names = param_names(load_config(directory))
    assert len(names) == len(set(n for n, _ in names))
    assert dict(names) == checkpoint_tensors(directory)


def test_param_names_of_a_sharded_checkpoint(llm_checkpoint):
    directory = llm_checkpoint("qwen2", sharded=True)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    expected = dict(param_names(load_config(directory)))
    assert set(index["weight_map"]) == set(expected)
    assert checkpoint_tensors(directory) == expected


@pytest.mark.parametrize(
    "family, flags",
    [("llama", dict(attention_bias=True, mlp_bias=True)), ("gemma", dict(attention_bias=True, head_dim=32))],
)
def test_param_names_with_biases_match_the_state_dict(tmp_path, family, flags):
    hf = getattr(transformers, {"llama": "LlamaConfig", "gemma": "GemmaConfig"}[family])(**TINY, **flags)
    cfg = LlmConfig.from_json(saved_config(tmp_path, hf))
    state = {k: tuple(v.shape) for k, v in transformers.AutoModelForCausalLM.from_config(hf).state_dict().items()}
    if hf.tie_word_embeddings:
        del state["lm_head.weight"]  # the tied head is the embedding: save_pretrained leaves it out
    assert dict(param_names(cfg)) == state


# ---- RoPE ------------------------------------------------------------------------------------------

ROPE_CASES = {
    "default": dict(**TINY, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    "linear": dict(**TINY, rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.5)),
    "llama3-tiny": dict(
        **TINY,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "llama3.1-8b": dict(
        vocab_size=256,
        hidden_size=4096,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_parameters=LLAMA31_ROPE,
    ),
}


def hf_rotary(kwargs):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(transformers.LlamaConfig(**kwargs))


@pytest.mark.parametrize("case", ROPE_CASES)
def test_rope_inv_freq_matches_transformers(tmp_path, case):
    hf = transformers.LlamaConfig(**ROPE_CASES[case])
    cfg = LlmConfig.from_json(saved_config(tmp_path, hf))
    ours = rope_inv_freq(cfg)
    assert ours.dtype == np.float64 and ours.shape == (cfg.head_dim // 2,)
    np.testing.assert_allclose(ours, hf_rotary(ROPE_CASES[case]).inv_freq.double().numpy(), rtol=2e-6)
    if cfg.rope_type != "default":
        inv, scaling = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[cfg.rope_type](hf)
        np.testing.assert_allclose(ours, inv.double().numpy(), rtol=2e-6)
        assert cfg.rope_attention_scaling == scaling == 1.0


def test_llama3_rope_has_all_three_bands():
    """The tiny llama3 case keeps high frequencies, divides low ones by the factor and blends the middle."""
    cfg = LlmConfig.from_json(llama_json(rope_parameters=ROPE_CASES["llama3-tiny"]["rope_parameters"]))
    base = 1.0 / cfg.rope_theta ** (np.arange(0, 16, 2) / 16)
    ratio = base / rope_inv_freq(cfg)
    assert ratio[0] == 1.0 and ratio[-1] == 8.0 and np.any((ratio > 1.0) & (ratio < 8.0))


@pytest.mark.parametrize("case", ["default", "llama3-tiny"])
def test_rope_tables_rotate_like_transformers(tmp_path, rng, case):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cfg = LlmConfig.from_json(saved_config(tmp_path, transformers.LlamaConfig(**ROPE_CASES[case])))
    n, half = cfg.max_position_embeddings, cfg.head_dim // 2
    cos, sin = rope_tables(cfg, n)
    assert cos.shape == sin.shape == (n, half) and cos.dtype == np.float64
    x = rng.uniform(-2, 2, size=(1, 1, n, cfg.head_dim))
    hf_cos, hf_sin = hf_rotary(ROPE_CASES[case])(torch.zeros(1, dtype=torch.float64), torch.arange(n)[None])
    want, _ = apply_rotary_pos_emb(torch.tensor(x), torch.tensor(x), hf_cos.double(), hf_sin.double())
    x1, x2 = x[..., :half], x[..., half:]
    got = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4 * math.sqrt(n))


def test_rope_tables_reject_bad_lengths():
    cfg = LlmConfig.from_json(llama_json())
    with pytest.raises(ModelImportError, match="n_positions = 0"):
        rope_tables(cfg, 0)


# ---- KV cache ----------------------------------------------------------------------------------------


def test_kv_cache_bytes_and_default_length():
    llama3_8b = LlmConfig.from_json(
        llama_json(
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            hidden_size=4096,
            head_dim=128,
            torch_dtype="bfloat16",
            max_position_embeddings=131072,
        )
    )
    assert kv_cache_bytes(llama3_8b, 1) == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert kv_cache_bytes(llama3_8b, 100, max_batch=3, dtype="float32") == 100 * 3 * 2 * 128 * 1024
    assert kv_cache_bytes(llama3_8b, 100, dtype=np.dtype(np.float32)) == 100 * 2 * 128 * 1024
    assert default_max_seq_len(llama3_8b) == KV_CACHE_BUDGET // (128 * 1024) == 32768
    assert default_max_seq_len(llama3_8b, max_batch=4) == 8192
    assert default_max_seq_len(llama3_8b, budget_bytes=128 * 1024 * 100) == 96  # rounded down to 16
    assert default_max_seq_len(llama3_8b, budget_bytes=1) == 16  # never below 16
    tiny = LlmConfig.from_json(llama_json())
    assert default_max_seq_len(tiny) == tiny.max_position_embeddings == 128  # fits: the model's own limit
    with pytest.raises(ModelImportError, match="max_seq_len = 0"):
        kv_cache_bytes(tiny, 0)
    with pytest.raises(ModelImportError, match="int32"):
        kv_cache_bytes(tiny, 16, dtype="int32")


# ---- the test checkpoints themselves -----------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_fixture_greedy_paths_are_decisive(family):
    tokens, gaps = greedy_with_gaps(build_model(family, SEEDS[family]), PROMPT_IDS, N_NEW)
    assert len(tokens) == N_NEW and is_decisive(tokens, gaps), (min(gaps), len(set(tokens)))


def test_hf_helpers_agree_on_a_saved_checkpoint(llm_checkpoint):
    directory = llm_checkpoint("llama3")
    tokens = hf_greedy(directory, PROMPT_IDS, N_NEW)
    assert tokens == greedy_with_gaps(build_model("llama3", SEEDS["llama3"]), PROMPT_IDS, N_NEW)[0]
    logits = hf_logits(directory, list(PROMPT_IDS) + tokens)
    assert logits.shape == (len(PROMPT_IDS) + N_NEW, 320) and logits.dtype == np.float64
    assert logits[len(PROMPT_IDS) - 1 : -1].argmax(-1).tolist() == tokens


def test_mistral_fixture_sliding_window_matters():
    """Over 40 positions a window of 8 changes the logits from position 8 on (and not before)."""
    windowed = build_model("mistral", SEEDS["mistral"])
    full = build_model("mistral", SEEDS["mistral"])
    full.config.sliding_window = None
    ids = torch.tensor([list(PROMPT_IDS) + greedy_with_gaps(windowed, PROMPT_IDS, N_NEW)[0]])
    with torch.no_grad():
        a, b = windowed(ids).logits[0], full(ids).logits[0]
    assert torch.allclose(a[:8], b[:8], atol=1e-5)
    assert (a[8:] - b[8:]).abs().amax(-1).min() > 1e-3


# ---- tokenizer -------------------------------------------------------------------------------------


def hf_tokenizer(directory):
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def test_checkpoint_tokenizer_matches_transformers(llm_checkpoint):
    directory = llm_checkpoint("llama")
    ours, hf = Tokenizer.from_dir(directory), hf_tokenizer(directory)
    assert ours.vocab_size <= load_config(directory).vocab_size
    assert (ours.bos_token_id, ours.eos_token_id, ours.add_bos) == (1, 2, True)
    for text in NON_ASCII:
        ids = ours.encode(text)
        assert ids == hf(text)["input_ids"]
        assert ids[0] == 1 and ours.encode(text, add_bos=False) == ids[1:]
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True) == text
        assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids)


@pytest.mark.parametrize(
    "bos_template, config, add_bos",
    [
        (True, {}, True),  # tokenizer.json's post-processor decides,
        (True, {"add_bos_token": False}, True),  # and transformers 5 ignores tokenizer_config.json's flags
        (False, {"add_bos_token": True}, False),
        (False, {}, False),
    ],
)
def test_bos_follows_transformers(tmp_path, bos_template, config, add_bos):
    save_tokenizer(train_tokenizer("byte_level"), tmp_path, bos_template=bos_template, config=config)
    ours = Tokenizer.from_dir(tmp_path)
    assert ours.add_bos == add_bos
    for text in NON_ASCII:
        assert ours.encode(text) == hf_tokenizer(tmp_path)(text)["input_ids"]


@pytest.mark.parametrize("style", ["byte_fallback", "byte_level"])
def test_stream_decoder_emits_complete_text(tmp_path, style):
    save_tokenizer(train_tokenizer(style), tmp_path, bos_template=False)
    tok = Tokenizer.from_dir(tmp_path)
    for text in NON_ASCII:
        ids = tok.encode(text)
        stream = tok.stream()
        pieces = [stream.push(i) for i in ids]
        assert "".join(pieces) + stream.flush() == tok.decode(ids) == text
        assert all("\ufffd" not in p for p in pieces)
        if not text.isascii():  # some character spans several tokens: its first tokens emit nothing
            assert "" in pieces
    cut = tok.encode("ok 😀")[:-1]  # the emoji's last byte is missing
    partial = StreamDecoder(tok)
    shown = "".join(partial.push(i) for i in cut)
    rest = partial.flush()
    assert shown == "ok " and rest and set(rest) == {"\ufffd"} and shown + rest == tok.decode(cut)


def test_stream_decoder_keeps_spaces_between_tokens(tmp_path):
    save_tokenizer(train_tokenizer("byte_fallback"), tmp_path, bos_template=True)
    tok = Tokenizer.from_dir(tmp_path)
    text = "the lazy dog jumps over the quick fox"
    stream = tok.stream()
    pieces = [stream.push(i) for i in tok.encode(text)]
    assert "".join(pieces) + stream.flush() == text
    assert sum(p.startswith(" ") for p in pieces) >= 4


def test_tokenizer_errors(tmp_path, monkeypatch):
    with pytest.raises(ModelImportError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    save_tokenizer(train_tokenizer("byte_level"), tmp_path, bos_template=False)
    tok = Tokenizer.from_dir(tmp_path)
    with pytest.raises(ModelImportError, match=f"token id {tok.vocab_size} is outside"):
        tok.decode([5, tok.vocab_size])
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ModelImportError, match=r"pip install rocmc\[llm\]"):
        Tokenizer.from_dir(tmp_path)
