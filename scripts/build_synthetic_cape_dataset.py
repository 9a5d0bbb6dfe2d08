"""Build the procedural CAPE dataset in the MP-100 layout: a thin command line over :mod:`utils.data.cape.synthetic`.

    python scripts/build_synthetic_cape_dataset.py --output-dir data/synthetic_cape
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.data.cape.synthetic import main  # noqa: E402
from utils.run.main import cli_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli_main(main))
