"""A run owns its directory: which run it is, which checkpoints it wrote, and where to resume.

``<run_dir>/run.json`` records the run's id, the trainer, a fingerprint of its settings and the
checkpoints it wrote, oldest first. The rules that follow from it:

- A new run (no ``resume``) starts only in a directory that holds no other run: a missing or
  empty directory, or one without any file a trainer writes. Otherwise it stops with one line
  saying how to continue the old run or where to start fresh.
- Pruning deletes only checkpoints listed in ``run.json``; files the run did not write (a stray
  ``step_999.pt``, anyone's notes) are never touched, and never chosen for a resume.
- ``resume`` finds the newest *valid* checkpoint of the run, skipping empty, truncated or corrupt
  files with a warning that names them.
- With the default, timestamped run directories, ``resume=auto`` continues the most recently
  updated run under the same parent folder whose settings fingerprint matches this command's
  (see :func:`find_matching_run`); when there is none it starts fresh.
- Temporary files of a checkpoint write that was killed are removed when the run starts again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from utils.errors import UserError
from utils.run.checkpoint import CheckpointError, CheckpointWriteError, remove_orphaned_temp_files, safe_load

log = logging.getLogger(__name__)

MANIFEST = "run.json"
# What a trainer may write into its run directory; a new run refuses a directory holding any of them.
RUN_FILES = ("run.json", "all_config.yaml", "plan.yaml", "metrics.jsonl", "tensorboard", "best.pt", "last.pt")


class RunDirError(UserError):
    """The run directory belongs to another run, is not writable, or lacks the room for checkpoints."""


def settings_fingerprint(settings: dict[str, Any], ignore: tuple[str, ...] = ()) -> str:
    """A short hash of ``settings`` (a JSON-able dict) without the keys in ``ignore``: equal settings, equal hash."""
    kept = {k: v for k, v in settings.items() if k not in ignore}
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _write_json(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _read_manifest(directory: Path) -> dict | None:
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunDirError(f"{path} is unreadable ({e}); it records which run owns {directory}: "
                          "restore it, or start fresh in another directory") from None
    if not isinstance(manifest, dict) or "run_id" not in manifest:
        raise RunDirError(f"{path} is not a run record; start fresh in another directory")
    return manifest


def _foreign_files(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir()
                  if p.name in RUN_FILES or (p.name.startswith("step_") and not p.name.startswith(".")))


@dataclass
class RunDirectory:
    """This run's directory and its record (see the module docstring for the rules).

    Only rank 0 creates one; other ranks of a torchrun job never write into the run directory.
    """

    path: Path
    manifest: dict = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.manifest["run_id"]

    @classmethod
    def claim(cls, path: str | os.PathLike, *, trainer: str, fingerprint: str, resuming: bool,
              resume_hint: str) -> "RunDirectory":
        """Start a new run in ``path``, or continue the run recorded there when ``resuming``.

        Args:
            trainer: ``"pretrain"`` or ``"cape"``; a directory of the other trainer is refused.
            fingerprint: :func:`settings_fingerprint` of this run's settings.
            resuming: whether the command asked to resume.
            resume_hint: how the user continues a run, e.g. ``"add resume=auto"``, for the refusal message.

        Raises:
            RunDirError: the directory holds another run (or files no run record claims) and
                ``resuming`` is false; or it is not writable.
        """
        path = Path(path)
        manifest = _read_manifest(path)
        if manifest is not None and manifest.get("trainer", trainer) != trainer:
            raise RunDirError(f"{path} holds a {manifest.get('trainer')} run, not a {trainer} run; choose another directory")
        if manifest is None:
            foreign = _foreign_files(path)
            if foreign and not resuming:
                raise RunDirError(f"{path} already holds files of another run ({', '.join(foreign[:4])}); "
                                  f"{resume_hint} to continue it, or choose a new directory")
            # Resuming a directory written before run records existed adopts its step checkpoints.
            adopted = [p.name for p in recorded_checkpoints(path)] if resuming else []
            manifest = {"run_id": uuid.uuid4().hex[:12], "trainer": trainer, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                        "fingerprint": fingerprint, "checkpoints": adopted, "best": None}
        elif not resuming:
            raise RunDirError(f"{path} already holds run {manifest['run_id']} (started {manifest.get('created', '?')}): "
                              f"{resume_hint} to continue it, or choose a new directory for a fresh run")
        elif manifest.get("fingerprint") != fingerprint:
            log.warning("resuming run %s with settings that differ from the ones it started with", manifest["run_id"])
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"cannot create run directory {path}: {e.strerror or e}; choose a writable location") from None
        removed = remove_orphaned_temp_files(path)
        if removed:
            log.info("removed %d temporary file(s) left by an interrupted checkpoint write: %s",
                     len(removed), ", ".join(p.name for p in removed))
        manifest["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        run = cls(path, manifest)
        run.save_manifest()
        return run

    def save_manifest(self) -> None:
        """Write ``run.json`` atomically (with the time of this update).

        Raises:
            RunDirError: the directory is not writable.
        """
        self.manifest["updated"] = time.time()
        try:
            _write_json(self.path / MANIFEST, self.manifest)
        except OSError as e:
            raise RunDirError(f"cannot write {self.path / MANIFEST}: {e.strerror or e}; "
                              "choose a writable run directory") from None

    def check_storage(self, checkpoint_bytes: int, copies: int = 2) -> None:
        """Fail early unless the directory is writable and has room for ``copies`` checkpoints.

        Raises:
            RunDirError: naming the directory, the free and the needed space.
        """
        probe = self.path / f".write-test-{os.getpid()}"
        try:
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as e:
            raise RunDirError(f"run directory {self.path} is not writable ({e.strerror or e}); "
                              "choose another checkpoint location") from None
        free = shutil.disk_usage(self.path).free
        need = copies * checkpoint_bytes
        if free < need:
            raise RunDirError(f"run directory {self.path} has {free / 2**20:.0f} MiB free, but {copies} checkpoints "
                              f"need about {need / 2**20:.0f} MiB; free some space or choose another location")

    # --- checkpoints this run wrote ---

    def checkpoints(self) -> list[Path]:
        """This run's step checkpoints that still exist, oldest first."""
        return [self.path / name for name in self.manifest["checkpoints"] if (self.path / name).is_file()]

    def claim_checkpoint(self, name: str) -> Path:
        """Record that this run is about to write checkpoint ``name`` and return its path.

        The record comes first: a run killed between the write and the record would otherwise leave a
        checkpoint it does not know as its own (and would refuse to overwrite it).

        Raises:
            CheckpointWriteError: a file of that name exists and this run did not write it.
        """
        path = self.path / name
        if path.exists() and name not in self.manifest["checkpoints"]:
            raise CheckpointWriteError(f"{path} exists and was not written by this run; move it away, then resume")
        self.manifest["checkpoints"] = [n for n in self.manifest["checkpoints"] if n != name] + [name]
        self.save_manifest()
        return path

    def claim_best(self, name: str = "best.pt") -> Path:
        """Record that this run is about to write its best-so-far checkpoint ``name`` (never pruned, never
        resumed from) and return its path.

        Raises:
            CheckpointWriteError: a file of that name exists and this run did not write it.
        """
        path = self.path / name
        if path.exists() and self.manifest.get("best") != name:
            raise CheckpointWriteError(f"{path} exists and was not written by this run; move it away, then resume")
        self.manifest["best"] = name
        self.save_manifest()
        return path

    def prune(self, keep_last: int) -> list[Path]:
        """Delete this run's step checkpoints beyond the newest ``keep_last`` (``keep_last <= 0`` keeps all) and
        return the deleted paths."""
        names = self.manifest["checkpoints"]
        doomed = names[:-keep_last] if keep_last > 0 else []
        self.manifest["checkpoints"] = names[len(doomed):]
        self.save_manifest()
        for name in doomed:
            (self.path / name).unlink(missing_ok=True)
        return [self.path / n for n in doomed]

    def newest_valid(self) -> tuple[Path, Any] | None:
        """The newest checkpoint of this run that loads, with its contents; None if none does.

        Files that fail to load are skipped with a warning naming them; files of the directory
        that the run did not write are never considered.
        """
        return newest_loadable(reversed(self.checkpoints()))


