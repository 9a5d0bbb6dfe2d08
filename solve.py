"""Solve your own puzzle with a trained HRM/TRM: print the answer, check it, watch the reasoning segment by segment.

    python solve.py --checkpoint RUN --sudoku "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
    python solve.py --checkpoint RUN --maze my_maze.txt
    python solve.py --serve --checkpoint RUN                             # a page to watch it think (local, offline)
    python solve.py --checkpoint checkpoints/sudoku-trm-cpu/RUN --sudoku my_puzzles.csv --segments 32 --early-exit
    python solve.py --checkpoint RUN --arc my_task.json --adapt-steps 200      # writes submission.json

Without ``--checkpoint``, Sudoku and 10x10 mazes are answered by the model bundled for them in models/pretrained/
(scripts/bundle_model.py makes one, with its card: recipe, data, held-out accuracy, the test-time compute it uses),
or one line says it is missing. A checkpoint is a file, a run directory
(its best.pt) or ``hf://owner/repo[/file]``. Sudoku and mazes are answered directly. An ARC task the model never saw
has no puzzle-embedding row: its demonstrations are augmented into a small dataset (utils/data/arc.py), the model
adapts to them for ``--adapt-steps`` steps (the puzzle embedding only, whose rows start as the checkpoint's mean
row; all weights with ``--adapt-all``), then answers every augmented copy of each test input, and the published
voting (utils/eval/arc.py) picks two attempts per input for ``submission.json``. Each answer is printed, checked,
and drawn (a PNG, and a GIF and strip of its segments, at most 32 of them); a file already in ``--out`` is kept,
never replaced. Test-time compute over the model's budget (segments x rollouts x views a puzzle, and the segment
answers kept in memory: utils/eval/solving.py) is one line and exit 2, before any work; Ctrl-C exits 130.
"""

import utils  # noqa: F401  (sets PYTORCH_ENABLE_MPS_FALLBACK before torch is imported)

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional

import torch

from utils.cli import ArgumentParser
from utils.config import ConfigError
from utils.data.user_puzzles import PuzzleInputError, format_maze, format_sudoku
from utils.device import select_device, select_dtype
from utils.eval.reasoning import add_test_time_arguments, test_time_compute
from utils.eval.load import Trained
from utils.eval.solving import TASK_SEQ_LEN, Answer, answer, check_budget, gif_segments, open_model, read_puzzles
from utils.outputs import check_writable_dir, unused_stem
from utils.run.main import cli_main
from utils.viz.puzzles import ANSWER_ENDINGS, render_example, render_segments, save_picture, save_segments

