"""Where a training step's time goes, read from a torch.profiler trace (scripts/benchmark_step.py ``--profile``).

Four findings per model, each per step:

- **kernels by time**: on a GPU the device kernels (and copies) by their summed duration; elsewhere, with no device
  kernels to see, the host operators by their own time (without the operators they call): ATen's, and the C++ kernels
  torch.compile generates, recorded with inductor's ``cpp.enable_kernel_profile``;
- **the GEMM share**: the part of that kernel time spent in matrix multiplications (cuBLAS/CUTLASS kernels,
  ``aten::mm`` and its kind), and apart from it the attention kernels' part;
- **launch gaps**: the time in the profiled window when no kernel runs (the union of the kernels' intervals taken
  from the window's length), the number of such gaps and the largest; on a GPU this is the time spent waiting on the
  host to launch work, on a CPU the time between operators (Python, the dispatcher);
- **host syncs**: on a GPU the CUDA runtime's synchronisations (``cudaStreamSynchronize`` and its kind), each
  with the operator it was made in and the innermost line of this repository's code it ran under. A CPU run has
  none; it lists instead the operators that read a tensor's value or size on the host (``aten::_local_scalar_dense``
  behind ``.item()`` and ``bool(tensor)``, ``aten::nonzero`` ...), the candidates: each is a synchronisation on a
  GPU when its tensor lives there.

The trace is the one ``torch.profiler.profile(activities=..., with_stack=True)`` records; the events are its
``events()`` (``torch.autograd.profiler_util.FunctionEvent``: ``name``, ``device_type``, ``time_range`` in
microseconds, ``self_cpu_time_total``, ``cpu_parent``; with_stack adds the Python frames as events of their own,
named ``path(line): function``). Events under a ``record_function`` named
:data:`MEASUREMENT` (the benchmark's own wait for the GPU at the end of the window) are left out of the syncs.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

MEASUREMENT = "benchmark: wait for the device"
GEMM = re.compile(r"gemm|cutlass|xmma|cublas|^aten::(mm|addmm|bmm|baddbmm|_addmm_activation)$|mkldnn.*matmul", re.I)
ATTENTION = re.compile(r"flash|fmha|attention|sdpa|scaled_dot_product", re.I)
RUNTIME_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
WAITING_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2",
               "aten::repeat_interleave")
PYTHON_FRAME = re.compile(r"(.+)\((\d+)\): (.+)")
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class StepProfile:
    """One model's profiled steps. Times in microseconds over all ``steps``; :meth:`report` divides by ``steps``.
    ``on_gpu``: the kernels are a GPU's and the syncs the CUDA runtime's; else host operators and value reads."""

    steps: int
    on_gpu: bool
    window_us: float  # from the first event's start to the last one's end
    kernels: Counter = field(default_factory=Counter)  # name -> summed duration
    calls: Counter = field(default_factory=Counter)  # name -> number of calls
    busy_us: float = 0.0  # the union of the kernels' intervals
    gaps_us: list[float] = field(default_factory=list)  # each stretch of the window with no kernel running
    syncs: Counter = field(default_factory=Counter)  # "what at where" -> count

    @property
    def kernel_us(self) -> float:
        return sum(self.kernels.values())

    def share(self, pattern: re.Pattern) -> float:
        """The part of the kernel time in kernels whose name matches ``pattern`` (0 with no kernels)."""
        total = self.kernel_us
        return sum(t for name, t in self.kernels.items() if pattern.search(name)) / total if total else 0.0

    def report(self, top: int = 15) -> str:
        """The four findings as text, with the ``top`` kernels."""
        n, unit = self.steps, "GPU" if self.on_gpu else "CPU"
        gemm, attention = self.share(GEMM), self.share(ATTENTION)
        idle = self.window_us - self.busy_us
        largest = max(self.gaps_us, default=0.0)
        lines = [f"  {unit} busy {self.busy_us / n / 1e3:.2f} ms of {self.window_us / n / 1e3:.2f} ms per step "
                 f"({self.busy_us / self.window_us:.0%}); idle between kernels {idle / n / 1e3:.2f} ms in "
                 f"{len(self.gaps_us) / n:.0f} gaps per step (largest {largest / 1e3:.2f} ms)" if self.window_us else
                 f"  no {unit} kernels recorded",
                 f"  GEMM {gemm:.0%} of kernel time, attention {attention:.0%}, other {1 - gemm - attention:.0%}",
                 (f"  host syncs per step: {sum(self.syncs.values()) / n:g}" if self.on_gpu else
                  f"  value reads per step: {sum(self.syncs.values()) / n:g} (each a host sync where its tensor is on "
                  "a GPU; a CPU-held value, such as AdamATan2's step count, costs nothing there)")]
        lines += [f"    {count / n:g} x {what}" for what, count in self.syncs.most_common()]
        lines.append(f"  kernels by time (top {top} of {len(self.kernels)}):\n    share  ms/step  calls/step  name")
        for name, t in self.kernels.most_common(top):
            lines.append(f"    {t / self.kernel_us:5.1%}  {t / n / 1e3:7.3f}  {self.calls[name] / n:10g}  {name[:90]}")
        return "\n".join(lines)


def kernel_events(events: Iterable, on_gpu: bool) -> list:
    """The events that are kernels: the device events on a GPU; on a CPU the operators (:func:`is_operator`)."""
    if on_gpu:
        return [e for e in events if _device(e) != "CPU"]
    return [e for e in events if _device(e) == "CPU" and is_operator(e)]


def is_operator(event) -> bool:
    """Whether a host event is an operator: not a Python frame (``path(line): function``, ``<built-in ...>``) nor a
    user annotation (``record_function``, the profiler's step markers)."""
    return not (PYTHON_FRAME.match(event.name) or event.name.startswith("<built-in")
                or getattr(event, "is_user_annotation", False))


def ancestors(event) -> Iterator:
    """The host events ``event`` ran under, innermost first."""
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def outermost(events: list) -> list:
    """The events among ``events`` that have no ancestor among them (their intervals hold the others')."""
    chosen = {id(e) for e in events}
    return [e for e in events if not any(id(parent) in chosen for parent in ancestors(e))]


def union(intervals: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """The covered length of ``intervals`` (``(start, end)`` pairs, any order), and the gaps between the covered
    stretches, in their order."""
    covered, gaps, end = 0.0, [], None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            if end is not None:
                gaps.append(start - end)
            covered += stop - start
            end = stop
        elif stop > end:
            covered += stop - end
            end = stop
    return covered, gaps


def analyse(events: list, steps: int, on_gpu: bool) -> StepProfile:
    """The :class:`StepProfile` of ``steps`` steps whose trace is ``events``.

    Raises:
        ValueError: ``steps`` < 1.
    """
    if steps < 1:
        raise ValueError(f"steps={steps}: profile at least one step")
    spans = [_span(e) for e in events]
    profile = StepProfile(steps, on_gpu,
                          max(end for _, end in spans) - min(start for start, _ in spans) if spans else 0.0)
    kernels = kernel_events(events, on_gpu)
    for e in kernels:  # a host operator's own time, without the operators it calls
        start, end = _span(e)
        profile.kernels[e.name] += end - start if on_gpu else e.self_cpu_time_total
        profile.calls[e.name] += 1
    timeline = kernels if on_gpu else outermost(kernels)
    profile.busy_us, profile.gaps_us = union([_span(e) for e in timeline])
    waits = RUNTIME_SYNCS if on_gpu else WAITING_OPS
    for e in events:
        if e.name in waits and not any(parent.name == MEASUREMENT for parent in ancestors(e)):
            profile.syncs[f"{e.name}{_under_op(e)} at {where(e)}"] += 1
    return profile


def _under_op(event) -> str:
    """`` (in aten::X)``: the operator a CUDA runtime call was made in, if any."""
    if event.name not in RUNTIME_SYNCS:
        return ""
    op = next((parent for parent in ancestors(event) if parent.name.startswith("aten::")), None)
    return f" (in {op.name})" if op is not None else ""


def where(event) -> str:
    """The innermost Python frame of this repository's code that ``event`` ran under (the profiler records frames
    as events named ``path(line): function``), as ``path:line (function)``; ``?`` where there is none."""
    for parent in ancestors(event):
        frame = PYTHON_FRAME.match(parent.name)
        if frame and (path := _ours(frame[1])):
            return f"{path}:{frame[2]} ({frame[3]})"
    return "?"


def _ours(path: str) -> str | None:
    """``path`` relative to the repository when it is one of its files (the profiler gives paths relative to the
    ``sys.path`` entry they were found under, or absolute), else None."""
    found = Path(path) if Path(path).is_absolute() else ROOT / path
    if found.is_file() and found.resolve().is_relative_to(ROOT) and "site-packages" not in found.parts:
        return found.resolve().relative_to(ROOT).as_posix()
    return None


def _span(event) -> tuple[float, float]:
    return event.time_range.start, event.time_range.end


def _device(event) -> str:
    kind = getattr(event, "device_type", None)
    return getattr(kind, "name", str(kind)) if kind is not None else "CPU"


def profiled_steps(step, steps: int, device, sync) -> tuple[StepProfile, float]:
    """Run ``step()`` ``steps`` times under torch.profiler (CPU activity, and CUDA's on a CUDA ``device``, Python
    stacks recorded); the :class:`StepProfile` and the seconds per step under the profiler. ``sync()`` waits for
    the device; it runs inside the window under :data:`MEASUREMENT`, so its wait is not counted as the step's."""
    import torch

    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # read as the profiler starts: no "gpuGetDeviceCount failed" on a CPU
    on_gpu = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_gpu else [])
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        begin = time.perf_counter()
        for _ in range(steps):
            step()
        with torch.profiler.record_function(MEASUREMENT):
            sync()
        seconds = (time.perf_counter() - begin) / steps
    return analyse(list(prof.events()), steps, on_gpu), seconds
