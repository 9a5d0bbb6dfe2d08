"""Solving a user's own puzzle with a trained HRM/TRM: the one room that solve.py and the web page (utils/serve/) call.

A model is a checkpoint the user names (a file, a run directory, ``hf://owner/repo``) or, without one, the model
bundled for the task (``models/pretrained/``, each with its card). Puzzles come as a user writes them
(utils/data/user_puzzles.py), are answered under a test-time compute policy (utils/eval/reasoning.py), and each
answer comes back with the grid after every ACT segment, the halting confidence ``sigmoid(q_halt)`` per segment, and
what keeps it from being a solution. An ARC task is adapted to first: utils/eval/arc_adapt.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import torch

from utils.data.arc import COLOUR_OFFSET, SEQ_LEN as ARC_SEQ_LEN
from utils.data.user_puzzles import PuzzleInputError, maze_problems, parse_maze, read_sudokus, sudoku_problems
from utils.eval.load import Trained, load_trained
from utils.eval.reasoning import TestTimeCompute, reason

BUNDLED_DIR = Path(__file__).resolve().parents[2] / "models" / "pretrained"


class Bundled(NamedTuple):
    """The model that answers a task when no checkpoint is given: its ``file`` in BUNDLED_DIR, ``what`` it was trained
    on (its card says more), and the ``side`` of its square grids."""

    file: str
    what: str
    side: int


BUNDLED = {"sudoku": Bundled("sudoku_hard_trm.pt", "hard 9x9 Sudoku", 9),
           "maze": Bundled("maze_10x10_trm.pt", "10x10 mazes", 10)}
# Each task's vocabulary (utils/data/user_puzzles.py, utils/data/arc.py) and how to name its puzzles.
VOCAB = {"sudoku": (11, "Sudoku"), "maze": (6, "mazes"), "arc": (COLOUR_OFFSET + 10, "ARC grids")}
TASK_SEQ_LEN = {"sudoku": 81, "arc": ARC_SEQ_LEN}  # a maze's is its own: side x side


@dataclass
class Answer:
    """One puzzle answered: ``puzzle`` and ``grid`` tokens [S], ``segment_grids`` [T, S] (the answer after each ACT
    segment; after a puzzle stopped, its answer repeats), ``segment_q_halt`` [T] (the halting logit ``q_halt`` per
    segment), ``halting`` (``sigmoid(q_halt)`` of the answer given), ``segments`` used, ``votes`` (of the views, when
    several), and ``problems`` (empty: a solution)."""

    name: str
    task: str
    puzzle: np.ndarray
    grid: np.ndarray
    segment_grids: np.ndarray
    segment_q_halt: np.ndarray
    halting: float
    segments: int
    votes: Optional[int] = None
    problems: list[str] = field(default_factory=list)

    @property
    def confidence(self) -> np.ndarray:
        """``sigmoid(q_halt)`` per segment, float64 [T]: the halting head's confidence that the answer is right."""
        return 0.5 * (1 + np.tanh(self.segment_q_halt.astype(np.float64) / 2))  # sigmoid without overflow

    @property
    def consistent(self) -> bool:
        """Whether the answer is a solution of the puzzle (no ``problems``)."""
        return not self.problems

    @property
    def verdict(self) -> str:
        """``consistent``, or ``NOT consistent: <why>``."""
        return "consistent" if self.consistent else "NOT consistent: " + "; ".join(self.problems)


def bundled_checkpoint(task: str) -> Path:
    """The bundled model for ``task``.

    Raises:
        PuzzleInputError: no model is bundled for the task (ARC needs one trained on ARC), or its file is missing.
    """
    if task not in BUNDLED:
        raise PuzzleInputError(f"no model is bundled for {VOCAB[task][1]} (only for "
                               f"{' and '.join(b.what for b in BUNDLED.values())}): give --checkpoint")
    path = BUNDLED_DIR / BUNDLED[task].file
    if not path.is_file():
        raise PuzzleInputError(f"the bundled model for {BUNDLED[task].what} is missing ({path}): give --checkpoint "
                               "(scripts/bundle_model.py makes one from a run)")
    return path


