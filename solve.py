"""Solve your own puzzle with a trained HRM/TRM: print the answer, check it, watch the reasoning segment by segment.

    python solve.py --checkpoint checkpoints/sudoku-trm-cpu/RUN --sudoku "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
    python solve.py --checkpoint RUN --sudoku my_puzzles.csv --segments 32 --early-exit
    python solve.py --checkpoint RUN --maze my_maze.txt
    python solve.py --checkpoint RUN --arc my_task.json --adapt-steps 200      # writes submission.json

The checkpoint is a file, a run directory (its best.pt) or ``hf://owner/repo[/file]``. Sudoku and mazes are
answered directly. An ARC task the model never saw has no puzzle-embedding row: its demonstrations are augmented
into a small dataset (utils/data/arc.py), the model adapts to them for ``--adapt-steps`` steps (the puzzle
embedding only, whose rows start as the checkpoint's mean row; all weights with ``--adapt-all``), then answers every
augmented copy of each test input, and the published voting (utils/eval/arc.py) picks two attempts per input for
``submission.json``. Each answer is printed, checked, and drawn (a PNG, and a GIF and strip of its segments).
"""

import utils  # noqa: F401  (sets PYTORCH_ENABLE_MPS_FALLBACK before torch is imported)

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from utils.data.user_puzzles import (PuzzleInputError, format_maze, format_sudoku, maze_problems, parse_maze,
                                     read_sudokus, sudoku_problems)
from utils.device import select_device, select_dtype
from utils.eval.arc_adapt import solve_arc_task
from utils.eval.load import Trained, load_trained
from utils.eval.reasoning import add_test_time_arguments, reason, test_time_compute
from utils.config import ConfigError
from utils.data.arc import COLOUR_OFFSET, SEQ_LEN as ARC_SEQ_LEN
from utils.outputs import check_writable_dir, unused_stem
from utils.run.main import ArgumentParser, cli_main
from utils.viz.puzzles import ANSWER_ENDINGS, render_example, render_segments, save_picture, save_segments

