"""Accuracy against training compute: compare recipes by the FLOPs each spent to reach an accuracy.

Reads each run's metrics.jsonl (``eval/train_pflop``, the run's own count of training FLOPs up to each evaluation,
utils/train/curriculum.py, and the evaluation metric), prints a markdown table of every evaluation, then for each
run after the first (the baseline) the training PFLOP at which it first reached the baseline's final accuracy and
that as a fraction of the baseline's PFLOP; draws the curves as a PNG.

    python scripts/compute_curve.py --run reference=checkpoints/expert/reference --run cgar=checkpoints/expert/cgar \\
        --picture docs/expert_compute_curve.png
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from utils.cli import ArgumentParser  # noqa: E402
from utils.config import ConfigError  # noqa: E402
from utils.outputs import announce_replacing, check_writable_file  # noqa: E402
from utils.run.main import cli_main  # noqa: E402
from utils.run.metrics import read_points  # noqa: E402
from utils.viz.charts import line_chart  # noqa: E402
from utils.viz.puzzles import save_picture  # noqa: E402

log = logging.getLogger(__name__)


def labelled_run(text: str) -> tuple[str, Path]:
    """``LABEL=RUN_DIR`` -> ``(label, path)``."""
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise ConfigError(f"--run {text!r}: give LABEL=RUN_DIR, e.g. --run reference=checkpoints/expert/reference")
    return label, Path(path)


def finite(value) -> bool:
    """Whether ``value`` (as JSON gave it) is a finite number: not NaN, not infinite, not text or a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def curve(run: Path, metric: str) -> list[tuple[float, float, int]]:
    """``(training PFLOP, metric, step)`` of every evaluation of ``run`` that logged both, in step order.

    An evaluation whose PFLOP or metric is not a finite number (a diverged run logs NaN; JSON also carries Infinity)
    has no place on a curve or in a comparison: it is left out, with a warning naming its steps.

    Raises:
        ConfigError: no metrics.jsonl, or no evaluation with a finite ``eval/train_pflop`` and ``metric`` in it.
    """
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{run}: no metrics.jsonl; give a run directory of pretrain.py")
    logged = [(point["eval/train_pflop"], point[metric], point.get("step")) for point in read_points(path)
              if "eval/train_pflop" in point and metric in point]
    points = [p for p in logged if all(map(finite, p))]
    left_out = [step for pflop, value, step in logged if not all(map(finite, (pflop, value, step)))]
    if left_out:
        log.warning("%s: left out %d evaluation(s) whose eval/train_pflop, %s or step is not a finite number (NaN, "
                    "Infinity or text; steps: %s)", path, len(left_out), metric, ", ".join(map(str, left_out)))
    if not points:
        raise ConfigError(f"{path}: no evaluation logged eval/train_pflop and {metric} as finite numbers (runs from "
                          "before the FLOP count cannot be compared, nor a run whose every evaluation is NaN)")
    return sorted(points, key=lambda p: p[2])


def first_reaching(points: list[tuple[float, float, int]], target: float) -> tuple[float, int] | None:
    """``(PFLOP, step)`` of the first evaluation at or above ``target``; None when none is."""
    return next(((pflop, step) for pflop, value, step in points if value >= target), None)


def check_picture(path: str) -> None:
    """Refuse a ``--picture`` that cannot be written or is not named as a PNG, before any work; say when it exists
    (the user named it: theirs to replace, utils/outputs.py).

    Raises:
        ConfigError: a name without the .png ending.
        OutputPathError: see :func:`utils.outputs.check_writable_file`.
    """
    if Path(path).suffix.lower() != ".png":
        raise ConfigError(f"--picture {path}: the picture is a PNG; give a file name ending in .png, e.g. "
                          f"--picture {Path(path).with_suffix('.png').name}")
    check_writable_file(path, "--picture")
    announce_replacing(path, "--picture")


def main(argv=None) -> int:
    parser = ArgumentParser(prog="compute_curve.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=RUN_DIR",
                        help="a run to compare; the first is the baseline (repeat for each run)")
    parser.add_argument("--metric", default="eval/exact_accuracy", help="the metric (default: eval/exact_accuracy)")
    parser.add_argument("--picture", help="also draw the curves into this PNG (a name ending in .png; one that exists "
                                          "is replaced, and the command says so)")
    args = parser.parse_args(argv)
    return cli_main(lambda: compare(args))


def compare(args) -> int:
    """The table, the comparison and the picture of ``main``'s arguments."""
    if args.picture:
        check_picture(args.picture)
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
            best_pflop, best, _ = max(points, key=lambda point: point[1])
            print(f"{label}: never reached {target:.4f} (best {best:.4f} at {best_pflop:.4g} PFLOP, of "
                  f"{points[-1][0]:.4g} in all)")
        else:
            # A baseline evaluated before any training (step 0, or a run that only evaluated) spent no FLOPs: no ratio.
            ratio = (f" = {reached[0] / base_pflop:.2f}x the {base_label}'s training FLOPs" if base_pflop > 0 else
                     f" (the {base_label} spent no training FLOPs: no ratio)")
            print(f"{label}: reached {target:.4f} at step {reached[1]} after {reached[0]:.4g} PFLOP{ratio}")
    if args.picture:
        chart = line_chart({label: ([p for p, _, _ in points], [v for _, v, _ in points])
                            for label, points in curves.items()},
                           "training PFLOP (the run's own count)", args.metric, f"{args.metric} against training compute")
        save_picture(chart, Path(args.picture))
        print(f"picture: {args.picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
