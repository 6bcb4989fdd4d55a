"""Build the small real models the ONNX import is tested on, at a fixed random initialization.

    python examples/models/make_models.py      # writes resnet18_narrow.onnx and llama2l_decoder.onnx here

export_torch.py exports the same two layouts from PyTorch (the *_torch.onnx files); these are built
node by node so the opset-23 fused ops (RMSNormalization, RotaryEmbedding, Attention) appear as such.

- resnet18_narrow.onnx: torchvision's ResNet-18 layout (7x7 stem, max pool, 4 stages of 2 basic
  blocks with 1x1 downsampling, global average pool, fully connected head) with channels 8-16-32-64,
  batch norms kept as nodes; input `image` f32[N, 3, 64, 64] with a symbolic batch.
- llama2l_decoder.onnx: a Llama-style decoder of 2 layers in opset 23 (RMSNormalization,
  RotaryEmbedding, grouped-query Attention with is_causal, SwiGLU MLP); inputs `input_ids`
  i64[batch, seq] and `position_ids` i64[batch, seq], output logits f32[batch, seq, vocab].
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


class Builder:
    """Nodes and initializers of one ONNX graph, with unique names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def weight(self, hint: str, shape, scale: float | None = None, value=None) -> str:
        name = self.name(hint)
        if value is None:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
            value = self.rng.normal(0.0, scale if scale is not None else 1.0 / np.sqrt(fan_in), size=shape)
        self.inits.append(
            numpy_helper.from_array(
                np.asarray(value, dtype=np.float32) if np.asarray(value).dtype.kind == "f" else np.asarray(value), name
            )
        )
        return name

    def op(self, op_type: str, inputs, n_out: int = 1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=outs[0], **attrs))
        return outs[0] if n_out == 1 else outs


# ---- ResNet-18, narrow ------------------------------------------------------------------------


def _conv_bn(b: Builder, x: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
    w = b.weight("conv_w", (cout, cin, k, k), scale=np.sqrt(2.0 / (cin * k * k)))
    y = b.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    bn = [
        b.weight("bn_scale", (cout,), value=b.rng.uniform(0.5, 1.5, cout)),
        b.weight("bn_bias", (cout,), value=b.rng.uniform(-0.2, 0.2, cout)),
        b.weight("bn_mean", (cout,), value=b.rng.uniform(-0.2, 0.2, cout)),
        b.weight("bn_var", (cout,), value=b.rng.uniform(0.5, 1.5, cout)),
    ]
    y = b.op("BatchNormalization", [y, *bn], epsilon=1e-5)
    return b.op("Relu", [y]) if relu else y


def _basic_block(b: Builder, x: str, cin: int, cout: int, stride: int) -> str:
    y = _conv_bn(b, x, cin, cout, 3, stride, relu=True)
    y = _conv_bn(b, y, cout, cout, 3, 1, relu=False)
    skip = x if stride == 1 and cin == cout else _conv_bn(b, x, cin, cout, 1, stride, relu=False)
    return b.op("Relu", [b.op("Add", [y, skip])])


def resnet18_narrow(widths=(8, 16, 32, 64), classes: int = 10, size: int = 64, seed: int = 0) -> onnx.ModelProto:
    b = Builder(seed)
    x = _conv_bn(b, "image", 3, widths[0], 7, 2, relu=True)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = widths[0]
    for stage, cout in enumerate(widths):
        for block in range(2):
            x = _basic_block(b, x, cin, cout, 2 if (stage > 0 and block == 0) else 1)
            cin = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    fc_w = b.weight("fc_w", (classes, cin))
    fc_b = b.weight("fc_b", (classes,), scale=0.1)
    b.nodes.append(helper.make_node("Gemm", [x, fc_w, fc_b], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(
        b.nodes,
        "resnet18_narrow",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        b.inits,
    )
    return _finish(graph, opset=18)


# ---- Llama-style decoder ----------------------------------------------------------------------


def _rope_tables(max_pos: int, head_dim: int, theta: float = 10000.0):
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    ang = np.outer(np.arange(max_pos), inv)
    return np.cos(ang), np.sin(ang)


def _decoder_layer(
    b: Builder, x: str, pos: str, cos: str, sin: str, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int
) -> str:
    def linear(v, fin, fout):
        return b.op("MatMul", [v, b.weight("w", (fin, fout), scale=1.0 / np.sqrt(fin))])

    def heads_first(v, n):  # [B, S, n*D] -> [B, n, S, D]
        shape = b.weight("shape", None, value=np.asarray([0, 0, n, head_dim], dtype=np.int64))
        return b.op("Transpose", [b.op("Reshape", [v, shape])], perm=[0, 2, 1, 3])

    h = b.op(
        "RMSNormalization",
        [x, b.weight("attn_norm", (hidden,), value=b.rng.uniform(0.8, 1.2, hidden))],
        axis=-1,
        epsilon=1e-6,
    )
    q = heads_first(linear(h, hidden, heads * head_dim), heads)
    k = heads_first(linear(h, hidden, kv_heads * head_dim), kv_heads)
    v = heads_first(linear(h, hidden, kv_heads * head_dim), kv_heads)
    q = b.op("RotaryEmbedding", [q, cos, sin, pos])
    k = b.op("RotaryEmbedding", [k, cos, sin, pos])
    a = b.op("Attention", [q, k, v], is_causal=1)
    merged = b.weight("shape", None, value=np.asarray([0, 0, heads * head_dim], dtype=np.int64))
    a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), merged])
    x = b.op("Add", [x, linear(a, heads * head_dim, hidden)])
    h = b.op(
        "RMSNormalization",
        [x, b.weight("mlp_norm", (hidden,), value=b.rng.uniform(0.8, 1.2, hidden))],
        axis=-1,
        epsilon=1e-6,
    )
    gate = linear(h, hidden, ffn)
    silu = b.op("Mul", [gate, b.op("Sigmoid", [gate])])
    return b.op("Add", [x, linear(b.op("Mul", [silu, linear(h, hidden, ffn)]), ffn, hidden)])


def llama_decoder(
    layers: int = 2,
    vocab: int = 256,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 172,
    max_pos: int = 128,
    seed: int = 1,
) -> onnx.ModelProto:
    b = Builder(seed)
    head_dim = hidden // heads
    cos_t, sin_t = _rope_tables(max_pos, head_dim)
    cos, sin = b.weight("rope_cos", None, value=cos_t), b.weight("rope_sin", None, value=sin_t)
    x = b.op("Gather", [b.weight("embed", (vocab, hidden), scale=0.5), "input_ids"], axis=0)
    for _ in range(layers):
        x = _decoder_layer(b, x, "position_ids", cos, sin, hidden, heads, kv_heads, head_dim, ffn)
    x = b.op(
        "RMSNormalization",
        [x, b.weight("final_norm", (hidden,), value=b.rng.uniform(0.8, 1.2, hidden))],
        axis=-1,
        epsilon=1e-6,
    )
    b.nodes.append(helper.make_node("MatMul", [x, b.weight("lm_head", (hidden, vocab))], ["logits"], name="lm_head"))
    graph = helper.make_graph(
        b.nodes,
        "llama2l_decoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])],
        b.inits,
    )
    return _finish(graph, opset=23)


def _finish(graph, opset: int) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="rocmc-examples")
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


MODELS = {"resnet18_narrow.onnx": resnet18_narrow, "llama2l_decoder.onnx": llama_decoder}


def main(out_dir: str = str(HERE)) -> None:
    for name, make in MODELS.items():
        path = Path(out_dir) / name
        onnx.save(make(), str(path))
        print(f"{path}: {path.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main(*sys.argv[1:])
