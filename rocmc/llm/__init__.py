"""Hugging Face causal language models (Llama 2/3, Mistral, Qwen2, Gemma) for rocmc.

`rocmc.llm.config` reads a checkpoint's config.json into an `LlmConfig` and derives what the model
builder needs (parameter names, RoPE tables, KV-cache sizes); `rocmc.llm.tokenizer` encodes and
decodes text with the checkpoint's tokenizer.json. Neither imports torch or transformers: a checkpoint
runs from its safetensors files alone.
"""

from .runtime import LanguageModel, compile_hf, load, load_hf  # noqa: E402

__all__ = ["LanguageModel", "compile_hf", "load", "load_hf"]
