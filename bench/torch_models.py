"""MobileNetV2 and ResNet-50 in plain torch.nn, for benchmarks that export them to ONNX.

The layer structure follows the two papers (Sandler et al. 2018, He et al. 2016) at their ImageNet
sizes; weights are random from a seed (latency does not depend on trained values). Batch-norm
statistics are randomised too, so an importer that folds or skips them is visible in the error.
"""

from __future__ import annotations

import torch
from torch import nn


def _conv_bn(c_in: int, c_out: int, k: int, stride: int = 1, groups: int = 1, act: type | None = nn.ReLU6):
    layers = [nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(c_out)]
    return nn.Sequential(*layers, act(inplace=True)) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """1x1 expansion, 3x3 depthwise, 1x1 linear projection; a shortcut when shapes allow it."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int):
        super().__init__()
        hidden = c_in * expand
        layers = [_conv_bn(c_in, hidden, 1)] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, c_out, 1, act=None)]
        self.body = nn.Sequential(*layers)
        self.shortcut = stride == 1 and c_in == c_out

    def forward(self, x):
        y = self.body(x)
        return x + y if self.shortcut else y


class MobileNetV2(nn.Module):
    # (expansion t, output channels c, repeats n, first stride s), the paper's table 2.
    SETTINGS = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, c = [_conv_bn(3, 32, 3, 2)], 32
        for t, c_out, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(c, c_out, s if i == 0 else 1, t))
                c = c_out
        layers.append(_conv_bn(c, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand x4; a projected shortcut when shapes change."""

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * 4
        self.body = nn.Sequential(
            _conv_bn(c_in, width, 1, act=nn.ReLU),
            _conv_bn(width, width, 3, stride, act=nn.ReLU),
            _conv_bn(width, c_out, 1, act=None),
        )
        self.shortcut = _conv_bn(c_in, c_out, 1, stride, act=None) if stride != 1 or c_in != c_out else nn.Identity()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    STAGES = [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]  # (width, blocks, first stride)

    def __init__(self, classes: int = 1000):
        super().__init__()
        stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        )
        blocks, c = [], 64
        for width, n, s in self.STAGES:
            for i in range(n):
                blocks.append(Bottleneck(c, width, s if i == 0 else 1))
                c = width * 4
        self.features = nn.Sequential(stem, *blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def randomize_batch_norm(model: nn.Module, seed: int) -> nn.Module:
    """Non-trivial running statistics and affine parameters (fresh modules have mean 0, var 1)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)
    return model


def build(name: str, seed: int = 0) -> nn.Module:
    """A model in eval mode with seeded random weights: 'mobilenet_v2' or 'resnet50'."""
    torch.manual_seed(seed)
    model = {"mobilenet_v2": MobileNetV2, "resnet50": ResNet50}[name]()
    return randomize_batch_norm(model, seed).eval()
