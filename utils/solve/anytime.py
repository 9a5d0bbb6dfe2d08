"""Anytime solving with checked answers: spend test-time compute on one puzzle until an answer obeys its rules, or
until its time budget is spent (``solve.py --budget``, the page's budget, ``evaluate.py --budget``).

Sudoku and mazes have rules an answer can be checked against (utils/data/user_puzzles.py); the model's own answer is
often wrong on a hard puzzle, and more trajectories find a right one more often the more are run (docs/results.md,
"Test-time search"). :func:`solve_anytime` first says what the puzzle is: a Sudoku with no solution (an exact search,
utils/data/sudoku/rating.py) or a maze whose S and G are not connected ends at once, nothing spent; one with several
solutions is solved, and its answer says it is not unique. Then it runs trajectories (utils/solve/search.py) in
rounds:

- round 0 is the model's own answer: one trajectory from its initial state, the puzzle as given (with the run's
  defaults, the references' evaluation of that puzzle);
- round r >= 1 runs ``2**(r-1)`` trajectories side by side (at most :func:`utils.eval.reasoning.rows_per_call`
  rows, the fastest batch on the device), each in a view of its own and with the noise :class:`Search` sets;
- every segment's answers are mapped back to the puzzle's orientation and checked, and the first answer that
  obeys the rules ends the solve (the most confident, ``q_halt``, of that segment's passing ones).

The budget is a ceiling: the clock is read before every segment, round 0's included, so a solve takes at most its
budget and one segment (the first segment of round 0 always runs, so that there is an answer); a round the
deadline overtakes is cut there, and its segments' answers count. When no answer passed, the answer kept is the
model's most confident one (highest ``q_halt``), as the Q head would choose.

This is not the references' protocol (they take the model's one answer): a figure under it is named
:func:`protocol` ("checked, anytime, <=S s a puzzle") and reported apart from the model-only figures.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np
import torch
from tqdm import tqdm

from models.losses import IGNORE_LABEL_ID
from utils.data.user_puzzles import count_puzzle_solutions
from utils.eval.load import Trained
from utils.eval.reasoning import (RULES, Cancelled, TestTimeCompute, TestTimeComputeError, checked_better,
                                  rows_per_call)
from utils.solve.search import Search, Segment, run_trajectories
from utils.solve.verdict import Answer
from utils.eval.stats import with_interval

MAX_BUDGET_S = 24 * 3600.0
log = logging.getLogger(__name__)

CUTOFFS_S = (1.0, 6.0, 60.0)  # the shorter budgets a longer run also reports: the GPU's 1 s, solve.py's 6 s, 60 s
PROGRESS_LOG_S = 60.0  # in a redirected log, a progress line at most this often instead of a bar
UNSOLVABLE = {"sudoku": "this Sudoku has no solution (an exact search found none): no answer can obey its rules",
              "maze": "S and G are not connected in this maze: no path can be marked"}


def protocol(budget_s: float) -> str:
    """The name a figure measured under :func:`solve_anytime` carries, e.g. ``checked, anytime, <=8 s a puzzle``."""
    return f"checked, anytime, <={budget_s:g} s a puzzle"


def check_budget_s(budget_s: float, flag: str = "--budget") -> float:
    """``budget_s`` as a float, if it is a usable per-puzzle budget in seconds: a real number (an int or a float, not
    a bool or a string), 0 < S <= a day.

    Raises:
        TestTimeComputeError: naming ``flag`` and the range, or the type given.
    """
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)):
        raise TestTimeComputeError(f"{flag} {budget_s!r} is not a number of seconds: give an int or a float, more "
                                   f"than 0 and at most {MAX_BUDGET_S:g} (a day)")
    if not (math.isfinite(budget_s) and 0 < budget_s <= MAX_BUDGET_S):
        raise TestTimeComputeError(f"{flag} {budget_s:g} is out of range: seconds a puzzle, more than 0 and at most "
                                   f"{MAX_BUDGET_S:g} (a day)")
    return float(budget_s)


def segments_for(trained: Trained, seq_len: int, segments: int) -> int:
    """ACT segments a trajectory of ``trained`` runs on a puzzle of ``seq_len`` cells, given the run's ``segments``
    for its own size: as many, or for a grid model on a larger square, ``segments`` times the ratio of the sides,
    rounded up (its blocks carry information a fixed number of cells a segment, and a shortest path grows about
    as the side: Maze-Hard's 110 moves at 30x30 against about 50 at 16x16, utils/data/maze.py)."""
    side, own = math.isqrt(seq_len), math.isqrt(trained.seq_len)
    if not trained.grid or side <= own:
        return segments
    return math.ceil(segments * side / own)


def default_search(trained: Trained, ttc: TestTimeCompute, seq_len: Optional[int] = None) -> Search:
    """The search anytime solving runs (docs/results.md, "Test-time search", gives the measurement behind it):
    the run's segments (``ttc.segments`` or ``halt_max_steps``; for a grid model on a puzzle of ``seq_len`` cells
    larger than it trained on, more: :func:`segments_for`), symmetry views, latent noise of std
    ``ttc.noise`` at every recursion update (:func:`anytime_compute` sets it), a check after every segment."""
    segments = ttc.segments or trained.cfg.arch["halt_max_steps"]
    if ttc.segments is None and seq_len is not None:
        segments = segments_for(trained, seq_len, segments)
    return Search(segments, "symmetry", ttc.noise)


# The std of the latent noise when --noise does not set one. Measured (docs/results.md, "Test-time search"): with
# Sudoku's symmetry views and 4-segment trajectories, noise 0.3 at every recursion update solved 20 of the 36 named
# hard puzzles within 32 trajectories (none: 19; noise alone, no views: 2 of 25) and no fewer mazes than none.
LATENT_NOISE = 0.3


@dataclass
class Spent:
    """What a solve used: segment ``passes`` (rows x segments run, cut rounds' segments included), wall-clock
    ``seconds``, ``rounds`` run (a cut one included) and ``trajectories`` started."""

    passes: int = 0
    seconds: float = 0.0
    rounds: int = 0
    trajectories: int = 0


@dataclass
class AnytimeAnswer:
    """One puzzle solved under a budget: the kept ``answer`` (None when the puzzle has no solution), what was
    ``spent``, and how it ``ended``: ``consistent`` (an answer obeys the rules), ``budget`` (spent, none did),
    ``stopped`` (the caller's ``enough``) or ``unsolvable`` (no answer can obey the rules: nothing was spent).
    ``own_seconds``: where the budget ended before the model's own answer (round 0) was complete, about the
    seconds it needs here; else None."""

    answer: Optional[Answer]
    spent: Spent
    ended: str
    own_seconds: Optional[float] = None

    @property
    def solved(self) -> bool:
        """Whether the kept answer obeys the puzzle's rules."""
        return self.ended == "consistent"


class _Clock:
    """The stop rule of one round: asked before each segment, it says stop when the caller wants (``enough``), when
    ``cancel`` does (raised through), or when the deadline has passed (never before ``free`` segments)."""

    def __init__(self, deadline: float, clock: Callable[[], float], enough: Optional[Callable[[], bool]],
                 cancel: Optional[Callable[[], bool]], free: int = 0):
        self.deadline, self.clock, self.enough, self.cancel, self.free = deadline, clock, enough, cancel, free
        self.segments, self.why = 0, None

    def __call__(self) -> bool:
        if self.cancel is not None and self.cancel():
            self.why = "cancelled"
        elif self.enough is not None and self.enough():
            self.why = "stopped"
        elif self.segments >= self.free and self.clock() >= self.deadline:
            self.why = "budget"
        else:
            self.segments += 1
            return False
        return True


def round_rows(r: int, most: int) -> int:
    """Trajectories of round ``r`` (:func:`solve_anytime`): 1 for round 0, then ``2**(r-1)`` up to ``most``."""
    return 1 if r == 0 else min(most, 2 ** (r - 1))


def solve_anytime(trained: Trained, task: str, name: str, tokens: np.ndarray, budget_s: float, ttc: TestTimeCompute,
                  device: torch.device, enough: Optional[Callable[[], bool]] = None,
                  cancel: Optional[Callable[[], bool]] = None,
                  progress: Optional[Callable[[Spent, Answer], None]] = None,
                  clock: Callable[[], float] = time.monotonic, search: Optional[Search] = None,
                  solutions: Optional[int] = None) -> AnytimeAnswer:
    """Solve one puzzle (``tokens`` [S], a Sudoku or a square maze) within ``budget_s`` seconds, as the module
    docstring says; ``search`` (default :func:`default_search` of ``ttc``) sets the trajectories, ``ttc.seed``
    their first seed.

    Args:
        solutions: the puzzle's solutions, counted up to 2 (:func:`utils.solve.precheck.prepare` counts them; None:
            counted here).
        enough: asked before every segment; True ends the solve with the best answer so far (the page's stop).
        cancel: asked before every segment; True abandons the solve (the page's client left, the server stops).
        progress: called after every round with what was spent and the answer kept so far.

    Raises:
        Cancelled: ``cancel`` said so; nothing is answered.
    """
    search = search or default_search(trained, ttc, tokens.size)
    solutions = count_puzzle_solutions(task, tokens) if solutions is None else solutions
    if solutions == 0:
        return AnytimeAnswer(None, Spent(), "unsolvable")
    most = rows_per_call(device, tokens.size)
    start = clock()
    spent, best, ended, own_seconds = Spent(), None, "budget", None
    for r in itertools.count():
        rows = round_rows(r, most)
        stop = _Clock(start + budget_s, clock, enough, cancel, free=1 if r == 0 else 0)
        frames: list[Segment] = []
        try:
            for segment in run_trajectories(trained, task, tokens, search, spent.trajectories, rows, ttc.seed,
                                            device, stop):
                frames.append(segment)
                spent.passes += rows
                best = _keep(best, frames, name, task, tokens, solutions)
                if best.consistent:
                    break
        except Cancelled:
            if stop.why == "cancelled":
                raise
            ended = stop.why
        if not frames:  # stopped before its first segment
            break
        spent.rounds, spent.trajectories = r + 1, spent.trajectories + rows
        spent.seconds = clock() - start
        if r == 0 and len(frames) < search.segments and not best.consistent:
            own_seconds = spent.seconds * search.segments / len(frames)
        if progress is not None:
            progress(replace(spent), best)
        if best.consistent:
            ended = "consistent"
            break
        if stop.why:
            break
    spent.seconds = clock() - start
    return AnytimeAnswer(best, spent, ended, own_seconds)


def _keep(best: Optional[Answer], frames: list[Segment], name: str, task: str, tokens: np.ndarray,
          solutions: int) -> Answer:
    """``best``, or the last segment's best answer (one that passes first, then the highest ``q_halt``) where that
    ranks higher under checked selection, as an :class:`Answer` with its trajectory's segments."""
    last = frames[-1]
    passes = last.passes if last.passes is not None else np.zeros(len(last.q_halt), bool)
    i = int(np.lexsort((last.q_halt, passes))[-1])
    if best is not None and not checked_better(torch.tensor(passes[i]), torch.tensor(last.q_halt[i]),
                                               torch.tensor(best.consistent), torch.tensor(best.segment_q_halt[-1])):
        return best
    return Answer(name, task, tokens, last.grids[i], np.stack([f.grids[i] for f in frames]),
                  np.array([f.q_halt[i] for f in frames], np.float32), float(torch.sigmoid(torch.tensor(last.q_halt[i]))),
                  last.t, None, RULES[task](last.grids[i], tokens), "checked", unique=solutions == 1)


def anytime_compute(args, ttc: TestTimeCompute) -> TestTimeCompute:
    """The settings each round of :func:`solve_anytime` takes from ``ttc`` (the flags' or the run's: segments, early
    exit, seed) when ``args.budget`` is set: one rollout and one view, which the rounds grow themselves, and as
    ``noise`` the std of the latent noise (``--noise``, 0 for none; else :data:`LATENT_NOISE`).

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
    noise = LATENT_NOISE if args.noise is None else args.noise  # not the run's eval_noise: that is start noise
    return replace(ttc, rollouts=1, views=1, checker=None, noise=noise)


def evaluate_anytime(trained: Trained, task: str, loader, budget_s: float, ttc: TestTimeCompute,
                     device: torch.device, max_examples: Optional[int] = None) -> dict[str, float]:
    """Solve each test puzzle of ``loader`` (a :class:`utils.data.puzzle_dataset.PuzzleDataset` split, one process)
    by :func:`solve_anytime` under ``budget_s`` seconds, one puzzle at a time, and score the kept answers against the
    labels. Progress: a bar on a terminal; in a redirected log, a line at most every :data:`PROGRESS_LOG_S` seconds
    (puzzles done, solved so far, seconds spent), so a long run is never silent.

    Returns:
        ``anytime/exact_accuracy`` (the fraction whose answer equals the label on every labelled cell) with its 95%
        Wilson interval, ``anytime/consistent`` (the fraction whose answer obeys the rules), ``anytime/count``,
        the median and 90th percentile over puzzles of the seconds (``anytime/seconds_median``,
        ``anytime/seconds_p90``) and of the segment passes (``anytime/passes_median``, ``anytime/passes_p90``),
        and for each of :data:`CUTOFFS_S` below ``budget_s`` the fraction solved within it (:func:`solved_within`).
    """
    exact, consistent, seconds, passes = [], [], [], []
    total = loader.num_examples if max_examples is None else min(max_examples, loader.num_examples)
    last_line = time.monotonic()
    with tqdm(total=total, desc=protocol(budget_s), unit="puzzle", leave=False,
              disable=not sys.stderr.isatty()) as bar:  # a bar only on a terminal; a log gets lines (below)
        for _set_name, batch, effective in loader:
            for tokens, labels in zip(batch["inputs"][:effective].numpy(), batch["labels"][:effective].numpy()):
                if len(exact) == total:
                    break
                solved = solve_anytime(trained, task, f"test {len(exact) + 1}", tokens, budget_s, ttc, device)
                labelled = labels != IGNORE_LABEL_ID
                exact.append(solved.answer is not None and bool((solved.answer.grid[labelled] ==
                                                                 labels[labelled]).all()))
                consistent.append(solved.solved)
                seconds.append(solved.spent.seconds)
                passes.append(solved.spent.passes)
                bar.update(1)
                if bar.disable and time.monotonic() - last_line >= PROGRESS_LOG_S:  # a long run is never silent
                    log.info("%s: %d of %d puzzles, %d solved exactly, %.0f s spent", protocol(budget_s),
                             len(exact), total, sum(exact), sum(seconds))
                    last_line = time.monotonic()
            if len(exact) == total:
                break
    n = len(exact)
    metrics = {"anytime/exact_accuracy": float(np.mean(exact)) if n else 0.0,
               "anytime/consistent": float(np.mean(consistent)) if n else 0.0, "anytime/count": float(n)}
    for name, values in (("seconds", seconds), ("passes", passes)):
        metrics[f"anytime/{name}_median"] = float(np.median(values)) if n else 0.0
        metrics[f"anytime/{name}_p90"] = float(np.percentile(values, 90)) if n else 0.0
    metrics.update(solved_within(exact, seconds, budget_s))
    return with_interval(metrics, "anytime/exact_accuracy", n)


def solved_within(exact: list[bool], seconds: list[float], budget_s: float) -> dict[str, float]:
    """``anytime/solved_within_<S>s``: the fraction of puzzles answered exactly within S seconds, for each S of
    :data:`CUTOFFS_S` below ``budget_s``, read off one run under ``budget_s``.

    The rounds do not depend on the budget (the module docstring), so a puzzle solved by S seconds here is solved the
    same way under a budget of S. The figure is a lower bound on that protocol's: a budget of S also lets a segment
    begun before S finish, which this count does not.

    Args:
        exact: per puzzle, whether its kept answer equals the label.
        seconds: per puzzle, the seconds its solve took (the same order).
    """
    n = len(exact)
    return {f"anytime/solved_within_{cut:g}s": (sum(e and s <= cut for e, s in zip(exact, seconds)) / n if n else 0.0)
            for cut in CUTOFFS_S if cut < budget_s}


def anytime_line(metrics: dict[str, float], budget_s: float) -> str:
    """The one line ``evaluate.py --budget`` prints for :func:`evaluate_anytime`'s ``metrics``, naming the protocol."""
    return (f"{protocol(budget_s)}: solved {metrics['anytime/exact_accuracy']:.4f} (95% CI "
            f"{metrics['anytime/exact_accuracy_ci95_low']:.2f}-{metrics['anytime/exact_accuracy_ci95_high']:.2f}, "
            f"n={metrics['anytime/count']:.0f}); seconds median {metrics['anytime/seconds_median']:.1f}, p90 "
            f"{metrics['anytime/seconds_p90']:.1f}; segment passes median {metrics['anytime/passes_median']:,.0f}, "
            f"p90 {metrics['anytime/passes_p90']:,.0f}"
            + "".join(f"; within {cut:g} s {metrics[f'anytime/solved_within_{cut:g}s']:.4f}"
                      for cut in CUTOFFS_S if f"anytime/solved_within_{cut:g}s" in metrics))
