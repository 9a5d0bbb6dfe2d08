"""pass@K of test-time search on hard Sudoku: whether any of K trajectories reaches the solution, against segments,
for each source of diversity (utils/solve/search.py), with the passes and seconds spent; the measurement behind
anytime solving's choice (docs/results.md, "Test-time search").

Each puzzle of the lists is answered by ``--trajectories`` K trajectories of ``--segments`` T segments per
method, side by side as anytime solving runs them (trajectory 0 is the model's own answer), and every segment's
answer is checked against the rules. One run gives every cell of the table: with a check after every segment,
pass@K at S segments is whether any of the first K trajectories passed at any of its first S segments; with a check
at the end only, whether one passed at segment S. The puzzles written outside the project have one solution each,
so an answer that obeys the rules is the solution. Rows are appended to ``--out`` (JSON lines, one per puzzle and
method) as they are measured, and a run with the same ``--out`` skips what is there.

    python scripts/measure_search.py                                  # named_hard.txt, every method, fp32
    python scripts/measure_search.py --lists norvig_top95 --methods sym+latent0.3 --dtype bfloat16
    python scripts/measure_search.py --report                         # the table of what --out holds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser, positive_int  # noqa: E402
from utils.config import ConfigError  # noqa: E402

# name: (views, latent noise, start noise); "old" is the search anytime solving ran before (start noise 0.5, the
# card's, and a dihedral view a round).
METHODS = {
    "old": ("dihedral", 0.0, 0.5),
    "start0.5": ("none", 0.0, 0.5),
    "latent0.1": ("none", 0.1, 0.0),
    "latent0.3": ("none", 0.3, 0.0),
    "sym": ("symmetry", 0.0, 0.0),
    "sym+latent0.1": ("symmetry", 0.1, 0.0),
    "sym+latent0.3": ("symmetry", 0.3, 0.0),
    "dihedral": ("dihedral", 0.0, 0.0),
    "dihedral+latent0.3": ("dihedral", 0.3, 0.0),
}
LISTS = ("named_hard", "norvig_hardest", "norvig_top95", "mazes")  # mazes: --mazes generated hard 10x10 mazes
KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SEGMENTS = (1, 2, 4, 8, 16, 32, 64)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = ArgumentParser(prog="measure_search.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 3)[-1])
    parser.add_argument("--lists", default="named_hard", help=f"comma-separated, of {', '.join(LISTS)} "
                                                               "(utils/data/sudoku/outside_puzzles/; default: named_hard)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--trajectories", type=positive_int, default=32, metavar="K", help="per puzzle (default: 32)")
    parser.add_argument("--segments", type=positive_int, default=16, metavar="T", help="per trajectory (default: 16)")
    parser.add_argument("--mazes", type=positive_int, default=64, help="hard 10x10 mazes generated for the list "
                                                                        "'mazes' (seed 12345; default: 64)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--checkpoint", help="a Sudoku checkpoint (default: the bundled model)")
    parser.add_argument("--out", default="search_pass_at_k.jsonl", help="JSON lines, appended (default: "
                                                                        "search_pass_at_k.jsonl)")
    parser.add_argument("--report", action="store_true", help="print the table of --out and measure nothing")
    args = parser.parse_args(argv)
    args.lists, args.methods = args.lists.split(","), args.methods.split(",")
    for value, known, flag in ((args.lists, LISTS, "--lists"), (args.methods, METHODS, "--methods")):
        unknown = sorted(set(value) - set(known))
        if unknown:
            parser.error(f"{flag}: {', '.join(unknown)} unknown; choose from {', '.join(known)}")
    if Path(args.out).is_dir():
        parser.error(f"--out {args.out} is a folder: give the JSON-lines file to append to")
    for flag in ("trajectories", "segments"):
        if getattr(args, flag) > 1024:
            parser.error(f"--{flag} {getattr(args, flag)} is out of range: 1..1024")
    return args


def puzzles(lists: list[str], mazes: int) -> list[tuple[str, int, str, str, "np.ndarray"]]:
    """``(list, line, name, task, tokens [S])`` of every puzzle of ``lists`` (generated mazes: line = index)."""
    import numpy as np

    from utils.data.maze import default_min_path_length, generate_maze
    from utils.data.sudoku.outside import LISTS_DIR, read_list

    found = []
    for name in lists:
        if name == "mazes":
            rng = np.random.default_rng(12345)  # not the builders' seeds: mazes the model never trained on
            for i in range(mazes):
                question = generate_maze(rng, 10, default_min_path_length(10))[0].reshape(-1)
                found.append(("mazes", i + 1, "", "maze", question.astype(np.uint8)))
        else:
            for e in read_list(LISTS_DIR / f"{name}.txt")[1]:
                found.append((e.list, e.line, e.name, "sudoku", np.where(e.puzzle > 0, e.puzzle + 1, 1).astype(np.uint8)))
    return found


def measure(models: dict, puzzle: tuple, method: str, k: int, t: int, device) -> dict:
    """One puzzle under one method: for each trajectory, the segments (1-based) whose answer passed."""
    import numpy as np

    from utils.eval.reasoning import rows_per_call
    from utils.solve.search import Search, run_trajectories

    source, line, name, task, tokens = puzzle
    views, latent, start = METHODS[method]
    search = Search(t, views, latent, start, "segment")
    rows, passed, began = rows_per_call(device, tokens.size), [], time.perf_counter()
    for first in range(0, k, rows):
        count = min(rows, k - first)
        ok = np.zeros((count, t), bool)
        for segment in run_trajectories(models[task], task, tokens, search, first, count, 0, device):
            ok[:, segment.t - 1] = segment.passes
        passed += [(np.flatnonzero(row) + 1).tolist() for row in ok]
    return {"list": source, "line": line, "name": name, "method": method, "trajectories": k,
            "segments": t, "passed": passed, "seconds": time.perf_counter() - began, "passes": k * t}


def pass_at(row: dict, k: int, s: int, every: bool) -> bool:
    """Whether any of the first ``k`` trajectories passed: at any of its first ``s`` segments (``every``), or at
    segment ``s``."""
    return any((any(x <= s for x in p) if every else s in p) for p in row["passed"][:k])


def report(rows: list[dict]) -> str:
    """A markdown table per dtype and method: pass@K for K x segments, checked every segment / at the end."""
    out = []

    def key(r: dict) -> tuple:
        return "mazes" if r["list"] == "mazes" else "Sudoku", r["dtype"], r["method"], r["trajectories"], r["segments"]

    for group in sorted({key(r) for r in rows}):
        kind, dtype, method, kmax, tmax = group
        mine = [r for r in rows if key(r) == group]
        rate = sum(r["passes"] for r in mine) / sum(r["seconds"] for r in mine)
        views, latent, start = METHODS[method]
        out += [f"\n{method} ({views} views, latent noise {latent:g}, start noise {start:g}; {dtype}; "
                f"{len(mine)} {kind}; {rate:.0f} segment passes/s): solved, checked every segment / at the end",
                "", "| K | " + " | ".join(f"{s} segments" for s in SEGMENTS if s <= tmax) + " |",
                "|---:|" + "---|" * sum(s <= tmax for s in SEGMENTS)]
        for k in (k for k in KS if k <= kmax):
            cells = [f"{sum(pass_at(r, k, s, True) for r in mine)} / {sum(pass_at(r, k, s, False) for r in mine)}"
                     for s in SEGMENTS if s <= tmax]
            out.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    from utils.run.main import cli_main

    def run() -> int:
        out = Path(args.out)
        try:
            done = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.is_file() else []
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"--out {out} is not this script's JSON lines ({e}): give a new file, or one it "
                              "wrote") from None
        if args.report:
            print(report(done))
            return 0
        import torch
        from tqdm import tqdm

        from utils.solve.solving import open_model
        from utils.hardware_optimizer import machine_line

        device, dtype = torch.device("cpu"), getattr(torch, args.dtype)
        entries = puzzles(args.lists, args.mazes)
        models = {task: open_model(args.checkpoint, task, size, 1, device, dtype)
                  for task, size in {(p[3], p[4].size) for p in entries}}
        print(machine_line(device), f"; {args.dtype}", flush=True)
        seen = {(r["list"], r["line"], r["method"], r["dtype"], r["trajectories"], r["segments"]) for r in done}
        work = [(p, m) for m in args.methods for p in entries
                if (p[0], p[1], m, args.dtype, args.trajectories, args.segments) not in seen]
        with out.open("a") as sink:
            for entry, method in tqdm(work, desc="puzzles x methods", unit="puzzle"):
                row = measure(models, entry, method, args.trajectories, args.segments, device)
                sink.write(json.dumps(row | {"dtype": args.dtype}) + "\n")
                sink.flush()
                done.append(row | {"dtype": args.dtype})
        print(report(done))
        return 0

    return cli_main(run)


if __name__ == "__main__":
    sys.exit(main())
