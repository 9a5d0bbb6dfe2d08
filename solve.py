"""Solve your own puzzle with a trained HRM/TRM: print the answer, check it, watch the reasoning segment by segment.

    python solve.py --checkpoint RUN --sudoku "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
    python solve.py --checkpoint RUN --maze my_maze.txt
    python solve.py --serve --checkpoint RUN                             # a page to watch it think (local, offline)
    python solve.py --checkpoint checkpoints/sudoku-trm-cpu/RUN --sudoku my_puzzles.csv --segments 32 --early-exit
    python solve.py --checkpoint RUN --arc my_task.json --adapt-steps 200      # writes submission.json

From Python: ``import solve; solver = solve.Solver(); solver.sudoku("...")`` (utils/solve/api.py, docs/solving.md).

Without ``--checkpoint``, Sudoku and mazes (of any side up to 32x32) are answered by the model bundled for them in
models/pretrained/ (scripts/bundle_model.py makes one, with its card: recipe, data, held-out accuracy, the test-time
compute it uses), or one line says it is missing. A checkpoint is a file, a run directory
(its best.pt) or ``hf://owner/repo[/file]``. Sudoku and mazes are answered directly. An ARC task the model never saw
has no puzzle-embedding row: its demonstrations are augmented into a small dataset (utils/data/arc.py), the model
adapts to them for ``--adapt-steps`` steps (the puzzle embedding only, whose rows start as the checkpoint's mean
row; all weights with ``--adapt-all``), then answers every augmented copy of each test input, and the published
voting (utils/eval/arc.py) picks two attempts per input for ``submission.json``. Each answer is printed, checked,
and drawn (a PNG, and a GIF and strip of its segments, at most 32 of them); a file already in ``--out`` is kept,
never replaced. Test-time compute over the model's budget (segments x rollouts x views a puzzle, and the segment
answers kept in memory: utils/solve/solving.py) is one line and exit 2, before any work; Ctrl-C exits 130.
"""

import utils  # noqa: F401  (sets the MPS fallback and the OpenMP wait before torch is imported)

import argparse
import logging
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from utils.cli import ArgumentParser, non_negative_int, positive_int
from utils.data.user_puzzles import PuzzleInputError, maze_file, sudoku_file
from utils.solve.bundled import BUNDLED
from utils.config import ConfigError
from utils.eval.flags import add_budget_argument, add_test_time_arguments
from utils.outputs import check_writable_dir
# torch, the model and the pictures are imported where they are used: --help answers without them.

