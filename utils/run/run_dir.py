"""A run owns its directory: which run it is, which files it wrote, who is using it, where to resume.

``<run_dir>/run.json`` records the run's id, the trainer, a fingerprint of its settings, the checkpoints it
wrote (oldest first), its best checkpoint, and the write in progress. The rules that follow from it:

- **One process at a time.** ``run.lock`` is held with ``flock`` while a process uses the directory; a
  second process is refused in one line naming the holder's process id. The kernel drops the lock of a
  killed process, so a ``kill -9`` never blocks the next start.
- **A new run** (no ``resume``) starts only in a directory that holds no other run. Opening writes nothing
  but the lock: ``run.json`` is first written by the first checkpoint, so a refused resume never rewrites
  another run's record, and a run that fails before its first checkpoint removes what it created
  (:meth:`RunDirectory.abandon`): the corrected command then runs.
- **Only recorded files are touched.** Pruning deletes only checkpoints listed in ``run.json``, and the only
  temporary files ever removed are those whose names the run recorded before creating them
  (utils/run/checkpointer.py): a stray ``step_999.pt`` or a user's ``.notes.backup1.tmp`` survives.
- ``resume`` finds the newest *valid* checkpoint of the run, skipping empty, truncated or corrupt files with
  a warning that names them. With the default, timestamped run directories, ``resume=auto`` continues the
  most recently updated run under the same parent folder whose settings fingerprint matches this command's
  (see :func:`find_matching_run`); when there is none it starts fresh.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from utils.errors import UserError
from utils.checkpoint import CheckpointError, CheckpointWriteError, safe_load

log = logging.getLogger(__name__)

MANIFEST = "run.json"
PLAN = "plan.yaml"  # every setting and decision of a run, written as it starts
LOCK = "run.lock"
# What a trainer may write into its run directory; a new run refuses a directory holding any of them, and a
# run that fails before its first checkpoint removes the ones it created.
RUN_FILES = ("run.json", "all_config.yaml", "plan.yaml", "metrics.jsonl", "tensorboard", "pictures", "best.pt",
             "pck_report.json")
_RUN_OUTPUT = re.compile(r"step_\d+.*|evaluator_.+_step_\d+")


class RunDirError(UserError):
    """The run directory belongs to another run, is in use, is not writable, or lacks the room for checkpoints."""


def settings_fingerprint(settings: dict[str, Any], ignore: tuple[str, ...] = ()) -> str:
    """A short hash of ``settings`` (a JSON-able dict) without the keys in ``ignore``: equal settings, equal hash."""
    kept = {k: v for k, v in settings.items() if k not in ignore}
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_manifest(directory: Path) -> dict | None:
    """The run record of ``directory``, or None when it has none.

    Raises:
        RunDirError: ``run.json`` exists but is unreadable or not a run record.
    """
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


def run_outputs(directory: Path) -> list[str]:
    """The names of the files in ``directory`` that a run writes (run.json, plan.yaml, checkpoints, ...), sorted; []
    when it is not a directory."""
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name in RUN_FILES or _RUN_OUTPUT.fullmatch(p.name))


class RunLock:
    """An exclusive ``flock`` on ``<dir>/run.lock`` holding the owner's process id and a ``mark`` of its own (random),
    by which the other ranks of a multi-node run check that they see this very directory (:func:`check_shared`).

    Raises:
        RunDirError: another process holds it (named by its id), or the file cannot be created.
    """

    def __init__(self, directory: Path):
        self.path = directory / LOCK
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunDirError(f"run directory {directory} is not writable ({e.strerror or e}); choose another "
                              "location") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = (os.pread(self.fd, 64, 0).decode(errors="replace").split() or ["unknown"])[0]
            os.close(self.fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise RunDirError(f"cannot lock {self.path}: {e.strerror or e}") from None
            raise RunDirError(f"{directory} is in use by process {holder} ({self.path}); wait for it to finish or "
                              "stop it, or choose another directory") from None
        self.mark = uuid.uuid4().hex
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()} {self.mark}\n".encode(), 0)

    def release(self, remove: bool = False) -> None:
        if self.fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        os.close(self.fd)  # closing drops the flock
        self.fd = None


class RunDirectory:
    """This run's directory, its record and its lock (see the module docstring). Only rank 0 opens one.

    Attributes:
        path: the directory.
        manifest: the record as it will next be written (``run.json`` itself is written by the checkpointer).
        written: whether this process has written ``run.json`` (its first checkpoint).
        garbage: names this run recorded and left behind (an interrupted write's temporary file, checkpoints
            pruned but not yet deleted); the checkpointer removes them with its first record.
    """

    def __init__(self, path: Path, manifest: dict, lock: RunLock, fresh: bool, before: set[str], created: bool):
        self.path, self.manifest, self._lock = path, manifest, lock
        self.fresh, self._before, self._created = fresh, before, created
        self.written = False
        self.garbage = self._recover()

    @property
    def run_id(self) -> str:
        return self.manifest["run_id"]

    @property
    def mark(self) -> str:
        """The mark its lock holds (:class:`RunLock`)."""
        return self._lock.mark

    @classmethod
    def open(cls, path: str | os.PathLike, *, trainer: str, fingerprint: str, resuming: bool,
             resume_hint: str) -> "RunDirectory":
        """Take the directory for a new run, or for continuing the run recorded there when ``resuming``.

        Writes nothing but ``run.lock`` (and the directory itself when missing).

        Args:
            trainer: ``"pretrain"`` or ``"cape"``; a directory of the other trainer is refused.
            fingerprint: :func:`settings_fingerprint` of this run's settings.
            resuming: whether the command asked to resume.
            resume_hint: how the user continues a run, e.g. ``"add resume=auto"``, for the refusal message.

        Raises:
            RunDirError: another trainer's run, another run without ``resuming``, files of a run without a
                record, a directory in use by another process, or one that cannot be created.
        """
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise RunDirError(f"run directory {path} is a file; choose a directory path")
        checks = dict(trainer=trainer, fingerprint=fingerprint, resuming=resuming, resume_hint=resume_hint)
        created = not path.exists()
        if not created:  # refuse without touching anything, then check again under the lock
            cls._take(path, None, created, **checks)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"cannot create run directory {path}: {e.strerror or e}; choose a writable location") from None
        try:
            lock = RunLock(path)
        except RunDirError:
            if created:
                _remove_empty(path)
            raise
        try:
            return cls._take(path, lock, created, **checks)
        except BaseException:
            lock.release(remove=created or not path.joinpath(MANIFEST).exists())
            if created:
                _remove_empty(path)
            raise

    @classmethod
    def _take(cls, path: Path, lock: RunLock | None, created: bool, *, trainer: str, fingerprint: str, resuming: bool,
              resume_hint: str) -> "RunDirectory":
        manifest = read_manifest(path)
        before = {p.name for p in path.iterdir()} - {LOCK}
        if manifest is not None and manifest.get("trainer", trainer) != trainer:
            raise RunDirError(f"{path} holds a {manifest.get('trainer')} run, not a {trainer} run; choose another directory")
        if manifest is None:
            outputs = run_outputs(path)
            if outputs and not resuming:
                raise RunDirError(f"{path} already holds files of another run ({', '.join(outputs[:4])}); "
                                  f"{resume_hint} to continue it, or choose a new directory")
            # Resuming a directory written without a run record adopts its step checkpoints.
            adopted = [p.name for p in recorded_checkpoints(path)] if resuming else []
            manifest = {"run_id": uuid.uuid4().hex[:12], "trainer": trainer, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                        "fingerprint": fingerprint, "checkpoints": adopted, "best": None}
            fresh = not outputs
        elif not resuming:
            raise RunDirError(f"{path} already holds run {manifest['run_id']} (started {manifest.get('created', '?')}): "
                              f"{resume_hint} to continue it, or choose a new directory for a fresh run")
        else:
            fresh = False
        manifest["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        return cls(path, manifest, lock, fresh, before, created)

    def _recover(self) -> list[str]:
        """Finish, in memory, a checkpoint sequence a crash cut short (utils/run/checkpointer.py): a recorded
        write whose file was renamed into place is this run's checkpoint; its temporary file, and checkpoints
        recorded as being deleted, are garbage."""
        garbage = [f".{MANIFEST}.{self.run_id}.tmp"]
        pending = self.manifest.pop("pending", None)
        if pending:
            garbage.append(pending["tmp"])
            if (self.path / pending["name"]).is_file():
                if pending.get("best"):
                    self.manifest["best"] = pending["name"]
                elif pending["name"] not in self.manifest["checkpoints"]:
                    self.manifest["checkpoints"].append(pending["name"])
        garbage += self.manifest.pop("deleting", [])
        return garbage

    def write_manifest(self) -> None:
        """Write ``run.json`` atomically (through ``.run.json.<run id>.tmp``), then remove the recorded garbage.

        Raises:
            CheckpointWriteError: the write failed (disk full, read-only); the previous ``run.json`` is intact
                and no temporary file is left.
        """
        self.manifest["updated"] = time.time()
        path, tmp = self.path / MANIFEST, self.path / f".{MANIFEST}.{self.run_id}.tmp"
        data = json.dumps(self.manifest, indent=1).encode()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise CheckpointWriteError(f"could not write {path} ({e.strerror or e}; {len(data)} bytes, "
                                       f"{free_bytes(self.path) / 2**20:.0f} MiB free)") from None
        self.written = True
        for name in self.garbage:
            (self.path / name).unlink(missing_ok=True)
        self.garbage = []

    def check_storage(self, checkpoint_bytes: int, copies: int) -> None:
        """Fail early unless the directory has room for ``copies`` checkpoints (the kept ones plus the one being
        written, and ``best.pt``).

        Raises:
            RunDirError: naming the directory, the free and the needed space.
        """
        free, need = free_bytes(self.path), copies * checkpoint_bytes
        if free < need:
            raise RunDirError(f"run directory {self.path} has {free / 2**20:.0f} MiB free, but {copies} checkpoints "
                              f"need about {need / 2**20:.0f} MiB; free some space, lower keep_last_checkpoints, "
                              "or choose another location")

    def checkpoints(self) -> list[Path]:
        """This run's step checkpoints that still exist, oldest first."""
        return [self.path / name for name in self.manifest["checkpoints"] if (self.path / name).is_file()]

    def abandon(self) -> None:
        """Undo a fresh run that failed before its first checkpoint and before it logged a step: remove the run
        files it created (and the directory, when it created it and it is left empty), so the corrected command can
        start there. A run that logged a finished step keeps its directory (its metrics say what it did)."""
        metrics = self.path / "metrics.jsonl"
        if not self.fresh or self.written or (metrics.is_file() and metrics.stat().st_size > 0):
            return
        for name in run_outputs(self.path):
            if name not in self._before:
                target = self.path / name
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        self.close(remove_lock=True)
        if self._created:
            _remove_empty(self.path)

    def close(self, remove_lock: bool = False) -> None:
        """Release the lock (and remove ``run.lock`` when the run left nothing else)."""
        self._lock.release(remove=remove_lock)


