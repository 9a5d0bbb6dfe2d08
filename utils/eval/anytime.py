"""Anytime solving with checked answers: spend test-time compute on one puzzle until an answer obeys its rules, or
until its time budget is spent (``solve.py --budget``, the page's budget, ``evaluate.py --budget``).

Sudoku and mazes have rules an answer can be checked against (utils/data/user_puzzles.py); the model's own answer is
often wrong on a hard puzzle, and more test-time compute (utils/eval/reasoning.py: noisy rollouts, dihedral views)
finds a right one more often the more is spent (docs/results.md, test-time scaling). :func:`solve_anytime` spends it
in rounds:

- round 0 is the model's own answer: one rollout from its initial state, the puzzle as given, the run's segments
  (with the run's defaults, the references' evaluation of that puzzle);
- round r >= 1 answers ``2**(r-1)`` rollouts (at most :data:`ROUND_ROWS`) side by side in one batch, each from the
  initial state plus Gaussian noise with a seed of its own (no seed is used twice), in dihedral view ``r mod 8``: a
  rotated or reflected Sudoku or maze obeys the same rules and sends the model down another path;
- after each round every answer is mapped back to the puzzle's orientation and checked; the first round with an
  answer that obeys the rules ends the solve, keeping that round's passing answer with the highest ``q_halt``.

A round is sized to what the budget has left at the pass rate measured so far, and the clock is read before every
segment: a round it overtakes is abandoned, so a puzzle takes at most its budget and one segment (or round 0, the
model's own answer, which is always given, when that is longer). When no answer passed, the answer kept is the
model's most confident one (highest ``q_halt``), as the Q head would choose.

This is not the references' protocol (they take the model's one answer): a figure under it is named
:func:`protocol` ("checked, anytime, <=S s a puzzle") and reported apart from the model-only figures.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from tqdm import tqdm

from utils.eval.load import Trained
from utils.eval.stats import with_interval
from utils.eval.reasoning import (SEQUENCE_AXIS, Cancelled, TestTimeCompute, TestTimeComputeError, checked_better,
                                  dihedral_order, rollout_answers)
from utils.eval.solving import Answer, answer_of
from models.losses import IGNORE_LABEL_ID

ROUND_ROWS = 256  # rollouts in one round at most: one forward call's rows
VIEWS = 8  # the dihedral transforms of a square grid, visited one per round
DEFAULT_NOISE = 1.0  # the noise of rollouts when neither --noise nor the run's eval_noise sets one
MAX_BUDGET_S = 24 * 3600.0


def protocol(budget_s: float) -> str:
    """The name a figure measured under :func:`solve_anytime` carries, e.g. ``checked, anytime, <=8 s a puzzle``."""
    return f"checked, anytime, <={budget_s:g} s a puzzle"


def check_budget_s(budget_s: float, flag: str = "--budget") -> float:
    """``budget_s`` if it is a usable per-puzzle budget in seconds (0 < S <= a day).

    Raises:
        TestTimeComputeError: naming ``flag`` and the range.
    """
    if not (math.isfinite(budget_s) and 0 < budget_s <= MAX_BUDGET_S):
        raise TestTimeComputeError(f"{flag} {budget_s:g} is out of range: seconds a puzzle, more than 0 and at most "
                                   f"{MAX_BUDGET_S:g} (a day)")
    return budget_s


@dataclass
class Spent:
    """What a solve used: segment ``passes`` (rows x segments run, abandoned rounds' segments included), wall-clock
    ``seconds`` and ``rounds`` completed."""

    passes: int = 0
    seconds: float = 0.0
    rounds: int = 0


@dataclass
class AnytimeAnswer:
    """One puzzle solved under a budget: the kept ``answer`` (None only when stopped before round 0 ended), what was
    ``spent``, and how it ``ended``: ``consistent`` (an answer obeys the rules), ``budget`` (spent, none did) or
    ``stopped`` (the caller's ``enough``)."""

    answer: Optional[Answer]
    spent: Spent
    ended: str

    @property
    def solved(self) -> bool:
        """Whether the kept answer obeys the puzzle's rules."""
        return self.ended == "consistent"


class _Clock:
    """The stop rule of one round: asked before each segment, it counts the segments and says stop when the caller
    wants (``enough``), when ``cancel`` does (raised through), or when the deadline has passed."""

    def __init__(self, deadline: float, clock: Callable[[], float], enough: Optional[Callable[[], bool]],
                 cancel: Optional[Callable[[], bool]]):
        self.deadline, self.clock, self.enough, self.cancel = deadline, clock, enough, cancel
        self.segments, self.why = 0, None

    def __call__(self) -> bool:
        if self.cancel is not None and self.cancel():
            self.why = "cancelled"
        elif self.enough is not None and self.enough():
            self.why = "stopped"
        elif self.clock() >= self.deadline:
            self.why = "budget"
        else:
            self.segments += 1
            return False
        return True


def round_size(r: int, left_s: float, passes_per_s: float, segments: int) -> int:
    """Rollouts of round ``r`` (:func:`solve_anytime`): 1 for round 0 (always run), then ``2**(r-1)`` up to
    :data:`ROUND_ROWS`, cut to what ``left_s`` seconds hold at ``passes_per_s``; 0: none fits."""
    if r == 0:
        return 1
    return max(0, min(ROUND_ROWS, 2 ** (r - 1), int(max(left_s, 0.0) * passes_per_s / segments)))


def solve_anytime(trained: Trained, task: str, name: str, tokens: np.ndarray, budget_s: float, ttc: TestTimeCompute,
                  device: torch.device, enough: Optional[Callable[[], bool]] = None,
                  cancel: Optional[Callable[[], bool]] = None,
                  progress: Optional[Callable[[Spent, Answer], None]] = None,
                  clock: Callable[[], float] = time.monotonic) -> AnytimeAnswer:
    """Solve one puzzle (``tokens`` [S], a Sudoku or a square maze) within ``budget_s`` seconds, as the module
    docstring says; ``ttc`` gives the segments, early exit, noise std (:data:`DEFAULT_NOISE` when 0) and first seed.

    Args:
        enough: asked before every segment; True ends the solve with the best answer so far (the page's stop).
        cancel: asked before every segment; True abandons the solve (the page's client left, the server stops).
        progress: called after every round with what was spent and the answer kept so far.

    Raises:
        Cancelled: ``cancel`` said so; nothing is answered.
    """
    segments = ttc.segments or trained.cfg.arch["halt_max_steps"]
    noise = ttc.noise or DEFAULT_NOISE
    side = math.isqrt(tokens.size)
    views = VIEWS if side * side == tokens.size else 1
    start = clock()
    spent, best, ended, seed = Spent(), None, "budget", ttc.seed
    for r in itertools.count():
        now = clock()
        rows = round_size(r, start + budget_s - now, spent.passes / max(now - start, 1e-9), segments)
        if rows == 0:
            break
        draws = [(0.0, seed)] if r == 0 else [(noise, seed + i) for i in range(rows)]
        seed += rows
        stop = _Clock(start + budget_s if r else math.inf, clock, enough, cancel)  # the model's own answer, always
        try:
            found = _round(trained, task, name, tokens, ttc, device, draws, r % views, side, stop)
        except Cancelled:
            spent.passes += stop.segments * rows  # the segments the round got through
            if stop.why == "cancelled":
                raise
            ended = stop.why
            break
        spent.passes += segments * rows
        spent.rounds += 1
        spent.seconds = clock() - start
        best = found if best is None or _better(found, best) else best
        if progress is not None:
            progress(dataclasses.replace(spent), best)
        if best.consistent:
            ended = "consistent"
            break
    spent.seconds = clock() - start
    return AnytimeAnswer(best, spent, ended)


def _better(answer: Answer, kept: Answer) -> bool:
    """Checked selection's ranking (:func:`utils.eval.reasoning.checked_better`) of two answers."""
    return bool(checked_better(torch.tensor(answer.consistent), torch.tensor(answer.halting),
                               torch.tensor(kept.consistent), torch.tensor(kept.halting)))


def _round(trained: Trained, task: str, name: str, tokens: np.ndarray, ttc: TestTimeCompute, device: torch.device,
           draws: list[tuple[float, int]], view: int, side: int, stop: _Clock) -> Answer:
    """One round: the rollouts ``draws`` of the puzzle in dihedral ``view``, side by side; the round's best answer
    by checked selection, in the puzzle's own orientation."""
    order = dihedral_order(side, view) if view else np.arange(tokens.size)
    seen = torch.from_numpy(tokens[order].astype(np.int32))[None].to(device)
    batch = {"inputs": seen, "labels": seen.long(), "puzzle_identifiers": torch.zeros(1, dtype=torch.int32,
                                                                                      device=device)}
    one = dataclasses.replace(ttc, rollouts=1, views=1, keep_segments=True, checker=None)
    back = torch.from_numpy(np.argsort(order))
    best = None
    for out in rollout_answers(trained.head, trained.head, batch, one, draws, stop):
        row = {k: (v[0].cpu().index_select(SEQUENCE_AXIS[k] - 1, back) if k in SEQUENCE_AXIS else v[0].cpu())
               for k, v in out.items()}
        found = answer_of(name, task, tokens, row, "checked")
        best = found if best is None or _better(found, best) else best
    return best


def anytime_compute(args, ttc: TestTimeCompute) -> TestTimeCompute:
    """The settings each round of :func:`solve_anytime` takes from ``ttc`` (the flags' or the run's: segments, early
    exit, noise, seed) when ``args.budget`` is set: one rollout and one view, which the rounds grow themselves.

    Raises:
        TestTimeComputeError: the budget out of range, or ``--rollouts``/``--views`` given beside it.
    """
    if args.budget is None:
        return ttc
    check_budget_s(args.budget)
    for flag in ("rollouts", "views"):
        value = getattr(args, flag)
        if value is not None:
            raise TestTimeComputeError(f"--{flag} {value} with --budget: the budget grows the rollouts and turns the "
                                       f"puzzle through its views itself, round by round; drop --{flag} (or "
                                       "--budget)")
    return dataclasses.replace(ttc, rollouts=1, views=1, checker=None)



def evaluate_anytime(trained: Trained, task: str, loader, budget_s: float, ttc: TestTimeCompute,
                     device: torch.device, max_examples: Optional[int] = None) -> dict[str, float]:
    """Solve each test puzzle of ``loader`` (a :class:`utils.data.puzzle_dataset.PuzzleDataset` split, one process)
    by :func:`solve_anytime` under ``budget_s`` seconds, one puzzle at a time, and score the kept answers against the
    labels.

    Returns:
        ``anytime/exact_accuracy`` (the fraction whose answer equals the label on every labelled cell) with its 95%
        Wilson interval, ``anytime/consistent`` (the fraction whose answer obeys the rules), ``anytime/count``,
        and the median and 90th percentile over puzzles of the seconds (``anytime/seconds_median``,
        ``anytime/seconds_p90``) and of the segment passes (``anytime/passes_median``, ``anytime/passes_p90``).
    """
    exact, consistent, seconds, passes = [], [], [], []
    total = loader.num_examples if max_examples is None else min(max_examples, loader.num_examples)
    with tqdm(total=total, desc=protocol(budget_s), unit="puzzle", leave=False) as bar:
        for _set_name, batch, effective in loader:
            for tokens, labels in zip(batch["inputs"][:effective].numpy(), batch["labels"][:effective].numpy()):
                if len(exact) == total:
                    break
                solved = solve_anytime(trained, task, f"test {len(exact) + 1}", tokens, budget_s, ttc, device)
                labelled = labels != IGNORE_LABEL_ID
                exact.append(bool((solved.answer.grid[labelled] == labels[labelled]).all()))
                consistent.append(solved.solved)
                seconds.append(solved.spent.seconds)
                passes.append(solved.spent.passes)
                bar.update(1)
            if len(exact) == total:
                break
    n = len(exact)
    metrics = {"anytime/exact_accuracy": float(np.mean(exact)) if n else 0.0,
               "anytime/consistent": float(np.mean(consistent)) if n else 0.0, "anytime/count": float(n)}
    for name, values in (("seconds", seconds), ("passes", passes)):
        metrics[f"anytime/{name}_median"] = float(np.median(values)) if n else 0.0
        metrics[f"anytime/{name}_p90"] = float(np.percentile(values, 90)) if n else 0.0
    return with_interval(metrics, "anytime/exact_accuracy", n)


def anytime_line(metrics: dict[str, float], budget_s: float) -> str:
    """The one line ``evaluate.py --budget`` prints for :func:`evaluate_anytime`'s ``metrics``, naming the protocol."""
    return (f"{protocol(budget_s)}: solved {metrics['anytime/exact_accuracy']:.4f} (95% CI "
            f"{metrics['anytime/exact_accuracy_ci95_low']:.2f}-{metrics['anytime/exact_accuracy_ci95_high']:.2f}, "
            f"n={metrics['anytime/count']:.0f}); seconds median {metrics['anytime/seconds_median']:.1f}, p90 "
            f"{metrics['anytime/seconds_p90']:.1f}; segment passes median {metrics['anytime/passes_median']:,.0f}, "
            f"p90 {metrics['anytime/passes_p90']:,.0f}")
