"""A Hugging Face causal-LM config.json, read into the facts rocmc's model builder needs.

Four families share one decoder (RMSNorm -> attention with RoPE and grouped KV heads -> RMSNorm ->
gated MLP, each with a residual) and differ only in details, which `_FAMILIES` lists per family:

- llama (Llama 2 and 3): optional q/k/v/o biases and MLP biases (`attention_bias`, `mlp_bias`).
- mistral: no biases; a sliding attention window on every layer (`sliding_window`).
- qwen2: q/k/v biases always, no o_proj bias; a sliding window only when `use_sliding_window`, and then only
  on the layers from `max_window_layers` on (or as `layer_types` says).
- gemma: embeddings multiplied by sqrt(hidden_size), RMSNorm weight used as (1 + w), a gelu-tanh MLP,
  optional q/k/v/o biases.

A key a config.json omits takes the default of transformers' config class for that family (e.g. gemma's
head_dim 256, mistral's sliding_window 4096), since that is the model the checkpoint was saved from.
Anything rocmc cannot build exactly -- another architecture, a RoPE type other than default/linear/llama3,
another activation, a quantized checkpoint, a feature of a related architecture (logit soft-capping, QK
norm, bidirectional attention, partial rotary) -- raises ModelImportError naming the field and its value:
rocmc never builds a different model silently. `pretraining_tp` is accepted: it only sliced the same
matmuls during pretraining and transformers ignores it.

RoPE is the half-split form of transformers' Llama (`rotate_half`): dimension j pairs with j + head_dim/2,
both rotated by position * inv_freq[j].
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import ModelImportError, RocmcError
from ..dtypes import dtype as _rocmc_dtype
from . import quant as _quant

# The KV cache `default_max_seq_len` sizes for: 4 GiB holds, e.g., a batch of one at 8192 positions of
# Llama-3-8B in f16 (128 KiB a position), and leaves the rest of a 16 GiB+ GPU for weights and activations.
KV_CACHE_BUDGET = 4 << 30
SEQ_LEN_MULTIPLE = 16

DEFAULT_ROPE_THETA = 10000.0
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class _Family:
    """How one family reads its config.json (transformers' config class and modeling file for it)."""

    architecture: str
    defaults: Mapping[str, Any]  # the config class's defaults for keys a config.json may omit
    qkv_bias: str | bool  # the key that switches q/k/v biases, or a fixed answer
    o_bias: str | bool
    mlp_bias: str | bool
    gemma_style: bool = False  # embedding * sqrt(hidden), RMSNorm by (1 + w)
    activation_keys: tuple = ("hidden_act",)
    activation_aliases: Mapping[str, str] = field(default_factory=dict)
    sliding: str | None = None  # "all" (mistral), "qwen2", or None: no sliding window
    ignored: tuple[str, ...] = ()  # switches this family's model does not read: must be off


_COMMON_DEFAULTS = {
    "head_dim": None,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "pad_token_id": None,
}
_NO_SLIDING = ("sliding_window", "use_sliding_window")

_FAMILIES: dict[str, _Family] = {
    "llama": _Family(
        "LlamaForCausalLM",
        {
            **_COMMON_DEFAULTS,
            "num_key_value_heads": None,
            "max_position_embeddings": 2048,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "attention_bias": False,
            "mlp_bias": False,
        },
        qkv_bias="attention_bias",
        o_bias="attention_bias",
        mlp_bias="mlp_bias",
        ignored=_NO_SLIDING,
    ),
    "mistral": _Family(
        "MistralForCausalLM",
        {
            **_COMMON_DEFAULTS,
            "num_key_value_heads": 8,
            "max_position_embeddings": 4096 * 32,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "sliding_window": 4096,
        },
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        sliding="all",
        ignored=("attention_bias", "mlp_bias"),
    ),
    "qwen2": _Family(
        "Qwen2ForCausalLM",
        {
            **_COMMON_DEFAULTS,
            "num_key_value_heads": 32,
            "max_position_embeddings": 32768,
            "bos_token_id": None,
            "eos_token_id": None,
            "use_sliding_window": False,
            "sliding_window": 4096,
            "max_window_layers": 28,
            "layer_types": None,
        },
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
        sliding="qwen2",
        ignored=("mlp_bias",),
    ),
    "gemma": _Family(
        "GemmaForCausalLM",
        {
            **_COMMON_DEFAULTS,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "hidden_act": "gelu_pytorch_tanh",
            "max_position_embeddings": 8192,
            "tie_word_embeddings": True,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
            "attention_bias": False,
            "hidden_activation": None,
        },
        qkv_bias="attention_bias",
        o_bias="attention_bias",
        mlp_bias=False,
        gemma_style=True,
        # older Gemma configs name the activation `hidden_activation`; plain "gelu" there meant the tanh form
        activation_keys=("hidden_activation", "hidden_act"),
        activation_aliases={"gelu": "gelu_pytorch_tanh"},
        ignored=(*_NO_SLIDING, "mlp_bias"),
    ),
}

# Features of related architectures that change the model when set (to anything but null or false).
_FOREIGN_FEATURES = (
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "use_qk_norm",
    "qk_norm",
    "query_pre_attn_scalar",
    "attention_chunk_size",
    "no_rope_layers",
    "use_bidirectional_attention",
)


@dataclass(frozen=True)
class LlmConfig:
    """Everything about a checkpoint's model that its weights do not say; read with `from_json`/`load_config`."""

    family: str  # "llama", "mistral", "qwen2" or "gemma"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # may differ from hidden_size / num_attention_heads (gemma-7b: 256 vs 192)
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool  # lm_head reuses model.embed_tokens.weight
    attention_bias: bool  # q_proj, k_proj, v_proj carry biases
    o_proj_bias: bool
    mlp_bias: bool  # gate_proj, up_proj, down_proj carry biases
    hidden_act: str  # "silu" or "gelu_pytorch_tanh"; the MLP is down(act(gate(x)) * up(x))
    embed_scale: float  # embeddings are multiplied by this (gemma: sqrt(hidden_size), in the weights' dtype)
    norm_offset: float  # RMSNorm multiplies by (norm_offset + weight) (gemma: 1.0, in float32)
    sliding_window: int | None  # a query at position i sees keys at positions > i - sliding_window
    layer_types: tuple[str, ...]  # per layer: "full_attention" or "sliding_attention"
    rope_type: str  # "default", "linear" or "llama3"
    rope_theta: float
    rope_factor: float  # linear and llama3: frequencies divided by it (1.0 for default)
    rope_low_freq_factor: float | None  # llama3 only
    rope_high_freq_factor: float | None  # llama3 only
    rope_original_max_position_embeddings: int | None  # llama3 only
    rope_attention_scaling: float  # cos and sin are multiplied by it (1.0 for every supported type)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # generation stops at any of these
    pad_token_id: int | None
    dtype: str  # the checkpoint's dtype: "float32", "float16" or "bfloat16"
    quant: Any = None  # a rocmc.llm.quant.QuantConfig: the decoder's linear layers stored quantized (GPTQ, AWQ, fp8)

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def num_kv_groups(self) -> int:
        """Query heads sharing one KV head; query head h reads KV head h // num_kv_groups."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def attention_scale(self) -> float:
        return self.head_dim**-0.5

    def attention_window(self, layer: int) -> int | None:
        """The sliding window of one layer, None where the layer attends to every earlier position."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    @classmethod
    def from_json(cls, source) -> "LlmConfig":
        """Parse a config.json: a dict, a file path, or a directory holding config.json."""
        if isinstance(source, Mapping):
            return _parse(dict(source), "config.json")
        path = _config_path(source)
        return _parse(read_json(path), str(path))


def load_config(path) -> LlmConfig:
    """The config of a checkpoint (a config.json file or its directory), with the bos/eos/pad ids of the
    generation_config.json beside it when there is one: those are the ids generation uses."""
    return read_config(path)[0]


def read_config(path) -> tuple[LlmConfig, bytes]:
    """`load_config`'s config and the bytes of the config.json it was parsed from, read once (the ranks
    of a tensor-parallel run compare those bytes)."""
    cfg_path = _config_path(path)
    raw, data = _read_json(cfg_path)
    cfg = _parse(raw, str(cfg_path))
    gen_path = cfg_path.parent / "generation_config.json"
    if not gen_path.is_file():
        return cfg, data
    return _with_generation_ids(cfg, read_json(gen_path), str(gen_path)), data


# ---- reading ---------------------------------------------------------------------------------------


def _config_path(path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ModelImportError(
            f"model config: no such file {str(p)!r} (expected a config.json or a checkpoint directory)"
        )
    return p


def read_json(path: Path) -> dict:
    """A checkpoint's JSON file (config, generation or tokenizer config): an object, or a ModelImportError."""
    return _read_json(path)[0]


def _read_json(path: Path) -> tuple[dict, bytes]:
    """`read_json`'s object and the file's bytes, from one read."""
    try:
        data = path.read_bytes()
        # decoded as Path.read_text decodes: UTF-8, universal newlines
        obj = json.loads(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelImportError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ModelImportError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj, data


_ASK = object()  # "read the value from the config", where None is a value


class _Reader:
    """Typed access to one config dict; every error names the source, the field and its value."""

    def __init__(self, raw: dict, source: str, defaults: Mapping[str, Any] = {}):
        self.raw, self.source, self.defaults = raw, source, defaults

    def fail(self, key: str, value, expected: str):
        raise ModelImportError(f"{self.source}: field {key!r} = {value!r}: {expected}")

    def get(self, key: str):
        if key in self.raw:
            return self.raw[key]
        return self.defaults.get(key)

    def require(self, key: str):
        if key not in self.raw and self.defaults.get(key) is None:
            raise ModelImportError(f"{self.source}: missing field {key!r}")
        return self.get(key)

    def int(self, key: str, value=_ASK, minimum: int = 1, optional: bool = False):
        v = value if value is not _ASK else self.get(key) if optional else self.require(key)
        if v is None and optional:
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            self.fail(key, v, f"expected an integer >= {minimum}")
        return v

    def float(self, key: str, value) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            self.fail(key, value, "expected a positive number")
        return float(value)

    def bool(self, key: str, value) -> bool:
        if not isinstance(value, bool):
            self.fail(key, value, "expected true or false")
        return value

    def token_ids(self, key: str, value) -> tuple[int, ...]:
        values = value if isinstance(value, list) else ([] if value is None else [value])
        return tuple(self.int(key, v, minimum=0) for v in values)


def _parse(raw: dict, source: str) -> LlmConfig:
    family = _family_of(raw, source)
    fam = _FAMILIES[family]
    r = _Reader(raw, source, fam.defaults)
    _reject_foreign_features(r, family)
    sizes = _sizes(r)
    window, layer_types = _attention_layout(r, fam, sizes["num_hidden_layers"])
    max_pos = r.int("max_position_embeddings")
    eos = r.token_ids("eos_token_id", r.get("eos_token_id"))
    return LlmConfig(
        family=family,
        **sizes,
        rms_norm_eps=r.float("rms_norm_eps", r.get("rms_norm_eps")),
        max_position_embeddings=max_pos,
        tie_word_embeddings=r.bool("tie_word_embeddings", r.get("tie_word_embeddings")),
        attention_bias=_switch(r, fam.qkv_bias),
        o_proj_bias=_switch(r, fam.o_bias),
        mlp_bias=_switch(r, fam.mlp_bias),
        hidden_act=_activation(r, fam),
        embed_scale=math.sqrt(sizes["hidden_size"]) if fam.gemma_style else 1.0,
        norm_offset=1.0 if fam.gemma_style else 0.0,
        sliding_window=window,
        layer_types=layer_types,
        **_rope(r, max_pos, sizes["head_dim"]),
        bos_token_id=r.int("bos_token_id", minimum=0, optional=True),
        eos_token_ids=eos,
        pad_token_id=r.int("pad_token_id", minimum=0, optional=True),
        dtype=_checkpoint_dtype(r),
        quant=None if r.raw.get("quantization_config") is None else _quant.parse(r.raw["quantization_config"], source),
    )


def _family_of(raw: dict, source: str) -> str:
    """The family from model_type, checked against architectures (either may be missing, not both)."""
    by_arch = {f.architecture: name for name, f in _FAMILIES.items()}
    model_type = raw.get("model_type")
    archs = raw.get("architectures")
    supported = ", ".join(_FAMILIES)
    if archs is not None:
        if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in by_arch:
            raise ModelImportError(
                f"{source}: field 'architectures' = {archs!r} is not supported (expected one of {', '.join(by_arch)})"
            )
    if model_type is None:
        if archs is None:
            raise ModelImportError(f"{source}: missing field 'model_type' (supported: {supported})")
        return by_arch[archs[0]]
    if model_type not in _FAMILIES:
        raise ModelImportError(
            f"{source}: field 'model_type' = {model_type!r} is not supported (supported: {supported})"
        )
    if archs is not None and by_arch[archs[0]] != model_type:
        raise ModelImportError(f"{source}: field 'architectures' = {archs!r} does not match model_type {model_type!r}")
    return model_type


def _reject_foreign_features(r: _Reader, family: str) -> None:
    for key in (*_FOREIGN_FEATURES, *_FAMILIES[family].ignored):
        value = r.raw.get(key)
        if value is not None and value is not False:
            r.fail(key, value, f"not supported for {family} models (rocmc would build a different model)")


def _sizes(r: _Reader) -> dict:
    heads = r.int("num_attention_heads")
    hidden = r.int("hidden_size")
    kv_heads = r.get("num_key_value_heads")
    kv_heads = r.int("num_key_value_heads", value=heads if kv_heads is None else kv_heads)
    if heads % kv_heads:
        r.fail("num_key_value_heads", kv_heads, f"must divide num_attention_heads = {heads}")
    head_dim = r.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            r.fail(
                "hidden_size", hidden, f"must be a multiple of num_attention_heads = {heads} when head_dim is not given"
            )
        head_dim = hidden // heads
    head_dim = r.int("head_dim", value=head_dim)
    if head_dim % 2:
        r.fail("head_dim", head_dim, "must be even (RoPE rotates pairs of dimensions)")
    return dict(
        vocab_size=r.int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=r.int("intermediate_size"),
        num_hidden_layers=r.int("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
    )


def _switch(r: _Reader, rule: str | bool) -> bool:
    return rule if isinstance(rule, bool) else r.bool(rule, r.get(rule))


def _activation(r: _Reader, fam: _Family) -> str:
    key = next((k for k in fam.activation_keys if r.get(k) is not None), fam.activation_keys[-1])
    act = r.get(key)
    act = fam.activation_aliases.get(act, act)
    if act not in SUPPORTED_ACTIVATIONS:
        r.fail(key, r.get(key), f"activation not supported (supported: {', '.join(SUPPORTED_ACTIVATIONS)})")
    return act


def _attention_layout(r: _Reader, fam: _Family, n_layers: int) -> tuple[int | None, tuple[str, ...]]:
    """(sliding_window, layer_types), following each family's modeling file."""
    if fam.sliding is None:
        return None, (FULL,) * n_layers
    window = r.int("sliding_window", optional=True)
    if fam.sliding == "all":
        return window, ((SLIDING if window else FULL),) * n_layers
    if not r.bool("use_sliding_window", r.get("use_sliding_window")):
        window = None
    types = r.get("layer_types")
    if types is None:
        first = r.int("max_window_layers", minimum=0)
        types = [SLIDING if window is not None and i >= first else FULL for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(t not in (FULL, SLIDING) for t in types):
        r.fail("layer_types", types, f"expected {n_layers} entries of {FULL!r} or {SLIDING!r}")
    if SLIDING in types and window is None:
        r.fail("layer_types", types, "has sliding layers but no sliding_window is in use")
    return window, tuple(types)


def _checkpoint_dtype(r: _Reader) -> str:
    """`dtype` (transformers 5) or `torch_dtype` (older); float32 when neither is given, as transformers loads it."""
    key = "dtype" if r.raw.get("dtype") is not None else "torch_dtype"
    value = r.raw.get(key) or "float32"
    if value not in SUPPORTED_DTYPES:
        r.fail(key, value, f"expected one of {', '.join(SUPPORTED_DTYPES)}")
    return value


def _with_generation_ids(cfg: LlmConfig, gen: dict, source: str) -> LlmConfig:
    r = _Reader(gen, source)
    updates = {}
    if gen.get("bos_token_id") is not None:
        updates["bos_token_id"] = r.int("bos_token_id", minimum=0)
    if gen.get("eos_token_id") is not None:
        updates["eos_token_ids"] = r.token_ids("eos_token_id", gen["eos_token_id"])
    if gen.get("pad_token_id") is not None:
        updates["pad_token_id"] = r.int("pad_token_id", minimum=0)
    return replace(cfg, **updates)


# ---- RoPE ------------------------------------------------------------------------------------------


def _rope(r: _Reader, max_pos: int, head_dim: int) -> dict:
    """RoPE fields from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older configs).
    As in transformers, a non-empty `rope_scaling` wins over `rope_parameters`, and a `rope_theta` inside the
    dict over the top-level one."""
    source = "rope_scaling" if r.raw.get("rope_scaling") else "rope_parameters"
    params = r.raw.get(source) or {}
    if not isinstance(params, dict):
        r.fail(source, params, "expected an object")
    if any(isinstance(v, dict) for v in params.values()):
        r.fail(source, params, "RoPE parameters per layer type are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        r.fail(
            f"{source}.rope_type", rope_type, f"RoPE type not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    partial = params.get("partial_rotary_factor", r.raw.get("partial_rotary_factor"))
    if partial is not None and partial != 1.0:
        r.fail("partial_rotary_factor", partial, "partial rotary embeddings are not supported")
    theta = params.get("rope_theta", r.raw.get("rope_theta", DEFAULT_ROPE_THETA))
    out = dict(
        rope_type=rope_type,
        rope_theta=r.float(f"{source}.rope_theta", theta),
        rope_factor=1.0,
        rope_low_freq_factor=None,
        rope_high_freq_factor=None,
        rope_original_max_position_embeddings=None,
        rope_attention_scaling=1.0,
    )
    if rope_type != "default":
        out["rope_factor"] = r.float(f"{source}.factor", params.get("factor"))
    if rope_type == "llama3":
        out.update(_llama3_rope(r, source, params, max_pos))
    return out


def _llama3_rope(r: _Reader, source: str, params: dict, max_pos: int) -> dict:
    low = r.float(f"{source}.low_freq_factor", params.get("low_freq_factor"))
    high = r.float(f"{source}.high_freq_factor", params.get("high_freq_factor"))
    if high <= low:
        r.fail(f"{source}.high_freq_factor", high, f"must exceed low_freq_factor = {low}")
    # transformers takes a top-level original_max_position_embeddings first, then the dict's, then
    # max_position_embeddings
    orig_key = "original_max_position_embeddings"
    orig = r.raw.get(orig_key, params.get(orig_key, max_pos))
    return dict(
        rope_low_freq_factor=low,
        rope_high_freq_factor=high,
        rope_original_max_position_embeddings=r.int(f"{source}.{orig_key}", value=orig),
    )


def _scale_linear(inv_freq: np.ndarray, cfg: LlmConfig) -> np.ndarray:
    return inv_freq / cfg.rope_factor


def _scale_llama3(inv_freq: np.ndarray, cfg: LlmConfig) -> np.ndarray:
    """Llama 3.1: wavelengths shorter than original/high_freq_factor stay, longer than original/low_freq_factor
    are divided by factor, and those in between blend the two linearly in original/wavelength."""
    orig = cfg.rope_original_max_position_embeddings
    low, high, factor = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (orig / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = np.where(wavelen > orig / low, inv_freq / factor, inv_freq)
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return np.where(medium, blended, out)


_ROPE_SCALING: dict[str, Callable[[np.ndarray, LlmConfig], np.ndarray]] = {
    "default": lambda inv_freq, cfg: inv_freq,
    "linear": _scale_linear,
    "llama3": _scale_llama3,
}


def rope_inv_freq(cfg: LlmConfig) -> np.ndarray:
    """Inverse frequencies, float64 (head_dim/2,): dimension pair j turns by position * inv_freq[j]."""
    d = cfg.head_dim
    base = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    return _ROPE_SCALING[cfg.rope_type](base, cfg)


def rope_tables(cfg: LlmConfig, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), float64 (n_positions, head_dim/2), for half-split RoPE:
    out[:h] = x[:h]*cos - x[h:]*sin ; out[h:] = x[h:]*cos + x[:h]*sin  (h = head_dim/2)."""
    if not isinstance(n_positions, int) or isinstance(n_positions, bool) or n_positions < 1:
        raise ModelImportError(f"rope_tables: n_positions = {n_positions!r}: expected a positive integer")
    angles = np.outer(np.arange(n_positions, dtype=np.float64), rope_inv_freq(cfg))
    return np.cos(angles) * cfg.rope_attention_scaling, np.sin(angles) * cfg.rope_attention_scaling


# ---- weights ---------------------------------------------------------------------------------------


def param_names(cfg: LlmConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Every checkpoint tensor the model reads, in transformers' names and stored shapes (Linear: (out, in))."""
    h = cfg.hidden_size
    names = [("model.embed_tokens.weight", (cfg.vocab_size, h))]
    for i in range(cfg.num_hidden_layers):
        names += _layer_params(cfg, f"model.layers.{i}.")
    names.append(("model.norm.weight", (h,)))
    if not cfg.tie_word_embeddings:
        names.append(("lm_head.weight", (cfg.vocab_size, h)))
    return names


def _layer_params(cfg: LlmConfig, prefix: str) -> list[tuple[str, tuple[int, ...]]]:
    h = cfg.hidden_size
    names = [(prefix + "input_layernorm.weight", (h,)), (prefix + "post_attention_layernorm.weight", (h,))]
    for module, out, inp in linear_layers(cfg, prefix):
        if quantized(cfg, module):
            names += [(n, shape) for n, shape, _ in _quant.checkpoint_tensors(cfg.quant, module, out, inp, "")]
        else:
            names.append((f"{module}.weight", (out, inp)))
        if has_bias(cfg, module):
            names.append((f"{module}.bias", (out,)))
    return names


def has_bias(cfg: LlmConfig, module: str) -> bool:
    """Whether a decoder linear layer carries a bias (by the config's switches)."""
    kind = module.rsplit(".", 1)[-1]
    return {"q_proj": cfg.attention_bias, "k_proj": cfg.attention_bias, "v_proj": cfg.attention_bias,
            "o_proj": cfg.o_proj_bias}.get(kind, cfg.mlp_bias)  # fmt: skip


def quantized(cfg: LlmConfig, module: str) -> bool:
    """Whether the checkpoint stores linear layer `module` quantized (cfg.quant)."""
    return cfg.quant is not None and cfg.quant.quantized(module)


def param_dtypes(cfg: LlmConfig) -> dict:
    """{tensor name: rocmc dtype} of the checkpoint tensors not in its float dtype (a quantized layer's packed
    integers); every other tensor of param_names has the checkpoint's dtype."""
    if cfg.quant is None:
        return {}
    out = {}
    for i in range(cfg.num_hidden_layers):
        for name, n, k in linear_layers(cfg, f"model.layers.{i}."):
            if quantized(cfg, name):
                out.update({t: d for t, _, d in _quant.checkpoint_tensors(cfg.quant, name, n, k, "") if d})
    return out


def linear_layers(cfg: LlmConfig, prefix: str) -> list:
    """[(module, out_features, in_features)] of a decoder layer's linear layers."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    return [
        (prefix + "self_attn.q_proj", cfg.q_dim, h),
        (prefix + "self_attn.k_proj", cfg.kv_dim, h),
        (prefix + "self_attn.v_proj", cfg.kv_dim, h),
        (prefix + "self_attn.o_proj", h, cfg.q_dim),
        (prefix + "mlp.gate_proj", inter, h),
        (prefix + "mlp.up_proj", inter, h),
        (prefix + "mlp.down_proj", h, inter),
    ]


# ---- KV cache --------------------------------------------------------------------------------------


def kv_cache_bytes(cfg: LlmConfig, max_seq_len: int, max_batch: int = 1, dtype=None) -> int:
    """Bytes of a full K and V cache: every layer, max_batch sequences of max_seq_len positions.
    dtype: a rocmc or numpy dtype or its name; the checkpoint's dtype by default."""
    for name, v in (("max_seq_len", max_seq_len), ("max_batch", max_batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ModelImportError(f"kv_cache_bytes: {name} = {v!r}: expected a positive integer")
    return (
        2
        * cfg.num_hidden_layers
        * max_batch
        * max_seq_len
        * cfg.kv_dim
        * _itemsize(cfg.dtype if dtype is None else dtype)
    )


def default_max_seq_len(cfg: LlmConfig, budget_bytes: int = KV_CACHE_BUDGET, max_batch: int = 1, dtype=None) -> int:
    """max_position_embeddings, capped so the KV cache fits budget_bytes, rounded down to a multiple of 16
    and never below 16."""
    per_position = kv_cache_bytes(cfg, 1, max_batch, dtype)
    fits = min(cfg.max_position_embeddings, budget_bytes // per_position)
    return max(SEQ_LEN_MULTIPLE, fits // SEQ_LEN_MULTIPLE * SEQ_LEN_MULTIPLE)


def _itemsize(dtype) -> int:
    try:
        d = _rocmc_dtype(dtype)
    except RocmcError:
        d = None
    if d is None or not d.is_float:
        raise ModelImportError(f"KV cache dtype {dtype!r}: expected float32, float16 or bfloat16")
    return d.bits // 8
