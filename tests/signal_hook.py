"""The tests' hook ``RUN_SIGNAL_AT``: a signal at a chosen point of a run, so a test stops a run at the step it names.

    RUN_SIGNAL_AT=train:100:SIGTERM        # a scheduler's stop during step 100
    RUN_SIGNAL_AT=eval:200:SIGINT:group    # Ctrl-C to the whole process group, during the evaluation at step 200
                                           # (after its first batch)
    RUN_SIGNAL_AT=val:40:SIGTERM:group     # the CAPE validation at step 40, workers included
    RUN_SIGNAL_AT=train:5:SIGUSR1          # a scheduler's early warning (the trainers' warning_signal)
    RUN_SIGNAL_AT=train:5:SIGUSR1:leader   # ... to the process that leads the group alone: a job's batch script

The value is ``POINT:STEP:SIGNAL[:group|:leader]``. POINT is one of the run's points (utils/run/points.py): ``train`` (as
optimizer step STEP begins, so a graceful stop comes right after step STEP; in the first step of a process, which
compiles, a stop is at once), ``eval`` (pretrain.py's evaluation at step STEP), ``val`` and ``test`` (the CAPE
trainer's validation and test split, run at step STEP); the evaluation points fire after the evaluation's first
batch, when DataLoader workers are running. SIGNAL is one of :data:`SIGNALS`, the stops the tests rehearse. With
``group`` the signal goes to the process group from a process of its own (as ``kill -- -PGID``, ``timeout`` and batch
schedulers send it), with ``leader`` to the group's leader alone (a batch script Slurm signals with
``--signal=B:...``; under torchrun, whose workers each lead a group of their own, the leader of the agent's group),
else to this process alone. It is sent once, from the process of rank 0 (the only process
without torchrun).

A test that stops a run this way stops it at the step it chose, whatever the device's pace: a step of a tiny model
takes milliseconds on a GPU, and a test that waited for a file to appear before signalling could see the run end
first.

The product holds no part of it: this module watches the run's points (:func:`install`), and only where the tests
put it, in the test session's own process (tests/conftest.py) and in the processes the tests start (tests/run_hook/
sitecustomize.py, on the PYTHONPATH of :func:`tests.conftest.child_env`). A user's environment never arms it,
whatever it sets. It reaches only a trainer started as a program of its own (utils/run/points.py
``program_run``): a trainer run inside another program (the ARC adaptation of ``solve.py --arc`` and of the page)
leaves it unarmed, since its signal would stop that program. An armed run says so on its first line, and the line
each signal is sent with names the variable, so a stop it caused says where it came from.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Optional

from tqdm import tqdm

from utils.errors import UserError
from utils.run import points

ENV = "RUN_SIGNAL_AT"
POINTS = ("train", "eval", "val", "test")
# The stops the tests rehearse: a graceful stop (SIGINT, SIGTERM), a crash (SIGKILL), a run frozen while it holds
# its run directory (SIGSTOP, tests/test_checkpointer.py), and a scheduler's early warning (SIGUSR1, the trainers'
# warning_signal). Any other signal would do what no test means: SIGCHLD does nothing.
SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL", "SIGSTOP", "SIGUSR1")
TARGETS = ("group", "leader")


@dataclass(frozen=True)
class SignalAt:
    """The point of ``RUN_SIGNAL_AT``: ``point`` (one of :data:`POINTS`), ``step`` (the optimizer step), ``signum``
    (one of :data:`SIGNALS`), ``target`` (None: this process; ``group``: its process group; ``leader``: the group's
    leader alone), and ``value`` as it was set."""

    point: str
    step: int
    signum: int
    target: Optional[str]
    value: str

    @property
    def group(self) -> bool:
        return self.target == "group"

    def when(self) -> str:
        """Where the run is when the signal goes, in words."""
        if self.point == "train":
            return f"as optimizer step {self.step} begins"
        return f"after the first batch of the {self.point} evaluation at step {self.step}"

    def whom(self) -> str:
        """Who gets the signal, in words."""
        return {"group": "its whole process group", "leader": f"its job's process group leader ({job_leader()})"}.get(
            self.target, "this process")

    def announcement(self) -> str:
        """The first line of an armed run."""
        target = f"-- -{os.getpgrp()}" if self.group else str(job_leader() if self.target else os.getpid())
        then = f"; it stays stopped until it gets SIGCONT (kill -CONT {target})" if self.signum == signal.SIGSTOP else ""
        return (f"{ENV}={self.value} is set: this run will send {signal.Signals(self.signum).name} to {self.whom()} "
                f"{self.when()}{then} (a test hook: unset {ENV} to run without it)")


def job_leader() -> int:
    """The process that leads this run's job: its process group's leader, or under torchrun (whose workers each lead
    a group of their own) the leader of its agent's group."""
    return os.getpgid(os.getppid()) if "TORCHELASTIC_RUN_ID" in os.environ else os.getpgrp()


