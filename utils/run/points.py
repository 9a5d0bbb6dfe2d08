"""Named points of a training run, for code that watches a trainer started as a program of its own.

The trainers pass these points (:func:`reach`): ``train`` as optimizer step N begins (pretrain.py's inside the step's
at-once block: utils/run/stop.py), ``eval`` after the first batch of pretrain.py's evaluation at step N, ``val`` and
``test`` after the first batch of the CAPE trainer's validation and test split run at step N (their DataLoader
workers running). A point goes to each :class:`Watcher` added with :func:`watch`, and only during the run of a
trainer's own entry (:func:`program_run`: ``pretrain.py``, ``python -m models.train_cape_episodic``); a trainer run
inside another program (the ARC adaptation of ``solve.py`` and of the page) passes none, since a watcher acts on the
process it watches.

The project adds no watcher, reads no variable and sends no signal here: a run passes its points to no one. The test
suite adds one (tests/signal_hook.py) in the processes it starts, to stop a run at the step a test chooses whatever
the device's pace.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Protocol


class Watcher(Protocol):
    """What hears of a program's runs: each run's beginning, its points, its end (in that run's process)."""

    def begin(self) -> None:
        """A trainer's own run begins, before any work; raising :class:`utils.errors.UserError` refuses it."""

    def reach(self, point: str, step: int) -> None:
        """The run is at ``point`` of optimizer step ``step``."""

    def end(self) -> None:
        """The run that began is over (finished, stopped or failed)."""


_watchers: list[Watcher] = []
_running = False  # a trainer's own run is under way in this process


def watch(watcher: Watcher) -> None:
    """Let ``watcher`` hear of every trainer run this process starts as a program of its own from now on."""
    _watchers.append(watcher)


@contextlib.contextmanager
def program_run() -> Iterator[None]:
    """The run of a trainer's own entry: each watcher begins (and may refuse the run), hears of the run's points
    (:func:`reach`) and ends with it.

    Raises:
        UserError: a watcher refused the run, before any work.
    """
    global _running
    with contextlib.ExitStack() as ends:
        for watcher in list(_watchers):
            watcher.begin()
            ends.callback(watcher.end)
        previous, _running = _running, True
        try:
            yield
        finally:
            _running = previous


def reach(point: str, step: int) -> None:
    """The run is at ``point`` of optimizer step ``step``: tell the watchers, during a program's own run."""
    if _running:
        for watcher in list(_watchers):
            watcher.reach(point, step)


class ReachOnFirstBatch:
    """An evaluation consumer (``update_batch``, utils/eval/puzzle.py) that reaches ``point`` at ``step`` when the
    evaluation's first batch is done."""

    def __init__(self, point: str, step: int):
        self.point, self.step, self.done = point, step, False

    def update_batch(self, batch, preds) -> None:
        if not self.done:
            self.done = True
            reach(self.point, self.step)


def first_batch_consumers(point: str, step: int) -> list[ReachOnFirstBatch]:
    """``[ReachOnFirstBatch(point, step)]`` while a program's run has watchers, else ``[]`` (an evaluation without
    consumers skips copying its outputs to the host)."""
    return [ReachOnFirstBatch(point, step)] if _running and _watchers else []
