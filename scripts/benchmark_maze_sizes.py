"""A maze model against maze size: model-only accuracy by segments, and checked anytime solving, on mazes of each
side from our builder and from generators outside the project (utils/data/maze_outside/).

    python scripts/benchmark_maze_sizes.py --checkpoint models/pretrained/maze_grid_trm.pt
    python scripts/benchmark_maze_sizes.py --checkpoint RUN --sizes 10,16,30 --sets random --count 64 --budget 0
    python scripts/benchmark_maze_sizes.py --checkpoint RUN --outside --budget 6 --json sizes.json --picture sizes.png
    python scripts/benchmark_maze_sizes.py --checkpoint RUN --sets "" --sizes 16 --held-out data/maze-mixed-6to16-48k
    python scripts/benchmark_maze_sizes.py --outside --sets "" --budget 0 --segments-x 1 --wrong wrong-answers

The sets, each maze of a set one side x side square, drawn from seeds no training build uses (``--seed``):
``random``, Maze-Hard's kind (random walls, a shortest path of at least 110 moves at 30x30 scaled to the side, made
unique: at 30x30 this is Maze-Hard's format); ``perfect``, lattice mazes with one path between any two cells;
``cycles``, braided lattice mazes, every shortest path kept (most have several); with ``--outside`` the kept
mazes of other generators (mazelib, maze-dataset, labmaze), grouped by file and side, then pooled by kind
(perfect, cycles) and band of sides (9-16, 17-24, 25-31), each figure with its 95% interval; and with ``--held-out
DATA`` a maze dataset's test split, its mazes with one shortest path and with several apart.

Two protocols, each named in the output:

- **model-only**: one trajectory from the model's initial state on the maze as given (the references' evaluation),
  ``--segments-x`` times the run's ``halt_max_steps`` segments, and the size-scaled default of solving
  (:func:`utils.solve.anytime.segments_for`); and with early exit, the answer of the first segment whose ``q_halt``
  is positive. An answer counts when it is *a* shortest S-G path (utils/data/user_puzzles.py ``maze_problems``): for a
  maze with one shortest path that is exact accuracy, the papers' figure; the rules only score, they select nothing.
- **checked, anytime** (``--budget`` seconds a maze, 0 for none): solve.py's search (utils/solve/anytime.py).

``--wrong DIR`` draws each wrong model-only answer (early exit) over the cells of every shortest path, its problems
in the title: where the model goes astray, seen rather than counted.

A fixed-size model (one trained on 10x10) takes a smaller maze framed with walls and no larger one: those cells say
``-``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser, non_negative_int, positive_int  # noqa: E402
from utils.outputs import check_writable_dir, check_writable_file  # noqa: E402

SETS = ("random", "perfect", "cycles")
OUTSIDE_DIR = Path(__file__).resolve().parents[1] / "utils" / "data" / "maze_outside"
SEED = 7_000_000  # far from the builder's streams (seed 0..): no maze here is a training maze of a recipe


def built_set(kind: str, side: int, count: int, seed: int) -> np.ndarray:
    """``count`` mazes of ``kind`` (:data:`SETS`) and ``side``: uint8 [count, side²] tokens, maze i from the RNG
    seeded ``[seed, side, kind index, i]``."""
    from utils.data.maze import generate_framed_maze

    settings = {"random": ("random", 0.5, "wall"), "perfect": ("lattice", 0.0, "wall"),
                "cycles": ("lattice", 1.0, "first")}[kind]
    mazes = []
    for i in range(count):
        rng = np.random.default_rng([seed, side, SETS.index(kind), i])
        question, _, _ = generate_framed_maze(rng, side, layout=settings[0], cycle_prob=settings[1], ties=settings[2])
        mazes.append(question.ravel())
    return np.stack(mazes)


def outside_sets() -> dict[tuple[str, int], np.ndarray]:
    """The kept mazes of other generators, by (file stem, side): uint8 [n, side²] tokens each."""
    from utils.data.user_puzzles import read_mazes

    sets: dict[tuple[str, int], list[np.ndarray]] = {}
    for path in sorted(OUTSIDE_DIR.glob("*.txt")):
        for _, tokens, _ in read_mazes(str(path)):
            sets.setdefault((path.stem, math.isqrt(tokens.size)), []).append(tokens)
    return {key: np.stack(value) for key, value in sets.items()}


def held_out_sets(data_path: str) -> dict[tuple[str, int], np.ndarray]:
    """The test split of the maze dataset ``data_path``, split into the mazes with one shortest path and those with
    several (:func:`models.maze_targets.shortest_path_graph`): ``{(name, side): uint8 [n, side²] tokens}``."""
    import torch

    from models.maze_targets import shortest_path_graph
    from utils.data.puzzle_dataset import load_datasets

    _, data, _ = load_datasets([Path(data_path)], "test")
    mazes = np.concatenate([d["inputs"] for d in data.values()]).astype(np.uint8)
    _, on_graph, length, _ = shortest_path_graph(torch.from_numpy(mazes.astype(np.int64)))
    several = (on_graph.sum((1, 2)) > length + 1).numpy()
    side = math.isqrt(mazes.shape[1])
    return {(f"held-out, {'several' if flag else 'one'} shortest path{'s' * flag}", side): mazes[several == flag]
            for flag in (False, True) if (several == flag).any()}


def model_only(trained, mazes: np.ndarray, segment_counts: list[int], device) -> tuple[dict[str, float], list]:
    """Model-only accuracy of ``mazes`` (uint8 [N, S]) after each of ``segment_counts`` segments of one trajectory,
    and with early exit on ``q_halt`` within the largest count; each answer scored by the rules.

    Returns:
        ``(figures, wrong)``: the accuracies by key (``segments_<t>``, ``early_exit``), and ``(index, maze, answer,
        problems)`` for each maze whose early-exit answer is wrong (the maze and answer as the model sees them:
        uint8 [S'] tokens, framed for a fixed-size model; ``problems`` from ``maze_problems``).
    """
    import torch

    from utils.data.user_puzzles import maze_problems
    from utils.eval.reasoning import initial_carry, run_segments
    from utils.solve.precheck import model_tokens

    seen = np.stack([model_tokens(trained, "maze", tokens) for tokens in mazes])
    inputs = torch.from_numpy(seen.astype(np.int32)).to(device)
    batch = {"inputs": inputs, "labels": inputs.long(),
             "puzzle_identifiers": torch.zeros(len(seen), dtype=torch.int32, device=device)}
    wanted, right = set(segment_counts), {}
    halted = np.zeros(len(seen), bool)
    final = np.zeros_like(seen)
    with torch.no_grad():
        for t, outputs in run_segments(trained.head, initial_carry(trained.head, batch, 0.0, 0), max(segment_counts)):
            grids = outputs["logits"].argmax(-1).cpu().numpy()
            good = np.array([not maze_problems(grid, maze) for grid, maze in zip(grids, seen)])
            confident = (outputs["q_halt_logits"].float().cpu().numpy() > 0) & ~halted
            final[confident] = grids[confident]
            halted |= confident
            if t in wanted:
                right[f"segments_{t}"] = float(good.mean())
    final[~halted] = grids[~halted]  # never confident: its last answer
    problems = [maze_problems(grid, maze) for grid, maze in zip(final, seen)]
    right["early_exit"] = float(np.mean([not p for p in problems]))
    return right, [(i, seen[i], final[i], p) for i, p in enumerate(problems) if p]


def draw_wrong(wrong: list, name: str, side: int, folder: Path) -> None:
    """One PNG a wrong answer of :func:`model_only` in ``folder`` (``<set>_<side>_<index>.png``, never over a file
    that is there): the cells of every shortest S-G path as the true path, the model's answer over them, its problems
    as the title."""
    import torch

    from models.maze_targets import shortest_path_graph
    from utils.data.user_puzzles import OPEN, PATH
    from utils.outputs import unused_name
    from utils.viz.puzzles import render_maze, save_picture

    folder.mkdir(parents=True, exist_ok=True)
    for index, maze, answer, problems in wrong:
        _, on_graph, _, _ = shortest_path_graph(torch.from_numpy(maze.astype(np.int64))[None])
        every_path = np.where(on_graph.flatten().numpy() & (maze == OPEN), PATH, maze)
        stem = f"{name.replace(' ', '_').replace(',', '')}_{side}_{index}"
        image = render_maze(maze, every_path, answer, title=f"{name} {side}x{side} #{index}: {'; '.join(problems)}")
        save_picture(image, folder / unused_name(folder, f"{stem}.png"))


def anytime(trained, mazes: np.ndarray, budget: float, device) -> dict[str, float]:
    """Checked anytime solving of each maze within ``budget`` seconds: the fraction solved and the median seconds."""
    from utils.solve.anytime import LATENT_NOISE, solve_anytime
    from utils.eval.reasoning import TestTimeCompute
    from utils.solve.precheck import model_tokens

    solved, seconds = [], []
    for i, tokens in enumerate(mazes):
        found = solve_anytime(trained, "maze", f"maze {i}", model_tokens(trained, "maze", tokens), budget,
                              TestTimeCompute(noise=LATENT_NOISE), device)
        solved.append(found.solved)
        seconds.append(found.spent.seconds)
    return {"anytime": float(np.mean(solved)), "anytime_seconds_median": float(np.median(seconds))}


def measure(args: argparse.Namespace) -> list[dict]:
    """One row per set: its name, side, count, and the figures of :func:`model_only` and :func:`anytime`."""
    import torch
    from tqdm import tqdm

    from utils.device import select_device
    from utils.solve.precision import solving_dtype
    from utils.solve.anytime import segments_for
    from utils.solve.precheck import largest_side
    from utils.solve.solving import open_model

    device = select_device(args.device).device
    dtype, _ = solving_dtype(device, args.forward_dtype)
    trained = open_model(args.checkpoint, "maze", min(args.sizes) ** 2, args.count, device, dtype)
    largest = largest_side(trained, "maze")
    halt = trained.cfg.arch["halt_max_steps"]
    sets = {(kind, side): None for kind in args.sets for side in args.sizes}
    outside = outside_sets() if args.outside else {}
    held_out = held_out_sets(args.held_out) if args.held_out else {}
    rows = []
    for (name, side), mazes in tqdm([*sets.items(), *outside.items(), *held_out.items()], desc="sets", unit="set"):
        row = {"set": name, "side": side, "outside": (name, side) in outside, "held_out": (name, side) in held_out}
        if largest is not None and side > largest:
            rows.append({**row, "count": 0})
            continue
        mazes = mazes if mazes is not None else built_set(name, side, args.count, args.seed)
        scaled = segments_for(trained, side * side, halt)
        counts = sorted({halt * x for x in args.segments_x} | {scaled})
        torch.manual_seed(0)
        figures, wrong = model_only(trained, mazes, counts, device)
        row |= {"count": len(mazes), "scaled_segments": scaled, **figures}
        if args.wrong:
            draw_wrong(wrong, name, side, Path(args.wrong))
        if args.budget:
            row |= anytime(trained, mazes, args.budget, device)
        rows.append(row)
    return [{"checkpoint": str(trained.path), "halt_max_steps": halt, "precision": str(dtype).removeprefix("torch."),
             "device": str(device)}] + rows


def table(result: list[dict], budget: float) -> str:
    """The rows as a markdown table."""
    head, rows = result[0], result[1:]
    halt = head["halt_max_steps"]
    counts = sorted({int(k.removeprefix("segments_")) for row in rows for k in row if k.startswith("segments_")})
    columns = [f"{c} seg" for c in counts] + ["early exit"] + ([f"anytime <={budget:g} s", "median s"] if budget else [])
    lines = [f"{head['checkpoint']} (halt_max_steps {halt}, {head['precision']}, {head['device']}): model-only, one "
             "answer, scored as a shortest path; the scaled default marked *", "",
             "| set | side | mazes | " + " | ".join(columns) + " |", "|---|---:|---:|" + "---:|" * len(columns)]
    for row in rows:
        if not row["count"]:
            lines.append(f"| {row['set']} | {row['side']} | - |" + " - |" * len(columns))
            continue
        cells = [("-" if f"segments_{c}" not in row else f"{row[f'segments_{c}']:.3f}"
                  + "*" * (c == row["scaled_segments"])) for c in counts]
        cells.append(f"{row['early_exit']:.3f}")
        if budget:
            cells += [f"{row['anytime']:.3f}", f"{row['anytime_seconds_median']:.1f}"]
        lines.append(f"| {row['set']} | {row['side']} | {row['count']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


OUTSIDE_BANDS = ((9, 16), (17, 24), (25, 31))  # the outside files' sides, in three bands of the issue's 9x9..31x31


def outside_summary(result: list[dict], budget: float) -> str:
    """The outside mazes pooled by kind (the file's ``_perfect`` or ``_cycles``) and band of sides
    (:data:`OUTSIDE_BANDS`), then all of them: the model-only figures at the scaled segments and with early exit, and
    the checked anytime share, each a fraction with its 95% Wilson interval; an empty string without outside rows."""
    from utils.eval.stats import wilson_interval

    rows = [row for row in result[1:] if row["outside"] and row["count"]]
    if not rows:
        return ""
    keys = ["scaled", "early_exit"] + ["anytime"] * bool(budget)
    pools: dict[tuple[int, str, int, int], dict[str, float]] = {}  # (pooled whole, kind, sides) -> sums
    for row in rows:
        band = next(band for band in OUTSIDE_BANDS if band[0] <= row["side"] <= band[1])
        values = {"scaled": row[f"segments_{row['scaled_segments']}"], **row}
        for name in ((0, row["set"].rsplit("_", 1)[-1], *band), (1, "all", OUTSIDE_BANDS[0][0], OUTSIDE_BANDS[-1][1])):
            pool = pools.setdefault(name, dict.fromkeys(["count", *keys], 0.0))
            pool["count"] += row["count"]
            for key in keys:
                pool[key] += values[key] * row["count"]

    def cell(right: float, n: float) -> str:
        low, high = wilson_interval(right, n)
        return f"{right / n:.3f} ({low:.2f}-{high:.2f})"

    titles = ["model-only, scaled segments", "model-only, early exit"]
    titles += [f"checked, anytime <={budget:g} s"] * bool(budget)
    lines = ["kept mazes of other generators, pooled by kind and side (95% Wilson intervals):", "",
             "| kind | sides | mazes | " + " | ".join(titles) + " |", "|---|---|---:|" + "---:|" * len(titles)]
    for (_, kind, low, high), pool in sorted(pools.items()):
        lines.append(f"| {kind} | {low}-{high} | {pool['count']:.0f} | "
                     + " | ".join(cell(pool[key], pool["count"]) for key in keys) + " |")
    return "\n".join(lines)


def picture(result: list[dict], path: Path) -> None:
    """Accuracy against side, one line per built set and protocol."""
    from utils.viz.charts import line_chart
    from utils.viz.puzzles import save_picture

    series = {}
    for row in result[1:]:
        if row["outside"] or row["held_out"] or not row["count"]:
            continue
        for key, label in (("early_exit", "model-only, early exit"), ("anytime", "checked, anytime")):
            if key in row:
                xs, ys = series.setdefault(f"{row['set']}: {label}", ([], []))
                xs.append(row["side"])
                ys.append(row[key])
    image = line_chart(series, "maze side", "solved", f"{Path(result[0]['checkpoint']).name} by maze size",
                       y_range=(0.0, 1.0))
    save_picture(image, path)


def run(argv: Optional[list[str]]) -> int:
    parser = ArgumentParser(prog="benchmark_maze_sizes.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=None,
                        help="a maze checkpoint, run directory or hf:// (default: the bundled maze model)")
    parser.add_argument("--sizes", default="10,12,16,20,24,30", help="sides of the built sets (default: %(default)s)")
    parser.add_argument("--sets", default=",".join(SETS), help=f"built sets, of {', '.join(SETS)} (default: all)")
    parser.add_argument("--count", type=positive_int, default=64, help="mazes a built set (default: 64)")
    parser.add_argument("--outside", action="store_true", help="also the kept mazes of other generators")
    parser.add_argument("--held-out", metavar="DATA", help="also the test split of this maze dataset, its mazes with "
                                                         "one shortest path and with several apart")
    parser.add_argument("--segments-x", default="1,2,4", help="model-only segments as multiples of the run's "
                                                              "halt_max_steps (default: %(default)s)")
    parser.add_argument("--budget", type=float, default=6.0, help="checked anytime seconds a maze; 0: none (default 6)")
    parser.add_argument("--seed", type=non_negative_int, default=SEED,
                        help="the built sets' seed (default: %(default)s)")
    parser.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N (default: auto)")
    parser.add_argument("--forward-dtype", default="auto", help="auto, bfloat16 or float32 (default: auto)")
    parser.add_argument("--json", metavar="JSON", help="also write the rows into this JSON file")
    parser.add_argument("--picture", help="also draw accuracy against side into this PNG")
    parser.add_argument("--wrong", metavar="DIR", help="also draw each wrong model-only answer (early exit) into "
                                                       "this folder, over the cells of every shortest path")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        args.segments_x = [int(s) for s in args.segments_x.split(",")]
        args.sets = [k for k in args.sets.split(",") if k]
    except ValueError:
        parser.error("--sizes and --segments-x are comma-separated whole numbers, e.g. 10,16,30")
    if any(k not in SETS for k in args.sets) or min(args.sizes) < 5 or min(args.segments_x) < 1:
        parser.error(f"--sets of {', '.join(SETS)}; --sizes of 5 or more; --segments-x of 1 or more")
    if not 0 <= args.budget <= 3600:
        parser.error("--budget is seconds a maze, 0 to 3600")
    for flag in ("json", "picture"):
        if getattr(args, flag):
            check_writable_file(getattr(args, flag), f"--{flag}")
    if args.wrong:
        check_writable_dir(args.wrong, "--wrong")
    if args.held_out and not (Path(args.held_out) / "test" / "dataset.json").is_file():
        parser.error(f"--held-out {args.held_out}: no maze dataset there (no test/dataset.json); give the folder a "
                     "maze recipe built, e.g. data/maze-mixed-6to16-48k")
    if args.checkpoint is not None:
        from utils.eval.load import resolve_checkpoint

        resolve_checkpoint(args.checkpoint)  # the input is there, before any set is built or the device chosen
    start = time.monotonic()
    result = measure(args)
    print(table(result, args.budget))
    if args.outside:
        print("\n" + outside_summary(result, args.budget))
    print(f"\n{time.monotonic() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.picture:
        picture(result, Path(args.picture))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    from utils.run.main import cli_main

    return cli_main(lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
