"""How long a run will take on this device, told before its first optimizer step.

The estimate is ``total_steps * FLOPs per step / (half the measured matmul rate)``:

- FLOPs per step: one training step (forward and backward of one ACT segment, and HRM's extra target pass) of the
  run's model at its local batch, traced on the ``meta`` device under ``torch.utils.flop_counter.FlopCounterMode``:
  shapes only, no memory, about a second;
- the matmul rate: a square GEMM in the run's dtype on the run's device, timed for a fraction of a second;
- one half: the share of that rate a training step reaches here (the compiled TRM quickstart and MLP recipe steps
  reach 59-75% on a CPU, eager steps less; scripts/benchmark_step.py measures it).

Evaluations are not counted, and a step can reach more than half the GEMM rate (fp32 on an AVX2 CPU: about 63%),
so the estimate is right within about a factor of two either way: 5 min for the TRM quickstart that took 5 min 16 s
on an AVX512-BF16 CPU, and 40 min for the same run that took 31 min 36 s on an AVX2-only one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

STEP_EFFICIENCY = 0.5  # share of the GEMM rate a training step reaches (see the module docstring)
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


def step_flops(meta_head, batch_size: int, seq_len: int) -> int:
    """FLOPs of one training step of ``meta_head`` (a loss head built on the ``meta`` device) at ``batch_size``."""
    batch = {"inputs": torch.ones(batch_size, seq_len, dtype=torch.int32, device="meta"),
             "labels": torch.ones(batch_size, seq_len, dtype=torch.int32, device="meta"),
             "puzzle_identifiers": torch.zeros(batch_size, dtype=torch.int32, device="meta")}
    meta_head.train()
    with FlopCounterMode(display=False) as counter:
        _, loss, *_ = meta_head(meta_head.initial_carry(batch), batch)
        loss.backward()
    return counter.get_total_flops()


def matmul_rate(device: torch.device, dtype: torch.dtype, size: int = 1024, seconds: float = 0.2) -> float:
    """FLOP/s of a ``size`` x ``size`` GEMM in ``dtype`` on ``device``, timed for about ``seconds``."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    sync = {"cuda": torch.cuda.synchronize, "mps": torch.mps.synchronize}.get(device.type, lambda: None)
    torch.mm(a, b)
    sync()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        runs += 1
        sync()
    return 2 * size**3 * runs / (time.perf_counter() - start)


def duration(seconds: float) -> str:
    """``seconds`` as a person says it: ``45 s``, ``12 min``, ``6.5 hours``, ``91 days``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.0f} days"
