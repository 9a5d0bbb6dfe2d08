"""Test-time compute against exact accuracy and time: one trained checkpoint on its held-out puzzles, evaluated with
more ACT segments, with early exit on the Q head, and with K rollouts ranked by q_halt (utils/eval/reasoning.py).

Every row is one full evaluation of the same puzzles in this process; the time column is its wall time and the
ratio is against the first row (the references' evaluation: halt_max_steps segments, one rollout), measured in the
same run. Exact accuracy comes with its 95% Wilson interval.

    python scripts/benchmark_test_time.py --checkpoint checkpoints/sudoku-gen-40-1k-aug-100/RUN
    python scripts/benchmark_test_time.py --checkpoint RUN --segments 4,8,16 --rollouts 2,4 --noise 0.5 --json out.json
    python scripts/benchmark_test_time.py --checkpoint RUN --segments 8 --rollouts 8,16 --combined 16x8   # K x S

``--grid`` answers every puzzle once with the largest rollouts x segments and reads the whole grid off those
passes: the answer after S segments of the first K rollouts, kept by the Q head (model-only selection, the
references') and by checked selection (an answer that obeys the puzzle's rules first), for every S and K asked:

    python scripts/benchmark_test_time.py --checkpoint RUN --grid --segments 4,8,16,32,64 --rollouts 1,4,16 \
        --max-examples 64 --picture docs/test_time_scaling.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from utils.cli import ArgumentParser, number_in, positive_int  # noqa: E402
from utils.data.puzzle_dataset import PuzzleDataset, load_metadata  # noqa: E402
from utils.device import select_device, select_dtype  # noqa: E402
from utils.distributed import Dist  # noqa: E402
from utils.eval.load import load_trained, resolve_checkpoint  # noqa: E402
from utils.eval.puzzle import evaluate_puzzles  # noqa: E402
from utils.data.puzzle_dataset import RATING_BAND_KEY  # noqa: E402
from utils.eval.reasoning import TestTimeCompute, checked_better, rollouts, rules_checker  # noqa: E402
from utils.eval.stats import wilson_interval  # noqa: E402
from utils.viz.charts import line_chart  # noqa: E402
from utils.viz.puzzles import known_task  # noqa: E402
from utils.hardware_optimizer import machine_line  # noqa: E402
from utils.outputs import check_writable_file  # noqa: E402
from utils.run.main import cli_main  # noqa: E402


def ints(text: str) -> list[int]:
    """``N,N,...`` -> ``[N, ...]``, each :func:`~utils.cli.positive_int` (counts of segments or rollouts).

    Raises:
        argparse.ArgumentTypeError: no number at all, or an item that is not such a number.
    """
    found = [item for item in text.split(",") if item.strip()]
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers of 1 or more separated by commas, e.g. 1,2,8")
    return [positive_int(item) for item in found]


def pairs(text: str) -> list[tuple[int, int]]:
    """``KxS,...`` -> ``[(K, S), ...]``."""
    try:
        found = [tuple(int(n) for n in item.split("x")) for item in text.split(",") if item]
    except ValueError:
        found = []
    if not found or any(len(pair) != 2 for pair in found):
        raise argparse.ArgumentTypeError(f"{text!r}: give K x S pairs such as 16x8,32x8")
    return found


def policies(halt_max_steps: int, segments: list[int], rollouts: list[int], noise: float,
             combined: list[tuple[int, int]] = ()) -> list[tuple[str, TestTimeCompute]]:
    """The rows of the table: the default first, then each segment count, early exit at each, each K, then each
    K rollouts of S segments."""
    rows = [(f"default ({halt_max_steps} segments)", TestTimeCompute())]
    rows += [(f"{t} segments", TestTimeCompute(segments=t)) for t in segments if t != halt_max_steps]
    rows += [(f"early exit, at most {t}", TestTimeCompute(segments=t, early_exit=True)) for t in segments]
    rows += [(f"K={k} rollouts (noise {noise})", TestTimeCompute(rollouts=k, noise=noise)) for k in rollouts if k > 1]
    rows += [(f"K={k} rollouts x {t} segments", TestTimeCompute(segments=t, rollouts=k, noise=noise)) for k, t in combined]
    return [(name, ttc.check()) for name, ttc in rows]


class Grid:
    """Exact answers on a grid of (segments S, rollouts K), model-only and checked, read off one set of passes; and
    the kept answers' blank-cell accuracy (``blank_accuracy`` as models/losses.py defines it: the supervised cells
    whose input differs from the label), which still moves where few puzzles are solved whole."""

    def __init__(self, segments: list[int], rollouts: list[int]):
        self.segments, self.rollouts = sorted(segments), sorted(rollouts)
        shape = (len(self.segments), len(self.rollouts))
        self.right = {"model": torch.zeros(shape, dtype=torch.int64), "checked": torch.zeros(shape, dtype=torch.int64)}
        self.blank = {name: torch.zeros(shape, dtype=torch.float64) for name in self.right}
        self.count = 0

    def add(self, runs, labels: torch.Tensor, inputs: torch.Tensor, checker) -> None:
        """Score one batch: ``runs`` yields its rollouts in order (``segment_preds`` [B, T, S], ``segment_q_halt``
        [B, T]); ``labels`` [B, L] (-100 unsupervised; rows without a label are padding)."""
        at = torch.tensor([s - 1 for s in self.segments])
        valid = (labels != -100).any(-1)
        blanks = (labels != -100) & (inputs != labels)  # [B, L]
        self.count += int(valid.sum())
        best = {}  # selection -> the kept answers' (q_halt, passes, right, blank-cell accuracy), each [B, nS]
        for k, run in enumerate(runs, start=1):
            preds, q = run["segment_preds"][:, at].cpu(), run["segment_q_halt"][:, at].float().cpu()  # [B, nS, L], [B, nS]
            right = ((preds == labels[:, None]) | (labels[:, None] == -100)).all(-1) & valid[:, None]
            blank = ((preds == labels[:, None]) & blanks[:, None]).sum(-1) / blanks.sum(-1, keepdim=True).clamp_min(1)
            passes = torch.stack([checker(inputs, preds[:, i]) for i in range(len(self.segments))], 1)
            for name in self.right:
                if name in best:
                    kept_q, kept_passes = best[name][:2]
                    better = q > kept_q if name == "model" else checked_better(passes, q, kept_passes, kept_q)
                    best[name] = tuple(torch.where(better, new, old) for new, old in
                                       zip((q, passes, right, blank), best[name]))
                else:
                    best[name] = (q, passes, right, blank)
            if k in self.rollouts:
                for name, (_, _, kept_right, kept_blank) in best.items():
                    self.right[name][:, self.rollouts.index(k)] += kept_right.sum(0)
                    self.blank[name][:, self.rollouts.index(k)] += kept_blank.sum(0).double()  # padding: no blanks, 0

    def rows(self) -> list[dict]:
        """One dict per (S, K): exact accuracy and its 95% interval under both selections (``model``, ``checked``),
        and the blank-cell accuracy of each (``model_blank``, ``checked_blank``)."""
        out = []
        for i, s in enumerate(self.segments):
            for j, k in enumerate(self.rollouts):
                row = {"segments": s, "rollouts": k, "passes": s * k, "count": self.count}
                for name, right in self.right.items():
                    n = int(right[i, j])
                    row[name] = n / max(self.count, 1)
                    row[f"{name}_ci95"] = list(wilson_interval(n, self.count))
                    row[f"{name}_blank"] = float(self.blank[name][i, j]) / max(self.count, 1)
                out.append(row)
        return out


def run_grid(trained, data_path: str, args, device) -> list[dict]:
    """The grid of ``--segments`` x ``--rollouts`` (see the module docstring); prints it as a markdown table."""
    loader = PuzzleDataset(data_path, "test", args.batch_size, seed=0)
    checker = rules_checker(known_task(loader.metadata))
    grid = Grid(args.segments, args.rollouts)
    ttc = TestTimeCompute(segments=max(grid.segments), rollouts=max(grid.rollouts), noise=args.noise,
                          keep_segments=True).check()
    trained.head.eval()
    with torch.inference_mode():
        for _set, batch, _effective in loader:
            batch = {k: v.to(device) for k, v in batch.items() if k != RATING_BAND_KEY}
            grid.add(rollouts(trained.head, trained.head, batch, ttc), batch["labels"].cpu(), batch["inputs"].cpu(),
                     checker)
            if args.max_examples and grid.count >= args.max_examples:
                break
    rows = grid.rows()
    for what, key in (("exact accuracy", ""), ("blank-cell accuracy", "_blank")):
        print(f"{what} on {grid.count} puzzles, model-only / checked selection (noise {args.noise}):")
        print("| segments | " + " | ".join(f"K={k}" for k in grid.rollouts) + " |\n|---|" + "---|" * len(grid.rollouts))
        for s in grid.segments:
            cells = [r for r in rows if r["segments"] == s]
            print(f"| {s} | " + " | ".join(f"{100 * r['model' + key]:.1f}% / {100 * r['checked' + key]:.1f}%"
                                           for r in cells) + " |")
    return rows


def grid_picture(rows: list[dict], path: str, what: str) -> None:
    """Exact accuracy against segment passes a puzzle (S x K): a line per rollout count K along the segment counts,
    or, where the grid has more rollout counts than segment counts, a line per S along K; the checked selection's
    lines only where they differ from the model-only ones somewhere (the title says when they never do)."""
    same = all(r["checked"] == r["model"] for r in rows)
    fixed, along = ("segments", "rollouts") if len({r["rollouts"] for r in rows}) > len({r["segments"] for r in rows}) \
        else ("rollouts", "segments")
    series = {}
    for value in sorted({r[fixed] for r in rows}):
        mine = sorted((r for r in rows if r[fixed] == value), key=lambda r: r[along])
        for name in ("model",) if same else ("model", "checked"):
            series[f"{value} {fixed}{'' if same else ', ' + name}"] = ([r["passes"] for r in mine],
                                                                      [r[name] for r in mine])
    title = f"{what}{'; checked = model-only everywhere' if same else ''}"
    steps = ", ".join(str(v) for v in sorted({r[along] for r in rows})[:3])
    line_chart(series, f"segment passes a puzzle (segments x rollouts; along each line {along} {steps}, ...)",
               f"exact accuracy (n={rows[0]['count']})", title, log_x=True, y_range=(0, 1)).save(path)
    print(f"picture: {path}")


def main(argv=None) -> int:
    parser = ArgumentParser(prog="benchmark_test_time.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoint file or a run directory (its best.pt)")
    parser.add_argument("--data-path", help="the held-out puzzles (default: the dataset the checkpoint trained on)")
    parser.add_argument("--segments", type=ints, default=[1, 2, 8, 16], help="segment counts (default: 1,2,8,16)")
    parser.add_argument("--rollouts", type=ints, default=[2, 4, 8], help="rollout counts K (default: 2,4,8)")
    parser.add_argument("--combined", type=pairs, default=[],
                        help="K rollouts of S segments each, as KxS pairs, e.g. 16x8,32x8 (default: none)")
    parser.add_argument("--noise", type=number_in(0, 100), default=0.5, help="std of the rollouts' noise (default: 0.5)")
    parser.add_argument("--batch-size", type=positive_int, default=256, help="evaluation batch (default: 256)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--forward-dtype", default="auto",
                        help="auto, bfloat16 or float32 (default: auto, bf16 where the device runs it natively)")
    parser.add_argument("--json", help="also write the table here")
    parser.add_argument("--grid", action="store_true",
                        help="the whole --segments x --rollouts grid from one set of passes, model-only and checked")
    parser.add_argument("--max-examples", type=positive_int,
                        help="stop after about this many puzzles (whole batches of --batch-size)")
    parser.add_argument("--picture", help="--grid: also draw accuracy against test-time compute into this PNG")
    args = parser.parse_args(argv)
    for flag in ("json", "picture"):
        if getattr(args, flag):
            check_writable_file(getattr(args, flag), f"--{flag}")
    if args.noise == 0 and (max(args.rollouts) > 1 or any(k > 1 for k, _ in args.combined)):
        parser.error("--noise 0 with more than one rollout: identical rollouts would add nothing; give --noise > 0")
    resolved = resolve_checkpoint(args.checkpoint)  # the inputs are there, before the device is chosen
    if args.data_path is not None:
        load_metadata(args.data_path, "test")
    device = select_device(args.device).device
    dtype, _ = select_dtype(device, args.forward_dtype)
    trained = load_trained(args.checkpoint, device, dtype, args.batch_size, args.data_path, resolved=resolved)
    data_path = args.data_path or (trained.cfg.data_paths_test or trained.cfg.data_paths)[0]
    precision = str(dtype).removeprefix("torch.")
    header = {"machine": machine_line(device), "precision": precision, "checkpoint": str(trained.path),
              "data": data_path}
    print(f"machine: {header['machine']}; precision {precision}")
    print(f"checkpoint: {trained.path} ({trained.note or 'as given'}); data: {data_path} (test)")
    if args.grid:
        rows = run_grid(trained, data_path, args, device)
        if args.picture:
            grid_picture(rows, args.picture, f"{Path(str(trained.path)).name} on {Path(data_path).name}: "
                                             "test-time compute")
        if args.json:
            Path(args.json).write_text(json.dumps({**header, "grid": rows}, indent=1))
        return 0
    rows, baseline = [], None
    for name, ttc in policies(trained.head.model.config.halt_max_steps, args.segments, args.rollouts, args.noise,
                               args.combined):
        loader = PuzzleDataset(data_path, "test", args.batch_size, seed=0)
        start = time.perf_counter()
        with torch.inference_mode():
            metrics = evaluate_puzzles(trained.head, trained.head, loader, device, Dist(), args.max_examples,
                                       ttc=ttc, progress=False)
        seconds = time.perf_counter() - start
        baseline = baseline or seconds
        rows.append({"policy": name, "exact_accuracy": metrics["exact_accuracy"],
                     "ci95": [metrics["exact_accuracy_ci95_low"], metrics["exact_accuracy_ci95_high"]],
                     "count": int(metrics["count"]), "mean_segments": metrics["steps"], "seconds": seconds,
                     "time_ratio": seconds / baseline})
        r = rows[-1]
        print(f"| {name:<28} | {100 * r['exact_accuracy']:5.1f}% ({100 * r['ci95'][0]:.1f}-{100 * r['ci95'][1]:.1f}) "
              f"| {r['mean_segments']:5.2f} | {seconds:6.1f} s | {r['time_ratio']:5.2f}x |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({**header, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main))
