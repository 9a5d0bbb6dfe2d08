"""The verdict on a puzzle's answer: the :class:`Answer` a solve gives, every segment's answer kept, checked against
the puzzle's rules (utils/data/user_puzzles.py, through utils/eval/reasoning.py ``RULES``). The search
(utils/solve/anytime.py) and fixed compute (utils/solve/solving.py) both end here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from utils.data.user_puzzles import format_maze, format_sudoku
from utils.eval.reasoning import RULES


@dataclass
class Answer:
    """One puzzle answered: ``puzzle`` and ``grid`` tokens [S], ``segment_grids`` [T, S] (the answer after each ACT
    segment; after a puzzle stopped, its answer repeats), ``segment_q_halt`` [T] (the halting logit ``q_halt`` per
    segment), ``halting`` (``sigmoid(q_halt)`` of the answer given), ``segments`` used, ``votes`` (of the views, when
    several), ``problems`` (empty: a solution), the ``selection`` that picked it among rollouts and views:
    ``model`` (the Q head and the votes, the references' way) or ``checked`` (an answer that obeys the rules first),
    whether the puzzle has exactly one solution (``unique``; None where not counted), and for a maze its own
    ``shape`` (rows, cols) within the square its tokens frame it in (None: the whole square), which :attr:`text`
    shows."""

    name: str
    task: str
    puzzle: np.ndarray
    grid: np.ndarray
    segment_grids: np.ndarray
    segment_q_halt: np.ndarray
    halting: float
    segments: int
    votes: Optional[int] = None
    problems: list[str] = field(default_factory=list)
    selection: str = "model"
    unique: Optional[bool] = None
    shape: Optional[tuple[int, int]] = None

    @property
    def text(self) -> str:
        """The answer as text rows: a Sudoku's 9 rows with box separators, a maze's own rows over ``# SGo``."""
        return format_sudoku(self.grid) if self.task == "sudoku" else format_maze(self.grid, self.shape)

    @property
    def confidence(self) -> np.ndarray:
        """``sigmoid(q_halt)`` per segment, float64 [T]: the halting head's confidence that the answer is right."""
        return 0.5 * (1 + np.tanh(self.segment_q_halt.astype(np.float64) / 2))  # sigmoid without overflow

    @property
    def consistent(self) -> bool:
        """Whether the answer is a solution of the puzzle (no ``problems``)."""
        return not self.problems

    @property
    def verdict(self) -> str:
        """``consistent``, or ``NOT consistent: <why>``; with ``unique`` False, that the puzzle has several solutions."""
        several = "; the puzzle is NOT unique: it has more than one solution" if self.unique is False else ""
        return ("consistent" if self.consistent else "NOT consistent: " + "; ".join(self.problems)) + several


def answer_of(name: str, task: str, tokens: np.ndarray, row: dict[str, torch.Tensor], selection: str) -> Answer:
    """The :class:`Answer` of one puzzle from its row of :func:`utils.eval.reasoning.reason`'s output (``preds``
    [S], ``segment_preds`` [T, S], ``segment_q_halt`` [T], ``q_halt_logits``, ``segments``, ``votes`` where views
    voted; on the CPU), checked against the puzzle's rules."""
    grid = row["preds"].numpy()
    return Answer(name, task, tokens, grid, row["segment_preds"].numpy(), row["segment_q_halt"].float().numpy(),
                  torch.sigmoid(row["q_halt_logits"].float()).item(), int(row["segments"]),
                  int(row["votes"]) if "votes" in row else None, RULES[task](grid, tokens), selection)
