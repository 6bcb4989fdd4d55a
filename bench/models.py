"""The benchmark models, one definition each, built for every system from the same weights.

A case names a model and its sizes (`llama_h1024_s128_f32`, `resnet18_b32_f32`, ...). `rocmc_graph(case)`
builds the rocmc graph (random weights from a fixed seed, as the examples do); `torch_module(case)`
builds a PyTorch module whose parameters are copied from that graph's constants, so PyTorch, ONNX
Runtime (which runs the module's ONNX export) and rocmc compute the same function of the same
weights; `inputs(case)` gives the inputs every system is called with.

torch is imported lazily: the GPU driver script and the compile-time script only need rocmc.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import rocmc

SEED = 0
INPUT_SEED = 1
# The llama block's shape, per hidden size: (heads, kv heads); head dim 128 at 1024 and above, as in Llama.
LLAMA_HEADS = {512: (8, 2), 1024: (8, 2), 2048: (16, 4), 4096: (32, 8)}
LLAMA_MAX_SEQ = 4096


@dataclass(frozen=True)
class Case:
    model: str  # "llama" or "resnet18"
    dtype: str
    hidden: int = 0  # llama
    seq: int = 0  # llama
    batch: int = 1
    size: int = 224  # resnet18 image size

    @property
    def name(self) -> str:
        if self.model == "llama":
            return f"llama_h{self.hidden}_s{self.seq}_{self.dtype}"
        return f"resnet18_b{self.batch}" + (f"_{self.size}px" if self.size != 224 else "") + f"_{self.dtype}"

    @property
    def graph_key(self) -> str:
        """Cases that share one compiled module (the llama block's sequence length is symbolic)."""
        if self.model == "llama":
            return f"llama_h{self.hidden}_{self.dtype}"
        return self.name

    @property
    def flops(self) -> float:
        """Multiply-adds x 2 of the matmuls/convolutions (the figure GFLOP/s columns divide)."""
        if self.model == "llama":
            h, s = self.hidden, self.seq
            heads, kv = LLAMA_HEADS[h]
            hd, ffn = h // heads, _ffn(h)
            proj = 2 * s * h * (2 * h + 2 * kv * hd + 3 * ffn)
            attn = 2 * 2 * heads * hd * s * (s + 1) / 2  # QK^T and PV over the causal half
            return self.batch * (proj + attn)
        return self.batch * 2 * 1.814e9 * (self.size / 224) ** 2


_CASE = re.compile(r"^(llama)_h(\d+)_s(\d+)_(\w+)$|^(resnet18)_b(\d+)(?:_(\d+)px)?_(\w+)$")


def parse(name: str) -> Case:
    m = _CASE.match(name)
    if not m:
        raise ValueError(
            f"unknown case {name!r}: expected llama_h<hidden>_s<seq>_<dtype> or resnet18_b<batch>[_<size>px]_<dtype>"
        )
    if m.group(1):
        return Case("llama", m.group(4), hidden=int(m.group(2)), seq=int(m.group(3)))
    return Case("resnet18", m.group(8), batch=int(m.group(6)), size=int(m.group(7) or 224))


def _ffn(hidden: int) -> int:
    return int(8 * hidden / 3 + 255) // 256 * 256  # the example's default


# ---- rocmc ---------------------------------------------------------------------------------------


def rocmc_graph(case: Case, batch_symbol: bool = False) -> rocmc.Graph:
    if case.model == "llama":
        from examples import llama_block

        heads, kv = LLAMA_HEADS[case.hidden]
        return llama_block.build_graph(
            hidden=case.hidden,
            heads=heads,
            kv_heads=kv,
            batch=case.batch,
            max_seq=LLAMA_MAX_SEQ,
            dtype=case.dtype,
            seed=SEED,
        )
    from examples import resnet18

    return resnet18.build_graph(batch="n" if batch_symbol else case.batch, dtype=case.dtype, seed=SEED, size=case.size)


def inputs(case: Case) -> list[np.ndarray]:
    rng = np.random.default_rng(INPUT_SEED)
    npd = rocmc.dtype(case.dtype).np
    if case.model == "llama":
        return [rng.standard_normal((case.batch, case.seq, case.hidden)).astype(npd)]
    return [rng.standard_normal((case.batch, 3, case.size, case.size)).astype(npd)]


# ---- PyTorch -------------------------------------------------------------------------------------


def torch_module(case: Case, graph: rocmc.Graph | None = None):
    """The PyTorch twin of the rocmc graph, its parameters copied from the graph's constants."""
    graph = graph or rocmc_graph(case)
    build = {"llama": _torch_llama, "resnet18": _torch_resnet18}[case.model]
    return build(case, graph).eval()


def _params(module, graph):
    import torch

    for name, arr in graph.constants.items():
        module.register_buffer(name, torch.from_numpy(np.array(arr)), persistent=False)


def _torch_llama(case: Case, graph):
    import torch
    import torch.nn.functional as F

    heads, kv = LLAMA_HEADS[case.hidden]
    hd = case.hidden // heads

    def rms_norm(x, w, eps=1e-5):
        xf = x.float()  # in f32 whatever the storage type, as rocmc's rms_norm
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def rope(x, cos, sin):  # x: (b, s, h, d), half-split rotation; tables (s, d/2)
        c, s = cos[:, None, :], sin[:, None, :]
        x0, x1 = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], -1)

    class LlamaBlock(torch.nn.Module):
        def forward(self, x):
            b, t, hidden = x.shape
            cos, sin = self.rope_cos[:t], self.rope_sin[:t]
            h = rms_norm(x, self.attn_norm)
            q = rope((h @ self.wq).view(b, t, heads, hd), cos, sin).transpose(1, 2)
            k = rope((h @ self.wk).view(b, t, kv, hd), cos, sin).transpose(1, 2)
            v = (h @ self.wv).view(b, t, kv, hd).transpose(1, 2)
            k = k.repeat_interleave(heads // kv, dim=1)
            v = v.repeat_interleave(heads // kv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x1 = x + a.transpose(1, 2).reshape(b, t, hidden) @ self.wo
            h2 = rms_norm(x1, self.mlp_norm)
            return x1 + (F.silu(h2 @ self.w_gate) * (h2 @ self.w_up)) @ self.w_down

    m = LlamaBlock()
    _params(m, graph)
    return m


def _torch_resnet18(case: Case, graph):
    import torch
    import torch.nn.functional as F

    from examples import resnet18

    def bn(m, x, name):
        return F.batch_norm(
            x,
            getattr(m, f"{name}_mean"),
            getattr(m, f"{name}_var"),
            getattr(m, f"{name}_weight"),
            getattr(m, f"{name}_bias"),
            False,
            0.0,
            1e-5,
        )

    def conv(m, x, name, stride=1):
        w = getattr(m, name)
        return F.conv2d(x, w, stride=stride, padding=w.shape[-1] // 2)

    def block(m, x, name, stride):
        y = F.relu(bn(m, conv(m, x, f"{name}_conv1", stride), f"{name}_bn1"))
        y = bn(m, conv(m, y, f"{name}_conv2"), f"{name}_bn2")
        if hasattr(m, f"{name}_down"):
            x = bn(m, conv(m, x, f"{name}_down", stride), f"{name}_down_bn")
        return F.relu(y + x)

    class ResNet18(torch.nn.Module):
        def forward(self, x):
            y = F.relu(bn(self, conv(self, x, "conv1", 2), "bn1"))
            y = F.max_pool2d(y, 3, stride=2, padding=1)
            for s, (_, stride) in enumerate(resnet18.STAGES, start=1):
                for b in range(resnet18.BLOCKS_PER_STAGE):
                    y = block(self, y, f"layer{s}_{b}", stride if b == 0 else 1)
            return F.linear(y.mean((2, 3)), self.fc_weight, self.fc_bias)

    m = ResNet18()
    _params(m, graph)
    return m


def export_onnx(case: Case, path: Path, graph: rocmc.Graph | None = None) -> Path:
    """The torch module exported to ONNX at the case's exact input shapes (what ONNX Runtime runs)."""
    import torch

    module = torch_module(case, graph)
    args = tuple(torch.from_numpy(a) for a in inputs(case))
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=["x"],
            output_names=["y"],
            dynamo=True,
            external_data=False,
            optimize=True,
            verbose=False,
        )
    return path


def rebuild(graph: rocmc.Graph, weights_as_inputs: bool = False, sizes: dict | None = None) -> rocmc.Graph:
    """A copy of `graph`, optionally with every constant turned into an input (after the graph's own
    inputs) and symbolic dims fixed to static sizes (`sizes={"seq": 2048}`: in input shapes and in
    attributes that name the symbol, e.g. reshape targets).

    Weights as inputs are for GPU runs: a module with its weights embedded is as large as the weights,
    and the modules travel to the GPU machine; there the weights are rebuilt from the seed and
    uploaded once.
    """
    sizes = sizes or {}

    def fix(v):
        if isinstance(v, str):
            return sizes.get(v, v)
        if isinstance(v, (list, tuple)):
            return type(v)(fix(x) for x in v)
        return v

    g = rocmc.Graph(graph.name)
    vals = {v.id: g.input(v.name, fix(tuple(v.shape)), v.dtype) for v in graph.inputs}
    if weights_as_inputs:
        for n in graph.nodes:
            if n.op == "constant":
                arr = graph.constants[n.attrs["name"]]
                vals[n.outputs[0].id] = g.input(n.attrs["name"], arr.shape, rocmc.dtype(arr.dtype))
    for n in graph.nodes:
        if n.op == "constant":
            if not weights_as_inputs:
                vals[n.outputs[0].id] = g.constant(n.attrs["name"], graph.constants[n.attrs["name"]])
            continue
        attrs = {k: fix(v) for k, v in n.attrs.items()}
        outs = g.apply(n.op, [None if v is None else vals[v.id] for v in n.inputs], attrs)
        for old, new in zip(n.outputs, outs):
            vals[old.id] = new
    g.output(*(vals[v.id] for v in graph.outputs))
    return g


def weights_as_inputs(graph: rocmc.Graph) -> rocmc.Graph:
    return rebuild(graph, weights_as_inputs=True)


def weight_arrays(graph: rocmc.Graph) -> list[np.ndarray]:
    """The constants of `graph` in the order weights_as_inputs makes them inputs."""
    return [graph.constants[n.attrs["name"]] for n in graph.nodes if n.op == "constant"]
