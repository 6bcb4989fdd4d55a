"""Tiny random-init Hugging Face checkpoints of every rocmc.llm family, and transformers as their reference.

Random-init models put near-equal logits at the top, so a greedy decode of two correct implementations can part
on a rounding difference. The weights here are drawn ten times larger than transformers' init (σ 0.2), the
final RMSNorm's weights sit around FINAL_NORM to spread the logits, the other norms and the biases are random
too (so a missing `1 + w`, bias or scale shows), and each family's seed (SEEDS) was chosen with `find_seed`
so that greedy decoding of N_NEW tokens after PROMPT_IDS keeps a top-2 logit gap of at least MIN_GAP at every
step and visits at least MIN_DISTINCT tokens; tests check that rather than search.

Use in a test module: `from llm_models import llm_checkpoint` (a session fixture: llm_checkpoint(family)
-> checkpoint directory, built once per test session), then `hf_greedy` / `hf_logits` for the reference.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT_IDS = (5, 17, 42, 99, 7, 200, 31, 64)
N_NEW = 32  # 8 + 32 = 40 positions: five times mistral's sliding window of 8
MIN_GAP = 0.1  # top-2 logit gap at every greedy step (0.05 would do; 0.1 leaves room for f32 rounding)
MIN_DISTINCT = N_NEW // 2  # distinct tokens on the greedy path: a model stuck repeating one token tests little
LAYER_STD = 0.2  # q/k/v/o and MLP weights
EMBED_STD = 0.2  # embeddings and lm_head
NORM_STD = 0.2  # RMSNorm weights around their neutral value (1 for llama-style, 0 for gemma's 1 + w)
FINAL_NORM = 8.0  # the final RMSNorm's weights sit around this: it spreads the logits (the greedy path stays)
BIAS_STD = 0.1

_SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)

# family -> (transformers config class name, its arguments beyond _SIZES)
FAMILIES = {
    # Llama 2 style: multi-head attention (as many KV heads as heads), default RoPE, bos 1 / eos 2
    "llama": ("LlamaConfig", dict(vocab_size=384, num_key_value_heads=4, bos_token_id=1, eos_token_id=2)),
    # Llama 3 style: grouped KV heads, llama3 RoPE scaling with all three frequency bands in head_dim 16
    "llama3": (
        "LlamaConfig",
        dict(
            vocab_size=320,
            bos_token_id=1,
            eos_token_id=[2, 3],
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "mistral": ("MistralConfig", dict(vocab_size=256, sliding_window=8, bos_token_id=1, eos_token_id=2)),
    "qwen2": (
        "Qwen2Config",
        dict(
            vocab_size=288,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=3,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
    ),
    "gemma": ("GemmaConfig", dict(vocab_size=300, head_dim=16, bos_token_id=2, eos_token_id=1, pad_token_id=0)),
}

# Chosen by find_seed(family) with the constants above; test_llm_config checks their gaps.
SEEDS = {"llama": 1, "llama3": 2, "mistral": 0, "qwen2": 0, "gemma": 4}


def hf_config(family: str):
    cls_name, extra = FAMILIES[family]
    return getattr(transformers, cls_name)(**{**_SIZES, **extra})


def build_model(family: str, seed: int):
    """A float32 random model of the family, with weights drawn as the module docstring says."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        hf_config(family), dtype=torch.float32, attn_implementation="eager"
    )
    gemma = family == "gemma"
    offset = 1.0 if gemma else 0.0  # gemma's RMSNorm multiplies by (1 + w)
    # gemma multiplies embeddings by sqrt(hidden) = 8: draw them smaller, so they don't drown the layers'
    # outputs in the residual stream, and widen the final norm to give the tied lm_head the same logit spread.
    embed_std, final_norm = (EMBED_STD / 4, FINAL_NORM * 4) if gemma else (EMBED_STD, FINAL_NORM)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                center = final_norm if name == "model.norm.weight" else 1.0
                p.copy_(center - offset + NORM_STD * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, BIAS_STD)
            elif "embed_tokens" in name or name.startswith("lm_head"):
                p.normal_(0.0, embed_std)
            else:
                p.normal_(0.0, LAYER_STD)
    return model.eval()


