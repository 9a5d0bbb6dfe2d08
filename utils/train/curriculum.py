"""Progressive depth curriculum (CGAR's PDC) and the training FLOPs it spends, step by step.

CGAR (Qasim and Zhang, "Accelerating Training Speed of Tiny Recursive Models with Curriculum Guided Adaptive
Recursion", arXiv 2511.08653, Sec. 3.3) trains TRM shallow first and deep last: on Sudoku-Extreme its schedule is
``(H_cycles, L_cycles)`` = (1, 2) for the first 30% of training, (2, 4) to 60%, and the full (3, 6) after, which
alone trained 2.26x faster at -1.2 points. The setting ``depth_curriculum`` writes such a schedule as a list of
``[until, H_cycles, L_cycles]`` stages, ``until`` being the fraction of the run's optimizer steps at which the stage
ends; after the last stage the architecture's own depth applies (CGAR's: ``[[0.3, 1, 2], [0.6, 2, 4]]``). An empty
list (the default, and every reference recipe) trains at full depth throughout, as HRM and TRM do; a single stage
ending at 1.0 trains at its depth throughout (``cfg_pretrain_trm_cpu_expert``: (1, 2), run at (3, 4)). Evaluations
always run the architecture's full depth: the curve then measures the model as it will be used.

The run's training FLOPs (``train/pflop`` in metrics.jsonl) count each optimizer step at its stage's depth, traced
once per stage by :func:`utils.run.estimate.step_flops`; that is the x axis on which recipes are compared
(scripts/compute_curve.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from utils.config import ConfigError


@dataclass(frozen=True)
class DepthStage:
    """One stage of a depth curriculum: steps ``< until * total_steps`` (after the previous stage's) run
    ``H_cycles`` x ``L_cycles``."""

    until: float
    H_cycles: int
    L_cycles: int


class DepthCurriculum:
    """The depth each optimizer step trains at, and the FLOPs spent up to a step.

    Args:
        stages: ``[[until, H_cycles, L_cycles], ...]`` (the ``depth_curriculum`` setting), ``until`` strictly
            increasing in (0, 1]; empty for none.
        full: the architecture's ``(H_cycles, L_cycles)``.
        total_steps: optimizer steps of the whole run.

    Raises:
        ConfigError: a stage that is not three numbers, fractions out of order or outside (0, 1], cycles below 1.
    """

    def __init__(self, stages: list, full: tuple[int, int], total_steps: int):
        self.full, self.total_steps = full, total_steps
        self.stages = [_stage(entry) for entry in stages]
        ends = [s.until for s in self.stages]
        if any(not 0 < u <= 1 for u in ends) or ends != sorted(set(ends)):
            raise ConfigError(f"depth_curriculum={stages}: the stages' first numbers (the fraction of the run at which "
                              "each ends) must increase strictly within (0, 1], e.g. [[0.3,1,2],[0.6,2,4]]")
        # The first step of each later stage, and of the full depth after the last.
        self.starts = [int(s.until * total_steps) for s in self.stages]

    def depth(self, step: int) -> tuple[int, int]:
        """``(H_cycles, L_cycles)`` of optimizer step ``step + 1`` (``step`` steps done before it)."""
        for stage, end in zip(self.stages, self.starts):
            if step < end:
                return stage.H_cycles, stage.L_cycles
        return self.full

    def segments(self) -> list[tuple[int, int, tuple[int, int]]]:
        """The run as ``(first step, end step, depth)`` pieces, in order, empty pieces left out."""
        pieces, start = [], 0
        for stage, end in zip(self.stages, self.starts):
            if end > start:
                pieces.append((start, end, (stage.H_cycles, stage.L_cycles)))
            start = max(start, end)
        if self.total_steps > start:
            pieces.append((start, self.total_steps, self.full))
        return pieces

    def flops_through(self, step: int, flops_of: Callable[[tuple[int, int]], float]) -> float:
        """Training FLOPs of the first ``step`` optimizer steps, ``flops_of(depth)`` being one step's at a depth."""
        return sum(max(0, min(step, end) - start) * flops_of(depth) for start, end, depth in self.segments())


def set_depth(model, depth: tuple[int, int]) -> None:
    """Make ``model`` (an :class:`models.act.ACTModel`; its inner network shares the config) run ``depth`` =
    ``(H_cycles, L_cycles)`` from its next call. A compiled model recompiles once per new depth."""
    model.config.H_cycles, model.config.L_cycles = depth


def _stage(entry) -> DepthStage:
    ok = (isinstance(entry, (list, tuple)) and len(entry) == 3 and isinstance(entry[0], (int, float))
          and all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in entry[1:]))
    if not ok:
        raise ConfigError(f"depth_curriculum: stage {entry!r} must be [until, H_cycles, L_cycles] with until a "
                          "fraction of the run and cycles >= 1, e.g. depth_curriculum=[[0.3,1,2],[0.6,2,4]]")
    return DepthStage(float(entry[0]), int(entry[1]), int(entry[2]))
