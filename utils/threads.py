"""How many threads a command's torch uses on a CPU, and how they wait: chosen once, by measurement
(docs/results.md, "Threads on a busy machine"; ``python scripts/benchmark_threads.py``).

On a CPU that other processes share, OpenMP threads that spin while they wait for work take the cores the others
need, and a step then waits for a thread that is not running: a 2-core VM beside one busy process ran a segment about
20x slower with 2 spinning threads than with 1 (issue 73). So:

- **waiting**: idle OpenMP threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``). The OpenMP runtime reads this when it
  starts, with torch's first import, so :func:`set_wait_policy` runs as ``utils`` is imported, before any command
  imports torch;
- **threads**: as many as the cores that are free when the command starts (:func:`free_cores`: the cores less the
  other processes runnable then), at least 1 (:func:`choose_threads`, called where the device is chosen).

A user's own ``OMP_NUM_THREADS`` or ``OMP_WAIT_POLICY`` is kept, and so is a ``torch.set_num_threads`` made before the
choice; the device line says which (:func:`thread_note`). ``HRM_THREADS=keep`` leaves torch's own defaults (the
benchmark measures them so).
"""

from __future__ import annotations

import os
import time
from typing import Optional

KEEP = "keep"  # HRM_THREADS=keep: torch's own threads and OpenMP's own wait
_note: Optional[str] = None
_chosen: Optional[int] = None


def _kept() -> bool:
    return os.environ.get("HRM_THREADS") == KEEP


def set_wait_policy() -> None:
    """Make idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``) unless the user set a policy, or
    ``HRM_THREADS=keep``; call it before torch is imported (``utils/__init__.py`` does)."""
    if not _kept():
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


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


def free_cores() -> float:
    """Cores not taken by other runnable processes now: ``os.cpu_count()`` less :func:`runnable_others`, at least
    1."""
    return max(1.0, (os.cpu_count() or 1) - runnable_others())


def choose_threads() -> int:
    """Set torch's threads for this process, once (a later call returns the first choice): the user's own where set
    (``OMP_NUM_THREADS``, or a ``torch.set_num_threads`` made before this), else the free cores at start. The reason
    is :func:`thread_note`."""
    global _note, _chosen
    import torch

    if _chosen is not None:
        return torch.get_num_threads()
    cores = os.cpu_count() or 1
    wait = os.environ.get("OMP_WAIT_POLICY")
    waiting = "idle threads sleep (OMP_WAIT_POLICY=PASSIVE)" if wait == "PASSIVE" else \
        f"OpenMP's {'default' if wait is None else wait} wait"
    if "OMP_NUM_THREADS" in os.environ:
        _note = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} (yours, kept); {waiting}"
    elif _kept():
        _note = f"torch's default (HRM_THREADS=keep); {waiting}"
    elif torch.get_num_threads() != cores:
        _note = f"set by torch.set_num_threads before this command chose (kept); {waiting}"
    else:
        others = runnable_others()
        threads = max(1, min(cores, round(cores - others)))
        torch.set_num_threads(threads)
        _note = (f"the free cores at start ({others:.0f} other process(es) runnable on {cores} cores); {waiting}")
    _chosen = torch.get_num_threads()
    return _chosen


def thread_note() -> str:
    """``N threads: why`` (:func:`choose_threads` first, if it has not run)."""
    threads = choose_threads()
    return f"{threads} thread{'s' * (threads != 1)}: {_note}"