log = logging.getLogger("solve")
DEFAULT_BUDGET_S = 6.0  # with start-up and the model's load, a solve's command ends within 10 s on 2 cores
PUZZLE_FLAGS = {"sudoku": "81 characters (1-9, . or 0 for blanks) or a file of Sudoku",
                "maze": "a text file of mazes or a Maze-Hard CSV", "arc": "a task JSON file in the ARC Prize format"}


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    maze_side = BUNDLED["maze"].side
    maze_note = " (its segments grow with the side)" if BUNDLED["maze"].grid else " (a smaller one is framed with walls)"
    parser = ArgumentParser(prog="solve.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Sudoku: 81 characters row by row, 1-9 and . or 0 for blanks, or a file of them (a "
                                   "CSV with a question column, or one per line).\nMaze: a text grid, any rectangle, of "
                                   "# (wall; also * or a block), space or . (open), S and G (or E); or a file of them, "
                                   "or a Maze-Hard CSV. The bundled maze model takes mazes of up to "
                                   f"{maze_side}x{maze_side}{maze_note}.\nARC: a task JSON in the ARC Prize format "
                                   "({\"train\": [{\"input\", \"output\"}...], \"test\": [{\"input\"}...]}).")
    parser.add_argument("--checkpoint", action="append", default=None,
                        help="a checkpoint file, a run directory (its best.pt), a folder of runs (its newest), or "
                             "hf://owner/repo[/file] (default: "
                             "the bundled model for the task); with --serve, repeat it to offer several")
    puzzle = parser.add_mutually_exclusive_group()
    puzzle.add_argument("--sudoku", metavar="PUZZLE_OR_FILE", help="a Sudoku, or a file of them (answered into "
                                                                   "OUT/answers.csv as they are found; resumable)")
    puzzle.add_argument("--maze", metavar="FILE", help="a text file with one maze, or several separated by empty "
                                                       "lines (answered into OUT/answers.csv)")
    puzzle.add_argument("--arc", metavar="TASK_JSON", help="an ARC task file in the ARC Prize format")
    puzzle.add_argument("--serve", action="store_true", help="start a local web page to solve puzzles and watch each "
                                                             "ACT segment (utils/serve/); the test-time compute "
                                                             "flags, --checked among them, fill its fields")
    parser.add_argument("--out", default="solutions", help="folder for the pictures, answers.csv and submission.json "
                                                           "(default: solutions)")
    parser.add_argument("--quiet", action="store_true", help="print only the results: no model line, no progress "
                                                             "bars (bars are drawn only on a terminal anyway)")
    parser.add_argument("--pictures", action="store_true", help="also draw every answer of a file of puzzles (a "
                                                                "single puzzle is always drawn)")
    parser.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N (default: auto)")
    parser.add_argument("--forward-dtype", default="auto", help="auto, bfloat16 or float32 (default: auto)")
    add_test_time_arguments(parser)
    add_budget_argument(parser, None, f"default for Sudoku and mazes: {DEFAULT_BUDGET_S:g} s a puzzle, unless "
                                      "--rollouts or --views ask for fixed compute; 0: fixed compute, the model's own "
                                      "test-time settings")
    arc = parser.add_argument_group("ARC adaptation")
    arc.add_argument("--adapt-steps", type=positive_int, default=100,
                     help="optimizer steps on the task's demonstrations (default: 100)")
    arc.add_argument("--adapt-all", action="store_true", help="adapt every weight, not only the puzzle embedding")
    arc.add_argument("--num-aug", type=non_negative_int, default=100,
                     help="augmented copies of the task (the papers: 1000; default: 100)")
    arc.add_argument("--adapt-batch-size", type=positive_int, default=32,
                     help="examples per adaptation step (default: 32)")
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
    check_puzzle_flags(args)  # before torch loads: a bad path or flag is refused at once
    solutions = solutions_ahead(args)  # before torch loads too: counted on another core meanwhile
    from utils.device import select_device, select_dtype
    from utils.solve.anytime import anytime_compute
    from utils.solve.precision import precision_line, solving_dtype
    from utils.eval.reasoning import test_time_compute
    from utils.solve.solving import check_budget

    args.budget = budget_of(args)
    ttc = anytime_compute(args, test_time_compute(args, keep_segments=True, task=flag_task(args)))  # checked now
    device = select_device(args.device).device
    out = Path(args.out)
    note = ""
    if args.arc is None:  # solving: the precision measured to solve more puzzles a second (ARC adapts: training's)
        dtype, why = solving_dtype(device, args.forward_dtype)
        note = "" if args.quiet else precision_line(device, dtype, why)
    else:
        dtype, _ = select_dtype(device, args.forward_dtype)
    if args.serve:
        from utils.serve.server import serve  # the page's server, only for --serve

        return serve(args, device, dtype, out, note)
    if note:
        print(note, flush=True)
    if args.arc is not None:
        from utils.train.arc_adapt import solve_arc_task  # the trainer, only for ARC: a Sudoku answers sooner

        check_budget(check_adaptable(args), ttc, args, device)
        return solve_arc_task(args, ttc, device, dtype, out)
    return solve_puzzles(args, device, dtype, out, solutions)


def solutions_ahead(args: argparse.Namespace) -> Optional[Callable[[], int]]:
    """For one Sudoku (``--sudoku`` a puzzle, or a file holding one), its solutions being counted while torch loads
    (utils/solve/count_ahead.py); None for anything else (the page, a file of puzzles, a maze, ARC).

    Raises:
        PuzzleInputError: a malformed Sudoku, named (refused before torch loads).
    """
    if args.sudoku is None or args.serve or is_file_of_puzzles("sudoku", args.sudoku):
        return None
    from utils.data.user_puzzles import read_sudokus
    from utils.solve.count_ahead import count_ahead

    (_, tokens), *more = read_sudokus(args.sudoku)
    return None if more else count_ahead("sudoku", tokens)


