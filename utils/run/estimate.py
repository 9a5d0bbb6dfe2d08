"""How long a run will take on this device: told from FLOPs before its first optimizer step, then from timed steps.

Before the first step the estimate is ``total_steps * FLOPs per step / (half the measured matmul rate)``:

- FLOPs per step: one training step (forward and backward of one ACT segment, and HRM's extra target pass) of the
  run's model at its local batch, traced on the ``meta`` device under ``torch.utils.flop_counter.FlopCounterMode``:
  shapes only, no memory, about a second;
- the matmul rate: a square GEMM in the run's dtype on the run's device, timed for a fraction of a second;
- one half: the share of that rate a training step reaches here (the compiled TRM quickstart and MLP recipe steps
  reach 59-75% on a CPU, eager steps less; scripts/benchmark_step.py measures it).

Evaluations are not counted, and a step can reach more than half the GEMM rate (fp32 on an AVX2 CPU: about 63%),
so the estimate is right within about a factor of two either way: 5 min for the TRM quickstart that took 5 min 16 s
on an AVX512-BF16 CPU, and 40 min for the same run that took 31 min 36 s on an AVX2-only one.

FLOPs do not bound every step: a small model at a small batch on a GPU waits on kernel launches and host work (the
hard-Sudoku recipe's 0.5M-parameter model ran 73-79 steps/s on an H200, where its FLOPs allowed about 16 s for the
whole schedule, and training took 206 s). So :class:`StepPace` times the steps after the first (which compiles,
when compile is on, and is told apart) and tells the rest of the schedule at that pace.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.utils.flop_counter import FlopCounterMode

from utils.threads import load_note

STEP_EFFICIENCY = 0.5  # share of the GEMM rate a training step reaches (see the module docstring)
# A backward pass costs about twice its forward (Kaplan et al. 2020, arXiv 2001.08361, Sec. 2.1: 2N FLOPs per token
# forward, 4N backward): for a step counted from its forward alone (the CAPE trainer counts one episode's forward on
# the run's own model, without gradients; its autocast does not run on the meta device).
BACKWARD_PER_FORWARD = 2.0
TIMED_MIN_S, TIMED_MIN_STEPS, TIMED_MAX_STEPS = 2.0, 5, 500  # StepPace's timed steps after the first
LONG_RUN_HOURS = 4.0  # past this on a CPU or MPS, the run names the recipe that fits


@dataclass(frozen=True)
class Estimate:
    """``flops_per_step`` (FLOP), ``matmul_rate`` (FLOP/s) and ``seconds`` for ``steps`` optimizer steps."""

    flops_per_step: float
    matmul_rate: float
    steps: int

    @property
    def seconds(self) -> float:
        return self.steps * self.flops_per_step / (STEP_EFFICIENCY * self.matmul_rate)

    def told(self, device: torch.device) -> str:
        """The start-up line of a trainer: the time to the end of the schedule and how it was reckoned."""
        return (f"estimated time to the end of the schedule: {duration(self.seconds)} ({self.steps} steps of "
                f"{self.flops_per_step / 1e12:.3g} TFLOP at {STEP_EFFICIENCY:.0%} of the {self.matmul_rate / 1e12:.3g} "
                f"TFLOP/s measured for a GEMM on {device}, on {load_note()}; evaluations not counted; told again from "
                "the first timed steps)")


def step_flops(meta_head, batch_size: int, seq_len: int) -> int:
    """FLOPs of one training step of ``meta_head`` (a loss head built on the ``meta`` device) at ``batch_size``."""
    batch = {"inputs": torch.ones(batch_size, seq_len, dtype=torch.int32, device="meta"),
             "labels": torch.ones(batch_size, seq_len, dtype=torch.int32, device="meta"),
             "puzzle_identifiers": torch.zeros(batch_size, dtype=torch.int32, device="meta")}
    meta_head.train()

    def step() -> None:
        _, loss, *_ = meta_head(meta_head.initial_carry(batch), batch)
        loss.backward()
    return counted_flops(step)


def counted_flops(work: Callable[[], object]) -> int:
    """FLOPs of ``work()`` (matrix products, convolutions and attention, as FlopCounterMode counts them)."""
    with FlopCounterMode(display=False) as counter:
        work()
    return counter.get_total_flops()


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA, MPS; nothing to wait for on a CPU)."""
    {"cuda": torch.cuda.synchronize, "mps": torch.mps.synchronize}.get(device.type, lambda: None)()


