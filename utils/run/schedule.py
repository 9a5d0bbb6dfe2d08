"""The learning-rate schedule both trainers use: linear warmup, then a cosine or a step decay.

``step`` is the number of the optimizer update about to be made, counting from 1, as in the
reference HRM and TRM loops (``train_state.step += 1`` happens before the lr is computed).

- ``cosine`` (HRM/TRM, ``sapientinc/HRM`` pretrain.py ``cosine_schedule_with_warmup_lr_lambda``):
  ``lr = base * step / warmup`` while ``step < warmup``, then
  ``base * (min_ratio + max(0, (1 - min_ratio) * 0.5 * (1 + cos(pi * progress))))`` with
  ``progress = (step - warmup) / max(1, total - warmup)``. With the reference default
  ``min_ratio = 1`` it is constant after warmup.
- ``step`` (CapeFormer and Pose Anything, mmcv's ``StepLrUpdaterHook`` with linear warmup):
  ``regular = base * gamma ** (number of milestones <= step - 1)``; during the first ``warmup``
  updates ``lr = regular * (1 - (1 - (step - 1) / warmup) * (1 - warmup_ratio))``, because mmcv
  counts iterations from 0. Milestones are in updates (an epoch milestone times the updates per epoch).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LRSchedule:
    """A warmup-then-decay schedule; :meth:`lr` gives the rate of each update.

    Attributes:
        base_lr: the peak learning rate.
        warmup_steps: updates of linear warmup.
        total_steps: updates in the run (``cosine`` only).
        kind: ``"cosine"`` or ``"step"``.
        min_ratio: final lr as a fraction of ``base_lr`` (``cosine``).
        milestones: updates after which the lr is multiplied by ``gamma`` (``step``).
        gamma: the step-decay factor (``step``).
        warmup_ratio: the fraction of the lr the first update gets (``step``; mmcv's ``warmup_ratio``).
    """

    base_lr: float
    warmup_steps: int
    total_steps: int
    kind: str = "cosine"
    min_ratio: float = 1.0
    milestones: tuple[int, ...] = field(default=())
    gamma: float = 0.1
    warmup_ratio: float = 0.001

    def __post_init__(self):
        if self.kind not in ("cosine", "step"):
            raise ValueError(f"lr schedule kind {self.kind!r}: use cosine or step")

    def lr(self, step: int) -> float:
        """The learning rate of update number ``step`` (1-based)."""
        if self.kind == "cosine":
            if step < self.warmup_steps:
                return self.base_lr * step / max(1, self.warmup_steps)
            progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
            cosine = (1 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
            return self.base_lr * (self.min_ratio + max(0.0, cosine))
        done = step - 1  # mmcv counts updates already made
        regular = self.base_lr * self.gamma ** bisect.bisect_right(sorted(self.milestones), done)
        if done < self.warmup_steps:
            return regular * (1 - (1 - done / self.warmup_steps) * (1 - self.warmup_ratio))
        return regular
