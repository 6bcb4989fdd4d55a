"""Small models of the families users export to ONNX, made with the real tools (transformers, torch).

Each `Case` builds a randomly initialised model (seeded) at a tiny config of its family, its example
inputs, and exports it with one of torch's two ONNX exporters: TorchScript (`dynamo=False`, opset 17)
or dynamo (`torch.export`, opset 18), with static shapes or a dynamic batch and sequence/size axis.
tests/onnx/test_onnx_exports.py imports and runs a fixed subset; `python -m bench.onnx_exports` runs them all.
The tests import this module as `export_models` (pytest puts tests/ on sys.path), the benchmarks as
`tests.export_models` (run from the repository root); it imports neither rocmc nor bench, and torch and
transformers only inside its functions.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

VOCAB = 128


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable  # () -> torch.nn.Module taking the example inputs positionally, one output
    inputs: Callable  # (rng, batch, seq) -> tuple of numpy arrays
    names: tuple  # input names
    dynamic: dict  # input name -> {axis: dim name} for a dynamic export
    llm: bool = False  # has RMSNorm/RoPE/attention that the rewrite stage should recognise


def _text_inputs(rng, batch, seq):
    ids = rng.integers(0, VOCAB, size=(batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    if batch > 1:
        mask[0, : seq // 2] = 0  # one left-padded row: the mask path is exercised
    return ids, mask


def _image_inputs(size, channels=3):
    def make(rng, batch, _seq):
        return (rng.standard_normal((batch, channels, size, size)).astype(np.float32),)

    return make


def _audio_inputs(rng, batch, _seq):
    return (rng.standard_normal((batch, 16, 40)).astype(np.float32),)


class _Logits:
    """Wrap a transformers model so it takes (input_ids, attention_mask) and returns one tensor."""

    @staticmethod
    def wrap(model, field: str, mask: bool = True):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *args):
                kw = {"input_ids": args[0]}
                if mask:
                    kw["attention_mask"] = args[1]
                if hasattr(self.m.config, "use_cache"):
                    kw["use_cache"] = False
                return getattr(self.m(**kw), field)

        return Wrapped().eval()


def _causal(cls_name: str, config_name: str, **extra):
    def build():
        import transformers

        cfg = getattr(transformers, config_name)(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=128,
            **extra,
        )
        return _Logits.wrap(getattr(transformers, cls_name)(cfg), "logits")

    return build


def _gpt2():
    import transformers

    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128)
    return _Logits.wrap(transformers.GPT2LMHeadModel(cfg), "logits")


def _bert():
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    return _Logits.wrap(transformers.BertModel(cfg), "last_hidden_state")


def _distilbert():
    import transformers

    cfg = transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=128
    )
    return _Logits.wrap(transformers.DistilBertModel(cfg), "last_hidden_state")


def _t5_encoder():
    import transformers

    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    return _Logits.wrap(transformers.T5EncoderModel(cfg), "last_hidden_state")


def _vision(cls_name: str, config_name: str, field: str = "last_hidden_state", **cfg):
    def build():
        import torch
        import transformers

        model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**cfg)).eval()

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, pixels):
                return getattr(self.m(pixel_values=pixels), field)

        return Wrapped().eval()

    return build


def _whisper_encoder():
    import torch
    import transformers

    cfg = transformers.WhisperConfig(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        decoder_layers=1,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=20,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    encoder = transformers.WhisperModel(cfg).get_encoder().eval()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = encoder

        def forward(self, features):
            return self.m(input_features=features).last_hidden_state

    return Wrapped().eval()


def _squeezenet():
    """SqueezeNet's fire modules in plain torch.nn (torchvision does not import beside the CPU torch)."""
    import torch
    from torch import nn

    class Fire(nn.Module):
        def __init__(self, cin, squeeze, expand):
            super().__init__()
            self.s = nn.Conv2d(cin, squeeze, 1)
            self.e1 = nn.Conv2d(squeeze, expand, 1)
            self.e3 = nn.Conv2d(squeeze, expand, 3, padding=1)

        def forward(self, x):
            x = torch.relu(self.s(x))
            return torch.cat([torch.relu(self.e1(x)), torch.relu(self.e3(x))], 1)

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(32, 8, 16),
        Fire(32, 8, 16),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(32, 16, 32),
        nn.Dropout(0.5),
        nn.Conv2d(64, 10, 1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    ).eval()


