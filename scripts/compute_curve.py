"""Accuracy against training compute: compare recipes by the FLOPs each spent to reach an accuracy.

Reads each run's metrics.jsonl (``eval/train_pflop``, the run's own count of training FLOPs up to each evaluation,
utils/train/curriculum.py, and the evaluation metric), prints a markdown table of every evaluation, then for each
run after the first (the baseline) the training PFLOP at which it first reached the baseline's final accuracy and
that as a fraction of the baseline's PFLOP; draws the curves as a PNG.

    python scripts/compute_curve.py --run reference=checkpoints/expert/reference --run cgar=checkpoints/expert/cgar \\
        --picture docs/expert_compute_curve.png
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from utils.cli import ArgumentParser  # noqa: E402
from utils.config import ConfigError  # noqa: E402
from utils.outputs import check_writable_file  # noqa: E402
from utils.run.main import cli_main  # noqa: E402
from utils.run.metrics import read_points  # noqa: E402
from utils.viz.charts import line_chart  # noqa: E402


def labelled_run(text: str) -> tuple[str, Path]:
    """``LABEL=RUN_DIR`` -> ``(label, path)``."""
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise ConfigError(f"--run {text!r}: give LABEL=RUN_DIR, e.g. --run reference=checkpoints/expert/reference")
    return label, Path(path)


def curve(run: Path, metric: str) -> list[tuple[float, float, int]]:
    """``(training PFLOP, metric, step)`` of every evaluation of ``run`` that logged both, in step order.

    Raises:
        ConfigError: no metrics.jsonl, or no evaluation with ``eval/train_pflop`` and ``metric`` in it.
    """
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{run}: no metrics.jsonl; give a run directory of pretrain.py")
    points = [(point["eval/train_pflop"], point[metric], point["step"]) for point in read_points(path)
              if "eval/train_pflop" in point and metric in point]
    if not points:
        raise ConfigError(f"{path}: no evaluation logged eval/train_pflop and {metric} (runs from before the FLOP "
                          "count cannot be compared)")
    return sorted(points, key=lambda p: p[2])


def first_reaching(points: list[tuple[float, float, int]], target: float) -> tuple[float, int] | None:
    """``(PFLOP, step)`` of the first evaluation at or above ``target``; None when none is."""
    return next(((pflop, step) for pflop, value, step in points if value >= target), None)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="compute_curve.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=RUN_DIR",
                        help="a run to compare; the first is the baseline (repeat for each run)")
    parser.add_argument("--metric", default="eval/exact_accuracy", help="the metric (default: eval/exact_accuracy)")
    parser.add_argument("--picture", help="also draw the curves into this PNG")
    args = parser.parse_args(argv)
    return cli_main(lambda: compare(args))


def compare(args) -> int:
    """The table, the comparison and the picture of ``main``'s arguments."""
    if args.picture:
        check_writable_file(args.picture, "--picture")
    runs = [labelled_run(text) for text in args.run]
    curves = {label: curve(path, args.metric) for label, path in runs}
    print(f"| run | step | training PFLOP | {args.metric} |\n|---|---|---|---|")
    for label, points in curves.items():
        for pflop, value, step in points:
            print(f"| {label} | {step} | {pflop:.4g} | {value:.4f} |")
    base_label, base = runs[0][0], curves[runs[0][0]]
    base_pflop, target = base[-1][0], base[-1][1]
    print(f"\n{base_label}: final {args.metric} {target:.4f} after {base_pflop:.4g} PFLOP")
    for label, points in list(curves.items())[1:]:
        reached = first_reaching(points, target)
        if reached is None:
            print(f"{label}: never reached {target:.4f} (best {max(v for _, v, _ in points):.4f} after "
                  f"{points[-1][0]:.4g} PFLOP)")
        else:
            print(f"{label}: reached {target:.4f} at step {reached[1]} after {reached[0]:.4g} PFLOP = "
                  f"{reached[0] / base_pflop:.2f}x the {base_label}'s training FLOPs")
    if args.picture:
        chart = line_chart({label: ([p for p, _, _ in points], [v for _, v, _ in points])
                            for label, points in curves.items()},
                           "training PFLOP (the run's own count)", args.metric, f"{args.metric} against training compute")
        chart.save(args.picture)
        print(f"picture: {args.picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
