"""Hugging Face causal language models (Llama 2/3, Mistral, Qwen2, Gemma) for rocmc.

`rocmc.llm.config` reads a checkpoint's config.json into an `LlmConfig` and derives what the model
builder needs (parameter names, RoPE tables, KV-cache sizes); `rocmc.llm.tokenizer` encodes and
decodes text with the checkpoint's tokenizer.json; `rocmc.llm.generation` holds the generation settings
(with the checkpoint's generation_config.json defaults), the host-side logits processors and the stop
conditions; `rocmc.llm.chat` renders the checkpoint's chat template; `rocmc.llm.quant` reads GPTQ, AWQ and fp8
checkpoints and writes GPTQ ones (`quantize`). None imports torch or transformers: a checkpoint runs from its
safetensors files alone.
"""

from .generation import GenerationConfig, GenerationResult  # noqa: E402
from .quant import quantize  # noqa: E402
from .runtime import LanguageModel, check_checkpoint, compile_hf, load, load_hf, serving_memory  # noqa: E402

__all__ = [
    "GenerationConfig",
    "GenerationResult",
    "LanguageModel",
    "check_checkpoint",
    "compile_hf",
    "load",
    "load_hf",
    "quantize",
    "serving_memory",
]
