"""A Sudoku's solutions counted in a forked process while this one imports torch and loads the model.

Before a user's Sudoku is searched its solutions are counted exactly (utils/solve/precheck.py): none ends the solve
at once, more than one is said in the answer. At a process's first count that costs about half a second, nearly all
of it numba's import and the loading of the compiled search (utils/data/sudoku/rating.py), not the search: a sixth
of the time to the first answer of ``solve.py --sudoku "..."``, which already waits about 1.8 s for torch's import
on one core (docs/results.md, "Start-up"). Forked before that import, the count runs on another core meanwhile and
this process never imports numba.

A process is forked only where that is safe and cheap: on Linux (macOS forbids frameworks in a forked child), while
this process runs one thread (a lock another thread holds would never be released in the child) and has not
imported torch (its OpenMP pool does not survive a fork). Anywhere else, and if the child dies without a count, the
count runs here when it is asked for, with the same result.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable

import numpy as np

from utils.data.user_puzzles import count_puzzle_solutions


def can_fork() -> bool:
    """Whether :func:`count_ahead` forks here (the module docstring's conditions)."""
    return sys.platform == "linux" and threading.active_count() == 1 and "torch" not in sys.modules


def count_ahead(task: str, tokens: np.ndarray) -> Callable[[], int]:
    """Start counting the solutions of ``tokens`` [S] (a ``task`` puzzle as utils/data/user_puzzles.py parses it),
    up to 2, as :func:`~utils.data.user_puzzles.count_puzzle_solutions` does; return a function that gives the count,
    waiting for it where it runs in a child. Call that function once.

    Raises (from the returned function):
        ValueError: as :func:`~utils.data.user_puzzles.count_puzzle_solutions`, for a task other than sudoku or maze.
    """
    if task != "sudoku" or not can_fork():  # a maze's count is a breadth-first search: nothing to hide
        return lambda: count_puzzle_solutions(task, tokens)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: count, hand the number over, leave without this process's exit handlers
        code = 1
        try:
            os.close(read)
            os.write(write, str(count_puzzle_solutions(task, tokens)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)

    def count() -> int:
        with os.fdopen(read, "rb") as pipe:
            text = pipe.read()
        os.waitpid(pid, 0)
        return int(text) if text else count_puzzle_solutions(task, tokens)  # the child died (a signal): count here

    return count
