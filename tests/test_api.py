"""The solver called from code (``solve.Solver``, utils/solve/api.py): the example of docs/solving.md runs as written,
answers carry what they claim, and bad input is one documented exception. On the CPU, with the bundled models."""

import contextlib
import io
import re
import threading
from pathlib import Path

import pytest

import solve
from utils.solve import api
from utils.solve.anytime import protocol
from utils.eval.reasoning import TestTimeComputeError

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5...."


def python_blocks(page: Path) -> list[str]:
    """The fenced ``python`` blocks of ``page``."""
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


def test_the_python_example_of_docs_solving_runs_as_written():
    (example,) = python_blocks(ROOT / "docs" / "solving.md")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, "docs/solving.md", "exec"), {"__name__": "docs_example"})
    lines = printed.getvalue().splitlines()
    assert lines[0].startswith("True True checked, anytime, <=6 s a puzzle ") and lines[0].endswith(" s")
    assert re.fullmatch(r"\d{81}", lines[1])
    assert lines[-1].startswith("the Sudoku: 5 cells; a Sudoku is 81 characters")


@pytest.fixture(scope="module")
def solver():
    return solve.Solver(device="cpu", dtype="float32")


def test_an_answer_says_what_it_is_and_how_it_was_found(solver):
    found = solver.sudoku(HELD_OUT, budget=5.0)
    assert found.consistent and found.unique and found.ended == "consistent" and found.problems == ()
    assert found.protocol == protocol(5.0) and found.passes >= 1 and found.seconds > 0
    assert found.segments[-1] == found.text and len(found.text) == 81
    assert all(a == b for a, b in zip(found.text, HELD_OUT) if b != ".")  # the givens kept
    no_solution = solver.sudoku("12345678." + "........9" + "." * 63)
    assert (no_solution.ended, no_solution.text, no_solution.passes, no_solution.consistent) == ("unsolvable", "", 0,
                                                                                                 False)
    maze = solver.maze((ROOT / "docs" / "examples" / "maze_10x10.txt").read_text(), budget=5.0)
    assert maze.task == "maze" and len(maze.text.splitlines()) == 10 and maze.unique


def test_bad_input_is_one_documented_exception(solver):
    with pytest.raises(solve.PuzzleInputError, match="row 1, column 3: 'x' is not a digit"):
        solver.sudoku("12x" + "." * 78)
    with pytest.raises(solve.PuzzleInputError, match="a maze is a grid of at least 2x2"):
        solver.maze("S G")
    with pytest.raises(TestTimeComputeError, match="budget 0 is out of range"):
        solver.sudoku(HELD_OUT, budget=0)
    answers = solver.sudokus([HELD_OUT, "", "123"], budget=2.0)
    assert next(answers).consistent  # yielded before the bad entry is reached
    with pytest.raises(solve.PuzzleInputError):
        next(answers)


class CountingLock:
    """A lock that sets ``waiting`` once a second caller has begun to wait for it."""

    def __init__(self):
        self.lock, self.callers, self.waiting = threading.Lock(), 0, threading.Event()

    def __enter__(self):
        self.callers += 1
        if self.callers > 1:
            self.waiting.set()
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def test_threads_sharing_a_solver_take_turns(monkeypatch):
    """device=cpu. Thread B asks while thread A's solve runs: B waits for its turn and solves after A's ends."""
    solver = solve.Solver(device="cpu", dtype="float32")
    solver._turn = CountingLock()
    order, real = [], api.solve_anytime
    second = threading.Thread(target=lambda: solver.sudoku(HELD_OUT, budget=1.0))

    def solve_in_turn(*args, **kwargs):
        order.append("start")
        if len(order) == 1:  # A: let B ask now, and see it wait
            second.start()
            assert solver._turn.waiting.wait(timeout=60) and order == ["start"]
        found = real(*args, **kwargs)
        order.append("end")
        return found

    monkeypatch.setattr(api, "solve_anytime", solve_in_turn)
    assert solver.sudoku(HELD_OUT, budget=1.0).consistent
    second.join()
    assert order == ["start", "end", "start", "end"]


@pytest.mark.parametrize("puzzle", [None, b"1" * 81, 5, ["1"] * 81, {"cells": 81}])
def test_issue74_a_puzzle_that_is_not_a_str_is_the_documented_error(solver, puzzle):
    with pytest.raises(solve.PuzzleInputError, match="not a str of its cells"):
        solver.sudoku(puzzle)
    with pytest.raises(solve.PuzzleInputError, match="not a str of its cells"):
        solver.maze(puzzle)
    with pytest.raises(solve.PuzzleInputError):
        next(solver.sudokus(puzzle if puzzle is not None else 5))
    with pytest.raises(solve.PuzzleInputError, match="a Sudoku of sudokus is a int"):
        next(solver.sudokus([7]))


@pytest.mark.parametrize("budget", ["6", None, True, float("nan"), -1, 0])
def test_issue74_a_budget_that_is_not_seconds_is_the_documented_error(solver, budget):
    with pytest.raises(TestTimeComputeError, match="budget"):
        solver.sudoku(HELD_OUT, budget=budget)


@pytest.mark.parametrize("seed", ["a", 1.5, 2**70, -1, True])
def test_issue74_a_seed_out_of_range_is_refused_when_the_solver_is_made(seed):
    with pytest.raises(TestTimeComputeError, match="seed="):
        solve.Solver(device="cpu", seed=seed)