def _remove_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def free_bytes(path: Path) -> int:
    """Free bytes on the file system of ``path``."""
    return shutil.disk_usage(path).free


def recorded_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The step checkpoints of the run in ``directory``, oldest first, without writing anything: those its
    ``run.json`` lists, or for a directory without one its ``step_<N>.pt`` files in step order."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is not None:
        names = list(manifest.get("checkpoints", []))
        pending = manifest.get("pending") or {}
        if pending and not pending.get("best") and pending["name"] not in names:
            names.append(pending["name"])
        return [directory / n for n in names if (directory / n).is_file()]
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
            manifest = read_manifest(child) if child.is_dir() else None
        except RunDirError:
            continue
        if manifest and manifest.get("trainer") == trainer and manifest.get("fingerprint") == fingerprint \
                and recorded_checkpoints(child):
            found.append((manifest.get("updated", 0), child))
    return max(found)[1] if found else None


def check_shared(path: Path, mark: str, rank: int) -> None:
    """Refuse, on rank ``rank`` of a multi-node run, a run directory ``path`` that is not the one rank 0 locked (its
    ``run.lock`` holds another mark, or none): the ranks would resume from different steps, and rank 0's checkpoints
    would be out of this rank's reach.

    Raises:
        RunDirError: naming the rank, the directory and the cure.
    """
    try:
        seen = (path / LOCK).read_text(errors="replace").split()
    except OSError:
        seen = []
    if seen[1:2] != [mark]:
        raise RunDirError(f"rank {rank} does not see the run directory {path} that rank 0 writes (a node-local disk, or a "
                          "relative path read from another working directory): a multi-node run's checkpoint_path "
                          "must be an absolute path on a filesystem every node sees")


