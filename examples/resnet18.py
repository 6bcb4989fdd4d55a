"""ResNet-18 (He et al. 2015, torchvision's layout) with random, seeded weights: a 7x7/2 stem, batch norm,
ReLU, 3x3/2 max pooling, four stages of two basic blocks (64, 128, 256, 512 channels; stages 2-4 start
with stride 2 and a 1x1/2 projection), global average pooling and a linear classifier.

    python examples/resnet18.py                      # compile for the CPU, run batch 2 at 64x64, check
    rocmc compile examples/resnet18.py -t gfx942 -o resnet18.vmfb --set batch=32
"""

from __future__ import annotations

import argparse

import numpy as np

import rocmc
from rocmc import ops

STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, stride of the first block)
BLOCKS_PER_STAGE = 2


def build_graph(
    batch=1,
    dtype: str = "f32",
    seed: int = 0,
    size: int = 224,
    width: int = 64,
    classes: int = 1000,
    in_channels: int = 3,
) -> rocmc.Graph:
    """ResNet-18 on x: (batch, in_channels, size, size) -> logits (batch, classes).

    `batch` may be a symbol (e.g. "n"); `width` scales every stage (64 is the real network). Constants
    are named after the torchvision parameters they stand for (`layer2_0_conv1`, `layer2_0_bn1_mean`, ...),
    so another framework can load the same weights from `graph.constants`.
    """
    rng = np.random.default_rng(seed)
    npd = rocmc.dtype(dtype).np
    g = rocmc.Graph("resnet18")

    def const(name, value):
        return g.constant(name, np.asarray(value).astype(npd))

    def conv(x, name, cin, cout, k, stride=1):
        # He initialisation keeps activations O(1) through the 17 convolutions.
        w = const(name, rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)))
        return ops.conv2d(x, w, stride=stride, padding=k // 2)

    def bn(x, name, c):
        return ops.batch_norm(
            x,
            const(f"{name}_mean", 0.1 * rng.standard_normal(c)),
            const(f"{name}_var", 1.0 + 0.1 * rng.random(c)),
            const(f"{name}_weight", 1.0 + 0.1 * rng.standard_normal(c)),
            const(f"{name}_bias", 0.1 * rng.standard_normal(c)),
            eps=1e-5,
        )

    def basic_block(x, name, cin, cout, stride):
        y = ops.relu(bn(conv(x, f"{name}_conv1", cin, cout, 3, stride), f"{name}_bn1", cout))
        y = bn(conv(y, f"{name}_conv2", cout, cout, 3), f"{name}_bn2", cout)
        if stride != 1 or cin != cout:
            x = bn(conv(x, f"{name}_down", cin, cout, 1, stride), f"{name}_down_bn", cout)
        return ops.relu(y + x)

    x = g.input("x", (batch, in_channels, size, size), dtype)
    y = ops.relu(bn(conv(x, "conv1", in_channels, width, 7, stride=2), "bn1", width))
    y = ops.max_pool2d(y, 3, stride=2, padding=1)
    cin = width
    for s, (channels, stride) in enumerate(STAGES, start=1):
        cout = channels * width // 64
        for b in range(BLOCKS_PER_STAGE):
            y = basic_block(y, f"layer{s}_{b}", cin, cout, stride if b == 0 else 1)
            cin = cout
    y = ops.mean(y, axis=(2, 3))
    fc_w = const("fc_weight", rng.standard_normal((classes, cin)) / np.sqrt(cin))
    g.output(ops.linear(y, fc_w, const("fc_bias", 0.01 * rng.standard_normal(classes))))
    return g


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--dtype", default="f32")
    a = ap.parse_args()
    g = build_graph(batch="n", dtype=a.dtype, size=a.size)
    print(f"{g.name}: {len(g.nodes)} nodes, {sum(c.size for c in g.constants.values()) / 1e6:.1f} M parameters")
    x = np.random.default_rng(1).standard_normal((a.batch, 3, a.size, a.size)).astype(rocmc.dtype(a.dtype).np)
    y = rocmc.load(rocmc.compile(g, "cpu"))(x)
    ref = rocmc.evaluate(g, x)
    print(
        f"logits {y.shape}, max error relative to max |y|: "
        f"{np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max():.2e}"
    )
