"""Export the same two small models from PyTorch (random init, fixed seed) with torch.onnx.export.

    python examples/models/export_torch.py     # needs torch and onnxscript; writes *_torch.onnx here

- resnet18_narrow_torch.onnx: torchvision's ResNet-18 structure (BasicBlock x [2, 2, 2, 2]) with
  channels 8-16-32-64, in eval mode, input image f32[N, 3, 64, 64] with a dynamic batch.
- llama2l_decoder_torch.onnx: a Llama-style decoder of 2 layers (RMSNorm, rotary embedding,
  grouped-query causal attention, SwiGLU MLP), input_ids i64[batch, seq] with dynamic sizes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, widths=(8, 16, 32, 64), classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 2 if i else 1), BasicBlock(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = F.adaptive_avg_pool2d(self.layers(x), 1)
        return self.fc(torch.flatten(x, 1))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim).uniform_(0.8, 1.2))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Layer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.attn_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * self.dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.o = nn.Linear(heads * self.dim, hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, s, self.heads, self.dim).transpose(1, 2)
        k = self.k(h).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v(h).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, layers=2, vocab=256, hidden=64, heads=4, kv_heads=2, ffn=172, max_pos=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Layer(hidden, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        dim = hidden // heads
        inv = 1.0 / 10000.0 ** (torch.arange(0, dim, 2).float() / dim)
        ang = torch.outer(torch.arange(max_pos).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, input_ids):
        s = input_ids.shape[1]
        cos, sin = self.cos[:s], self.sin[:s]
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def _randomize_bn(model, gen):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.weight.data = torch.rand(n, generator=gen) + 0.5
            m.bias.data = torch.rand(n, generator=gen) * 0.4 - 0.2
            m.running_mean = torch.rand(n, generator=gen) * 0.4 - 0.2
            m.running_var = torch.rand(n, generator=gen) + 0.5


def export(out_dir: Path = HERE) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    resnet = ResNet18().eval()
    _randomize_bn(resnet, gen)
    batch = torch.export.Dim("N", min=1, max=64)
    torch.onnx.export(
        resnet,
        (torch.randn(2, 3, 64, 64),),
        str(out_dir / "resnet18_narrow_torch.onnx"),
        input_names=["image"],
        output_names=["logits"],
        dynamic_shapes={"x": {0: batch}},
        dynamo=True,
        opset_version=18,
        external_data=False,
    )
    llama = Llama().eval()
    ids = torch.randint(0, 256, (2, 7))
    torch.onnx.export(
        llama,
        (ids,),
        str(out_dir / "llama2l_decoder_torch.onnx"),
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_shapes={"input_ids": {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=128)}},
        dynamo=True,
        opset_version=18,
        external_data=False,
    )
    for name in ("resnet18_narrow_torch.onnx", "llama2l_decoder_torch.onnx"):
        print(f"{out_dir / name}: {(out_dir / name).stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    export(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
