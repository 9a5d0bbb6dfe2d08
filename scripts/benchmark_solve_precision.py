"""Segment passes a second of anytime solving in float32 and in bfloat16, against the trajectories run side by side:
the measurement behind the precision solving uses on each device (utils/solve/precision.py).

For each model and each number of rows (trajectories side by side, as a round of utils/solve/anytime.py runs them),
both precisions run the same trajectories of the same puzzle, interleaved, ``--repeats`` times; the table gives
the median passes a second of each and their ratio. The first lines name the machine, its bf16 features and its
GEMM rate in both precisions, measured in this run.

    python scripts/benchmark_solve_precision.py                       # both bundled models, rows 1..256
    python scripts/benchmark_solve_precision.py --models sudoku --rows 1,12,256 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser, positive_int  # noqa: E402

PUZZLES = {"sudoku": "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5....",  # the README's
           "maze": "docs/examples/maze_10x10.txt"}


def counts(text: str) -> list[int]:
    """``1,12,256`` as whole numbers of 1 to 1024.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    values = [part.strip() for part in text.split(",")]
    if not all(v.isdecimal() and 1 <= int(v) <= 1024 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give row counts from 1 to 1024, comma-separated")
    return [int(v) for v in values]


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = ArgumentParser(prog="benchmark_solve_precision.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 3)[-1])
    parser.add_argument("--models", default="sudoku,maze", help="comma-separated bundled models: sudoku, maze "
                                                                 "(default: both)")
    parser.add_argument("--rows", type=counts, default=[1, 4, 12, 32, 64, 256], metavar="R,R,...",
                        help="trajectories side by side, each a row of the table (default: 1,4,12,32,64,256)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed repeats, interleaved (default: 3)")
    parser.add_argument("--min-seconds", type=float, default=1.0, metavar="S",
                        help="each measurement repeats its work for at least S seconds (default: 1.0)")
    args = parser.parse_args(argv)
    args.models = args.models.split(",")
    if set(args.models) - set(PUZZLES):
        parser.error(f"--models {','.join(args.models)}: choose from {', '.join(PUZZLES)}")
    if args.repeats > 100:
        parser.error(f"--repeats {args.repeats} is out of range: 1..100")
    if not 0 < args.min_seconds <= 600:
        parser.error(f"--min-seconds {args.min_seconds} is out of range: more than 0, at most 600")
    return args


def passes_per_second(trained, task: str, tokens, rows: int, min_seconds: float) -> float:
    """Segment passes a second of ``rows`` trajectories side by side (the default search, every segment checked)."""
    import torch

    from utils.solve.anytime import LATENT_NOISE, default_search
    from utils.eval.reasoning import TestTimeCompute
    from utils.solve.search import run_trajectories

    search = default_search(trained, TestTimeCompute(noise=LATENT_NOISE))
    passes, began = 0, time.perf_counter()
    while passes == 0 or time.perf_counter() - began < min_seconds:
        for _ in run_trajectories(trained, task, tokens, search, 1, rows, 0, torch.device("cpu")):
            passes += rows
    return passes / (time.perf_counter() - began)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    from utils.run.main import cli_main

    def run() -> int:
        import torch

        from utils.data.user_puzzles import parse_maze, parse_sudoku
        from utils.solve.solving import open_model
        from utils.hardware_optimizer import machine_line
        from utils.run.estimate import matmul_rate

        cpu = torch.device("cpu")
        print(machine_line(cpu))
        rates = {d: matmul_rate(cpu, getattr(torch, d), seconds=args.min_seconds) for d in ("float32", "bfloat16")}
        print("GEMM 1024^3, this run: " + ", ".join(f"{d} {r / 1e9:.0f} GFLOP/s" for d, r in rates.items()))
        for task in args.models:
            tokens = (parse_sudoku(PUZZLES[task], "sudoku") if task == "sudoku" else
                      parse_maze(Path(PUZZLES[task]).read_text(), PUZZLES[task])[0])
            models = {d: open_model(None, task, tokens.size, 1, cpu, getattr(torch, d)) for d in rates}
            print(f"\n{task}: {models['float32'].path.name}, segment passes a second (median of {args.repeats})")
            print("\n| rows side by side | float32 | bfloat16 | bf16 / fp32 |\n|---:|---:|---:|---:|")
            for rows in args.rows:
                timed = {d: [] for d in models}
                for _ in range(args.repeats):
                    for d, trained in models.items():
                        timed[d].append(passes_per_second(trained, task, tokens, rows, args.min_seconds))
                fp32, bf16 = (statistics.median(timed[d]) for d in ("float32", "bfloat16"))
                print(f"| {rows} | {fp32:.1f} | {bf16:.1f} | {bf16 / fp32:.2f}x |", flush=True)
        return 0

    return cli_main(run)


if __name__ == "__main__":
    sys.exit(main())
