"""Opening a run and closing it, the same for both trainers.

:func:`open_session` finds the run directory (rank 0), takes it (lock, resume checkpoint, storage check),
shares where it is with every rank, and on the way out:

- a :class:`~utils.errors.RunFailure` (disk full, divergence) gets the command that resumes the run when
  a checkpoint of it exists, or says that none does;
- a fresh run that fails before its first checkpoint removes what it created (the corrected command runs);
- the lock is released.
"""

from __future__ import annotations

import logging
import os
import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from utils.distributed import Dist, any_ranks, main_decides
from utils.errors import RunFailure
from utils.run.checkpointer import Checkpointer
from utils.run.run_dir import RunDirectory, check_shared, open_run
from utils.run.stop import GracefulStop
from utils.run.train_state import TrainState

log = logging.getLogger(__name__)


@dataclass
class RunSession:
    """The run as every rank sees it: ``run`` (rank 0 only), its ``path``, the checkpoint to resume from (None:
    a fresh start), the command that resumes it, and whether the directory already held this run's files
    (``continuing``: its metrics then restart from the resumed step, or from 0 when no checkpoint loads)."""

    run: Optional[RunDirectory]
    path: Path
    resume_path: Optional[Path]
    resume_command: str
    continuing: bool


# torchrun sets this in every worker: how many times it has restarted the worker group (--max-restarts) after a failure.
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"


def restarted_resume(resume: Optional[str]) -> Optional[str]:
    """``resume`` as the user set it; or ``"auto"`` where it is unset in a worker group that torchrun restarted after
    a failure (``--max-restarts N``): the restarted workers continue from the run's newest complete checkpoint, as
    the user would with ``resume=auto``, instead of starting a new run (and never overwrite the run they continue)."""
    restarts = int(os.environ.get(RESTART_COUNT, "0") or 0)
    if resume is None and restarts > 0:
        log.info("torchrun restarted the workers (restart %d, %s): continuing from the run's newest checkpoint, as "
                 "resume=auto", restarts, RESTART_COUNT)
        return "auto"
    return resume


def resume_command(prefix: list[str], argv: list[str], drop: tuple[str, ...], add: list[str]) -> str:
    """The copy-pastable command that continues a run: ``prefix``, the user's ``argv`` without the options in
    ``drop`` (``key=value`` items, ``--flag=value`` and ``--flag value`` alike), then ``add``."""
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in drop:
            skip = True
        elif not item.startswith(tuple(f"{d}=" for d in drop)):
            kept.append(item)
    return shlex.join([*prefix, *kept, *add])


@contextmanager
def open_session(rank: Dist, *, trainer: str, location: Callable[[], Path], fingerprint: str, resume: Optional[str],
                 resume_hint: Callable[[Path], str], command: Callable[[Path], str],
                 storage: Callable[[], tuple[int, int]]) -> Iterator[RunSession]:
    """Open the run (see the module docstring) for the ``with`` block.

    Args:
        location: where the run lives (called on rank 0).
        resume_hint: for a refusal, how the user continues the run at a path (e.g. ``"add resume=auto"``).
        command: the command that resumes the run at a path.
        storage: ``(bytes of one checkpoint, copies the run holds at once)`` for the pre-flight check.

    Raises:
        RunDirError, CheckpointError: see :func:`utils.run.run_dir.open_run`, and too little free space; on a rank
            that does not see rank 0's run directory (:func:`utils.run.run_dir.check_shared`).
    """
    run, resume_path = None, None
    if rank.is_main:
        path = location()
        run, resume_path = open_run(path, trainer=trainer, fingerprint=fingerprint, resume=resume,
                                    resume_hint=resume_hint(path))
    try:
        if run is not None:
            run.check_storage(*storage())
        path, resume_path, continuing, mark = main_decides(
            (None if run is None else run.path, resume_path, run is not None and not run.fresh,
             None if run is None else run.mark), rank)
        if run is None:  # every rank resumes from the checkpoints rank 0 writes: it must see them
            check_shared(path, mark, rank.rank)
        session = RunSession(run, path, resume_path, command(path), continuing)
        try:
            yield session
        except RunFailure as e:
            if run is not None:
                hint = f"resume with: {session.resume_command}" if run.checkpoints() else \
                    "no checkpoint of this run exists yet"
                e.args = (f"{e}; {hint}",)
            raise
    except BaseException:
        if run is not None:
            run.abandon()
        raise
    finally:
        if run is not None:
            run.close()


def after_signals(checkpointer: Checkpointer, state: TrainState, stopper: GracefulStop, session: RunSession,
                  rank: Dist) -> Optional[int]:
    """What the signals received ask of the run after a step, agreed across ranks: the exit code of a run stopped
    (SIGINT, SIGTERM, or an early warning with ``on_warning=stop``: checkpointed, :func:`stop_run`); or None, to go
    on, after writing a checkpoint where an early warning came (``on_warning=checkpoint``)."""
    stop, warned = any_ranks([stopper.requested, stopper.warned], rank)
    if warned and stopper.on_warning == "stop":
        stopper.signal_name = stopper.signal_name or stopper.warning_name or stopper.warning_signal
        stop = True
    if stop:
        return stop_run(checkpointer, state, stopper, session, rank)
    if warned:
        path = checkpointer.save(state)
        if rank.is_main:
            log.info("early warning (%s): checkpoint %s after step %d; going on", stopper.warning_name or "on another "
                     "rank", path, state.step)
        stopper.warning_name = None
    return None


def stop_run(checkpointer: Checkpointer, state: TrainState, stopper: GracefulStop, session: RunSession, rank: Dist) -> int:
    """Checkpoint a run a signal stopped, say how to resume it, and return the exit code that asks a scheduler to
    requeue it (128 + the signal's number, utils/run/stop.py)."""
    path = checkpointer.save(state)
    if rank.is_main:
        log.info("stopped by %s after step %d (checkpoint %s); exit code %d; resume with: %s",
                 stopper.signal_name or "a signal on another rank", state.step, path, stopper.exit_code,
                 session.resume_command)
    return stopper.exit_code