def budget_of(args: argparse.Namespace) -> Optional[float]:
    """The seconds a puzzle of anytime solving (``--budget``; without it :data:`DEFAULT_BUDGET_S` for Sudoku and
    mazes unless --rollouts or --views ask for fixed compute), or None: fixed compute (``--budget 0``, ARC).

    Raises:
        ConfigError: a negative budget, or one for an ARC task, whose answers have no rules to check.
    """
    if args.budget is None:
        fixed = args.arc is not None or args.rollouts is not None or args.views is not None
        return None if fixed else DEFAULT_BUDGET_S
    if args.budget < 0:
        raise ConfigError(f"--budget {args.budget:g} is out of range: seconds a puzzle, 0 for fixed compute")
    if args.arc is not None and args.budget:
        raise ConfigError("--budget checks answers against the puzzle's rules, which an ARC task does not have: "
                          "drop --budget")
    return args.budget or None


def solve_puzzles(args: argparse.Namespace, device, dtype, out: Path,
                  solutions: Optional[Callable[[], int]] = None) -> int:
    """Answer the Sudoku or maze of ``--sudoku``/``--maze``, print and draw each answer; 1 when one is not
    consistent (with what would help), else 0. ``solutions``: the count of a single puzzle's solutions, begun
    before torch loaded (:func:`solutions_ahead`)."""
    from utils.eval.reasoning import test_time_compute
    from utils.solve.anytime import anytime_compute
    from utils.solve.precheck import prepare
    from utils.solve.solving import check_budget, open_model, read_puzzles
    from utils.viz.puzzles import ANSWER_ENDINGS
    from utils.outputs import unused_stem

    task = "sudoku" if args.sudoku is not None else "maze"
    spec = args.sudoku if task == "sudoku" else args.maze
    if is_file_of_puzzles(task, spec):
        return solve_a_file(args, task, Path(spec), device, dtype, out)
    read = read_puzzles(task, spec)
    trained = open_model(args.checkpoint, task, max(len(tokens) for _, tokens, _ in read), len(read), device, dtype)
    ready = [prepare(trained, task, tokens, shape, solutions() if solutions else None) for _, tokens, shape in read]
    puzzles = [(name, one.tokens) for (name, _, _), one in zip(read, ready)]
    if not args.quiet:
        print(f"model: {trained.note or trained.path} (step {trained.step})", flush=True)
    ttc = anytime_compute(args, test_time_compute(args, trained.cfg, keep_segments=True, task=task))
    check_budget(trained, ttc, args, device, 1 if args.budget else len(puzzles))  # before any work
    more = None
    if args.budget is None:
        answers, notes, spent, rate = fixed_compute(trained, task, puzzles, ttc, device)
    else:
        answers, notes, spent, rate, more = anytime(args.budget, trained, task, puzzles, ttc, device, args.quiet,
                                                    [one.solutions for one in ready])
    out.mkdir(parents=True, exist_ok=True)
    earlier = len(list(out.glob(f"{task}_*.png"))) - len(list(out.glob(f"{task}_*_strip.png")))
    for i, (found, note, (name, _, shape)) in enumerate(zip(answers, notes, read)):
        if found is None:  # no answer can obey its rules: nothing was run
            print(f"\n{name}: {note}")
            continue
        stem = out / unused_stem(out, f"{task}_{i + 1}", ANSWER_ENDINGS)  # files there are kept
        report(replace(found, shape=shape), stem, ttc.views, note)
    kept = f" (beside {earlier} earlier answer(s) there: delete them, or give --out, to keep runs apart)" * bool(earlier)
    consistent = sum(a is not None and a.consistent for a in answers)
    print(f"\n{consistent} of {len(answers)} answer(s) consistent; {spent}; pictures in {out}{kept}")
    if consistent == len(answers):
        return 0
    if args.budget is None or more:
        print(what_would_help(args.budget, ttc, trained, rate, more), flush=True)
    return 1