def read_puzzles(task: str, spec: str) -> list[tuple[str, np.ndarray]]:
    """``(name, tokens [S])`` for each puzzle ``spec`` gives: Sudoku as :func:`read_sudokus` reads them, a maze from a
    text file.

    Raises:
        PuzzleInputError: a malformed puzzle or an unreadable file, named.
    """
    if task == "sudoku":
        return read_sudokus(spec)
    try:
        text = Path(spec).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PuzzleInputError(f"{spec}: cannot be read as UTF-8 text ({e}); give a text file with one maze") from None
    return [(Path(spec).stem, parse_maze(text, spec)[0])]


def check_fits(trained: Trained, task: str, seq_len: int, bundled: bool = False) -> None:
    """Check that ``trained`` answers ``task`` puzzles of ``seq_len`` tokens (its vocabulary and sequence length).

    Raises:
        PuzzleInputError: the model was trained on another kind or size of puzzle (named, for a bundled model with
            the flag that takes another).
    """
    vocab, kind = VOCAB[task]
    if trained.vocab_size == vocab and trained.seq_len == seq_len:
        return
    side, given = math.isqrt(trained.seq_len), math.isqrt(seq_len)
    if bundled:
        raise PuzzleInputError(f"the bundled model {trained.path.name} was trained on {BUNDLED[task].what}, not on "
                               f"{kind} of {given}x{given}: give --checkpoint with a model trained on them")
    raise PuzzleInputError(f"{trained.path} was trained on puzzles of {trained.seq_len} cells"
                           f"{f' ({side}x{side})' if side * side == trained.seq_len else ''} and a vocabulary of "
                           f"{trained.vocab_size}, not {kind} of {seq_len} cells: use a checkpoint trained on them")


def open_model(spec: Optional[str], task: str, seq_len: int, batch_size: int, device: torch.device,
               dtype: torch.dtype) -> Trained:
    """The model that answers ``task`` puzzles of ``seq_len`` tokens: the checkpoint ``spec`` names, or without one
    the bundled model (its ``note`` says so).

    Raises:
        PuzzleInputError: no bundled model for the task, or a model of other puzzles.
        CheckpointError, ConfigError: see :func:`utils.eval.load.load_trained`.
    """
    trained = load_trained(spec or str(bundled_checkpoint(task)), device, dtype, batch_size, seq_len=seq_len)
    check_fits(trained, task, seq_len, bundled=spec is None)
    if spec is None:
        card = trained.path.with_suffix(".md")
        trained.note = f"the bundled model for {BUNDLED[task].what}, {trained.path} (its card: {card})"
    return trained


def answer(trained: Trained, task: str, puzzles: list[tuple[str, np.ndarray]], ttc: TestTimeCompute,
           device: torch.device) -> list[Answer]:
    """Answer ``puzzles`` (one batch) under ``ttc``, with every segment's answer kept, and check each answer."""
    inputs = torch.from_numpy(np.stack([tokens for _, tokens in puzzles]).astype(np.int32)).to(device)
    batch = {"inputs": inputs, "labels": inputs.long(),
             "puzzle_identifiers": torch.zeros(len(puzzles), dtype=torch.int32, device=device)}
    out = {k: v.cpu() for k, v in reason(trained.head, trained.head, batch, replace(ttc, keep_segments=True)).items()}
    check = sudoku_problems if task == "sudoku" else maze_problems
    answers = []
    for i, (name, tokens) in enumerate(puzzles):
        grid = out["preds"][i].numpy()
        answers.append(Answer(name, task, tokens, grid, out["segment_preds"][i].numpy(),
                              out["segment_q_halt"][i].float().numpy(),
                              torch.sigmoid(out["q_halt_logits"][i].float()).item(), int(out["segments"][i]),
                              int(out["votes"][i]) if "votes" in out else None, check(grid, tokens)))
    return answers
