"""The non-finite guard both trainers share: skip a step whose loss or gradients are NaN/inf, name the
culprits, stop after too many in a row; and reset ACT carry rows that went non-finite.

A skipped step leaves the weights, the optimizer states and the puzzle embedding untouched. Under
torchrun every rank takes the same decision (a flag per checked tensor is all-reduced), so no rank
ever waits alone in a collective.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from utils.distributed import Dist
from utils.errors import RunFailure

log = logging.getLogger(__name__)


class DivergedError(RunFailure):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def _nonfinite_flags(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``[N]`` int32 on the tensors' device: 1 where tensor i holds a NaN or inf (no host sync)."""
    norms = torch._foreach_norm([t.detach().reshape(-1).float() for t in tensors])
    return (~torch.isfinite(torch.stack([n.float() for n in norms]))).to(torch.int32)


def nonfinite_names(tensors: dict[str, torch.Tensor], rank: Dist) -> list[str]:
    """Names of the tensors that hold a NaN or inf on any rank (one device sync, one all-reduce).

    Args:
        tensors: name -> tensor (a loss, a gradient, ...); the same names in the same order on every rank.
    """
    if not tensors:
        return []
    bad = _nonfinite_flags(list(tensors.values())).cpu()
    if rank.world_size > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return [n for n, b in zip(tensors, bad.tolist()) if b]


def check_training_step(tensors: dict[str, torch.Tensor], carry, rank: Dist, step: int) -> list[str]:
    """The per-step check of an ACT trainer in one device-to-host copy (and one all-reduce under torchrun):
    the names of the tensors that hold a NaN or inf on any rank, as :func:`nonfinite_names` gives them, and
    a reset of the ACT carry rows whose recurrent state (``z_H``/``z_L``) went non-finite.

    Those rows are marked halted, so the model restarts them from ``H_init``/``L_init`` with a new puzzle at
    the next step; without this a NaN in a row's state stays there for every later segment, and every later
    step is skipped. The rows are marked on the device (a finite carry is left bitwise as it was); only
    their count, for the warning on rank 0, travels to the host with the tensors' flags, so the check costs
    one sync per step rather than two (a sync stalls the GPU's queue).

    Args:
        tensors: name -> tensor, as for :func:`nonfinite_names`.
        carry: the ACT carry (:class:`models.act.Carry`); its ``halted`` is replaced.
        step: the update number, for the warning.
    """
    inner = carry.inner_carry
    bad_rows = ~(torch.isfinite(inner.z_H).flatten(1).all(1) & torch.isfinite(inner.z_L).flatten(1).all(1))
    carry.halted = carry.halted | bad_rows
    flags = _nonfinite_flags(list(tensors.values())) if tensors else bad_rows.new_zeros(0, dtype=torch.int32)
    host = torch.cat([flags, bad_rows.sum().to(torch.int32).reshape(1)]).cpu()
    if rank.world_size > 1:
        dist.all_reduce(host)  # summed: a flag > 0 means some rank saw it; the last entry counts rows on all ranks
    *bad, reset = host.tolist()
    if reset and rank.is_main:
        log.warning("step %d: the ACT carry (z_H/z_L) went non-finite in %d row(s); they restart from H_init/L_init "
                    "with new puzzles. If this repeats, try forward_dtype=float32 or a lower lr", step, reset)
    return [n for n, b in zip(tensors, bad) if b]


class NonFiniteGuard:
    """Counts skipped steps and stops the run after ``max_in_a_row`` of them in a row.

    Args:
        max_in_a_row: consecutive non-finite steps tolerated before :class:`DivergedError`.
        advice: what to try, appended to the messages (e.g. ``"a lower lr, forward_dtype=float32"``).
    """

    def __init__(self, max_in_a_row: int, advice: str):
        self.max_in_a_row, self.advice = max_in_a_row, advice
        self.in_a_row = 0
        self.total = 0

    def step(self, step: int, culprits: list[str], rank: Dist) -> bool:
        """Record update ``step``; True when it may be applied (``culprits`` is empty).

        Raises:
            DivergedError: ``max_in_a_row`` steps in a row had culprits.
        """
        if not culprits:
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        self.total += 1
        named = ", ".join(culprits[:4]) + (f" and {len(culprits) - 4} more" if len(culprits) > 4 else "")
        if rank.is_main:
            log.warning("step %d: non-finite %s; skipped the update (%d in a row, %d in all)",
                        step, named, self.in_a_row, self.total)
        if self.in_a_row >= self.max_in_a_row:
            raise DivergedError(f"stopping at step {step}: {self.in_a_row} non-finite steps in a row (last: {named}). "
                                f"Try {self.advice}, then resume from the last checkpoint")
        return False
