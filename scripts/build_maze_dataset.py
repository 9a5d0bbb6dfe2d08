"""Build a maze dataset (Maze-Hard) in the HRM on-disk format: a thin command line over :mod:`utils.data.maze`.

    python scripts/build_maze_dataset.py --output-dir data/maze-30x30-hard-1k-aug --aug
    python scripts/build_maze_dataset.py --source-dir data/raw/maze-30x30-hard-1k \\
        --output-dir data/maze-30x30-hard-1k --aug
    python scripts/build_maze_dataset.py --generate --output-dir data/maze-gen-30x30-1k --aug --workers 2
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.data.maze import main  # noqa: E402
from utils.run.main import cli_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli_main(lambda: main() and 0))
