"""A ResNet basic block with a stem: conv -> batch norm -> relu -> max pool, then two 3x3 convs + residual,
global average pooling.

    rocmc compile examples/resnet_block.py -t gfx942 -o resnet.vmfb
"""

from __future__ import annotations

import numpy as np

import rocmc
from rocmc import ops


def build_graph(
    channels: int = 32, in_channels: int = 3, batch="n", size: int = 56, dtype: str = "f32", seed: int = 0
) -> rocmc.Graph:
    rng = np.random.default_rng(seed)
    npd = rocmc.dtype(dtype).np
    g = rocmc.Graph("resnet_block")

    def conv_w(name, cout, cin, k):
        return g.constant(name, (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(npd))

    def bn(x, name, c):
        p = lambda suffix, v: g.constant(f"{name}_{suffix}", v.astype(npd))
        return ops.batch_norm(
            x,
            p("mean", 0.1 * rng.standard_normal(c)),
            p("var", 1.0 + 0.1 * rng.random(c)),
            p("weight", 1.0 + 0.1 * rng.standard_normal(c)),
            p("bias", 0.1 * rng.standard_normal(c)),
        )

    x = g.input("x", (batch, in_channels, size, size), dtype)
    y = ops.relu(bn(ops.conv2d(x, conv_w("stem", channels, in_channels, 7), stride=2, padding=3), "bn0", channels))
    y = ops.max_pool2d(y, 3, stride=2, padding=1)
    r = ops.relu(bn(ops.conv2d(y, conv_w("conv1", channels, channels, 3), padding=1), "bn1", channels))
    r = bn(ops.conv2d(r, conv_w("conv2", channels, channels, 3), padding=1), "bn2", channels)
    y = ops.relu(r + y)
    g.output(ops.mean(y, axis=(2, 3)))
    return g


if __name__ == "__main__":
    g = build_graph()
    print(g)
    art = rocmc.compile(g, "cpu")
    x = np.random.default_rng().standard_normal((2, 3, 56, 56)).astype(np.float32)
    y = rocmc.load(art)(x)
    err = np.abs(y - rocmc.evaluate(g, x)).max()
    print(f"output {y.shape}, max abs error vs float64 reference {err:.2e}")
