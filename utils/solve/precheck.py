"""What comes before a user's puzzle is searched: whether the model takes it (its vocabulary and size; a maze larger
than the model takes is one line naming the largest), the tokens it answers (a smaller maze framed with walls up to a
fixed-size model's side), and how many solutions it has (counted exactly: a puzzle with
none is never searched). Everything a solve needs to know of a puzzle is known here, once (:func:`prepare`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from utils.data.arc import COLOUR_OFFSET, SEQ_LEN as ARC_SEQ_LEN
from utils.data.user_puzzles import PuzzleInputError, count_puzzle_solutions, frame_maze
from utils.eval.load import Trained
from utils.solve.bundled import BUNDLED

# Each task's vocabulary (utils/data/user_puzzles.py, utils/data/arc.py) and how to name its puzzles.
VOCAB = {"sudoku": (11, "Sudoku"), "maze": (6, "mazes"), "arc": (COLOUR_OFFSET + 10, "ARC grids")}
TASK_SEQ_LEN = {"sudoku": 81, "arc": ARC_SEQ_LEN}  # a maze's is its own: side x side

# The recipe that trains a maze model of any size, named where a maze is larger than a model takes.
GRID_MAZE_RECIPE = "python pretrain.py --config-name=cfg_pretrain_trm_maze_grid_cpu"


def largest_side(trained: Trained, task: str) -> Optional[int]:
    """The side of the largest square puzzle ``trained`` takes: a fixed-size model's own; for a grid model
    (:attr:`Trained.grid`) the side :data:`~utils.solve.bundled.BUNDLED` sets when it is the bundled one, else None
    (any side, within the compute budget)."""
    if not trained.grid:
        return math.isqrt(trained.seq_len)
    return BUNDLED[task].side if trained.bundled else None


def check_fits(trained: Trained, task: str, seq_len: int) -> None:
    """Check that ``trained`` answers ``task`` puzzles of ``seq_len`` tokens: its vocabulary, and its sequence length,
    or for a maze (a square framed around it, utils/data/user_puzzles.py) one it takes: a fixed-size model's side or
    less (:func:`model_tokens` frames it), a grid model's any side up to :func:`largest_side`.

    Raises:
        PuzzleInputError: the model was trained on another kind or size of puzzle (named, for a bundled model with
            the flag that takes another); a maze larger than the model takes (naming the largest it takes and the
            recipe that trains a model of any size).
    """
    bundled = trained.bundled
    vocab, kind = VOCAB[task]
    side, given = math.isqrt(trained.seq_len), math.isqrt(seq_len)
    if trained.vocab_size == vocab and task == "maze" and given * given == seq_len:
        largest = largest_side(trained, task)
        if largest is None or given <= largest:
            return
        name = f"the bundled model {trained.path.name}" if bundled else str(trained.path)
        raise PuzzleInputError(f"a maze {given} cells wide or tall is larger than {name} takes: at most "
                               f"{largest}x{largest}; {GRID_MAZE_RECIPE} trains a model on mazes of mixed sizes that "
                               "solves larger ones by thinking longer (give it with --checkpoint)")
    if trained.vocab_size == vocab and trained.seq_len == seq_len:
        return
    if bundled:
        raise PuzzleInputError(f"the bundled model {trained.path.name} was trained on {BUNDLED[task].what}, not on "
                               f"{kind} of {given}x{given}: give --checkpoint with a model trained on them")
    raise PuzzleInputError(f"{trained.path} was trained on puzzles of {trained.seq_len} cells"
                           f"{f' ({side}x{side})' if side * side == trained.seq_len else ''} and a vocabulary of "
                           f"{trained.vocab_size}, not {kind} of {seq_len} cells: use a checkpoint trained on them")


def model_tokens(trained: Trained, task: str, tokens: np.ndarray) -> np.ndarray:
    """The tokens [S'] ``trained`` answers for a puzzle's ``tokens`` [S] that :func:`check_fits` passed: a maze
    smaller than a fixed-size model's grid framed with walls on the right and bottom up to it (which changes no
    shortest path, and leaves the maze where :func:`utils.data.user_puzzles.crop_maze` takes it back); any other
    puzzle as it is."""
    if task != "maze" or trained.grid or tokens.size == trained.seq_len:
        return tokens
    return frame_maze(tokens, math.isqrt(trained.seq_len))


@dataclass(frozen=True)
class Prepared:
    """A puzzle ready for the search: the ``tokens`` [S'] the model answers (:func:`model_tokens`), the user's own
    ``shape`` (rows, cols) of a maze (None: the whole square, or a Sudoku), and its ``solutions`` counted up to 2
    (0: none, so nothing is searched; 2: more than one)."""

    tokens: np.ndarray
    shape: Optional[tuple[int, int]]
    solutions: int


def prepare(trained: Trained, task: str, tokens: np.ndarray, shape: Optional[tuple[int, int]] = None,
            solutions: Optional[int] = None) -> Prepared:
    """Everything a solve needs of a Sudoku or maze (``tokens`` [S] as utils/data/user_puzzles.py parses it) before
    its search, in one pass: the model takes it, the tokens it answers, its solutions counted (or ``solutions``,
    where a Sudoku's were counted already: utils/solve/count_ahead.py).

    Raises:
        PuzzleInputError: as :func:`check_fits`.
    """
    check_fits(trained, task, tokens.size)
    seen = model_tokens(trained, task, tokens)
    return Prepared(seen, shape, count_puzzle_solutions(task, seen) if solutions is None else solutions)
