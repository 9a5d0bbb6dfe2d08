"""CAPE backbones from the libraries: torchvision ResNet-18/50 and timm SwinV2-T/S, with their pretrained weights.

What each paper uses (and what these modules return):

- CapeFormer (``flyinglynx/CapeFormer``, ``configs/mp100/capeformer/*``): mmpose ``ResNet`` depth 50 with
  ``out_indices=(3,)``, i.e. the stride-32 ``layer4`` map (2048 channels, 8 x 8 at 256 px), started from
  ``torchvision://resnet50`` (torchvision's ImageNet weights). :class:`ResNetBackbone` with ``stride=32``.
- Pose Anything (``orhir/PoseAnything``, ``configs/1shots/graph_*`` and ``configs/1shot-swin/graph_*``): Swin
  Transformer V2 (embed 96, heads 3/6/12/24, window 16, 256 px input; depths 2/2/6/2 = SwinV2-T with drop path
  0.2, or 2/2/18/2 = SwinV2-S with drop path 0.3). ``SwinTransformerV2.forward_features`` in
  ``models/models/backbones/swin_transformer_v2.py`` takes the last stage after the final LayerNorm (stride 32,
  768 channels) and upsamples it x2 bilinearly (``upsample="bilinear"``, ``align_corners=False``): a stride-16
  map, 16 x 16 at 256 px. :class:`SwinV2Backbone` (timm ``swinv2_tiny_window16_256`` /
  ``swinv2_small_window16_256``, the same architecture in timm's layout).

Weights come from a local file (``--backbone_weights PATH``) or from the local caches (torchvision's
``torch.hub.get_dir()/checkpoints/resnet50-*.pth``; the Hugging Face hub cache for timm's
``timm/<variant>.ms_in1k``); nothing is downloaded. Accepted layouts: torchvision ResNet state dicts (with or
without ``fc.*``, optionally under ``state_dict``/``model`` and a ``module.`` prefix); timm SwinV2 state dicts
(``.pth``/``.bin``/``.safetensors``); Microsoft's Swin-Transformer checkpoints (``{"model": ...}``, patch
merging at the end of a stage, as Pose Anything loads ``swinv2_tiny_patch4_window16_256.pth``) and SimMIM ones
(``encoder.`` prefix, ``rpe_mlp`` names, as in ``swinv2_small_1k_500k.pth``), converted with timm's own
``checkpoint_filter_fn``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from utils.errors import UserError
from utils.checkpoint import CheckpointError, safe_load

RESNETS = {"resnet18": torchvision.models.resnet18, "resnet50": torchvision.models.resnet50}
SWINV2 = ("swinv2_tiny_window16_256", "swinv2_small_window16_256")
BACKBONES = (*RESNETS, *SWINV2)
# torchvision's ImageNet file names; IMAGENET1K_V1 first, the weights mmcv's ``torchvision://resnet50`` loads.
_TORCHVISION_FILES = {"resnet18": ("resnet18-f37072fd.pth", "resnet18-5c106cde.pth"),
                      "resnet50": ("resnet50-0676ba61.pth", "resnet50-19c8e357.pth", "resnet50-11ad3fa6.pth")}
_STAGES_FOR_STRIDE = {8: 2, 16: 3, 32: 4}
_SWIN_BUFFERS = ("relative_position_index", "relative_coords_table", "attn_mask")  # recomputed, never loaded


class CapeModelError(UserError, ValueError):
    """A CAPE model, backbone or recipe setting (or a model input) is invalid; the message says how to fix it."""


class ResNetBackbone(nn.Module):
    """A torchvision ResNet trunk (no pooling or classifier) returning one feature map.

    The submodules are torchvision's own (``conv1``, ``bn1``, ``layer1`` ...), so this module's state-dict keys
    are exactly torchvision's minus ``fc.*`` (and minus the stages after the output one).

    Args:
        name: ``resnet18`` or ``resnet50``.
        stride: 32 for ``layer4`` (CapeFormer's ``out_indices=(3,)``), 16 for ``layer3`` or 8 for ``layer2``
            (finer maps for small CPU inputs).

    Input ``[B, 3, H, W]`` ImageNet-normalised float; output ``[B, channels, H/stride, W/stride]``.

    Raises:
        CapeModelError: an unknown name or stride.
    """

    def __init__(self, name: str = "resnet50", stride: int = 32):
        super().__init__()
        if name not in RESNETS or stride not in _STAGES_FOR_STRIDE:
            raise CapeModelError(f"backbone {name!r} at stride {stride}: use one of {sorted(RESNETS)} "
                                 f"at stride {' or '.join(map(str, _STAGES_FOR_STRIDE))}")
        self.name, self.stride = name, stride
        net = RESNETS[name](weights=None)
        self.stages = ("layer1", "layer2", "layer3", "layer4")[:_STAGES_FOR_STRIDE[stride]]
        for part in ("conv1", "bn1", "relu", "maxpool", *self.stages):
            setattr(self, part, getattr(net, part))
        last = getattr(self, self.stages[-1])[-1]
        self.channels = (last.bn3 if hasattr(last, "bn3") else last.bn2).num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in self.stages:
            x = getattr(self, stage)(x)
        return x

    def cached_weights(self) -> Path | None:
        """torchvision's ImageNet file for this depth in ``torch.hub.get_dir()/checkpoints``, if there is one."""
        folder = Path(torch.hub.get_dir()) / "checkpoints"
        for file in _TORCHVISION_FILES[self.name]:
            if (folder / file).is_file():
                return folder / file
        found = sorted(folder.glob(f"{self.name}-*.pth"))
        return found[0] if found else None

    def load_pretrained(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Load a torchvision-layout state dict, ignoring the classifier and stages this trunk does not have.

        Raises:
            CheckpointError: keys or shapes do not match (naming ``source``).
        """
        dropped = ("fc.",) + tuple(f"layer{i}." for i in range(len(self.stages) + 1, 5))
        _load_strict(self, {k: v for k, v in state.items() if not k.startswith(dropped)}, source,
                     f"a torchvision {self.name} state dict")


class SwinV2Backbone(nn.Module):
    """timm SwinV2 as Pose Anything uses it: last-stage features after the final norm, upsampled x2 (stride 16).

    Args:
        variant: ``swinv2_tiny_window16_256`` or ``swinv2_small_window16_256``.
        image_size: input side in pixels (SwinV2 is built for one input size; Pose Anything: 256).
        drop_path_rate: stochastic depth (Pose Anything: 0.2 for T, 0.3 for S).
        **timm_kwargs: further ``timm.create_model`` arguments (e.g. ``window_size``, ``embed_dim``, ``depths``,
            ``num_heads`` for a small test network).

    Input ``[B, 3, image_size, image_size]`` ImageNet-normalised float; output
    ``[B, channels, image_size/16, image_size/16]`` (``channels`` = 768 for T and S). State-dict keys live
    under ``body.`` in timm's layout, without the classifier ``head.fc.*``.

    Raises:
        CapeModelError: an unknown variant; in ``forward``, an input of another size than ``image_size``.
    """

    stride = 16

    def __init__(self, variant: str = "swinv2_tiny_window16_256", image_size: int = 256, drop_path_rate: float = 0.2,
                 **timm_kwargs):
        super().__init__()
        if variant not in SWINV2:
            raise CapeModelError(f"backbone {variant!r} is not supported: use one of {SWINV2}")
        import timm  # imported here so ResNet-only use never pays for it

        self.name, self.image_size = variant, image_size
        self.body = timm.create_model(variant, pretrained=False, num_classes=0, img_size=image_size,
                                      drop_path_rate=drop_path_rate, **timm_kwargs)
        self.channels = self.body.num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.image_size, self.image_size):
            raise CapeModelError(f"{self.name} was built for {self.image_size} px inputs, got {tuple(x.shape[-2:])}; "
                                 "pass the same image_size to the model as to the data (--image_size)")
        x = self.body.forward_features(x).permute(0, 3, 1, 2)  # timm returns NHWC
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)

    def cached_weights(self) -> Path | None:
        """timm's ImageNet-1k weights (``timm/<variant>.ms_in1k``) in the local Hugging Face hub cache, if there."""
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        for file in ("model.safetensors", "pytorch_model.bin"):
            found = try_to_load_from_cache(f"timm/{self.name}.ms_in1k", file)
            if isinstance(found, str):
                return Path(found)
        return None

    def load_pretrained(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Load a timm, Microsoft Swin-Transformer or SimMIM SwinV2 state dict (see the module docstring).

        Raises:
            CheckpointError: keys or shapes do not match (naming ``source``).
        """
        from timm.models.swin_transformer_v2 import checkpoint_filter_fn

        if any(k.startswith("encoder.") for k in state):  # SimMIM pre-training: the backbone is under encoder.
            state = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
        state = {k.replace("rpe_mlp", "cpb_mlp"): v for k, v in state.items() if k != "mask_token"}
        if any(k.startswith("layers.0.downsample.") for k in state):  # Microsoft layout: merging ends a stage
            state = checkpoint_filter_fn(state, self.body)
        state = {k: v for k, v in state.items() if not k.startswith("head.") and not k.endswith(_SWIN_BUFFERS)}
        _load_strict(self.body, state, source, f"a {self.name} state dict (timm, Microsoft or SimMIM layout)")


Backbone = ResNetBackbone | SwinV2Backbone


def build_backbone(name: str, image_size: int = 256, stride: int = 32, drop_path_rate: float = 0.2,
                   **timm_kwargs) -> Backbone:
    """The backbone called ``name`` (one of :data:`BACKBONES`), randomly initialised.

    ``stride`` applies to ResNets, ``image_size``, ``drop_path_rate`` and ``timm_kwargs`` to SwinV2.

    Raises:
        CapeModelError: an unknown name, or timm arguments for a ResNet.
    """
    if name not in BACKBONES:
        raise CapeModelError(f"backbone {name!r} is not supported: use one of {BACKBONES}")
    if name in RESNETS:
        if timm_kwargs:
            raise CapeModelError(f"backbone {name!r} takes no SwinV2 arguments, got {sorted(timm_kwargs)}")
        return ResNetBackbone(name, stride)
    return SwinV2Backbone(name, image_size, drop_path_rate, **timm_kwargs)


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A tensor state dict from a ``.pth``/``.pt``/``.bin`` (``torch.load(weights_only=True)``) or ``.safetensors``
    file, unwrapped from a ``state_dict`` or ``model`` entry, without a ``module.`` (DataParallel) prefix.

    Raises:
        CheckpointError: the file is missing, corrupt, unsafe to unpickle, or holds no state dict.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        if not path.is_file():
            raise CheckpointError(f"backbone weights {path} do not exist")
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            state = load_file(path)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"backbone weights {path} are not a readable safetensors file ({e})") from e
    else:
        state = safe_load(path)
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"backbone weights {path} hold no state dict of tensors "
                              f"(got {type(state).__name__}); save one with torch.save(model.state_dict(), path)")
    return {k.removeprefix("module."): v for k, v in state.items()}


def init_backbone_weights(backbone: Backbone, path: str | os.PathLike | None = None) -> str:
    """Load pretrained weights into ``backbone`` from ``path``, else from the local cache; returns one line saying
    which (or that the backbone stays random), for the run log.

    Raises:
        CheckpointError: ``path`` (or the cached file) is missing, unreadable or does not fit the backbone.
    """
    source = Path(path) if path is not None else backbone.cached_weights()
    if source is None:
        return (f"backbone {backbone.name}: random initialisation (no --backbone_weights and no cached ImageNet "
                "weights); published numbers assume ImageNet-pretrained weights")
    backbone.load_pretrained(read_state_dict(source), str(source))
    return f"backbone {backbone.name}: weights from {source}" + ("" if path is not None else " (local cache)")


def _load_strict(module: nn.Module, state: dict[str, torch.Tensor], source: str, expected: str) -> None:
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"backbone weights {source} do not fit: {len(missing)} missing (e.g. {missing[:2]}), {len(unexpected)} "
            f"unexpected (e.g. {unexpected[:2]}), {len(wrong)} with other shapes (e.g. {wrong[:2]}); pass {expected}")
    module.load_state_dict(state)
