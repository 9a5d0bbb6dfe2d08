"""Atomic checkpoint writes and safe loads.

A checkpoint is written to a temporary file in the same directory, fsynced, then renamed
over the target, so a crash or a full disk never leaves a half-written file under the
final name. Loads use ``torch.load(weights_only=True)``: a checkpoint is data, and one
that needs arbitrary pickled code to load is refused.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or is missing, corrupt, unsafe or incompatible."""


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` ``obj`` to ``path`` atomically (temp file, fsync, rename).

    Raises:
        CheckpointError: the write failed (e.g. disk full); any previous file at ``path`` is intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
        raise CheckpointError(f"could not write checkpoint {path}: {e}; the previous checkpoint is untouched") from e
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


def safe_load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """Load a checkpoint with ``weights_only=True``.

    Raises:
        CheckpointError: the file is missing, truncated/corrupt, or needs arbitrary code to unpickle.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"refusing to load {path}: it needs arbitrary Python code to unpickle ({str(e).splitlines()[0]}). "
            "Checkpoints must be plain tensors and containers; re-save it with a state_dict only"
        ) from e
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({str(e).splitlines()[0]}); delete it or pick another") from e


_STEP_RE = re.compile(r"^step_(\d+)\.pt$")


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoints named ``step_<N>.pt`` in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def prune_checkpoints(directory: str | os.PathLike, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` ``step_<N>.pt`` files (keep_last <= 0 keeps all)."""
    if keep_last <= 0:
        return
    for old in list_checkpoints(directory)[:-keep_last]:
        old.unlink(missing_ok=True)


def newest_valid_checkpoint(directory: str | os.PathLike) -> tuple[Path, Any] | None:
    """The newest ``step_<N>.pt`` in ``directory`` that loads cleanly, and its contents; None if there is none."""
    for candidate in reversed(list_checkpoints(directory)):
        try:
            return candidate, safe_load(candidate)
        except CheckpointError:
            continue
    return None


def capture_rng_state() -> dict[str, Any]:
    """Every RNG that affects a run (python, numpy, torch CPU and CUDA), as tensors and ints.

    Plain tensors and ints keep the checkpoint loadable with ``weights_only=True``.
    """
    import random

    import numpy as np

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
    import random

    import numpy as np

    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
