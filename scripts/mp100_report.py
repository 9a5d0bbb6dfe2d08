"""Print the per-category report of MP-100 annotation files: keypoints, instances, skeleton edges and base.

    python scripts/mp100_report.py --data_root data/mp100 --split 1             # train, val and test of split 1
    python scripts/mp100_report.py --data_root data/mp100 --split 4 --subset test --missing_images allow
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser  # noqa: E402
from utils.data.cape.mp100 import MISSING_IMAGES, SUBSETS, annotation_path, format_report, load_split  # noqa: E402
from utils.run.main import cli_main  # noqa: E402


def main(argv=None) -> int:
    parser = ArgumentParser(prog="mp100_report.py", description="Load MP-100 annotation files with this project's loader "
                            "(the papers' instance rules) and print each category: keypoint count (from the "
                            "annotations), instances kept, skeleton edges and whether they were 0- or 1-based.")
    parser.add_argument("--data_root", required=True, help="MP-100 folder with annotations/ (and images/)")
    parser.add_argument("--split", type=int, choices=range(1, 6), required=True, help="MP-100 split (1..5)")
    parser.add_argument("--subset", choices=SUBSETS, action="append",
                        help="train, val or test (repeatable; default: all three)")
    parser.add_argument("--missing_images", choices=MISSING_IMAGES, default="allow",
                        help="what a missing image file does: error, drop the instance, or allow it (default: allow, "
                             "so the report works on the annotation files alone)")
    args = parser.parse_args(argv)
    for subset in args.subset or SUBSETS:
        split = load_split(annotation_path(args.data_root, args.split, subset), Path(args.data_root) / "images",
                           missing_images=args.missing_images)
        print(format_report(split))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main))