def is_file_of_puzzles(task: str, spec: str) -> bool:
    """Whether ``spec`` is a file holding more than one puzzle (read no further than its second)."""
    import itertools

    from utils.data.user_puzzles import iter_puzzle_file

    path = Path(spec)
    return path.is_file() and len(list(itertools.islice(iter_puzzle_file(task, path), 2))) > 1


def solve_a_file(args: argparse.Namespace, task: str, path: Path, device, dtype, out: Path) -> int:
    """Answer every puzzle of the file ``path`` into ``out/answers.csv`` (utils/solve/file_solving.py); its exit
    code."""
    import itertools

    from utils.data.user_puzzles import iter_puzzle_file
    from utils.solve.anytime import anytime_compute, default_search, protocol
    from utils.solve.file_solving import solve_file
    from utils.eval.reasoning import test_time_compute
    from utils.solve.solving import check_budget, open_model

    # The smallest of the first puzzles opens the model: one that takes any of them takes it; each is checked later.
    sizes = [e.tokens.size for e in itertools.islice(iter_puzzle_file(task, path), 1000) if e.tokens is not None]
    seq_len = min(sizes, default=BUNDLED[task].side ** 2)
    trained = open_model(args.checkpoint, task, seq_len, 1, device, dtype)
    if not args.quiet:
        print(f"model: {trained.note or trained.path} (step {trained.step})", flush=True)
    ttc = anytime_compute(args, test_time_compute(args, trained.cfg, keep_segments=True, task=task))
    check_budget(trained, ttc, args, device, 1)  # before any work
    how = (f"{protocol(args.budget)}, {default_search(trained, ttc).describe()}" if args.budget else
           ttc.describe(trained.cfg.arch["halt_max_steps"]))
    settings = {"input": str(path.resolve()), "task": task, "model": str(trained.path), "protocol": how,
                "precision": str(dtype).removeprefix("torch."), "seed": ttc.seed}
    shown = None
    if args.pictures:
        from utils.outputs import unused_stem
        from utils.viz.puzzles import ANSWER_ENDINGS

        def shown(found, entry):
            report(found, out / unused_stem(out, f"{task}_line{entry.line}", ANSWER_ENDINGS), ttc.views)
    return solve_file(trained, task, path, out, settings, args.budget, ttc, device, args.quiet, shown)


def fixed_compute(trained, task, puzzles, ttc, device) -> tuple[list, list[str], str, float]:
    """The answers under ``ttc`` (the flags', or the model's own settings), a note for each (none), what they cost,
    and the segment passes a second this machine gave."""
    import time

    from utils.solve.solving import answer

    start = time.monotonic()
    answers = answer(trained, task, puzzles, ttc, device)
    seconds = time.monotonic() - start
    passes = ttc.passes(trained.cfg.arch["halt_max_steps"])
    return (answers, [""] * len(answers), f"{passes:,} segment passes a puzzle in {seconds:.1f} s",
            passes * len(puzzles) / max(seconds, 1e-9))


