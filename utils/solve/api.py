"""The solver called from your own code: ``import solve; solver = solve.Solver()`` (solve.py exports this class).

    import solve

    solver = solve.Solver()                                   # the bundled models, on the best device
    found = solver.sudoku("...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5....")
    print(found.text, found.consistent, found.unique, found.passes, found.seconds)
    for found in solver.sudokus(open("puzzles.txt"), budget=2.0):   # answers as they are found
        print(found.consistent)

Each puzzle is solved as ``solve.py`` solves it: checked, anytime (utils/solve/anytime.py) within ``budget`` seconds,
in the precision measured to solve the most puzzles a second (utils/solve/precision.py). A figure from it is under
that protocol (:attr:`Solution.protocol`), not the references' one answer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from collections.abc import Iterable
from typing import Iterator, Optional

import numpy as np

from utils.data.user_puzzles import PuzzleInputError, parse_maze, parse_sudoku, puzzle_text
from utils.device import select_device
from utils.solve.anytime import LATENT_NOISE, UNSOLVABLE, check_budget_s, protocol, solve_anytime
from utils.eval.load import Trained
from utils.solve.precision import solving_dtype
from utils.eval.reasoning import MAX_SEED, TestTimeCompute, TestTimeComputeError
from utils.solve.precheck import prepare
from utils.solve.solving import open_model

__all__ = ["Solver", "Solution", "PuzzleInputError"]


@dataclass(frozen=True)
class Solution:
    """One puzzle answered by :class:`Solver`.

    Attributes:
        task: ``sudoku`` or ``maze``.
        text: the answer grid as text (a Sudoku as 81 digits, a maze as rows over ``# SGo``); "" when the puzzle has
            no solution.
        consistent: whether the answer obeys the puzzle's rules (for a puzzle with one solution: it is the solution).
        unique: whether the puzzle has exactly one solution (counted exactly before solving).
        ended: ``consistent``, ``budget`` (spent, none obeyed the rules) or ``unsolvable`` (nothing was run).
        problems: what keeps the answer from obeying the rules (empty when consistent).
        protocol: the protocol the answer was found under, e.g. ``checked, anytime, <=6 s a puzzle``.
        passes: segment passes spent (trajectories x segments run).
        seconds: wall-clock seconds spent solving, the model's load excluded.
        segments: the kept trajectory's answer after each segment, as text, the last equal to ``text``.
    """

    task: str
    text: str
    consistent: bool
    unique: bool
    ended: str
    problems: tuple[str, ...]
    protocol: str
    passes: int
    seconds: float
    segments: tuple[str, ...]


def _text(puzzle: object, what: str) -> str:
    """``puzzle`` if it is a str.

    Raises:
        PuzzleInputError: any other type (bytes: decode them first; a number, None, a list, an array).
    """
    if isinstance(puzzle, str):
        return puzzle
    hint = ": decode it first (puzzle.decode())" if isinstance(puzzle, (bytes, bytearray)) else ""
    raise PuzzleInputError(f"{what} is a {type(puzzle).__name__}, not a str of its cells{hint}")


class Solver:
    """Solve Sudoku and mazes from Python (module docstring). Models load on first use, one a task.

    One puzzle at a time: threads that share a Solver take turns (a solve sets state on its model, the
    search's latent noise), and a puzzle's budget starts when its turn comes. ``device``, ``dtype`` with
    ``dtype_reason``, and ``threads`` (``"N threads: why"``, chosen once a process by utils/threads.py) say how it
    solves.

    Args:
        checkpoint: a Sudoku or maze checkpoint (a file, a run directory, ``hf://owner/repo``) used for its task;
            None: the bundled models (a Sudoku, and mazes of 10x10).
        device: ``auto``, ``cpu``, ``mps``, ``cuda`` or ``cuda:N``.
        dtype: ``auto`` (measured per device, utils/solve/precision.py), ``float32`` or ``bfloat16``.
        seed: the first seed of the trajectories' noise and views, an int in 0..2**62. It fixes which trajectories a
            solve runs and in what order, on one device; the answer kept also depends on how many rounds the budget
            allowed, so two solves of one puzzle give the same answer when it is found in the same round (always so
            for an answer found within the budget on an idle machine, not across budgets or machines).

    Raises:
        DeviceError: a device this machine does not have, or a dtype not named above.
        TestTimeComputeError: a seed that is not an int in range.
    """

    def __init__(self, checkpoint: Optional[str] = None, device: str = "auto", dtype: str = "auto", seed: int = 0):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise TestTimeComputeError(f"seed={seed!r}: give an int in 0..{MAX_SEED}")
        choice = select_device(device)
        self.device, self.threads = choice.device, choice.threads  # threads: "N threads: why" (utils/threads.py)
        self.dtype, self.dtype_reason = solving_dtype(self.device, dtype)
        self.checkpoint, self.seed = checkpoint, seed
        self._models: dict[tuple[str, int], Trained] = {}
        self._turn = threading.Lock()

    def sudoku(self, puzzle: str, budget: float = 6.0) -> Solution:
        """Solve one Sudoku: 81 characters, row by row, ``1``-``9`` for givens and ``.`` or ``0`` for blanks.

        Args:
            budget: seconds at most (0 < budget <= a day).

        Raises:
            PuzzleInputError: not a str, not a Sudoku (the message says where and why), or a checkpoint of other
                puzzles.
            TestTimeComputeError: a budget that is not a number of seconds in range.
        """
        return self._solve("sudoku", parse_sudoku(_text(puzzle, "the Sudoku"), "the Sudoku"), budget)

    def maze(self, text: str, budget: float = 6.0) -> Solution:
        """Solve one maze: a text grid, one line per row, any rectangle, of ``#`` (wall), space (open), ``S`` and
        ``G`` (the spellings utils/data/user_puzzles.py reads: ``E`` for the goal, ``.`` for open, ...).

        Raises:
            PuzzleInputError: not a str, not such a maze, or larger than the model takes (naming the largest it
                takes).
            TestTimeComputeError: a budget that is not a number of seconds in range.
        """
        tokens, shape = parse_maze(_text(text, "the maze"), "the maze")
        return self._solve("maze", tokens, budget, shape)

    def sudokus(self, puzzles: Iterable[str], budget: float = 6.0) -> Iterator[Solution]:
        """Solve each Sudoku of ``puzzles`` (blank lines skipped), yielding each answer as soon as it is found.

        Raises:
            PuzzleInputError: ``puzzles`` is not an iterable of str (a str itself is refused: iterating it would give
                characters), or at the first entry that is not a Sudoku; the answers before it were yielded.
        """
        if isinstance(puzzles, (str, bytes)) or not isinstance(puzzles, Iterable):
            raise PuzzleInputError(f"sudokus takes an iterable of puzzles (a list of str, an open file), not a "
                                   f"{type(puzzles).__name__}: for one puzzle, call sudoku")
        for puzzle in puzzles:
            if _text(puzzle, "a Sudoku of sudokus").strip():
                yield self.sudoku(puzzle, budget)

    def _solve(self, task: str, tokens: np.ndarray, budget: float, shape: Optional[tuple[int, int]] = None
               ) -> Solution:
        check_budget_s(budget, "budget")
        with self._turn:
            trained = self._model(task, tokens.size)
            ready = prepare(trained, task, tokens, shape)
            ttc = TestTimeCompute(noise=LATENT_NOISE, seed=self.seed)
            solved = solve_anytime(trained, task, task, ready.tokens, budget, ttc, self.device,
                                   solutions=ready.solutions)
        found = solved.answer
        if found is None:
            return Solution(task, "", False, False, solved.ended, (UNSOLVABLE[task],), protocol(budget), 0, 0.0, ())
        return Solution(task, puzzle_text(task, found.grid, shape), found.consistent, bool(found.unique),
                        solved.ended, tuple(found.problems), protocol(budget), solved.spent.passes,
                        solved.spent.seconds, tuple(puzzle_text(task, grid, shape) for grid in found.segment_grids))

    def _model(self, task: str, seq_len: int) -> Trained:
        key = (task, seq_len)
        if key not in self._models:
            self._models[key] = open_model(self.checkpoint, task, seq_len, 1, self.device, self.dtype)
        return self._models[key]
