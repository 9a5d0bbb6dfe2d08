"""The one checkpointer both trainers use: it saves and restores a :class:`~utils.run.train_state.TrainState`
inside the run directory, crash-consistent by construction.

Writing ``step_<N>.pt`` is this sequence; a crash (``kill -9``, power loss) after any prefix of it leaves a
directory that resumes from its newest complete checkpoint and touches nothing it did not write:

1. **record**: ``run.json`` gets ``pending: {name, tmp}``, the temporary file's name, *before* it exists
   (``.<name>.<run id>.<random>.tmp``; ``run.json`` itself is replaced through ``.run.json.<run id>.tmp``);
2. **write** the temporary file and fsync it;
3. **rename** it to ``step_<N>.pt`` (atomic) and fsync the directory;
4. **commit**: ``run.json`` lists the new checkpoint, drops ``pending``, and moves the checkpoints beyond
   ``keep_last_checkpoints`` to ``deleting``;
5. **prune**: those files are deleted.

On the next start (utils/run/run_dir.py) a ``pending`` file that exists was renamed into place whole and is
adopted; the recorded temporary files and the ``deleting`` names are removed with the next record. Nothing
else in the directory is ever deleted. ``best.pt`` is written by the same steps and never pruned.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from utils.distributed import Dist, main_decides
from utils.checkpoint import CheckpointError, CheckpointWriteError, payload_bytes, safe_load
from utils.run.run_dir import RunDirectory, free_bytes
from utils.run.train_state import TrainState

log = logging.getLogger(__name__)


class Best:
    """The best value so far of a headline metric (higher is better), a part of the train state.

    Args:
        metric: its name in the evaluation results, e.g. ``"exact_accuracy"`` or ``"PCK@0.2"``.
    """

    def __init__(self, metric: str):
        self.metric, self.value, self.step = metric, None, None

    def improved(self, value: float, step: int) -> bool:
        """Whether ``value`` beats the best so far (then it becomes the best)."""
        if self.value is not None and not value > self.value:
            return False
        self.value, self.step = float(value), step
        return True

    def update(self, value: Optional[float], step: int, rank: Dist) -> bool:
        """:meth:`improved` on rank 0, which alone evaluates (``value`` is ignored elsewhere); every rank gets its
        verdict and the best so far, so all take the same branch to the ``best.pt`` write."""
        verdict = rank.is_main and value is not None and self.improved(value, step)
        verdict, state = main_decides((verdict, self.state_dict()), rank)
        self.load_state_dict(state)
        return verdict

    def state_dict(self) -> dict:
        return {"metric": self.metric, "value": self.value, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.step = state["value"], state["step"]


def describe_mismatch(saved: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """``key: saved X, now Y`` for every top-level key whose values differ, in ``ours``'s key order."""
    return [f"{k}: saved {saved.get(k)!r}, now {ours.get(k)!r}" for k in dict.fromkeys([*ours, *saved])
            if saved.get(k) != ours.get(k)]


