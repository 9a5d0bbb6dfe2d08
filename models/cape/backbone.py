"""Plain-PyTorch ResNet-18/50 (He et al., arXiv 1512.03385) with torchvision's parameter names.

torchvision is not a dependency (there is no CPU wheel of it for every platform this project
supports), but its ImageNet checkpoints are the usual starting point, so the module and
parameter names here match torchvision's ``resnet18``/``resnet50`` exactly: a state dict saved
from torchvision loads with :func:`load_backbone_weights` (its ``fc.*`` head is ignored).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from utils.run.checkpoint import CheckpointError, safe_load


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _downsample(cin: int, cout: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual (ResNet-18/34)."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv3x3(cin, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(cin, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided, as in torchvision's "ResNet v1.5"), 1x1 expand, with a residual (ResNet-50)."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(cin, width * 4, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


_ARCHS = {"resnet18": (BasicBlock, (2, 2, 2, 2)), "resnet50": (Bottleneck, (3, 4, 6, 3))}


class ResNet(nn.Module):
    """ResNet trunk without the classifier, returning the stride-8, -16 and -32 feature maps.

    Input: images ``[B, 3, H, W]`` float, ImageNet-normalised. Output: a tuple
    ``(c3 [B, C3, H/8, W/8], c4 [B, C4, H/16, W/16], c5 [B, C5, H/32, W/32])`` with
    ``channels = (C3, C4, C5)`` = (128, 256, 512) for ResNet-18 and (512, 1024, 2048) for ResNet-50.
    Initialisation follows torchvision: Kaiming-normal convs, BN weight 1 / bias 0.
    """

    def __init__(self, name: str = "resnet18"):
        super().__init__()
        if name not in _ARCHS:
            raise ValueError(f"backbone={name!r} is not supported: use one of {sorted(_ARCHS)}")
        block, depths = _ARCHS[name]
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        cin, layers = 64, []
        for i, (width, depth) in enumerate(zip((64, 128, 256, 512), depths)):
            blocks = []
            for j in range(depth):
                blocks.append(block(cin, width, stride=2 if (i > 0 and j == 0) else 1))
                cin = width * block.expansion
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.channels = tuple(w * block.expansion for w in (128, 256, 512))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        c3 = self.layer2(self.layer1(x))
        c4 = self.layer3(c3)
        return c3, c4, self.layer4(c4)


def load_backbone_weights(backbone: ResNet, path: str | os.PathLike) -> None:
    """Load a torchvision-layout ResNet state dict (e.g. ``torchvision.models.resnet50(weights=...).state_dict()``
    saved with ``torch.save``) into ``backbone``, with ``torch.load(weights_only=True)``.

    The classifier (``fc.*``) is dropped; every other key must match in name and shape.

    Raises:
        CheckpointError: the file is missing, unsafe or corrupt, or its keys/shapes do not match this backbone.
    """
    state = safe_load(path)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointError(f"--backbone_weights {path}: expected a state dict, got {type(state).__name__}")
    state = {k.removeprefix("module."): v for k, v in state.items() if not k.removeprefix("module.").startswith("fc.")}
    own = backbone.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"--backbone_weights {path} does not fit this backbone: {len(missing)} missing (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:3]}), {len(wrong)} with other shapes (e.g. {wrong[:3]}); "
            "pass a torchvision state dict of the same depth as --backbone"
        )
    backbone.load_state_dict(state)
