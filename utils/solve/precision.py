"""The precision that solving and evaluation run in (``solve.py``, the page, ``evaluate.py``, :class:`solve.Solver`),
chosen by what solves more puzzles a second, measured; training keeps its own policy (:func:`utils.device.select_dtype`:
bf16 wherever the device runs it natively, since a training step is a large batch).

What was measured (docs/results.md, "Precision for solving"), with the bundled models:

- **CPU with AVX512-BF16 and no AMX** (a 2-core AMD EPYC, Zen 4): bf16 ran 1.3-1.7x fp32's segment passes a second
  at 1-32 trajectories side by side (Sudoku; mazes 1.1-1.5x), reached the solution as often (20 of the 36 named hard
  puzzles within 32 trajectories of 4 segments, fp32 20), and under the default 6 s solved 96.4% of the outside
  yardstick (median 0.4 s a puzzle) against fp32's 95.6% (median 0.6 s): bf16;
- **CPU with AMX** (a 2-core Xeon, measured by the issue that asked for this choice): at the 12-16 trajectories a CPU
  round holds, bf16 ran 17 segment passes a second against fp32's 30, and gave the references' one answer on 17.5% of
  the outside yardstick against 21.2%: fp32;
- **CPU without native bf16** (AVX2): bf16 is emulated: fp32;
- **CUDA (compute capability >= 8) and MPS (macOS >= 14)**: not measured for solving by this project (no GPU was
  lent when it was chosen); bf16 as in training, where the devices run it natively.
"""

from __future__ import annotations

import torch

from utils.device import bf16_support, cpu_bf16_features, select_dtype
from utils.threads import threads_and_reason


def solving_dtype(device: torch.device, forced: str | None = None) -> tuple[torch.dtype, str]:
    """The activation dtype for solving and evaluating on ``device``, with the reason (module docstring).

    Args:
        forced: None/``"auto"`` for the measured choice, or ``"bfloat16"``/``"float32"``.

    Raises:
        DeviceError: ``forced`` is not one of those names.
    """
    if forced not in (None, "auto"):
        return select_dtype(device, forced)
    if device.type != "cpu":
        dtype, why = select_dtype(device)
        return dtype, f"{why}; bf16 where native, as in training (solving not measured on this kind of device)"
    if "amx_bf16" in cpu_bf16_features():
        return torch.float32, "measured on AMX CPUs: fp32 solves more puzzles a second than bf16 at a CPU round's size"
    if bf16_support(device)[0]:
        return torch.bfloat16, ("measured on AVX512-BF16 CPUs without AMX: bf16 solves as many puzzles, 1.3-1.7x "
                                "faster")
    return torch.float32, "this CPU has no native bf16"


def precision_line(device: torch.device, dtype: torch.dtype, why: str) -> str:
    """The line a solving command prints, e.g. ``device cpu, precision float32 (this CPU has no native bf16); 2
    threads (every core is free; ...)``: the threads as :func:`utils.threads.threads_and_reason` gives them."""
    threads, reason = threads_and_reason()
    return f"device {device}, precision {str(dtype).removeprefix('torch.')} ({why}); {threads} ({reason})"
