"""The non-finite guard both trainers share: an optimizer update is applied only when everything it touches
stays finite, the culprits are named, and the run stops after too many bad steps in a row.

One guarded update (:meth:`NonFiniteGuard.update`):

1. the dense optimizers' parameters and states are copied aside (:class:`Snapshot`);
2. the dense update runs (AdamATan2, AdamW, or the GradScaler's step);
3. the loss and gradients handed in, the updated weights, and (for ACT trainers) the carry rows are
   checked for NaN/inf in **one** device-to-host copy (and one all-reduce under torchrun, so every rank
   takes the same decision and none waits alone in a collective);
4. if anything is non-finite, the weights and optimizer states are put back as they were before the
   update and the step is counted; otherwise the follow-up updates run (the sparse sign-SGD step of the
   puzzle embedding, whose result is finite whenever its gradient and its finite settings are).

So a saved checkpoint never holds a weight that an update made non-finite: with ``lr=1e30`` the very
first update overflows, is undone, and the run stops after ``max_nonfinite_steps`` with advice.
"""

from __future__ import annotations

import copy
import logging
from typing import Callable, Optional

import torch
import torch.distributed as dist

from utils.distributed import Dist
from utils.errors import RunFailure

log = logging.getLogger(__name__)


class DivergedError(RunFailure):
    """Too many optimizer steps in a row had a non-finite loss, gradient or updated weight."""


def nonfinite_flags(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``[N]`` int32 on the tensors' device: 1 where tensor i holds a NaN or inf (no host sync)."""
    if not tensors:
        return torch.zeros(0, dtype=torch.int32)
    norms = torch._foreach_norm([t.detach().reshape(-1).float() for t in tensors])
    return (~torch.isfinite(torch.stack([n.float() for n in norms]))).to(torch.int32)


class Snapshot:
    """A copy of some optimizers' parameters and state tensors, taken before an update and put back to undo it.

    The copy buffers are allocated once and reused (an optimizer's state appears at its first step, so the
    buffers are re-made when the set of tensors changes). Non-tensor state entries are deep-copied. A
    parameter without state at :meth:`take` has its state cleared again by :meth:`restore`.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        self._buffers: list[torch.Tensor] = []
        self._tensors: list[torch.Tensor] = []
        self._other: list[tuple[dict, dict]] = []

    def _params(self):
        return [(opt, p) for opt in self.optimizers for g in opt.param_groups for p in g["params"]]

    @torch.no_grad()
    def take(self) -> None:
        tensors, self._other = [], []
        for opt, p in self._params():
            tensors.append(p)
            state = opt.state.get(p, {})
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
            self._other.append((opt.state, {k: copy.deepcopy(v) for k, v in state.items()
                                            if not isinstance(v, torch.Tensor)} if state else None))
        if [t.shape for t in tensors] != [b.shape for b in self._buffers] or \
                [t.dtype for t in tensors] != [b.dtype for b in self._buffers]:
            self._buffers = [torch.empty_like(t) for t in tensors]
        if tensors:
            torch._foreach_copy_(self._buffers, tensors)
        self._tensors = tensors

    @torch.no_grad()
    def restore(self) -> None:
        if self._tensors:
            torch._foreach_copy_(self._tensors, self._buffers)
        for (opt, p), (states, other) in zip(self._params(), self._other):
            if other is None:
                states.pop(p, None)
            else:
                states[p].update(other)


class NonFiniteGuard:
    """Applies guarded updates, counts the undone ones, and stops the run after ``max_in_a_row`` in a row.

    Args:
        max_in_a_row: consecutive non-finite steps tolerated before :class:`DivergedError`.
        advice: what to try, appended to the messages (e.g. ``"a lower lr, forward_dtype=float32"``).
    """

    def __init__(self, max_in_a_row: int, advice: str):
        self.max_in_a_row, self.advice = max_in_a_row, advice
        self.in_a_row = 0
        self.total = 0
        self._snapshot: Optional[Snapshot] = None

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "total": self.total}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row, self.total = int(state["in_a_row"]), int(state["total"])

    def update(self, step: int, checked: dict[str, torch.Tensor], optimizers: list[torch.optim.Optimizer],
               apply: Callable[[], None], weights: dict[str, torch.Tensor], rank: Dist,
               then: Optional[Callable[[], None]] = None, carry=None) -> bool:
        """One guarded update (see the module docstring); True when it was kept.

        Args:
            step: the update's number, for messages.
            checked: name -> tensor (the loss, gradients) that must be finite; the same names in the same order
                on every rank.
            optimizers: the dense optimizers ``apply`` steps: their parameters and states are snapshotted, and
                their parameters checked after the update.
            apply: makes the dense update (sets nothing else).
            weights: name -> parameter, checked after the update (the parameters ``optimizers`` hold).
            then: the updates to make only when all is finite (the sparse puzzle-embedding step).
            carry: an ACT carry (:class:`models.act.Carry`): rows whose recurrent state went non-finite restart
                from the initial state with a new puzzle (:meth:`~models.act.Carry.restart_nonfinite_rows`);
                their count shares the same host copy.

        Raises:
            DivergedError: ``max_in_a_row`` updates in a row were undone.
        """
        if self._snapshot is None or self._snapshot.optimizers != optimizers:  # the buffers are kept across steps
            self._snapshot = Snapshot(optimizers)
        snapshot = self._snapshot
        snapshot.take()
        apply()
        names = [*checked, *(f"updated weight {n}" for n in weights)]
        flags = nonfinite_flags([*checked.values(), *weights.values()])
        restarted = carry.restart_nonfinite_rows() if carry is not None else flags.new_zeros(())
        host = torch.cat([flags.to(restarted.device), restarted.to(torch.int32).reshape(1)]).cpu()
        if rank.world_size > 1:
            dist.all_reduce(host)  # summed: a flag > 0 means some rank saw it; the last entry counts rows on all ranks
        *bad, reset = host.tolist()
        if reset and rank.is_main:
            log.warning("step %d: the ACT carry went non-finite in %d row(s); they restart with new puzzles. If this "
                        "repeats, try forward_dtype=float32 or a lower lr", step, reset)
        culprits = [n for n, b in zip(names, bad) if b]
        if culprits:
            snapshot.restore()
            self._count(step, culprits, rank)
            return False
        self.in_a_row = 0
        if then is not None:
            then()
        return True

    def _count(self, step: int, culprits: list[str], rank: Dist) -> None:
        self.in_a_row += 1
        self.total += 1
        named = ", ".join(culprits[:4]) + (f" and {len(culprits) - 4} more" if len(culprits) > 4 else "")
        if rank.is_main:
            log.warning("step %d: non-finite %s; the update was undone (%d in a row, %d in all)",
                        step, named, self.in_a_row, self.total)
        if self.in_a_row >= self.max_in_a_row:
            raise DivergedError(f"stopping at step {step}: {self.in_a_row} non-finite steps in a row (last: {named}). "
                                f"Try {self.advice}, then resume from the last checkpoint")

