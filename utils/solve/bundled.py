"""The models this repository ships in models/pretrained/, one a task, each with its card: a table torch-free, so
that ``solve.py --help`` can name what they take without loading anything."""

from __future__ import annotations

from typing import NamedTuple


class Bundled(NamedTuple):
    """The model that answers a task when no checkpoint is given: its ``file`` in BUNDLED_DIR, ``what`` it was trained
    on (its card says more), and the ``side`` of the largest square grid it takes (a smaller maze is framed with
    walls up to a fixed-size model's side)."""

    file: str
    what: str
    side: int


BUNDLED = {"sudoku": Bundled("sudoku_hard_trm.pt", "hard 9x9 Sudoku", 9),
           "maze": Bundled("maze_10x10_trm.pt", "10x10 mazes", 10)}

