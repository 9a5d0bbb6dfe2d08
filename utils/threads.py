"""How many threads a command's torch uses on a CPU, and how long they spin: chosen once, by measurement
(docs/results.md, "Threads on a busy machine"; ``python scripts/benchmark_threads.py``).

On a CPU that other processes share, a step with more threads than free cores waits at every barrier for a thread
that is not running, and OpenMP threads that spin while they wait take the cores the others need: a 2-core VM beside
one busy process ran a segment about 20x slower with 2 threads than with 1 (issue 73). So:

- **threads**: as many as the cores that are free when the command starts (:func:`choose_threads`: the cores less
  the other processes runnable then, at least 1), called where the device is chosen (:func:`utils.device.select_device`);
- **waiting**: idle OpenMP threads spin for about 30 us, then sleep (libgomp's ``GOMP_SPINCOUNT=3000``, against its
  default 300,000, about 3 ms). Measured on a 2-core AVX512-BF16 EPYC: as fast as the default alone (128 against
  127-137 solving passes a second), where ``OMP_WAIT_POLICY=PASSIVE`` lost a third (84-102); beside a busy process
  the thread choice does the work. The runtime reads it as it loads, with torch's first import, so
  :func:`set_wait_policy` runs as ``utils`` is imported, before any command imports torch. Other OpenMP runtimes
  (macOS's libomp) keep their own wait, which was not measured.

A user's own ``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is kept, and so is a
``torch.set_num_threads`` made before the choice; the device line says which (:func:`thread_note`).
``HRM_THREADS=keep`` leaves torch's and OpenMP's own defaults (the benchmark measures them so).
"""

from __future__ import annotations

import os
import time
from typing import Optional

KEEP = "keep"  # HRM_THREADS=keep: torch's own threads and OpenMP's own wait
SPIN_COUNT = "3000"  # libgomp's spins before a waiting thread sleeps: about 30 us at its 100 spins a us
_note: Optional[str] = None
_chosen: Optional[int] = None


def _kept() -> bool:
    return os.environ.get("HRM_THREADS") == KEEP


def set_wait_policy() -> None:
    """Make idle OpenMP threads sleep after a short spin (``GOMP_SPINCOUNT``, :data:`SPIN_COUNT`) unless the user set
    a wait (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``), or ``HRM_THREADS=keep``; call it before torch is imported
    (``utils/__init__.py`` does)."""
    if not _kept() and "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)


def _waiting() -> str:
    """How idle OpenMP threads wait in this process, for :func:`thread_note`."""
    policy, spins = os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")
    if policy is not None:
        return f"OMP_WAIT_POLICY={policy} (yours, kept)"
    if spins == SPIN_COUNT and not _kept():
        return f"idle threads spin about 30 us, then sleep: GOMP_SPINCOUNT={spins}"
    return f"GOMP_SPINCOUNT={spins} (yours, kept)" if spins is not None else "OpenMP's own wait"


def runnable_others(samples: int = 3, pause_s: float = 0.01) -> float:
    """Processes runnable now besides this one, the mean of ``samples`` readings of ``/proc/loadavg``'s running count
    (0 where there is no /proc: macOS, Windows)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return 0.0
        counts.append(running - 1)  # this process is running as it reads
        if i + 1 < samples:
            time.sleep(pause_s)
    return max(0.0, sum(counts) / len(counts))


def load_note() -> str:
    """The load a measurement was made under, for a length estimate: ``"a quiet machine"`` or ``"a busy machine (N
    other process(es) runnable on C cores)"`` (:func:`runnable_others` now)."""
    others = runnable_others()
    return "a quiet machine" if others < 0.5 else \
        f"a busy machine ({others:.0f} other process(es) runnable on {os.cpu_count() or 1} cores)"


def free_cores() -> float:
    """Cores not taken by other runnable processes now: ``os.cpu_count()`` less :func:`runnable_others`, at least
    1."""
    return max(1.0, (os.cpu_count() or 1) - runnable_others())


def choose_threads(deterministic: bool = False, physical_cores: Optional[int] = None) -> int:
    """Set torch's threads for this process, once (a later call returns the first choice): the user's own where set
    (``OMP_NUM_THREADS``, or a ``torch.set_num_threads`` made before this), else the free cores at start; with
    ``deterministic``, torch's default whatever the load, since a sum's bits depend on how many threads share it
    and a resumed run must compute as the first one did. ``physical_cores`` (without hyperthread siblings, where
    torch's default comes from; :func:`utils.device.physical_cores`) tells torch's default from a user's choice.
    The reason is :func:`thread_note`."""
    global _note, _chosen
    import torch

    if _chosen is not None:
        return _chosen
    cores, waiting = os.cpu_count() or 1, _waiting()
    torch_default = torch.get_num_threads() in (cores, physical_cores or cores)
    if "OMP_NUM_THREADS" in os.environ:  # torchrun sets 1 for each of several processes
        _note = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} from the environment (kept); {waiting}"
    elif _kept():
        _note = f"torch's default (HRM_THREADS=keep); {waiting}"
    elif not torch_default:
        _note = f"set by torch.set_num_threads before this command chose (kept); {waiting}"
    elif deterministic:
        _note = f"torch's default whatever the load (deterministic: a resume computes as the run did); {waiting}"
    else:
        others = runnable_others()
        threads = max(1, min(torch.get_num_threads(), round(cores - others)))
        torch.set_num_threads(threads)
        _note = (f"the machine is busy, {others:.0f} other process(es) runnable on {cores} cores: a thread a free "
                 f"core, so none waits for one; {waiting}" if others >= 0.5 else f"every core is free; {waiting}")
    _chosen = torch.get_num_threads()
    return _chosen


def threads_and_reason() -> tuple[str, str]:
    """``("N threads", why)`` of this process's choice (:func:`choose_threads` first, if it has not run)."""
    threads = choose_threads()
    return f"{threads} thread{'s' * (threads != 1)}", _note


def thread_note() -> str:
    """``N threads: why``, one line (:func:`threads_and_reason`)."""
    return ": ".join(threads_and_reason())
