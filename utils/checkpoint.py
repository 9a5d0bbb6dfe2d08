"""Checkpoint errors and safe loads.

Loads use ``torch.load(weights_only=True)``: a checkpoint is data, and one that needs arbitrary pickled
code to load is refused. Writing is the checkpointer's job (utils/run/checkpointer.py). This module is on the
floor because models, the Hub and evaluation read checkpoints too.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

from utils.errors import RunFailure, UserError


class CheckpointError(UserError):
    """A checkpoint to read is missing, empty, corrupt, unsafe or does not fit the run."""


class CheckpointWriteError(RunFailure):
    """A checkpoint could not be written (full disk, read-only or vanished directory)."""


def payload_bytes(obj: Any) -> int:
    """Bytes of tensor data in a nested dict/list/tuple (what a checkpoint of ``obj`` needs on disk, about)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 64


def check_checkpoint_file(path: str | os.PathLike) -> Path:
    """``path`` as a Path, after the checks that need no unpickling: a file that exists, is not empty and starts
    as ``torch.save`` writes (a zip archive, or long ago a raw pickle). Cheap, so commands run it before any work.

    Raises:
        CheckpointError: a directory, a missing or empty file, or one in another format.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory; pass a checkpoint file in it (e.g. step_<N>.pt)")
    if not path.is_file():
        steps = sorted(path.parent.glob("step_*.pt"), key=lambda p: int(p.stem[5:]) if p.stem[5:].isdigit() else -1)
        beside = (f"; {path.parent} holds {steps[-1].name}, its newest checkpoint (a run stopped before its first "
                  "evaluation writes no best.pt): pass that" if steps and path.parent.is_dir() else "")
        raise CheckpointError(f"checkpoint {path} does not exist{beside}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes; a write was cut off); delete it or pick another")
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic != b"PK" and magic[:1] != b"\x80":
        raise CheckpointError(f"{path} is not a PyTorch checkpoint (neither a zip archive nor a pickle); pick another file")
    return path


def safe_load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """Load a checkpoint with ``weights_only=True``.

    Raises:
        CheckpointError: the file is missing or empty, truncated/corrupt, or needs arbitrary code to unpickle.
    """
    path = check_checkpoint_file(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        detail = str(e)
        if "WeightsUnpickler error:" in detail:  # the useful part of torch's long explanation
            detail = detail.split("WeightsUnpickler error:", 1)[1]
        detail = detail.strip().split(". ")[0].splitlines()[0]
        raise CheckpointError(f"refusing to load {path}: it needs arbitrary Python code to unpickle ({detail}). "
                              "Checkpoints must be plain tensors and containers; re-save it with a state_dict only") from None
    except Exception as e:  # torch.load reports damage as many types (RuntimeError, EOFError, IndexError, ...)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({first}); delete it or pick another") from None
