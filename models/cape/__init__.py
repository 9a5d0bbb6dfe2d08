"""Category-agnostic pose estimation (CAPE): a CapeFormer-style model, its ResNet backbone and losses."""

from models.cape.backbone import ResNet, load_backbone_weights
from models.cape.losses import cape_loss, supervised_mask
from models.cape.model import CapeConfig, CapeModel

__all__ = ["CapeConfig", "CapeModel", "ResNet", "cape_loss", "load_backbone_weights", "supervised_mask"]
