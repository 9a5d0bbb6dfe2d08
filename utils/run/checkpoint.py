"""Atomic checkpoint writes, safe loads, and the RNG state a bitwise resume needs.

A checkpoint is written to a temporary file in the same directory (``.<name>.<random>.tmp``),
fsynced, then renamed over the target, so a crash, a ``kill -9`` or a full disk never leaves a
half-written file under the final name; :func:`remove_orphaned_temp_files` clears what a killed
write left behind. Loads use ``torch.load(weights_only=True)``: a checkpoint is data, and one that
needs arbitrary pickled code to load is refused.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from utils.errors import RunFailure, UserError

_TEMP_RE = re.compile(r"^\..+\.[A-Za-z0-9_]{6,}\.tmp$")


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


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` ``obj`` to ``path`` atomically (temp file, fsync, rename).

    Raises:
        CheckpointWriteError: the write failed; the message names the path, the error and the
            bytes the checkpoint needs. Any previous file at ``path`` is intact and no temporary
            file is left.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise CheckpointWriteError(_write_failure(path, obj, e)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise CheckpointWriteError(_write_failure(path, obj, e)) from None
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


def _write_failure(path: Path, obj: Any, error: BaseException) -> str:
    reason = getattr(error, "strerror", None) or (str(error).splitlines() or [type(error).__name__])[0]
    return (f"could not write checkpoint {path} ({reason}); it needs about {payload_bytes(obj) / 2**20:.1f} MiB. "
            "The previous checkpoint is intact: free some space or choose another checkpoint_path, then resume")


def remove_orphaned_temp_files(directory: str | os.PathLike) -> list[Path]:
    """Delete the ``.<name>.<random>.tmp`` files that :func:`atomic_save` leaves when a write is killed.

    Only call it on a directory this run owns: the pattern is :func:`atomic_save`'s own.
    Returns the removed paths.
    """
    removed = []
    directory = Path(directory)
    if directory.is_dir():
        for p in directory.iterdir():
            if p.is_file() and _TEMP_RE.match(p.name):
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def safe_load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """Load a checkpoint with ``weights_only=True``.

    Raises:
        CheckpointError: the file is missing or empty, truncated/corrupt, or needs arbitrary code to unpickle.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory; pass a checkpoint file in it (e.g. step_<N>.pt)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes; a write was cut off); delete it or pick another")
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic != b"PK" and magic[:1] != b"\x80":  # torch.save writes a zip archive (or, long ago, a raw pickle)
        raise CheckpointError(f"{path} is not a PyTorch checkpoint (neither a zip archive nor a pickle); pick another file")
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


def capture_rng_state() -> dict[str, Any]:
    """Every RNG that affects a run (python, numpy, torch CPU and CUDA), as tensors and ints.

    Plain tensors and ints keep the checkpoint loadable with ``weights_only=True``.
    """
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
        "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Undo :func:`capture_rng_state`: put every RNG back where it was."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