def anytime(budget: float, trained, task, puzzles, ttc, device, quiet: bool = False,
            solutions: Optional[list[int]] = None) -> tuple[list, list[str], str, float, Optional[float]]:
    """Each puzzle solved under ``budget`` seconds (utils/solve/anytime.py), its progress shown while it runs; the
    answers (None for a puzzle with no solution), a note for each (what it spent, or why nothing was), what they
    cost, the segment passes a second this machine gave, and the budget that more time would take for one that
    failed (4x this one, or the budget that holds the model's own answer where this one did not; None: none
    failed). ``solutions``: each puzzle's, counted before (utils/solve/precheck.py), so none is counted twice."""
    from tqdm import tqdm

    from utils.solve.anytime import UNSOLVABLE, protocol, solve_anytime

    answers, notes, passes, seconds, more = [], [], 0, 0.0, None
    for (name, tokens), counted in zip(puzzles, solutions or [None] * len(puzzles)):
        with tqdm(total=budget, desc=name, unit="s", leave=False, bar_format="{desc}: {bar} {n:.1f}/{total:g} s"
                  "{postfix}", disable=quiet or not sys.stderr.isatty()) as bar:  # bars only on a terminal
            def shown(spent, best, bar=bar):
                bar.n = min(spent.seconds, budget)
                bar.set_postfix_str(f"round {spent.rounds}, {spent.passes:,} segment passes"
                                    f"{', consistent' if best.consistent else ''}")

            solved = solve_anytime(trained, task, name, tokens, budget, ttc, device, progress=shown,
                                   solutions=counted)
        spent = solved.spent
        answers.append(solved.answer)
        if solved.ended == "unsolvable":
            notes.append(f"{UNSOLVABLE[task]}; nothing was run")
            continue
        if not solved.solved:
            more = max(more or 0.0, 4 * budget, holding_budget(solved.own_seconds) if solved.own_seconds else 0)
        found = "found in" if solved.solved else "none obeyed the rules in"
        notes.append(f"{protocol(budget)}: {found} {spent.rounds} round(s) of {spent.trajectories} trajectories, "
                     f"{spent.passes:,} segment passes, {spent.seconds:.1f} s" + own_answer_note(solved, budget))
        passes, seconds = passes + spent.passes, seconds + spent.seconds
    return (answers, notes, f"{passes:,} segment passes in {seconds:.1f} s ({protocol(budget)})",
            passes / max(seconds, 1e-9), more)


def own_answer_note(solved, budget: float) -> str:
    """Where the budget ended before the model's own answer (round 0) was complete: that, and the budget that would
    hold it here; else nothing."""
    if solved.own_seconds is None:
        return ""
    return (f"\nthe budget ({budget:g} s) ended before the model's own answer (round 0) was complete: it needs about "
            f"{solved.own_seconds:.1f} s here; --budget {holding_budget(solved.own_seconds)} holds it")


def holding_budget(own_seconds: float) -> int:
    """Whole seconds that hold the model's own answer, which took about ``own_seconds`` here: a quarter more."""
    return max(1, math.ceil(own_seconds * 1.25))


def what_would_help(budget: Optional[float], ttc, trained, rate: float, more: Optional[float] = None) -> str:
    """The last line when an answer is not consistent: more test-time compute (under a budget, ``more`` seconds, by
    default 4x the budget), and about how long it takes here at ``rate``, the segment passes a second this command
    measured."""
    if budget is not None:
        more = more or 4 * budget
        return (f"more time may find a consistent answer: --budget {more:g} spends up to {more:g} s a puzzle (about "
                f"{more * rate:,.0f} segment passes here)")
    rollouts = 4 * ttc.rollouts
    seconds = ttc.passes(trained.cfg.arch["halt_max_steps"]) * 4 / max(rate, 1e-9)
    return (f"more test-time compute may find a consistent answer: --rollouts {rollouts} (about {seconds:.0f} s a "
            f"puzzle here), or --budget 30: rollouts until an answer obeys the rules, up to 30 s a puzzle")


def flag_task(args: argparse.Namespace) -> str:
    """The task the puzzle flag names (sudoku, maze, arc), or for the page, sudoku: --checked then fits its models."""
    return next((flag for flag in PUZZLE_FLAGS if getattr(args, flag) is not None), "sudoku")


def check_puzzle_flags(args: argparse.Namespace) -> None:
    """Refuse, before any work (torch not yet loaded), an empty puzzle flag, a --sudoku or --maze file that is not
    there, and ARC adaptation settings out of range.

    Raises:
        PuzzleInputError: an empty --sudoku, --maze or --arc, a missing file or a directory for --sudoku or --maze
            (:func:`utils.data.user_puzzles.sudoku_file`, :func:`~utils.data.user_puzzles.maze_file`), or --views
            with --arc.
        ConfigError: a --port out of range. (The ARC adaptation flags' ranges are their parser types', checked
            whatever the puzzle.)
    """
    for flag, wanted in PUZZLE_FLAGS.items():
        value = getattr(args, flag)
        if value is not None and not value.strip():
            raise PuzzleInputError(f"--{flag} is empty: give {wanted}")
    if args.sudoku is not None:
        sudoku_file(args.sudoku)
    if args.maze is not None:
        maze_file(args.maze)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port} is out of range: 0..65535")
    if args.arc is not None and args.views not in (None, 1):
        raise PuzzleInputError(f"--views {args.views} cannot be used with --arc: an ARC task is answered in its "
                               "augmented copies (--num-aug), which vote instead")