def parse(value: str) -> SignalAt:
    """``POINT:STEP:SIGNAL[:group]`` as a :class:`SignalAt`.

    Raises:
        UserError: a malformed value, or a signal not in :data:`SIGNALS`, with the form it should have.
    """
    parts = value.split(":")
    problem = f"{ENV}={value!r} is not POINT:STEP:SIGNAL[:group|:leader]"
    form = (f"(e.g. train:100:SIGTERM; POINT one of {', '.join(POINTS)}; SIGNAL one of {', '.join(SIGNALS)}; unset "
            f"{ENV} to run without it)")
    if len(parts) not in (3, 4) or parts[0] not in POINTS or not parts[1].isdigit() or \
            parts[3:] not in ([], *([t] for t in TARGETS)):
        raise UserError(f"{problem} {form}")
    name = parts[2].upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    if name not in SIGNALS:
        raise UserError(f"{problem}: {parts[2]!r} is not a stop it rehearses {form}")
    return SignalAt(parts[0], int(parts[1]), int(signal.Signals[name]), parts[3] if len(parts) == 4 else None, value)


class SignalHook:
    """The :class:`utils.run.points.Watcher` that sends ``RUN_SIGNAL_AT``'s signal at its point (once a run)."""

    def __init__(self):
        self.plan: Optional[SignalAt] = None  # armed for the run now in this process
        self.sent = False
        self._outer: list[Optional[SignalAt]] = []  # the plans of the runs this one is inside

    def begin(self) -> None:
        """Arm ``RUN_SIGNAL_AT`` for the run that begins (rank 0 only) and say so on its first line.

        Raises:
            UserError: a malformed value (on every rank), before the run does any work.
        """
        value = os.environ.get(ENV)
        plan = parse(value) if value else None  # every rank refuses a malformed value
        if os.environ.get("RANK", "0") != "0":
            plan = None  # rank 0 alone sends the signal
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
            plan = None  # a worker group torchrun restarted runs unarmed: the crash a test rehearses happens once
        if plan is not None:
            print(plan.announcement(), file=sys.stderr, flush=True)
        self._outer.append(self.plan)
        self.plan, self.sent = plan, False

    def end(self) -> None:
        self.plan = self._outer.pop()

    def reach(self, point: str, step: int) -> None:
        """Send the planned signal if this is its point (once)."""
        plan = self.plan
        if plan is None or (plan.point, plan.step) != (point, step) or self.sent:
            return
        self.sent = True
        tqdm.write(f"{ENV}={plan.value}: sending {signal.Signals(plan.signum).name} to {plan.whom()} {plan.when()}",
                   file=sys.stderr)
        sys.stderr.flush()
        if not plan.target:
            os.kill(os.getpid(), plan.signum)
            return
        if plan.target == "leader":
            os.kill(job_leader(), plan.signum)
            return
        # From another process, as a scheduler sends it: a DataLoader worker treats a SIGTERM from its parent (this
        # process) as a request to exit quietly, but dies of one from anyone else.
        child = os.fork()
        if child == 0:
            signal.pthread_sigmask(signal.SIG_BLOCK, {plan.signum})  # the sender is in the group too: not its business
            os.killpg(os.getpgrp(), plan.signum)
            os._exit(0)
        os.waitpid(child, 0)


HOOK = SignalHook()
_installed = False


def install() -> None:
    """Let :data:`HOOK` watch this process's trainer runs (once, however often it is called)."""
    global _installed
    if not _installed:
        points.watch(HOOK)
        _installed = True


def planned() -> Optional[SignalAt]:
    """The point armed for the run now in this process, None where there is none."""
    return HOOK.plan