@functools.cache
def matmul_rate(device: torch.device, dtype: torch.dtype, size: int = 1024, seconds: float = 0.2) -> float:
    """FLOP/s of a ``size`` x ``size`` GEMM in ``dtype`` on ``device``, timed for about ``seconds``. The operands come
    from a generator of their own: the run's random streams, restored on a resume, do not move. Timed once a process
    for each set of arguments: a program that trains several times (the page's ARC adaptation, the tests) reuses it
    for each run's first length estimate, which the timed steps then replace."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator).to(device, dtype) for _ in range(2))
    torch.mm(a, b)
    synchronize(device)
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        runs += 1
        synchronize(device)
    return 2 * size**3 * runs / (time.perf_counter() - start)


def duration(seconds: float) -> str:
    """``seconds`` as a person says it: ``40 ms``, ``2.5 s``, ``45 s``, ``12 min``, ``6.5 hours``, ``91 days``."""
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.0f} days"


def slower_than_flops(device: torch.device) -> str:
    """What bounds a step beyond its FLOPs on ``device``'s kind: on a GPU a small model waits on kernel launches and
    the host; on a CPU, other processes on its cores (or a step too small to keep its threads busy)."""
    if device.type == "cpu":
        return "on a CPU: other processes on its cores, or steps too small to keep its threads busy"
    return "for a small model on a GPU, kernel launches and host work"


class StepPace:
    """Times a run's steps and tells the rest of the schedule at the measured pace.

    The first step of a process is timed alone (it compiles when compile is on: tens of seconds to minutes); then
    each step after it, until they add up to :data:`TIMED_MIN_S` seconds over at least :data:`TIMED_MIN_STEPS`
    steps (or :data:`TIMED_MAX_STEPS` steps), and the rest of the schedule is told at their median: a step that
    waited for an evaluation or a checkpoint does not move it. A schedule too short for that is told once as many
    steps were timed as are left (a 3-step run after its second step): later, there would be nothing left to tell.
    Evaluations are not counted.

    Args:
        first_step: the step count before this process's first step (0, or the resumed step).
        total_steps: the schedule's last step.
        device: where the steps run (synchronized after each timed step).
        compiles: whether the first step compiles the training step.
        flop_seconds: the FLOP estimate of the rest of the schedule (:class:`Estimate`), for comparison.
        report: where the lines go (a logger's ``info``); None times nothing (the other ranks of a torchrun job).
    """

    def __init__(self, first_step: int, total_steps: int, device: torch.device, compiles: bool, flop_seconds: float,
                 report: Optional[Callable[..., None]]):
        self.first_step, self.total_steps, self.device = first_step, total_steps, device
        self.compiles, self.flop_seconds, self.report = compiles, flop_seconds, report
        self._last: Optional[float] = None
        self._seconds: list[float] = []
        if compiles and report is not None:
            report("compiling the training step: the first step builds its kernels (about a minute with an empty "
                   "torch.compile cache; TORCHINDUCTOR_CACHE_DIR keeps them for the next run)")

    @property
    def per_step(self) -> Optional[float]:
        """The median seconds of the steps timed so far (the first one left out); None before any."""
        return statistics.median(self._seconds) if self._seconds else None

    def begin(self) -> None:
        """Call before the first step."""
        if self.report is not None:
            synchronize(self.device)
            self._last = time.perf_counter()

    def step_done(self, step: int) -> None:
        """Call after optimizer step ``step``."""
        if self._last is None or step >= self.total_steps:
            return
        synchronize(self.device)
        now = time.perf_counter()
        took, self._last = now - self._last, now
        if step == self.first_step + 1:
            what = "compiling the training step and running it" if self.compiles else "the first step"
            self.report("%s took %s", what, duration(took))
            return
        self._seconds.append(took)
        n, rest = len(self._seconds), self.total_steps - step
        if n < min(TIMED_MAX_STEPS, rest) and (n < TIMED_MIN_STEPS or sum(self._seconds) < TIMED_MIN_S):
            return
        per_step = self.per_step
        bound = "" if per_step * rest < 2 * self.flop_seconds else (
            f"; the FLOP estimate said {duration(self.flop_seconds)}: these steps are bound by more than their FLOPs "
            f"({slower_than_flops(self.device)})")
        timed = f"step {step} took %.3g ms (" if n == 1 else f"steps {step - n + 1}-{step} took %.3g ms each (median; "
        self.report("measured: " + timed + "%.3g steps/s, on %s); the rest of the schedule (%d step%s): about %s at "
                    "this pace, evaluations not counted%s", 1e3 * per_step, 1 / per_step, load_note(), rest,
                    "" if rest == 1 else "s", duration(per_step * rest), bound)
        self._last = None
