"""The architecture registry for the recursive reasoning models: ``arch.name`` -> model class.

``hrm_v1`` is HRM (models/hrm/hrm_act_v1.py) and ``trm`` is TRM (models/trm/trm_act_v1.py). The
reference repositories' own names (``hrm.hrm_act_v1@HierarchicalReasoningModel_ACTV1``,
``recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1``) are accepted too, so their
``all_config.yaml`` files load. Each model class names its config dataclass (``config_class``),
whose fields are the reference's ``arch.*`` keys; the dataset-dependent ones are filled in here.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

# utils before torch: `python -m models.train_cape_episodic` enters here, and the MPS fallback and OpenMP's wait
# (utils/__init__.py) must be set before torch loads
import utils  # noqa: F401
import torch
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from models.losses import LOSSES, ACTLossHead
from utils.config import ConfigError

ARCHITECTURES = {
    "hrm_v1": "models.hrm.hrm_act_v1:HierarchicalReasoningModel_ACTV1",
    "trm": "models.trm.trm_act_v1:TinyRecursiveReasoningModel_ACTV1",
}
REFERENCE_NAMES = {
    "hrm.hrm_act_v1@HierarchicalReasoningModel_ACTV1": "hrm_v1",
    "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1": "trm",
}
# Filled from the dataset and the run, never set in arch.*.
DATASET_KEYS = ("batch_size", "seq_len", "vocab_size", "num_puzzle_identifiers", "forward_dtype", "causal")


def arch_name(name: str) -> str:
    """The registry name for ``name`` (a registry name or a reference class path).

    Raises:
        ConfigError: an unknown name, listing the known ones.
    """
    name = REFERENCE_NAMES.get(name, name)
    if name not in ARCHITECTURES:
        raise ConfigError(f"arch.name={name!r} is not a known architecture: use one of {', '.join(ARCHITECTURES)}")
    return name


def arch_class(name: str) -> type[torch.nn.Module]:
    """The model class registered as ``name``."""
    module, cls = ARCHITECTURES[arch_name(name)].split(":")
    return getattr(importlib.import_module(module), cls)


def validate_arch(arch: dict[str, Any]) -> dict[str, Any]:
    """Check ``arch`` (name, loss and the architecture's own keys) and return it with the registry name.

    Raises:
        ConfigError: an unknown architecture, an unknown or dataset-filled key, a value of the wrong type,
            or values the model cannot be built with (e.g. a hidden size not divisible by the heads).
    """
    arch = dict(arch)
    name = arch_name(arch.pop("name"))
    loss = arch.pop("loss", {"loss_type": "stablemax_cross_entropy"})
    loss_type = loss.get("loss_type") if isinstance(loss, dict) else None
    if loss_type not in LOSSES:
        raise ConfigError(f"arch.loss.loss_type={loss_type!r}: use one of {', '.join(LOSSES)}")
    config_class = arch_class(name).config_class
    settable = [f.name for f in dataclasses.fields(config_class) if f.name not in DATASET_KEYS]
    for key in arch:
        if key not in settable:
            reason = "is filled from the dataset" if key in DATASET_KEYS else "is not a key of this architecture"
            raise ConfigError(f"arch.{key} {reason}; {name} keys: {', '.join(settable)}")
    try:
        typed = OmegaConf.merge(OmegaConf.structured(config_class), arch)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        kind = "unknown" if isinstance(e, ConfigKeyError) else "bad value for"
        raise ConfigError(f"arch: {kind} {key!r}: {str(e).splitlines()[0]}") from None
    values = {k: typed[k] for k in arch}
    _build_config(config_class, values)
    return {"name": name, "loss": {"loss_type": loss_type}, **values}


def is_grid(arch: dict[str, Any]) -> bool:
    """Whether ``arch`` (as :func:`validate_arch` returns it) is a size-agnostic grid model (TRM's ``token_mixer``
    conv or conv_attention, or 2D relative positions): its weights take square puzzles of any side.

    Raises:
        ConfigError: as :func:`validate_arch`.
    """
    config_class = arch_class(arch["name"]).config_class
    return _build_config(config_class, {k: v for k, v in arch.items() if k not in ("name", "loss")}).grid


def _dataset_fields(batch_size: int = 1, seq_len: int = 1, vocab_size: int = 2, num_puzzle_identifiers: int = 1,
                    forward_dtype: str = "float32") -> dict[str, Any]:
    return dict(batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size,
                num_puzzle_identifiers=num_puzzle_identifiers, forward_dtype=forward_dtype)


def _build_config(config_class, values: dict[str, Any], **dataset: Any):
    fields = {f.name for f in dataclasses.fields(config_class)}
    try:
        return config_class.from_dict({**{k: v for k, v in _dataset_fields(**dataset).items() if k in fields}, **values})
    except ValueError as e:
        raise ConfigError(f"arch: {e}") from None


def build_model(arch: dict[str, Any], *, batch_size: int, seq_len: int, vocab_size: int, num_puzzle_identifiers: int,
                dtype: torch.dtype, device: torch.device | str) -> ACTLossHead:
    """The architecture of ``arch`` (as :func:`validate_arch` returns it) in its ACT loss head, on ``device``.

    The model is created directly on ``device`` (the sparse embedding's gradient buffer must be a leaf
    there); ``device="meta"`` builds it without memory, to count parameters before a run.
    """
    values = {k: v for k, v in arch.items() if k not in ("name", "loss")}
    cls = arch_class(arch["name"])
    config = _build_config(cls.config_class, values, batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size,
                           num_puzzle_identifiers=num_puzzle_identifiers,
                           forward_dtype=str(dtype).removeprefix("torch."))
    with torch.device(device):
        model = cls(dataclasses.asdict(config))
    return ACTLossHead(model, loss_type=arch["loss"]["loss_type"])


def model_bytes(head: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers of ``head`` (works on the meta device)."""
    tensors = list(head.parameters()) + list(head.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)
