"""CAPE learning benchmark: PCK@0.2 on unseen categories against the copy-the-support baseline, over time.

Runs ``./START_CAPE_TRAINING.sh`` as a user would (on a CPU: capeformer_lite on the synthetic MP-100
stand-in, built on first use; validation on the split's val categories after every epoch, then the
test categories at the end; none of them is seen in training) and prints, for each validation, the
minutes elapsed, the model's PCK@0.2, the baseline's PCK@0.2 on the same episodes and their ratio.
The baseline ("copy the support keypoints", in crop coordinates) is measured in the same run, so the
ratio is comparable across machines while the minutes are not.

    python scripts/benchmark_cape_learning.py                       # the CPU quickstart, about 6.5 minutes on 2 cores
    python scripts/benchmark_cape_learning.py --output-dir /tmp/cape-bench -- --epochs 4
    MP100_ROOT=/data/mp100 python scripts/benchmark_cape_learning.py -- --split 2

Arguments after ``--`` go to START_CAPE_TRAINING.sh (and win over its defaults).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from utils.cli import ArgumentParser  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.run.metrics import read_points  # noqa: E402


class BenchmarkError(UserError):
    """The training run failed or left no metrics to read."""


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (one JSON object per line, as MetricsWriter writes them).

    Raises:
        BenchmarkError: the file is missing.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise BenchmarkError(f"{path} was not written: the training run failed (see its output above)")
    return read_points(path)


def report(records: list[dict]) -> str:
    """A table of every validation and the final test, and whether PCK rose above its first value.

    ``records`` are metrics.jsonl lines; PCK is read from ``val/PCK@0.2_percent``, ``test/PCK@0.2_percent`` and
    their ``copy_support_`` twins, in percent, as the trainer logs them."""
    val = [r for r in records if "val/PCK@0.2_percent" in r]
    test = [r for r in records if "test/PCK@0.2_percent" in r]
    if not val:
        return "no validation was logged"
    lines = [f"{'epoch':>5} {'minutes':>8} {'PCK@0.2':>8} {'copy-support':>12} {'ratio':>6}"]
    for r in val:
        base = r["val/copy_support_PCK@0.2_percent"]
        pck = r["val/PCK@0.2_percent"]
        lines.append(f"{r['epoch']:>5} {r['val/elapsed_s'] / 60:>8.1f} {pck:>8.2f} {base:>12.2f} "
                     f"{pck / base if base else float('nan'):>6.2f}")
    first, best = val[0]["val/PCK@0.2_percent"], max(r["val/PCK@0.2_percent"] for r in val)
    last = val[-1]["val/PCK@0.2_percent"]
    lines.append(f"val (unseen categories): first {first:.2f}, best {best:.2f}, last {last:.2f}; "
                 f"{'rising' if best > first else 'NOT rising'}")
    for r in test:
        base = r["test/copy_support_PCK@0.2_percent"]
        pck = r["test/PCK@0.2_percent"]
        lines.append(f"test (unseen categories): PCK@0.2 {pck:.2f}, copy-support {base:.2f}, "
                     f"ratio {pck / base if base else float('nan'):.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Arguments after -- go to START_CAPE_TRAINING.sh.")
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="run directory for the training run (default: a new temporary directory)")
    args = parser.parse_args(ours)
    if args.output_dir is not None and args.output_dir.exists() and (not args.output_dir.is_dir()
                                                                      or any(args.output_dir.iterdir())):
        parser.error(f"--output-dir {args.output_dir} is not an empty folder: name a new folder")
    run_dir = args.output_dir or Path(tempfile.mkdtemp(prefix="cape-learning-"))
    # Imported after the parse: --help is answered without torch.
    from utils.hardware_optimizer import machine_line
    from utils.run.main import cli_main

    def body() -> int:
        print(machine_line())
        cmd = ["bash", str(REPO / "START_CAPE_TRAINING.sh"), "--output_dir", str(run_dir), "--val_interval", "1", *extra]
        print("running:", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, cwd=REPO)
        if rc != 0:
            raise BenchmarkError(f"START_CAPE_TRAINING.sh exited with {rc} (its output is above); run directory: {run_dir}")
        print(report(read_metrics(run_dir)))
        print(f"run directory: {run_dir}")
        return 0

    return cli_main(body)


if __name__ == "__main__":
    sys.exit(main())
