"""Start-up of the README's Sudoku: seconds from the command to its answer's first line and to its exit, for this
checkout and any others named (e.g. a `git worktree` of an older commit), beside the floor that no change here can
cut: a Python that only imports torch. Each command runs once unmeasured (byte-compiled files, the page cache), then
``--runs`` times, the commands in turn, so a machine's drift falls on all alike; the table gives the median and the
range, and each median's ratio to the floor's.

    python scripts/benchmark_startup.py
    git worktree add /tmp/before 78c5caa && python scripts/benchmark_startup.py --also /tmp/before
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
README_SUDOKU = "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5...."
FIRST_LINE = "puzzle 1"  # solve.py's answer begins with the puzzle's name and verdict


def timed(argv: list[str], cwd: Path) -> tuple[Optional[float], float]:
    """Seconds from starting ``argv`` in ``cwd`` to its first output line that begins with :data:`FIRST_LINE` (None
    if none) and to its exit.

    Raises:
        RuntimeError: the command failed (its exit code and the end of its error output).
    """
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = None
    try:
        for line in proc.stdout:
            if first is None and line.startswith(FIRST_LINE):
                first = time.perf_counter() - start
        err = proc.stderr.read()
    except BaseException:  # Ctrl-C, SIGTERM: the command timed must not outlive the benchmark
        proc.kill()
        proc.wait()
        raise
    if proc.wait() not in (0, 1):  # 1: an answer that is not consistent, still an answer
        raise RuntimeError(f"{' '.join(argv)} in {cwd} exited with {proc.returncode}: {err.strip()[-500:]}")
    return first, time.perf_counter() - start


def commands(checkouts: list[Path], out: Path) -> dict[str, tuple[list[str], Path]]:
    """The floor and the README's Sudoku in each checkout (its pictures into a folder of its own under ``out``), by
    label."""
    runs = {"floor: python -c 'import torch'": ([sys.executable, "-c", "import torch"], ROOT)}
    for i, checkout in enumerate(checkouts):
        runs[f"solve.py in {checkout}"] = ([sys.executable, "solve.py", "--sudoku", README_SUDOKU, "--out",
                                            str(out / str(i))], checkout)
    return runs


def measure(checkouts: list[Path], repeats: int) -> dict[str, list[tuple[Optional[float], float]]]:
    """Each command's (first line, exit) seconds, ``repeats`` times, in turn after one unmeasured run each; the
    solves' pictures go to a temporary folder, removed after."""
    with tempfile.TemporaryDirectory(prefix="startup-") as out:
        runs = commands(checkouts, Path(out))
        for argv, cwd in runs.values():
            timed(argv, cwd)
        times: dict[str, list[tuple[Optional[float], float]]] = {label: [] for label in runs}
        for _ in range(repeats):
            for label, (argv, cwd) in runs.items():
                times[label].append(timed(argv, cwd))
    return times


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def table(times: dict[str, list[tuple[Optional[float], float]]]) -> str:
    """Markdown: each command's first-line and exit medians (ranges), and the exit's ratio to the floor's."""
    floor = statistics.median(end for _, end in next(iter(times.values())))
    lines = ["| command | first answer, median (range) | exit, median (range) | exit / floor |", "|---|---|---|---:|"]
    for label, pairs in times.items():
        firsts = [first for first, _ in pairs if first is not None]
        ends = [end for _, end in pairs]
        lines.append(f"| {label} | {spread(firsts) if firsts else '-'} | {spread(ends)} | "
                     f"{statistics.median(ends) / floor:.2f}x |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = ArgumentParser(prog="benchmark_startup.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=8, help="measured runs of each command (default 8)")
    parser.add_argument("--also", type=Path, action="append", default=[], metavar="CHECKOUT",
                        help="another checkout of this repository to time the same way (repeatable)")
    args = parser.parse_args(argv)
    from utils.errors import UserError
    from utils.run.main import cli_main

    def body() -> int:
        for checkout in args.also:
            if not (checkout / "solve.py").is_file():
                raise UserError(f"--also {checkout}: no solve.py there; give a checkout of this repository")
        checkouts = [ROOT, *(c.resolve() for c in args.also)]
        print(table(measure(checkouts, args.runs)))
        return 0

    return cli_main(body)


if __name__ == "__main__":
    sys.exit(main())
