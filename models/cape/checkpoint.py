"""The CAPE model a checkpoint of models/train_cape_episodic.py holds: its ``architecture`` record and weights.

A checkpoint (``best.pt``, ``step_<N>.pt``) is a dict with at least ``model`` (the state dict) and
``architecture`` (:func:`model_record`: the model's name and its whole config), so the network can be rebuilt
without the run's settings: by ``--eval_only`` and by ``scripts/predict_pose.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from models.cape import build_model
from utils.checkpoint import CheckpointError, safe_load


def model_record(name: str, model) -> dict:
    """The ``architecture`` record of ``model`` built as ``--model name``: ``{"model": name, **model.cfg}``."""
    return {"model": name, **dataclasses.asdict(model.cfg)}


def build_from_record(record: dict):
    """The model and loss a checkpoint's ``architecture`` describes (randomly initialised)."""
    settings = dict(record)
    return build_model(settings.pop("model"), **settings)


def load_trained(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[torch.nn.Module, dict]:
    """The trained model a CAPE checkpoint holds, in eval mode, and its ``architecture`` record.

    Raises:
        CheckpointError: the file is missing, corrupt or unsafe (``safe_load``), was not written by the CAPE
            trainer, or its weights do not fit its own architecture record.
        CapeModelError: the record names an unknown model or setting.
    """
    payload = safe_load(path, map_location=map_location)
    if isinstance(payload, dict) and payload.get("trainer") == "pretrain":
        raise CheckpointError(f"{path} is an HRM/TRM checkpoint of pretrain.py, not a CAPE one; give a checkpoint of "
                              "models.train_cape_episodic (use solve.py or evaluate.py with this one)")
    if not isinstance(payload, dict) or "model" not in payload or "model" not in (payload.get("architecture") or {}):
        raise CheckpointError(f"{path} was not written by models.train_cape_episodic (no architecture record)")
    model, _ = build_from_record(payload["architecture"])
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:
        raise CheckpointError(f"{path}: the weights do not fit its architecture record "
                              f"({str(e).splitlines()[0]}); the file is damaged or was edited") from None
    return model.eval(), payload["architecture"]