class Checkpointer:
    """Saves the train state as ``step_<N>.pt`` (and ``best.pt``) in a run directory and restores it.

    Args:
        run: the run directory (rank 0), None on the other ranks of a torchrun job.
        rank: this process.
        keep_last: step checkpoints kept (``<= 0`` keeps all).
        identity: what a resumed checkpoint must match: ``trainer`` (``"pretrain"`` or ``"cape"``),
            ``architecture`` (a dict) and ``settings`` (the fingerprinted settings, compared for a warning).
        export: extra entries written beside the state (reference-format weights, the settings), called on
            rank 0 at each save.
    """

    def __init__(self, run: Optional[RunDirectory], rank: Dist, keep_last: int, identity: dict[str, Any],
                 export: Callable[[], dict[str, Any]]):
        self.run, self.rank, self.keep_last = run, rank, keep_last
        self.identity, self.export = identity, export

    # ---- saving ----

    def save(self, state: TrainState) -> Optional[Path]:
        """Write ``step_<state.step>.pt`` (see the module docstring) and prune; every rank calls it.

        Returns:
            the path on rank 0, None elsewhere.

        Raises:
            CheckpointWriteError: the write failed; the message names the path and the bytes (the run session adds
                how to resume).
        """
        return self._save(state, f"step_{state.step}.pt", best=False)

    def save_best(self, state: TrainState, best: Best) -> Optional[Path]:
        """Write ``best.pt`` (the same state; never pruned, never resumed from) and record its metric in
        ``run.json``; every rank calls it."""
        if self.run is not None:
            self.run.manifest["best_metric"] = best.state_dict()
        return self._save(state, "best.pt", best=True)

    def _save(self, state: TrainState, name: str, best: bool) -> Optional[Path]:
        payload = state.state_dict()
        path = None
        if self.rank.is_main:
            path = self._write(name, {**payload, **self.export(), "trainer": self.identity["trainer"],
                                      "architecture": self.identity["architecture"],
                                      "settings": self.identity["settings"], "run_id": self.run.run_id}, best)
            log.info("checkpoint: %s", path)
        if self.rank.world_size > 1:
            dist.barrier()  # the others may read it next (best.pt before the test)
        return path

    def _write(self, name: str, payload: dict, best: bool) -> Path:
        run = self.run
        target = run.path / name
        ours = name == run.manifest.get("best") if best else name in run.manifest["checkpoints"]
        if target.exists() and not ours:
            raise CheckpointWriteError(f"{target} exists and was not written by this run; move it away")
        tmp = run.path / f".{name}.{run.run_id}.{uuid.uuid4().hex[:8]}.tmp"
        run.manifest["pending"] = {"name": name, "tmp": tmp.name, **({"best": True} if best else {})}
        run.write_manifest()                                    # 1. record
        _write_file(tmp, payload, target)                       # 2. write
        try:
            os.replace(tmp, target)                             # 3. rename
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise CheckpointWriteError(f"could not rename {tmp.name} to {target} ({e.strerror or e}); the previous "
                                       "checkpoint is intact") from None
        _fsync_directory(run.path)
        del run.manifest["pending"]
        doomed = []
        if best:
            run.manifest["best"] = name
        else:
            names = [n for n in run.manifest["checkpoints"] if n != name] + [name]
            doomed = names[:-self.keep_last] if self.keep_last > 0 else []
            run.manifest["checkpoints"] = names[len(doomed):]
            run.manifest["deleting"] = doomed
        run.write_manifest()                                    # 4. commit
        for old in doomed:                                      # 5. prune
            (run.path / old).unlink(missing_ok=True)
        run.manifest.pop("deleting", None)
        return target

    # ---- restoring ----

    def restore(self, state: TrainState, path: Path) -> dict[str, Any]:
        """Load ``path`` into ``state`` (every rank reads the file) after checking it belongs to this kind of run.
        Returns the whole checkpoint.

        The file is read into host memory and each part puts its values on its own device (the optimizers on their
        parameters', the ACT carry on the run's): a checkpoint written on a GPU resumes anywhere, and the parts
        that are host data (NumPy's RNG state) never see a GPU tensor.

        Raises:
            CheckpointError: unreadable or unsafe, written by the other trainer, for another architecture
                (named first by importance: trainer, architecture, then missing parts), or lacking resume state.
        """
        payload = safe_load(path)
        if not isinstance(payload, dict):
            raise CheckpointError(f"{path} holds a {type(payload).__name__}, not a checkpoint of this project")
        trainer = self.identity["trainer"]
        if payload.get("trainer") != trainer:
            written = f"the {payload['trainer']} trainer" if "trainer" in payload else "an older version or another tool"
            raise CheckpointError(f"{path} was written by {written}, not by this {trainer} trainer; resume from a "
                                  "checkpoint of this trainer (start from its weights with load_checkpoint= instead)")
        differences = describe_mismatch(payload.get("architecture") or {}, self.identity["architecture"])
        if differences:
            raise CheckpointError(f"{path} holds another architecture ({'; '.join(differences[:3])}); resume with "
                                  "the settings it was trained with (its all_config.yaml / plan.yaml)")
        changed = describe_mismatch(payload.get("settings") or {}, self.identity["settings"])
        try:
            state.load_state_dict(payload, str(path))
        except CheckpointError as e:
            raise CheckpointError(f"{e}; settings that differ: {'; '.join(changed[:3])}" if changed else str(e)) from None
        if changed and self.rank.is_main:
            log.warning("resuming %s with settings that differ from the ones it was saved with: %s", path,
                        "; ".join(changed[:5]))
        return payload


def _write_file(tmp: Path, payload: dict, target: Path) -> None:
    """``torch.save`` to ``tmp`` and fsync; on failure remove ``tmp`` and raise naming ``target`` and the bytes.

    Raises:
        CheckpointWriteError: the write failed (a ``KeyboardInterrupt`` is re-raised as it is, after cleanup).
    """
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        reason = getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0]
        raise CheckpointWriteError(f"could not write checkpoint {target} ({reason}); it needs about "
                                   f"{payload_bytes(payload) / 2**20:.1f} MiB, {free_bytes(target.parent) / 2**20:.0f} "
                                   "MiB are free. The previous checkpoint is intact: free some space or choose another "
                                   "location") from None


def _fsync_directory(path: Path) -> None:
    """Make a rename in ``path`` durable (where the OS allows opening a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
