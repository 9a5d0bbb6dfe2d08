"""Category-agnostic pose estimation (CAPE) models: ``--model capeformer | pose_anything | capeformer_lite``.

    model, loss_fn = build_model("capeformer", backbone="resnet18")   # keyword overrides of the config
    out = model(support_image, support_keypoints, support_visible, query_image, keypoint_mask, adjacency)
    loss, parts = loss_fn(out, batch, heatmap_weight=2.0)

- ``capeformer``: CapeFormer (Shi et al., CVPR 2023) as the reference MP-100 configs build it
  (:mod:`models.cape.capeformer`).
- ``pose_anything``: Pose Anything (Hirschorn and Avidan, ECCV 2024), CapeFormer with a skeleton-graph decoder
  and a SwinV2 backbone (:mod:`models.cape.pose_anything`); needs ``adjacency``.
- ``capeformer_lite``: the same CapeFormer network sized for a CPU quickstart (ResNet-18 at stride 16, width
  128, FFN 512), for 128 px crops: 8 x 8 matching maps, as the full model has at 256 px. Not a paper model.
"""

from __future__ import annotations

from dataclasses import fields
from functools import partial
from typing import Callable

import torch

from models.cape.backbone import BACKBONES, CapeModelError, build_backbone, init_backbone_weights
from models.cape.capeformer import CapeFormer, CapeFormerConfig
from models.cape.losses import capeformer_loss
from models.cape.pose_anything import PoseAnything, PoseAnythingConfig

LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

_LITE = dict(backbone="resnet18", backbone_stride=16, image_size=128, hidden_dim=128, num_heads=4, ffn_dim=512,
             similarity_proj_dim=128, dynamic_proj_dim=64)
_MODELS = {
    "capeformer": (CapeFormer, CapeFormerConfig, {}),
    "pose_anything": (PoseAnything, PoseAnythingConfig, {}),
    "capeformer_lite": (CapeFormer, CapeFormerConfig, _LITE),
}
MODELS = tuple(_MODELS)


def model_config(name: str, **overrides) -> CapeFormerConfig:
    """The configuration of model ``name`` (one of :data:`MODELS`) with keyword ``overrides``.

    Raises:
        CapeModelError: an unknown model name or config key, or an invalid value.
    """
    if name not in _MODELS:
        raise CapeModelError(f"--model {name!r} is not one of {MODELS}")
    _, config, preset = _MODELS[name]
    known = {f.name for f in fields(config)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise CapeModelError(f"{name} has no setting {unknown}; its settings are {sorted(known)}")
    return config(**{**preset, **overrides})


def build_model(name: str, **overrides) -> tuple[CapeFormer, LossFn]:
    """Model ``name`` (randomly initialised; load backbone weights with :func:`init_backbone_weights`) and its
    loss, ``loss_fn(outputs, batch, heatmap_weight=2.0) -> (loss, parts)`` (:func:`capeformer_loss` with the
    model's heatmap sigma). The model's configuration is ``model.cfg``.

    Raises:
        CapeModelError: see :func:`model_config`.
    """
    cfg = model_config(name, **overrides)
    return _MODELS[name][0](cfg), partial(capeformer_loss, heatmap_sigma=cfg.heatmap_sigma)


__all__ = ["BACKBONES", "MODELS", "CapeFormer", "CapeFormerConfig", "CapeModelError", "PoseAnything",
           "PoseAnythingConfig",
           "build_backbone", "build_model", "capeformer_loss", "init_backbone_weights", "model_config"]
