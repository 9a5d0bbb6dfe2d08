"""The solutions of one Sudoku counted in a forked process while solve.py imports torch (utils/solve/count_ahead.py):
the same counts as the count in the process, and the process that asked never imports numba. On CPU; Linux, where
the fork is made (elsewhere the count runs in the process, which the in-process cases cover)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from utils.data.user_puzzles import GOAL, OPEN, START, count_puzzle_solutions, parse_sudoku
from utils.solve.count_ahead import count_ahead

ROOT = Path(__file__).resolve().parent.parent
UNIQUE = "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5...."  # the README's puzzle
NONE = ".12345678" + "9" + "." * 71  # cell 1 needs a 9, which its column holds already
MANY = "." * 81
COUNTS = {UNIQUE: 1, NONE: 0, MANY: 2}


@pytest.mark.skipif(sys.platform != "linux", reason="the count is forked on Linux only; elsewhere it runs in-process")
def test_a_fresh_process_counts_in_a_child_and_never_imports_numba():
    """As solve.py starts: one thread, torch not imported. Each count comes back through the child, and this process
    has neither numba nor the compiled search loaded afterwards."""
    code = ("import sys\n"
            "from utils.data.user_puzzles import parse_sudoku\n"
            "from utils.solve.count_ahead import can_fork, count_ahead\n"
            f"puzzles = {list(COUNTS)!r}\n"
            "assert can_fork()\n"
            "pending = [count_ahead('sudoku', parse_sudoku(p, 'test')) for p in puzzles]\n"
            "print([count() for count in pending], 'numba' in sys.modules, 'utils.data.sudoku.rating' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == f"{list(COUNTS.values())} False False"


@pytest.mark.parametrize("puzzle", list(COUNTS))
def test_where_it_cannot_fork_the_count_runs_in_the_process(puzzle):
    """pytest's process has imported torch (and runs threads under xdist): no fork; the count is the exact one."""
    tokens = parse_sudoku(puzzle, "test")
    assert count_ahead("sudoku", tokens)() == COUNTS[puzzle] == count_puzzle_solutions("sudoku", tokens)


def test_a_maze_is_counted_in_the_process():
    """A maze's count is a breadth-first search with nothing to hide; it is never forked."""
    tokens = np.array([START, OPEN, GOAL, OPEN], np.int64)  # a 2x2 grid, S above G
    assert count_ahead("maze", tokens)() == count_puzzle_solutions("maze", tokens)
