"""Build the outside yardstick, a Sudoku test split of published hard puzzles: a thin command line over
:mod:`utils.data.sudoku.outside`.

    python scripts/build_outside_sudoku.py --output-dir data/sudoku-outside
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.data.sudoku.outside import main  # noqa: E402
from utils.run.main import cli_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli_main(lambda: main() and 0))
