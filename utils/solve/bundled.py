"""The models this repository ships in models/pretrained/, one a task, each with its card: a table torch-free, so
that ``solve.py --help`` can name what they take without loading anything."""

from __future__ import annotations

from typing import NamedTuple


class Bundled(NamedTuple):
    """The model that answers a task when no checkpoint is given: its ``file`` in BUNDLED_DIR, ``what`` it answers
    (its card says more), the ``side`` of the largest square grid it takes, and whether it is a ``grid`` model (any
    side up to ``side``, its segments growing with the side) rather than a fixed-size one (a smaller maze is framed
    with walls up to its side)."""

    file: str
    what: str
    side: int
    grid: bool = False


# The maze model trained on mazes of 6x6 to 16x16 (cfg_pretrain_trm_maze_grid_cpu), then of 14x14 to 32x32
# (cfg_pretrain_trm_maze_grid_cpu_large). The side it takes is set here, not measured by its card: 32, its largest
# training side, past Maze-Hard's 30x30 and the outside mazes' 31x31 (docs/results.md, "Mazes of other sizes",
# measures it by side up to 31x31).
BUNDLED = {"sudoku": Bundled("sudoku_hard_trm.pt", "hard 9x9 Sudoku", 9),
           "maze": Bundled("maze_grid_trm.pt", "mazes of any side up to 32x32", 32, grid=True)}

