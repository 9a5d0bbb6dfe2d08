"""Build a Sudoku dataset in the HRM on-disk format: a thin command line over :mod:`utils.data.sudoku.build`.

    python scripts/build_sudoku_dataset.py --output-dir data/sudoku-extreme-1k-aug-1000 --subsample-size 1000 \\
        --num-aug 1000
    python scripts/build_sudoku_dataset.py --generate --output-dir data/sudoku-gen-1k-aug-1000 --num-aug 1000
    python scripts/build_sudoku_dataset.py --generate --minimal --min-rating 1 --output-dir data/sudoku-gen-hard-1k --workers 2
    python scripts/build_sudoku_dataset.py --source-dir data/raw/sudoku-extreme --output-dir data/sudoku-extreme-1k-aug-1000 \\
        --subsample-size 1000 --num-aug 1000
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.data.sudoku.build import main  # noqa: E402
from utils.run.main import cli_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli_main(lambda: main() and 0))