def run_location(*, explicit: str | None, resume: str | None, parent: Path, trainer: str, fingerprint: str,
                 new_name: str, named: bool = False) -> Path:
    """Where a run lives, in order: ``explicit`` (``checkpoint_path`` / ``--output_dir``); the directory of
    ``resume=<file or dir>``; with ``resume=auto`` and a run not ``named`` by the user (``run_name``), the newest
    run under ``parent`` started with the same settings (:func:`find_matching_run`); else ``parent / new_name``."""
    if explicit:
        return Path(explicit)
    if resume and resume != "auto":
        return Path(resume) if Path(resume).is_dir() else Path(resume).parent
    found = find_matching_run(parent, trainer, fingerprint) if resume == "auto" and not named else None
    return found or parent / new_name


def open_run(path: Path, *, trainer: str, fingerprint: str, resume: str | None,
             resume_hint: str) -> tuple[RunDirectory, Path | None]:
    """Open the run directory ``path`` and find the checkpoint to resume from (None: start fresh).

    ``resume`` is None (a new run), ``"auto"`` (this run's newest valid checkpoint, or a fresh start when there
    is none), a run directory (its newest valid checkpoint) or a checkpoint file.

    Raises:
        CheckpointError: ``resume`` names something missing, or a directory without a valid checkpoint.
        RunDirError: see :meth:`RunDirectory.open`.
    """
    explicit = Path(resume) if resume and resume != "auto" else None
    if explicit is not None and not explicit.exists():
        raise CheckpointError(f"resume {resume}: no such file or directory")
    run = RunDirectory.open(path, trainer=trainer, fingerprint=fingerprint, resuming=bool(resume),
                            resume_hint=resume_hint)
    try:
        if explicit is not None and explicit.is_file():
            return run, explicit
        candidates = run.checkpoints() if explicit is None or explicit.resolve() == run.path.resolve() \
            else recorded_checkpoints(explicit)
        found = newest_loadable(reversed(candidates))
        if found is None and explicit is not None:
            raise CheckpointError(f"resume {resume}: no valid step_<N>.pt checkpoint in {explicit}")
        return run, None if found is None else found[0]
    except BaseException:
        run.abandon()
        run.close()
        raise