def recorded_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The step checkpoints of the run in ``directory``, oldest first, without writing anything: those its
    ``run.json`` lists, or for a directory without one (from before run records existed) its
    ``step_<N>.pt`` files in step order."""
    directory = Path(directory)
    manifest = _read_manifest(directory)
    if manifest is not None:
        return [directory / n for n in manifest.get("checkpoints", []) if (directory / n).is_file()]
    steps = [(int(m.group(1)), p) for p in directory.glob("step_*.pt") if (m := re.fullmatch(r"step_(\d+)\.pt", p.name))]
    return [p for _, p in sorted(steps)]


def newest_loadable(candidates) -> tuple[Path, Any] | None:
    """The first of ``candidates`` (paths, newest first) that :func:`safe_load` reads; warns for each one skipped."""
    for candidate in candidates:
        try:
            return candidate, safe_load(candidate)
        except CheckpointError as e:
            log.warning("skipping %s", e)
    return None


def find_matching_run(parent: Path, trainer: str, fingerprint: str) -> Path | None:
    """The most recently updated run directory directly under ``parent`` with this trainer and fingerprint
    and at least one checkpoint file; None if there is none. This is how ``resume=auto`` finds a run
    when run directories are named by their start time."""
    if not parent.is_dir():
        return None
    found = []
    for child in parent.iterdir():
        try:
            manifest = _read_manifest(child) if child.is_dir() else None
        except RunDirError:
            continue
        if manifest and manifest.get("trainer") == trainer and manifest.get("fingerprint") == fingerprint \
                and any((child / n).is_file() for n in manifest.get("checkpoints", [])):
            found.append((manifest.get("updated", 0), child))
    return max(found)[1] if found else None


def open_run(path: Path, *, trainer: str, fingerprint: str, resume: str | None,
             resume_hint: str) -> tuple[RunDirectory, Path | None]:
    """Claim the run directory ``path`` and find the checkpoint to resume from (None: start fresh).

    ``resume`` is None (a new run), ``"auto"`` (this run's newest valid checkpoint, or a fresh start when there
    is none), a run directory (its newest valid checkpoint) or a checkpoint file.

    Raises:
        CheckpointError: ``resume`` names something missing, or a directory without a valid checkpoint.
        RunDirError: see :meth:`RunDirectory.claim`.
    """
    explicit = Path(resume) if resume and resume != "auto" else None
    if explicit is not None and not explicit.exists():
        raise CheckpointError(f"resume {resume}: no such file or directory")
    run = RunDirectory.claim(path, trainer=trainer, fingerprint=fingerprint, resuming=bool(resume),
                             resume_hint=resume_hint)
    if explicit is not None and explicit.is_file():
        return run, explicit
    candidates = run.checkpoints() if explicit is None or explicit.resolve() == run.path.resolve() \
        else recorded_checkpoints(explicit)
    found = newest_loadable(reversed(candidates))
    if found is None and explicit is not None:
        raise CheckpointError(f"resume {resume}: no valid step_<N>.pt checkpoint in {explicit}")
    return run, None if found is None else found[0]
