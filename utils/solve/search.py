"""Test-time search over trajectories for puzzles whose answers can be checked (Sudoku, mazes): the mechanics under
anytime solving (utils/solve/anytime.py) and its measurement (scripts/measure_search.py).

A *trajectory* is one run of the model over ``segments`` ACT segments. Trajectory 0 of a solve is the model's own:
the puzzle as given, from the model's initial state, the references' evaluation of that puzzle. Trajectory k >= 1
differs from it in the sources of diversity that the field uses, each set by :class:`Search`:

- a **view** of the puzzle: for Sudoku a random element of its symmetry group (digits relabelled, rows and columns
  moved within bands and stacks, bands and stacks moved, transposed: arXiv 2601.19085), or one of the 8 dihedral
  maps of the square (rotations and reflections; the only symmetries of a maze); the answer is mapped back exactly;
- **latent noise**: Gaussian noise of std ``latent_noise`` added to the latent state after every recursion update
  (PTRM, arXiv 2605.19943, Sec. 3; :class:`models.act.LatentNoise`);
- **start noise**: Gaussian noise of std ``start_noise`` on the initial latent state (arXiv 2605.25230).

Trajectories run side by side, ``rows`` in one batch. After every segment (``check="segment"``) or after the last
only (``"end"``), each answer is mapped back to the puzzle's orientation and checked against its rules: a plain
TRM can reach a solution at one segment and leave it a few segments later (pixeli99/InfiLoop), and a check after
every segment keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from models.act import Carry, InnerCarry, LatentNoise
from utils.data.sudoku.symmetry import random_symmetry
from utils.eval.reasoning import RULES, dihedral_order, run_segments, seeded_model_randomness, stacked_initial_carry

VIEW_KINDS = ("symmetry", "dihedral", "none")
CHECKS = ("segment", "end")


@dataclass(frozen=True)
class Search:
    """How trajectories after the model's own differ from it, and when answers are checked (module docstring).

    Attributes:
        segments: ACT segments of each trajectory.
        views: ``symmetry`` (Sudoku's group; for a maze, the dihedral maps), ``dihedral`` or ``none``.
        latent_noise: std of the noise added after every recursion update (0: none).
        start_noise: std of the noise on the initial latent state (0: none).
        check: ``segment`` (every segment's answer is checked) or ``end`` (the last segment's only).
    """

    segments: int
    views: str = "symmetry"
    latent_noise: float = 0.0
    start_noise: float = 0.0
    check: str = "segment"

    def __post_init__(self):
        if self.views not in VIEW_KINDS or self.check not in CHECKS or self.segments < 1:
            raise ValueError(f"Search({self}): views one of {VIEW_KINDS}, check one of {CHECKS}, segments >= 1")
        if not (0 <= self.latent_noise <= 100 and 0 <= self.start_noise <= 100):
            raise ValueError(f"Search({self}): noise stds in 0..100")

    def describe(self) -> str:
        """One line for a report, e.g. ``4 segments, Sudoku symmetries, latent noise 0.1, checked every segment``."""
        parts = [f"{self.segments} segments", {"symmetry": "symmetry views", "dihedral": "dihedral views",
                                               "none": "the puzzle as given"}[self.views]]
        parts += [f"latent noise {self.latent_noise:g}"] * bool(self.latent_noise)
        parts += [f"start noise {self.start_noise:g}"] * bool(self.start_noise)
        return ", ".join(parts + [f"checked {'every segment' if self.check == 'segment' else 'at the end'}"])


@dataclass(frozen=True)
class View:
    """One view of a puzzle: cell ``j`` of the view is cell ``order[j]`` of the puzzle, and token ``v`` of the puzzle
    is token ``tokens[v]`` in the view (a permutation of the vocabulary)."""

    order: np.ndarray
    tokens: np.ndarray

    @staticmethod
    def identity(cells: int, vocab: int) -> "View":
        return View(np.arange(cells), np.arange(vocab))

    def apply(self, grid: np.ndarray) -> np.ndarray:
        """``grid`` [..., S] tokens seen in this view."""
        return self.tokens[grid[..., self.order]]

    def back(self, grid: np.ndarray) -> np.ndarray:
        """``grid`` [..., S] tokens of this view, in the puzzle's own orientation and labels (undoes :meth:`apply`)."""
        return np.argsort(self.tokens)[grid][..., np.argsort(self.order)]


SUDOKU_DIGIT_TOKEN = 1  # utils/data/user_puzzles.py: blank 1, digit d -> d + 1 (vocab 11)


def draw_view(task: str, kind: str, cells: int, vocab: int, rng: np.random.Generator) -> View:
    """A random view of a ``task`` puzzle of ``cells`` cells (a square grid) and ``vocab`` tokens, of ``kind``
    (:data:`VIEW_KINDS`; ``symmetry`` is a maze's dihedral map, the only symmetries of its rules)."""
    if kind == "none":
        return View.identity(cells, vocab)
    if kind == "symmetry" and task == "sudoku":
        order, digits = random_symmetry(rng)
        tokens = np.arange(vocab)
        tokens[SUDOKU_DIGIT_TOKEN + 1:SUDOKU_DIGIT_TOKEN + 10] = digits[1:] + SUDOKU_DIGIT_TOKEN
        return View(order, tokens)
    side = int(round(cells ** 0.5))
    return View(dihedral_order(side, int(rng.integers(8))), np.arange(vocab))


@dataclass
class Segment:
    """The answers of a batch of trajectories after one segment ``t`` (1-based), in the puzzle's orientation:
    ``grids`` [R, S] int64 tokens, ``q_halt`` [R] fp32 logits, ``passes`` [R] bool (None where not checked)."""

    t: int
    grids: np.ndarray
    q_halt: np.ndarray
    passes: Optional[np.ndarray]


def trajectory_views(task: str, search: Search, tokens: np.ndarray, vocab: int, first: int, count: int,
                     seed: int) -> list[View]:
    """The views of trajectories ``first .. first + count - 1`` of a solve seeded ``seed``: trajectory 0 sees the
    puzzle as given, trajectory k a view drawn from a generator seeded ``(seed, k)`` (so it does not depend on how
    trajectories are batched)."""
    return [View.identity(tokens.size, vocab) if k == 0 else
            draw_view(task, search.views, tokens.size, vocab, np.random.default_rng([seed, k]))
            for k in range(first, first + count)]


def run_trajectories(trained, task: str, tokens: np.ndarray, search: Search, first: int, count: int, seed: int,
                     device: torch.device, stop: Optional[Callable[[], bool]] = None) -> Iterator[Segment]:
    """Trajectories ``first .. first + count - 1`` of ``tokens`` [S] (module docstring) side by side; each segment's
    answers, checked where ``search.check`` says.

    The noise of a batch comes from one generator on ``device`` seeded ``seed + first``: a seed fixes a solve's
    answers on one device for one batching. Trajectory 0 gets no noise.

    Raises:
        Cancelled: ``stop`` (asked before every segment) said so.
    """
    head, vocab = trained.head, trained.vocab_size
    views = trajectory_views(task, search, tokens, vocab, first, count, seed)
    seen = torch.from_numpy(np.stack([view.apply(tokens) for view in views]).astype(np.int32)).to(device)
    batch = {"inputs": seen, "labels": seen.long(), "puzzle_identifiers": torch.zeros(count, dtype=torch.int32,
                                                                                      device=device)}
    plain = torch.tensor([k == 0 for k in range(first, first + count)], device=device)
    generator = torch.Generator(device).manual_seed(seed + first)
    with seeded_model_randomness(head, seed + first, device):  # an EqR model's own draws, seeded too
        carry = stacked_initial_carry(head, batch, [(0.0, 0)])
        if search.start_noise:
            noise = LatentNoise(torch.where(plain, 0.0, search.start_noise), generator)
            carry = Carry(InnerCarry(*(noise(z) for z in (carry.inner_carry.z_H, carry.inner_carry.z_L))), carry.steps,
                          carry.halted, carry.current_data)
        inner = head.model.inner
        inner.latent_noise = LatentNoise(torch.where(plain, 0.0, search.latent_noise), generator) \
            if search.latent_noise else None
        problems = RULES[task]
        try:
            for t, outputs in run_segments(head, carry, search.segments, stop):
                answers = outputs["logits"].argmax(-1).cpu().numpy()
                grids = np.stack([view.back(row) for view, row in zip(views, answers)])
                checked = search.check == "segment" or t == search.segments
                passes = np.array([not problems(grid, tokens) for grid in grids]) if checked else None
                yield Segment(t, grids, outputs["q_halt_logits"].float().cpu().numpy(), passes)
        finally:
            inner.latent_noise = None