_TEXT = dict(
    inputs=_text_inputs,
    names=("input_ids", "attention_mask"),
    dynamic={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
)
_PIXELS = dict(names=("pixels",), dynamic={"pixels": {0: "batch"}})

FAMILIES = {
    f.name: f
    for f in [
        Family("llama", _causal("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=2), llm=True, **_TEXT),
        Family("qwen2", _causal("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=2), llm=True, **_TEXT),
        Family("mistral", _causal("MistralForCausalLM", "MistralConfig", num_key_value_heads=2), llm=True, **_TEXT),
        Family(
            "gemma", _causal("GemmaForCausalLM", "GemmaConfig", num_key_value_heads=2, head_dim=16), llm=True, **_TEXT
        ),
        Family("phi", _causal("PhiForCausalLM", "PhiConfig", partial_rotary_factor=0.5), **_TEXT),
        Family("gpt2", _gpt2, **_TEXT),
        Family("bert", _bert, **_TEXT),
        Family("distilbert", _distilbert, **_TEXT),
        Family("t5_encoder", _t5_encoder, **_TEXT),
        Family(
            "vit",
            _vision(
                "ViTModel",
                "ViTConfig",
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
                image_size=32,
                patch_size=8,
            ),
            inputs=_image_inputs(32),
            **_PIXELS,
        ),
        Family(
            "clip_vision",
            _vision(
                "CLIPVisionModel",
                "CLIPVisionConfig",
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
                image_size=32,
                patch_size=8,
            ),
            inputs=_image_inputs(32),
            **_PIXELS,
        ),
        Family(
            "whisper_encoder",
            _whisper_encoder,
            inputs=_audio_inputs,
            names=("features",),
            dynamic={"features": {0: "batch"}},
        ),
        Family(
            "mobilenet_v2",
            _vision("MobileNetV2Model", "MobileNetV2Config", "pooler_output", image_size=32, depth_multiplier=0.35),
            inputs=_image_inputs(32),
            **_PIXELS,
        ),
        Family(
            "resnet",
            _vision(
                "ResNetModel",
                "ResNetConfig",
                "pooler_output",
                embedding_size=16,
                hidden_sizes=[16, 32, 64, 128],
                depths=[1, 1, 1, 1],
            ),
            inputs=_image_inputs(32),
            **_PIXELS,
        ),
        Family(
            "convnext",
            _vision(
                "ConvNextModel", "ConvNextConfig", "pooler_output", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]
            ),
            inputs=_image_inputs(32),
            **_PIXELS,
        ),
        Family("squeezenet", _squeezenet, inputs=_image_inputs(32), **_PIXELS),
    ]
}

EXPORTERS = ("torchscript", "dynamo")


def build(family: str, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    return FAMILIES[family].build()


def export(model, family: str, exporter: str, dynamic: bool, path, example) -> None:
    """Export `model` at the example inputs (numpy) to `path` with torch's `exporter`."""
    import torch

    f = FAMILIES[family]
    args = tuple(torch.from_numpy(a) for a in example)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(
                model,
                args,
                str(path),
                dynamo=False,
                opset_version=17,
                input_names=list(f.names),
                output_names=["y"],
                dynamic_axes=f.dynamic if dynamic else None,
            )
        else:
            shapes = None
            if dynamic:
                dims = {}
                shapes = tuple(
                    {
                        axis: dims.setdefault(name, torch.export.Dim(name, min=1))
                        for axis, name in f.dynamic.get(n, {}).items()
                    }
                    or None
                    for n in f.names
                )
                if _takes_varargs(model):
                    shapes = (shapes,)
            onnx_program = torch.onnx.export(
                model,
                args,
                dynamo=True,
                dynamic_shapes=shapes,
                input_names=list(f.names),
                output_names=["y"],
                verbose=False,
            )
            onnx_program.save(str(path))


def torch_dynamic_shapes(family: str, model, seq_max: int = 64):
    """torch.export's dynamic_shapes for a family's dynamic axes (one Dim per axis name, 1..seq_max)."""
    import torch

    f = FAMILIES[family]
    dims: dict = {}
    shapes = tuple(
        {
            axis: dims.setdefault(name, torch.export.Dim(name, min=1, max=seq_max))
            for axis, name in f.dynamic.get(n, {}).items()
        }
        or None
        for n in f.names
    )
    return (shapes,) if _takes_varargs(model) else shapes


def _takes_varargs(model) -> bool:
    import inspect

    return any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(model.forward).parameters.values())


def valid_rows(family: str, inputs):
    """Which output rows mean something: a padded position's output is whatever the exporter's mask
    arithmetic makes of a row with nothing to attend to (torch and ONNX differ there), so only the
    positions the attention mask keeps are compared. None: every row."""
    if "attention_mask" not in FAMILIES[family].names:
        return None
    return inputs[FAMILIES[family].names.index("attention_mask")].astype(bool)


def run_torch(model, inputs) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(*(torch.from_numpy(a) for a in inputs)).numpy()