log = logging.getLogger("solve")
PUZZLE_FLAGS = {"sudoku": "81 characters (1-9, . or 0 for blanks) or a file of Sudoku",
                "maze": "a text file with one maze", "arc": "a task JSON file in the ARC Prize format"}


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = ArgumentParser(prog="solve.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Sudoku: 81 characters row by row, 1-9 and . or 0 for blanks, or a file of them (a "
                                   "CSV with a question column, or one per line).\nMaze: a square text grid of # (wall), "
                                   "space (open), S and G.\nARC: a task JSON in the ARC Prize format "
                                   "({\"train\": [{\"input\", \"output\"}...], \"test\": [{\"input\"}...]}).")
    parser.add_argument("--checkpoint", action="append", default=None,
                        help="a checkpoint file, a run directory (its best.pt), or hf://owner/repo[/file] (default: "
                             "the bundled model for the task); with --serve, repeat it to offer several")
    puzzle = parser.add_mutually_exclusive_group()
    puzzle.add_argument("--sudoku", metavar="PUZZLE_OR_FILE", help="a Sudoku, or a file of them")
    puzzle.add_argument("--maze", metavar="FILE", help="a text file with one maze")
    puzzle.add_argument("--arc", metavar="TASK_JSON", help="an ARC task file in the ARC Prize format")
    puzzle.add_argument("--serve", action="store_true", help="start a local web page to solve puzzles and watch each "
                                                             "ACT segment (utils/serve/); the test-time compute "
                                                             "flags, --checked among them, fill its fields")
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
    serve = parser.add_argument_group("the page (--serve)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine "
                                                           "only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    args = parser.parse_args(argv)
    if not (args.serve or any(getattr(args, flag) is not None for flag in PUZZLE_FLAGS)):
        parser.error("give a puzzle (--sudoku, --maze or --arc), or --serve for the page")
    if not args.serve and args.checkpoint and len(args.checkpoint) > 1:
        parser.error("give one --checkpoint (several are for --serve)")
    args.checkpoint = args.checkpoint if args.serve else (args.checkpoint or [None])[0]
    return args


def run(args: argparse.Namespace) -> int:
    check_writable_dir(args.out, "--out")
    check_puzzle_flags(args)
    ttc = test_time_compute(args, keep_segments=True, task=flag_task(args))  # the flags checked before any work
    device = select_device(args.device).device
    dtype, _ = select_dtype(device, args.forward_dtype)
    out = Path(args.out)
    if args.serve:
        from utils.serve.server import serve  # the page's server, only for --serve

        return serve(args, device, dtype, out)
    if args.arc is not None:
        from utils.train.arc_adapt import solve_arc_task  # the trainer, only for ARC: a Sudoku answers sooner

        check_budget(check_adaptable(args), ttc, args, device)
        return solve_arc_task(args, ttc, device, dtype, out)
    task = "sudoku" if args.sudoku is not None else "maze"
    puzzles = read_puzzles(task, args.sudoku if task == "sudoku" else args.maze)
    trained = open_model(args.checkpoint, task, len(puzzles[0][1]), len(puzzles), device, dtype)
    print(f"model: {trained.note or trained.path} (step {trained.step})", flush=True)
    ttc = test_time_compute(args, trained.cfg, keep_segments=True, task=task)
    check_budget(trained, ttc, args, device, len(puzzles))
    answers = answer(trained, task, puzzles, ttc, device)
    out.mkdir(parents=True, exist_ok=True)
    for i, found in enumerate(answers):
        report(found, out / unused_stem(out, f"{task}_{i + 1}", ANSWER_ENDINGS), ttc.views)  # a file there is kept
    print(f"{sum(a.consistent for a in answers)} of {len(answers)} answer(s) consistent; pictures in {out}")
    return 0


def flag_task(args: argparse.Namespace) -> str:
    """The task the puzzle flag names (sudoku, maze, arc), or for the page, sudoku: --checked then fits its models."""
    return next((flag for flag in PUZZLE_FLAGS if getattr(args, flag) is not None), "sudoku")


def check_puzzle_flags(args: argparse.Namespace) -> None:
    """Refuse, before any work, an empty puzzle flag and ARC adaptation settings out of range.

    Raises:
        PuzzleInputError: an empty --sudoku, --maze or --arc, or --views with --arc.
        ConfigError: --adapt-steps or --adapt-batch-size below 1, --num-aug below 0, a --port out of range.
    """
    for flag, wanted in PUZZLE_FLAGS.items():
        value = getattr(args, flag)
        if value is not None and not value.strip():
            raise PuzzleInputError(f"--{flag} is empty: give {wanted}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port} is out of range: 0..65535")
    if args.arc is None and not args.serve:
        return
    if args.arc is not None and args.views not in (None, 1):
        raise PuzzleInputError(f"--views {args.views} cannot be used with --arc: an ARC task is answered in its "
                               "augmented copies (--num-aug), which vote instead")
    for flag, low in (("adapt_steps", 1), ("adapt_batch_size", 1), ("num_aug", 0)):
        if getattr(args, flag) < low:
            raise ConfigError(f"--{flag.replace('_', '-')} {getattr(args, flag)} is out of range: at least {low}")


def check_adaptable(args: argparse.Namespace) -> Trained:
    """Refuse, before building the task's dataset, a checkpoint that cannot adapt to an ARC task; return it (on the
    CPU).

    Raises:
        PuzzleInputError: no checkpoint (none is bundled for ARC), a model of other puzzle sizes, or one without the
            puzzle embedding the adaptation trains (unless --adapt-all).
        CheckpointError, ConfigError: see :func:`utils.eval.load.load_trained`.
    """
    trained = open_model(args.checkpoint, "arc", TASK_SEQ_LEN["arc"], 1, torch.device("cpu"), torch.float32)
    if not args.adapt_all and not trained.cfg.arch.get("puzzle_emb_ndim"):
        raise PuzzleInputError(f"{trained.path} has no puzzle embedding (its arch.puzzle_emb_ndim is 0), the part an "
                               "ARC task adapts by default: add --adapt-all to adapt every weight")
    return trained


def report(found: Answer, stem: Path, views: int = 1) -> None:
    """Print one answer, whether it is consistent, its segments, halting confidence and (of ``views`` > 1) how many
    views agree with it; draw it (``stem``.png, .gif, _strip.png)."""
    print(f"\n{found.name}: {found.verdict}\n{(format_sudoku if found.task == 'sudoku' else format_maze)(found.grid)}")
    agree = f"; {found.votes} of {views} views gave this answer" if found.votes is not None else ""
    picked = "; checked selection (an answer that obeys the rules first)" if found.selection == "checked" else ""
    print(f"segments used: {found.segments}; halting confidence sigmoid(q_halt) = {found.halting:.3f}{agree}{picked}")
    verdict = "consistent" if found.consistent else "not consistent"
    picture = render_example(found.task, found.puzzle, found.grid, found.grid,
                             title=f"{found.task} · {found.name} · {verdict} · {found.segments} segments")
    save_picture(picture, stem.with_suffix(".png"))
    frames = render_segments(found.task, found.puzzle, found.grid, found.segment_grids, found.segment_q_halt,
                             title=f"{found.task} · {found.name} (cells wrong = cells that differ from the final "
                                   "answer)", shown=gif_segments(len(found.segment_grids)))
    gif, strip = save_segments(frames, stem)
    print(f"picture: {stem.with_suffix('.png')}; segments: {gif}, {strip}")


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    return cli_main(lambda: run(args))  # Ctrl-C: "stopped (Ctrl-C)", status 130; pictures are written whole or not at all


if __name__ == "__main__":
    sys.exit(main())