def greedy_with_gaps(model, prompt_ids, n: int) -> tuple[list[int], list[float]]:
    """transformers' greedy decode of exactly n tokens (end-of-sequence ids don't stop it) and the top-2
    logit gap at each step."""
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        out = model.generate(
            torch.tensor([list(prompt_ids)]),
            do_sample=False,
            max_new_tokens=n,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    finally:
        model.generation_config.eos_token_id = saved
    top2 = [torch.topk(step[0], 2).values for step in out.logits]
    gaps = [float(t[0] - t[1]) for t in top2]
    return out.sequences[0, len(prompt_ids) :].tolist(), gaps


def is_decisive(tokens: list[int], gaps: list[float]) -> bool:
    return min(gaps) >= MIN_GAP and len(set(tokens)) >= MIN_DISTINCT


def find_seed(family: str, start: int = 0, tries: int = 200) -> int:
    """The first seed from `start` whose greedy path after PROMPT_IDS is decisive and varied."""
    for seed in range(start, start + tries):
        if is_decisive(*greedy_with_gaps(build_model(family, seed), PROMPT_IDS, N_NEW)):
            return seed
    raise RuntimeError(f"{family}: no decisive seed in [{start}, {start + tries})")


def make_checkpoint(family: str, directory, seed: int | None = None, max_shard_size=None) -> Path:
    """Save the family's model (SEEDS[family] unless given) as safetensors, with config.json and
    generation_config.json; max_shard_size (e.g. "40KB") splits it into an indexed multi-file checkpoint."""
    directory = Path(directory)
    model = build_model(family, SEEDS[family] if seed is None else seed)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    return directory


# ---- tokenizers ------------------------------------------------------------------------------------

TOKENIZER_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A café serves crème brûlée and naïve piñatas.",
    "Grüße aus München: Übermäßig schöne Straßen.",
    "rocmc compiles graphs for the GPU and the CPU.",
    "Tokens arrive one at a time while the model generates text.",
] * 4
SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: llama's bos 1 and eos 2


def train_tokenizer(style: str, vocab_size: int = 300):
    """A BPE tokenizer trained on TOKENIZER_CORPUS. style "byte_level": GPT-2/Llama 3/Qwen byte-level BPE;
    "byte_fallback": Llama 2/Mistral/Gemma style (▁ for spaces, characters outside the vocabulary as
    <0xNN> byte tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if style == "byte_level":
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tk.train_from_iterator(TOKENIZER_CORPUS, trainer)
        return tk
    if style != "byte_fallback":
        raise ValueError(style)
    tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=list(SPECIALS))
    tk.train_from_iterator(TOKENIZER_CORPUS, trainer)
    return _with_byte_tokens(tk)


def _with_byte_tokens(tk):
    """Add the 256 <0xNN> tokens byte fallback needs (sentencepiece-converted vocabularies carry them)."""
    from tokenizers import Tokenizer

    data = json.loads(tk.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return Tokenizer.from_str(json.dumps(data))


def save_tokenizer(tk, directory, *, bos_template: bool, config: dict | None = None) -> Path:
    """Write tokenizer.json (with a TemplateProcessing post-processor adding <s> when bos_template) and
    tokenizer_config.json (config's keys added to bos/eos/unk names and a generic tokenizer class)."""
    from tokenizers import processors

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if bos_template:
        tk.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tk.token_to_id("<s>"))]
        )
    tk.save(str(directory / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        **(config or {}),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return directory


# ---- transformers as the reference -----------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _load(directory: str):
    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_greedy(directory, prompt_ids, n: int) -> list[int]:
    """The n tokens transformers' greedy decoding (generate(do_sample=False)) appends to prompt_ids; end-of-
    sequence ids don't stop it."""
    return greedy_with_gaps(_load(str(directory)), prompt_ids, n)[0]


def hf_logits(directory, prompt_ids) -> np.ndarray:
    """transformers' logits for every prompt position, float64 (len(prompt_ids), vocab_size)."""
    with torch.no_grad():
        out = _load(str(directory))(torch.tensor([list(prompt_ids)]))
    return out.logits[0].double().numpy()


@pytest.fixture(scope="session")
def llm_checkpoint(tmp_path_factory):
    """llm_checkpoint(family, sharded=False) -> directory of the family's checkpoint, built once per session.
    family "llama" also carries a byte-fallback tokenizer (tokenizer.json + tokenizer_config.json) whose
    vocabulary fits the model's."""
    root = tmp_path_factory.mktemp("llm_checkpoints")
    built: dict = {}

    def get(family: str, sharded: bool = False) -> Path:
        key = (family, sharded)
        if key not in built:
            directory = root / (family + ("-sharded" if sharded else ""))
            make_checkpoint(family, directory, max_shard_size="40KB" if sharded else None)
            if family == "llama":
                save_tokenizer(
                    train_tokenizer("byte_fallback", 300), directory, bos_template=True, config={"add_bos_token": True}
                )
            built[key] = directory
        return built[key]

    return get
