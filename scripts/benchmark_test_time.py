"""Test-time compute against exact accuracy and time: one trained checkpoint on its held-out puzzles, evaluated with
more ACT segments, with early exit on the Q head, and with K rollouts ranked by q_halt (utils/eval/reasoning.py).

Every row is one full evaluation of the same puzzles in this process; the time column is its wall time and the
ratio is against the first row (the references' evaluation: halt_max_steps segments, one rollout), measured in the
same run. Exact accuracy comes with its 95% Wilson interval.

    python scripts/benchmark_test_time.py --checkpoint checkpoints/sudoku-gen-40-1k-aug-100/RUN
    python scripts/benchmark_test_time.py --checkpoint RUN --segments 4,8,16 --rollouts 2,4 --noise 0.5 --json out.json
    python scripts/benchmark_test_time.py --checkpoint RUN --segments 8 --rollouts 8,16 --combined 16x8   # K x S
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

from utils.cli import ArgumentParser  # noqa: E402
from utils.data.puzzle_dataset import PuzzleDataset  # noqa: E402
from utils.device import select_device, select_dtype  # noqa: E402
from utils.distributed import Dist  # noqa: E402
from utils.eval.load import load_trained  # noqa: E402
from utils.eval.puzzle import evaluate_puzzles  # noqa: E402
from utils.eval.reasoning import TestTimeCompute  # noqa: E402
from utils.hardware_optimizer import machine_line  # noqa: E402
from utils.outputs import check_writable_file  # noqa: E402
from utils.run.main import cli_main  # noqa: E402


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


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


def main(argv=None) -> int:
    parser = ArgumentParser(prog="benchmark_test_time.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoint file or a run directory (its best.pt)")
    parser.add_argument("--data-path", help="the held-out puzzles (default: the dataset the checkpoint trained on)")
    parser.add_argument("--segments", type=ints, default=[1, 2, 8, 16], help="segment counts (default: 1,2,8,16)")
    parser.add_argument("--rollouts", type=ints, default=[2, 4, 8], help="rollout counts K (default: 2,4,8)")
    parser.add_argument("--combined", type=pairs, default=[],
                        help="K rollouts of S segments each, as KxS pairs, e.g. 16x8,32x8 (default: none)")
    parser.add_argument("--noise", type=float, default=0.5, help="std of the rollouts' noise (default: 0.5)")
    parser.add_argument("--batch-size", type=int, default=256, help="evaluation batch (default: 256)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args(argv)
    if args.json:
        check_writable_file(args.json, "--json")
    device = select_device(args.device).device
    dtype, _ = select_dtype(device, "auto")
    trained = load_trained(args.checkpoint, device, dtype, args.batch_size, args.data_path)
    data_path = args.data_path or (trained.cfg.data_paths_test or trained.cfg.data_paths)[0]
    print(f"machine: {machine_line(device)}")
    print(f"checkpoint: {trained.path} ({trained.note or 'as given'}); data: {data_path} (test)")
    rows, baseline = [], None
    for name, ttc in policies(trained.head.model.config.halt_max_steps, args.segments, args.rollouts, args.noise,
                               args.combined):
        loader = PuzzleDataset(data_path, "test", args.batch_size, seed=0)
        start = time.perf_counter()
        with torch.inference_mode():
            metrics = evaluate_puzzles(trained.head, trained.head, loader, device, Dist(), ttc=ttc, progress=False)
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
        Path(args.json).write_text(json.dumps({"machine": machine_line(device), "checkpoint": str(trained.path),
                                               "data": data_path, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main))