def check_adaptable(args: argparse.Namespace):
    """Refuse, before building the task's dataset, a checkpoint that cannot adapt to an ARC task; return it (on the
    CPU).

    Raises:
        PuzzleInputError: no checkpoint (none is bundled for ARC), a model of other puzzle sizes, or one without the
            puzzle embedding the adaptation trains (unless --adapt-all).
        CheckpointError, ConfigError: see :func:`utils.eval.load.load_trained`.
    """
    import torch

    from utils.solve.precheck import TASK_SEQ_LEN
    from utils.solve.solving import open_model

    trained = open_model(args.checkpoint, "arc", TASK_SEQ_LEN["arc"], 1, torch.device("cpu"), torch.float32)
    if not args.adapt_all and not trained.cfg.arch.get("puzzle_emb_ndim"):
        raise PuzzleInputError(f"{trained.path} has no puzzle embedding (its arch.puzzle_emb_ndim is 0), the part an "
                               "ARC task adapts by default: add --adapt-all to adapt every weight")
    return trained


def report(found, stem: Path, views: int = 1, note: str = "") -> None:
    """Print one answer (an :class:`utils.solve.solving.Answer`), whether it is consistent, its segments, halting
    confidence, (of ``views`` > 1) how many views agree with it and ``note`` (what anytime solving spent); draw it
    (``stem``.png, .gif, _strip.png)."""
    from utils.solve.solving import gif_segments
    from utils.viz.puzzles import render_example, render_segments, save_picture, save_segments

    print(f"\n{found.name}: {found.verdict}\n{found.text}")
    agree = f"; {found.votes} of {views} views gave this answer" if found.votes is not None else ""
    picked = ""
    if found.selection == "checked":
        picked = ("; checked selection (an answer that obeys the rules first)" if found.consistent else
                  "; checked selection found no answer that obeys the rules: this is the Q head's choice")
    print(f"segments used: {found.segments}; halting confidence sigmoid(q_halt) = {found.halting:.3f}{agree}{picked}")
    if note:
        print(note)
    verdict = "consistent" if found.consistent else "not consistent"
    picture = render_example(found.task, found.puzzle, found.grid, found.grid,
                             title=f"{found.task} · {found.name} · {verdict} · {found.segments} segments")
    save_picture(picture, stem.with_suffix(".png"))
    frames = render_segments(found.task, found.puzzle, found.grid, found.segment_grids, found.segment_q_halt,
                             title=f"{found.task} · {found.name} (cells wrong = cells that differ from the final "
                                   "answer)", shown=gif_segments(len(found.segment_grids)))
    gif, strip = save_segments(frames, stem)
    print(f"picture: {stem.with_suffix('.png')}; segments: {gif}, {strip}")


def __getattr__(name: str):
    """``solve.Solver``: the solver for your own code (utils/solve/api.py), loaded with torch only when asked for, so
    that ``solve.py --help`` stays quick."""
    if name in ("Solver", "Solution"):
        from utils.solve import api

        return getattr(api, name)
    raise AttributeError(f"module 'solve' has no attribute {name!r}")


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    from utils.run.main import cli_main

    return cli_main(lambda: run(args))  # Ctrl-C: "stopped (Ctrl-C)", status 130; pictures are written whole or not at all


if __name__ == "__main__":
    from utils.run.main import exit_skipping_teardown

    exit_skipping_teardown(main())  # torch's teardown is a quarter of a short solve: skipped once all is written
