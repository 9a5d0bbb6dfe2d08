"""The papers' CAPE training recipes as plain data: ``--recipe capeformer | pose_anything | pose_anything_s``.

Each :class:`Recipe` maps trainer flags (names without the leading ``--``) to the reference config's values;
flags given on the command line win. Sources (every split's config differs only in its annotation files, and
every 5-shot config only in ``num_shots``; checked by diffing them):

- ``capeformer``: ``flyinglynx/CapeFormer`` ``configs/mp100/capeformer/1shots/two_stage_split{1..5}_config.py``
  and ``5shots/two_stage_split{1..5}_5shot_config.py``; one GPU (README: "Training CAPEFormer on 1-shot setting
  only need one GPU").
- ``pose_anything``: ``orhir/PoseAnything`` ``configs/1shots/graph_split{1..5}_config.py`` (SwinV2-T; 5-shot:
  ``configs/5shots/``).
- ``pose_anything_s``: ``orhir/PoseAnything`` ``configs/1shot-swin/graph_split{1..5}_config.py`` (SwinV2-S;
  5-shot: ``configs/5shot-swin/``).

Shared by all three (mmcv 1.x runner semantics): ``Adam`` at lr 1e-5 with no weight decay and no gradient
clipping (``grad_clip=None``); ``lr_config`` ``policy="step", step=[160, 180]`` (lr x 0.1, mmcv's default gamma,
from 0-based epoch 160 and again from 180), ``warmup="linear", warmup_iters=1000, warmup_ratio=0.001`` (iteration i <
1000 uses lr * (1 - (1 - i / 1000) * (1 - 0.001))); 200 epochs; 256 x 256 crops; fp32 (no fp16 config). A
training sample is one query with its own K supports, so a batch of 16 samples is 16 episodes of one query
(``batch_size`` 16, ``queries`` 1; the hardware profile splits the batch into micro-batches where memory is
short; Adam's betas and eps are torch's defaults, as mmcv's).
Augmentation (``TopDownGetRandomScaleRotation``, mmpose 0.x): scale factor clip(1 + 0.15 n, 0.85, 1.15) and,
with probability 0.6, rotation clip(15 n, -30, 30) degrees, n ~ N(0, 1); no flips and no colour jitter.
An epoch (``TransformerPoseDataset.random_paired_samples``) draws, for every training category, as many
queries as the largest category has instances (:func:`reference_epoch_queries`). Validation: 100 episodes per
category, test: 200, 15 queries each; CapeFormer validates every 50 epochs, Pose Anything every 25.

The other model settings (widths, dropout, heatmap sigma) are the defaults of
:class:`~models.cape.capeformer.CapeFormerConfig` / :class:`~models.cape.pose_anything.PoseAnythingConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from models.cape.backbone import CapeModelError

_SHARED = {
    "image_size": 256, "shots": 1, "queries": 1, "epochs": 200,
    "optimizer": "adam", "lr": 1e-5, "weight_decay": 0.0, "clip_max_norm": 0.0,
    "lr_schedule": "step", "lr_steps": (160, 180), "lr_gamma": 0.1,
    "lr_warmup_steps": 1000, "lr_warmup_ratio": 0.001,
    "heatmap_weight": 2.0, "use_amp": False,
    "aug_scale": 0.15, "aug_rotation": 15.0, "aug_rotation_prob": 0.6, "aug_colour": 0.0,
    "eval_queries": 15, "val_episodes_per_category": 100, "test_episodes_per_category": 200,
    "episodes_per_epoch": 0,  # the reference's epoch (reference_epoch_queries), computed from the training split
}


@dataclass(frozen=True)
class Recipe:
    """One paper recipe. ``flags``: trainer flag -> value (read-only); ``published_pck``: the paper's mean
    PCK@0.2 over the five MP-100 splits, (1-shot, 5-shot); ``backbone_weights``: what the paper started from."""

    name: str
    source: str
    flags: Mapping[str, object]
    published_pck: tuple[float, float]
    backbone_weights: str


RECIPES: dict[str, Recipe] = {
    "capeformer": Recipe(
        name="capeformer",
        source="flyinglynx/CapeFormer configs/mp100/capeformer/{1shots,5shots}/two_stage_split*_config.py",
        flags=MappingProxyType({**_SHARED, "model": "capeformer", "backbone": "resnet50", "batch_size": 16,
                                "val_interval": 50}),
        published_pck=(85.3, 89.3),
        backbone_weights="torchvision ImageNet ResNet-50 (pretrained='torchvision://resnet50', IMAGENET1K_V1)",
    ),
    "pose_anything": Recipe(
        name="pose_anything",
        source="orhir/PoseAnything configs/{1shots,5shots}/graph_split*_config.py",
        flags=MappingProxyType({**_SHARED, "model": "pose_anything", "backbone": "swinv2_tiny_window16_256",
                                "drop_path_rate": 0.2, "batch_size": 16, "val_interval": 25}),
        published_pck=(87.2, 91.2),
        backbone_weights="Microsoft SwinV2-T ImageNet-1k swinv2_tiny_patch4_window16_256.pth "
                         "(= timm swinv2_tiny_window16_256.ms_in1k)",
    ),
    "pose_anything_s": Recipe(
        name="pose_anything_s",
        source="orhir/PoseAnything configs/{1shot-swin,5shot-swin}/graph_split*_config.py",
        flags=MappingProxyType({**_SHARED, "model": "pose_anything", "backbone": "swinv2_small_window16_256",
                                "drop_path_rate": 0.3, "batch_size": 8, "val_interval": 25}),
        published_pck=(90.7, 92.8),
        backbone_weights="SimMIM-pretrained SwinV2-S swinv2_small_1k_500k.pth (Microsoft Swin MODELHUB); "
                         "timm's swinv2_small_window16_256.ms_in1k is supervised ImageNet-1k, not the same start",
    ),
}


def reference_epoch_queries(instances_per_category: Mapping[int, int]) -> int:
    """Query samples in one reference training epoch: every category contributes as many as the largest
    category has instances (``random_paired_samples`` balances the classes).

    Args:
        instances_per_category: category id -> number of usable training instances.

    Raises:
        CapeModelError: no categories.
    """
    if not instances_per_category:
        raise CapeModelError("reference_epoch_queries needs at least one training category")
    return len(instances_per_category) * max(instances_per_category.values())


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``.

    Raises:
        CapeModelError: an unknown name (the message lists the known ones).
    """
    if name not in RECIPES:
        raise CapeModelError(f"--recipe {name!r} is not one of {sorted(RECIPES)}")
    return RECIPES[name]