log = logging.getLogger("solve")
VOCAB = {"sudoku": (11, "Sudoku"), "maze": (6, "mazes"), "arc": (COLOUR_OFFSET + 10, "ARC grids")}  # their tokens
PUZZLE_FLAGS = {"sudoku": "81 characters (1-9, . or 0 for blanks) or a file of Sudoku",
                "maze": "a text file with one maze", "arc": "a task JSON file in the ARC Prize format"}


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = ArgumentParser(prog="solve.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Sudoku: 81 characters row by row, 1-9 and . or 0 for blanks, or a file of them (a "
                                   "CSV with a question column, or one per line).\nMaze: a square text grid of # (wall), "
                                   "space (open), S and G.\nARC: a task JSON in the ARC Prize format "
                                   "({\"train\": [{\"input\", \"output\"}...], \"test\": [{\"input\"}...]}).")
    parser.add_argument("--checkpoint", required=True,
                        help="a checkpoint file, a run directory (its best.pt), or hf://owner/repo[/file]")
    puzzle = parser.add_mutually_exclusive_group(required=True)
    puzzle.add_argument("--sudoku", metavar="PUZZLE_OR_FILE", help="a Sudoku, or a file of them")
    puzzle.add_argument("--maze", metavar="FILE", help="a text file with one maze")
    puzzle.add_argument("--arc", metavar="TASK_JSON", help="an ARC task file in the ARC Prize format")
    parser.add_argument("--out", default="solutions", help="folder for the pictures and submission.json "
                                                           "(default: solutions)")
    parser.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N (default: auto)")
    parser.add_argument("--forward-dtype", default="auto", help="auto, bfloat16 or float32 (default: auto)")
    add_test_time_arguments(parser)
    arc = parser.add_argument_group("ARC adaptation")
    arc.add_argument("--adapt-steps", type=int, default=100, help="optimizer steps on the task's demonstrations "
                                                                  "(default: 100)")
    arc.add_argument("--adapt-all", action="store_true", help="adapt every weight, not only the puzzle embedding")
    arc.add_argument("--num-aug", type=int, default=100, help="augmented copies of the task (the papers: 1000; "
                                                              "default: 100)")
    arc.add_argument("--adapt-batch-size", type=int, default=32, help="examples per adaptation step (default: 32)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    check_writable_dir(args.out, "--out")
    check_puzzle_flags(args)
    ttc = test_time_compute(args, keep_segments=True)  # the flags checked before any work
    device = select_device(args.device).device
    dtype, _ = select_dtype(device, args.forward_dtype)
    out = Path(args.out)
    if args.arc is not None:
        check_adaptable(args)
        return solve_arc_task(args, ttc, device, dtype, out)
    task = "sudoku" if args.sudoku is not None else "maze"
    if task == "sudoku":
        puzzles = read_sudokus(args.sudoku)
    else:
        tokens, size = parse_maze(read_text(args.maze), args.maze)
        puzzles = [(Path(args.maze).stem, tokens)]
    inputs = torch.from_numpy(np.stack([t for _, t in puzzles]).astype(np.int32))
    trained = load_trained(args.checkpoint, device, dtype, len(puzzles), seq_len=inputs.shape[1])
    check_fits(trained, task, inputs.shape[1])
    print(f"model: {trained.note or trained.path} (step {trained.step})")
    ttc = test_time_compute(args, trained.cfg, keep_segments=True)
    batch = {"inputs": inputs.to(device), "labels": inputs.to(device).long(),
             "puzzle_identifiers": torch.zeros(len(puzzles), dtype=torch.int32, device=device)}
    answer = {k: v.cpu() for k, v in reason(trained.head, trained.head, batch, ttc).items()}
    out.mkdir(parents=True, exist_ok=True)
    consistent = 0
    for i, (name, tokens) in enumerate(puzzles):
        mine = {k: v[i] for k, v in answer.items()}
        stem = out / unused_stem(out, f"{task}_{i + 1}", ANSWER_ENDINGS)  # a file already there is kept
        consistent += report(task, name, tokens, mine, stem, ttc.views)
    print(f"{consistent} of {len(puzzles)} answer(s) consistent; pictures in {out}")
    return 0


def check_puzzle_flags(args: argparse.Namespace) -> None:
    """Refuse, before any work, an empty puzzle flag and ARC adaptation settings out of range.

    Raises:
        PuzzleInputError: an empty --sudoku, --maze or --arc, or --views with --arc.
        ConfigError: --adapt-steps or --adapt-batch-size below 1, --num-aug below 0.
    """
    for flag, wanted in PUZZLE_FLAGS.items():
        value = getattr(args, flag)
        if value is not None and not value.strip():
            raise PuzzleInputError(f"--{flag} is empty: give {wanted}")
    if args.arc is None:
        return
    if args.views not in (None, 1):
        raise PuzzleInputError(f"--views {args.views} cannot be used with --arc: an ARC task is answered in its "
                               "augmented copies (--num-aug), which vote instead")
    for flag, low in (("adapt_steps", 1), ("adapt_batch_size", 1), ("num_aug", 0)):
        if getattr(args, flag) < low:
            raise ConfigError(f"--{flag.replace('_', '-')} {getattr(args, flag)} is out of range: at least {low}")


def check_adaptable(args: argparse.Namespace) -> None:
    """Refuse, before building the task's dataset, a checkpoint that cannot adapt to an ARC task.

    Raises:
        PuzzleInputError: a model of other puzzle sizes, or without the puzzle embedding the adaptation trains
            (unless --adapt-all).
        CheckpointError, ConfigError: see :func:`utils.eval.load.load_trained`.
    """
    trained = load_trained(args.checkpoint, torch.device("cpu"), torch.float32, 1, seq_len=ARC_SEQ_LEN)
    check_fits(trained, "arc", ARC_SEQ_LEN)
    if not args.adapt_all and not trained.cfg.arch.get("puzzle_emb_ndim"):
        raise PuzzleInputError(f"{trained.path} has no puzzle embedding (its arch.puzzle_emb_ndim is 0), the part an "
                               "ARC task adapts by default: add --adapt-all to adapt every weight")


def read_text(path: str) -> str:
    """Raises:
        PuzzleInputError: the file is missing or not UTF-8 text."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PuzzleInputError(f"{path}: cannot be read as UTF-8 text ({e})") from None


def check_fits(trained: Trained, task: str, seq_len: int) -> None:
    """Raises:
        PuzzleInputError: the model was trained on another kind or size of puzzle."""
    vocab, kind = VOCAB[task]
    if trained.vocab_size != vocab or trained.seq_len != seq_len:
        side = math.isqrt(trained.seq_len)
        raise PuzzleInputError(f"{trained.path} was trained on puzzles of {trained.seq_len} cells"
                               f"{f' ({side}x{side})' if side * side == trained.seq_len else ''} and a vocabulary of "
                               f"{trained.vocab_size}, not {kind} of {seq_len} cells: use a checkpoint trained on them")


def report(task: str, name: str, tokens: np.ndarray, answer: dict, stem: Path, views: int = 1) -> bool:
    """Print one answer, whether it is consistent, its segments, halting confidence and (of ``views`` > 1) how many
    views agree with it; draw it. True if consistent."""
    pred = answer["preds"].numpy()
    problems = sudoku_problems(pred, tokens) if task == "sudoku" else maze_problems(pred, tokens)
    confidence = torch.sigmoid(answer["q_halt_logits"]).item()
    verdict = "consistent" if not problems else "NOT consistent: " + "; ".join(problems)
    print(f"\n{name}: {verdict}\n{(format_sudoku if task == 'sudoku' else format_maze)(pred)}")
    agree = f"; {int(answer['votes'])} of {views} views gave this answer" if "votes" in answer else ""
    print(f"segments used: {int(answer['segments'])}; halting confidence sigmoid(q_halt) = {confidence:.3f}{agree}")
    title = f"{task} · {name} · {'consistent' if not problems else 'not consistent'} · {int(answer['segments'])} segments"
    picture = render_example(task, tokens, pred, pred, title=title)
    save_picture(picture, stem.with_suffix(".png"))
    frames = render_segments(task, tokens, pred, answer["segment_preds"].numpy(), answer["segment_q_halt"].numpy(),
                             title=f"{task} · {name} (cells wrong = cells that differ from the final answer)")
    gif, strip = save_segments(frames, stem)
    print(f"picture: {stem.with_suffix('.png')}; segments: {gif}, {strip}")
    return not problems


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    return cli_main(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
