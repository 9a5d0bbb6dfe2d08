"""A signal at a chosen point of a run: rehearse a scheduler's stop, and stop a test's run at the step it names.

    RUN_SIGNAL_AT=train:100:SIGTERM python pretrain.py ...        # a scheduler's stop during step 100
    RUN_SIGNAL_AT=eval:200:SIGINT:group python pretrain.py ...    # Ctrl-C to the whole process group, during the
                                                                  # evaluation at step 200 (after its first batch)
    RUN_SIGNAL_AT=val:40:SIGTERM:group ./START_CAPE_TRAINING.sh   # the CAPE validation at step 40, workers included

The value is ``POINT:STEP:SIGNAL[:group]``. POINT is where the trainer is: ``train`` (as optimizer step STEP
begins, so a graceful stop comes right after step STEP; in the first step of a process, which compiles, a stop is
at once), ``eval`` (pretrain.py's evaluation at step STEP), ``val`` and ``test`` (the CAPE trainer's validation and
test split, run at step STEP); the evaluation points fire after the evaluation's first batch, when DataLoader
workers are running. SIGNAL is a name such as SIGTERM, SIGINT or SIGKILL. With ``group`` the signal goes to the
process group from a process of its own (as ``kill -- -PGID``, ``timeout`` and batch schedulers send it), else to
this process alone. It is sent once, from the process of rank 0 (the only process without torchrun).

A test that stops a run this way stops it at the step it chose, whatever the device's pace: a step of a tiny model
takes milliseconds on a GPU, and a test that waited for a file to appear before signalling could see the run end
first.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from utils.errors import UserError

ENV = "RUN_SIGNAL_AT"
POINTS = ("train", "eval", "val", "test")


@dataclass(frozen=True)
class SignalAt:
    """The point of ``RUN_SIGNAL_AT``: ``point`` (one of :data:`POINTS`), ``step`` (the optimizer step), ``signum``,
    and ``group`` (the process group, not this process alone)."""

    point: str
    step: int
    signum: int
    group: bool


def parse(value: str) -> SignalAt:
    """``POINT:STEP:SIGNAL[:group]`` as a :class:`SignalAt`.

    Raises:
        UserError: a malformed value, with the form it should have.
    """
    parts = value.split(":")
    form = (f"{ENV}={value!r} is not POINT:STEP:SIGNAL[:group] (e.g. train:100:SIGTERM; POINT one of "
            f"{', '.join(POINTS)})")
    if len(parts) not in (3, 4) or parts[0] not in POINTS or not parts[1].isdigit() or parts[3:] not in ([], ["group"]):
        raise UserError(form)
    name = parts[2].upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    if name not in signal.Signals.__members__:
        raise UserError(f"{form}: no signal {parts[2]!r}")
    return SignalAt(parts[0], int(parts[1]), int(signal.Signals[name]), len(parts) == 4)


@lru_cache(maxsize=1)
def planned() -> Optional[SignalAt]:
    """The point ``RUN_SIGNAL_AT`` names in this process, None where it is unset or this is not rank 0.

    Raises:
        UserError: a malformed value (trainers call this before their first step).
    """
    value = os.environ.get(ENV)
    if not value or os.environ.get("RANK", "0") != "0":
        return None
    return parse(value)


_sent: set[SignalAt] = set()


def reach(point: str, step: int) -> None:
    """The run is at ``point`` at optimizer step ``step``: send the planned signal if this is its point (once)."""
    plan = planned()
    if plan is None or (plan.point, plan.step) != (point, step) or plan in _sent:
        return
    _sent.add(plan)
    if not plan.group:
        os.kill(os.getpid(), plan.signum)
        return
    # From another process, as a scheduler sends it: a DataLoader worker treats a SIGTERM from its parent (this
    # process) as a request to exit quietly, but dies of one from anyone else.
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_BLOCK, {plan.signum})  # the sender is in the group too: not its business
        os.killpg(os.getpgrp(), plan.signum)
        os._exit(0)
    os.waitpid(child, 0)


class ReachOnFirstBatch:
    """An evaluation consumer (``update_batch``, utils/eval/puzzle.py) that reaches ``point`` at ``step`` when the
    evaluation's first batch is done."""

    def __init__(self, point: str, step: int):
        self.point, self.step = point, step

    def update_batch(self, batch, preds) -> None:
        reach(self.point, self.step)


def first_batch_consumers(point: str, step: int) -> list[ReachOnFirstBatch]:
    """``[ReachOnFirstBatch(point, step)]`` where ``RUN_SIGNAL_AT`` names that point and step, else ``[]`` (an
    evaluation without consumers skips copying its outputs to the host)."""
    plan = planned()
    return [ReachOnFirstBatch(point, step)] if plan is not None and (plan.point, plan.step) == (point, step) else []
