"""Building a recipe's dataset on first use: ``dataset_builder: {kind: sudoku|maze|arc, <builder options>}``.

The options are the keyword arguments of the builder (its command-line flags without the dashes):
:func:`utils.data.sudoku.build.build_dataset`, :func:`utils.data.maze.build_maze_dataset` or
:func:`utils.data.arc.build_arc_dataset`. ``kind`` defaults to ``sudoku``. A Sudoku or maze builder given neither
``source_dir`` nor ``generate`` downloads the published CSVs from the Hugging Face Hub (``repo``, ``revision``), so
``{kind: sudoku, subsample_size: 1000, num_aug: 1000}`` is Sudoku-Extreme 1k.
"""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path
from typing import Any

from utils.config import ConfigError, dataset_builder_parts

BUILDERS = {
    "sudoku": ("utils.data.sudoku.build", "build_dataset", "scripts/build_sudoku_dataset.py"),
    "maze": ("utils.data.maze", "build_maze_dataset", "scripts/build_maze_dataset.py"),
    "arc": ("utils.data.arc", "build_arc_dataset", "scripts/build_arc_dataset.py"),
}


def build_dataset(path: str | os.PathLike, spec: dict[str, Any]) -> Path:
    """Build the dataset ``spec`` describes at ``path``.

    Raises:
        ConfigError: an unknown ``kind`` or an option the builder does not take.
        DatasetError: the builder's own checks (bad sizes, a non-empty output directory, ...).
    """
    kind, options = dataset_builder_parts(spec)
    if kind not in BUILDERS:
        raise ConfigError(f"dataset_builder.kind={kind!r}: use one of {', '.join(BUILDERS)}")
    module, function, script = BUILDERS[kind]
    builder = getattr(importlib.import_module(module), function)
    known = [name for name in inspect.signature(builder).parameters if name != "output_dir"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"dataset_builder: {kind} builds take no {', '.join(unknown)}; use the flags of {script} "
                          f"without dashes: {', '.join(known)}")
    return builder(path, **options)
