"""The HRM puzzle-dataset format: metadata, validated loading, and the train/test batch sampler.

On-disk layout (shared by every builder; ``sapientinc/HRM`` dataset/common.py and puzzle_dataset.py)::

    <data_path>/identifiers.json                        list, puzzle id -> name, "<blank>" at 0
    <data_path>/<split>/dataset.json                    PuzzleDatasetMetadata as JSON
    <data_path>/<split>/<set>__inputs.npy               [N_examples, seq_len] integer tokens
    <data_path>/<split>/<set>__labels.npy               [N_examples, seq_len] integer tokens
    <data_path>/<split>/<set>__puzzle_identifiers.npy   int32 [N_puzzles]
    <data_path>/<split>/<set>__puzzle_indices.npy       int32 [N_puzzles + 1], example offsets
    <data_path>/<split>/<set>__group_indices.npy        int32 [N_groups + 1], puzzle offsets
    <data_path>/<split>/<set>__ratings.npy              optional, int [N_puzzles], each puzzle's difficulty rating

A group is one original puzzle and its augmentations; a puzzle is one identifier with one
or more examples (input/label sequence pairs). The ratings file is ours (the reference loaders never
open it): a builder that rates its puzzles (utils/data/sudoku/build.py) writes it, and evaluations then report
exact accuracy per rating band as well as overall (utils/eval/puzzle.py).
"""

from __future__ import annotations

import json
import os
import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from utils.errors import UserError

if TYPE_CHECKING:
    import torch

IGNORE_LABEL_ID = -100  # what ignored label positions become in batches (torch cross-entropy's default)
ARRAY_FIELDS = ("inputs", "labels", "puzzle_identifiers", "puzzle_indices", "group_indices")
RATINGS_FIELD = "ratings"         # the optional <set>__ratings.npy
RATING_BAND_KEY = "rating_band"   # in test batches of a rated dataset: each row's rating band
NO_BAND = np.iinfo(np.int64).min  # the band of a padding row, or of a puzzle without a rating


def rating_bands(ratings) -> np.ndarray:
    """The band of each rating, named by its lowest rating: 0 and 1 are bands of their own, then powers of two
    (2-3, 4-7, 8-15, ...), and every negative rating falls in band -1 ("<0"); the bins of
    utils/data/sudoku/build.py ``rating_summary``'s histogram.

    Args:
        ratings: int array of any shape.
    Returns:
        int64, the same shape: 0, 1, 2, 4, 8, ... or -1.
    """
    ratings = np.asarray(ratings, np.int64)
    # r = m * 2**e with 0.5 <= m < 1; a rating past 2**53 rounds as float64, up to the next power of two at most
    # (2**63 - 1 to 2**63, which int64 cannot hold): capped there, and a power one too high halved.
    _, exponent = np.frexp(np.maximum(ratings, 1).astype(np.float64))
    power = np.left_shift(np.int64(1), np.minimum(exponent - 1, 62))
    power = np.where(power > ratings, power >> 1, power)
    return np.where(ratings < 0, -1, np.where(ratings < 2, ratings, power))


def band_name(band: int) -> str:
    """A band of :func:`rating_bands` as its histogram bin is named: "0", "1", "2-3", "4-7", ..., "<0"."""
    return "<0" if band < 0 else str(band) if band < 2 else f"{band}-{2 * band - 1}"


class DatasetError(UserError):
    """A dataset is missing, malformed or inconsistent, or was asked for in an impossible way."""


def _build_hint(data_path) -> str:
    return f"build it with python scripts/build_sudoku_dataset.py --generate --output-dir {data_path}"


@dataclass(frozen=True)
class PuzzleDatasetMetadata:
    """Contents of ``<split>/dataset.json`` (field names as in the reference).

    Attributes:
        pad_id: token used to pad inputs.
        ignore_label_id: label token that is not supervised (-> IGNORE_LABEL_ID in batches); None: none.
        blank_identifier_id: puzzle identifier used for padding rows.
        vocab_size: tokens are in [0, vocab_size).
        seq_len: tokens per example.
        num_puzzle_identifiers: identifiers are in [0, num_puzzle_identifiers).
        total_groups: groups summed over all sets.
        mean_puzzle_examples: mean examples per puzzle (used for the step count of a run).
        sets: names of the array sets (files ``<set>__*.npy``), usually ["all"].
    """

    pad_id: int
    ignore_label_id: int | None
    blank_identifier_id: int
    vocab_size: int
    seq_len: int
    num_puzzle_identifiers: int
    total_groups: int
    mean_puzzle_examples: float
    sets: list[str]


def load_metadata(data_path: str | os.PathLike, split: str) -> PuzzleDatasetMetadata:
    """Read and check ``<data_path>/<split>/dataset.json``. Extra fields (e.g. TRM's ``total_puzzles``) are ignored.

    Raises:
        DatasetError: missing directory or file, bad JSON, missing fields (named), wrong types or ranges.
    """
    data_path = Path(data_path)
    if not data_path.is_dir():
        raise DatasetError(f"data_path '{data_path}' not found: {_build_hint(data_path)}")
    path = data_path / split / "dataset.json"
    if not path.is_file():
        raise DatasetError(f"{path} not found: '{data_path}' has no '{split}' split; rebuild it ({_build_hint(data_path)})")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path} is not valid JSON ({e}); rebuild the dataset") from None
    if not isinstance(raw, dict):
        raise DatasetError(f"{path} must hold a JSON object, got {type(raw).__name__}; rebuild the dataset")
    missing = [f.name for f in fields(PuzzleDatasetMetadata) if f.name not in raw]
    if missing:
        raise DatasetError(f"{path} lacks field(s) {', '.join(missing)}; rebuild the dataset with a current builder")
    meta = PuzzleDatasetMetadata(**{f.name: raw[f.name] for f in fields(PuzzleDatasetMetadata)})

    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    for name in ("pad_id", "blank_identifier_id", "vocab_size", "seq_len", "num_puzzle_identifiers", "total_groups"):
        if not is_int(getattr(meta, name)):
            raise DatasetError(f"{path}: {name} must be an integer, got {getattr(meta, name)!r}")
    if not (meta.ignore_label_id is None or is_int(meta.ignore_label_id)):
        raise DatasetError(f"{path}: ignore_label_id must be an integer or null, got {meta.ignore_label_id!r}")
    if not isinstance(meta.mean_puzzle_examples, (int, float)) or isinstance(meta.mean_puzzle_examples, bool):
        raise DatasetError(f"{path}: mean_puzzle_examples must be a number, got {meta.mean_puzzle_examples!r}")
    if not (isinstance(meta.sets, list) and meta.sets and all(isinstance(s, str) and s for s in meta.sets)):
        raise DatasetError(f"{path}: sets must be a non-empty list of names, got {meta.sets!r}")
    if meta.vocab_size < 1 or meta.seq_len < 1 or meta.num_puzzle_identifiers < 1 or meta.total_groups < 0:
        raise DatasetError(f"{path}: vocab_size, seq_len and num_puzzle_identifiers must be >= 1 and total_groups >= 0")
    if not 0 <= meta.pad_id < meta.vocab_size:
        raise DatasetError(f"{path}: pad_id {meta.pad_id} is outside the vocabulary [0, {meta.vocab_size})")
    if not 0 <= meta.blank_identifier_id < meta.num_puzzle_identifiers:
        raise DatasetError(f"{path}: blank_identifier_id {meta.blank_identifier_id} is outside [0, {meta.num_puzzle_identifiers})")
    return meta


def check_compatible(train: PuzzleDatasetMetadata, test: PuzzleDatasetMetadata, where: str) -> None:
    """Check that one model can train on ``train`` and be evaluated on ``test``.

    Run before training, so a mismatch is found before the training time is spent, not at the first
    evaluation.

    Raises:
        DatasetError: they disagree on ``seq_len``, ``vocab_size``, ``pad_id``, ``ignore_label_id`` or
            ``blank_identifier_id``, or the test data uses puzzle identifiers beyond the training table.
    """
    for name in ("seq_len", "vocab_size", "pad_id", "ignore_label_id", "blank_identifier_id"):
        if getattr(train, name) != getattr(test, name):
            raise DatasetError(f"{where}: train and test disagree on {name} ({getattr(train, name)} vs "
                               f"{getattr(test, name)}); train and test data must come from one build of the dataset")
    if test.num_puzzle_identifiers > train.num_puzzle_identifiers:
        raise DatasetError(f"{where}: the test data has {test.num_puzzle_identifiers} puzzle identifiers, more than "
                           f"the {train.num_puzzle_identifiers} of the training data; rebuild the dataset")


def _check_offsets(where: str, offsets: np.ndarray, total: int, what: str) -> None:
    """offsets must run 0 = o[0] < o[1] < ... < o[-1] = total (every entry non-empty)."""
    if offsets.size < 1 or offsets[0] != 0 or offsets[-1] != total or np.any(np.diff(offsets) <= 0):
        raise DatasetError(f"{where}: must rise strictly from 0 to {total} (the number of {what}); the dataset is corrupt, rebuild it")


def _load_ratings(path: Path, num_puzzles: int) -> np.ndarray | None:
    """The optional ratings file: int64 [num_puzzles], or None when there is none.

    Raises:
        DatasetError: it is unreadable, not integers, or not one rating per puzzle.
    """
    if not path.is_file():
        return None
    ratings = _load_npy(path, "rebuild the dataset, or delete the file (the ratings are optional)")
    if not np.issubdtype(ratings.dtype, np.integer) or ratings.shape != (num_puzzles,):
        raise DatasetError(f"{path} holds {ratings.dtype} {list(ratings.shape)}, expected one integer rating per puzzle "
                           f"[{num_puzzles}]; rebuild the dataset or delete the file")
    largest = np.iinfo(np.int64).max
    if ratings.size and ratings.max() > largest:  # uint64: cast to int64, it would wrap into the "<0" band
        raise DatasetError(f"{path} holds ratings up to {ratings.max()}, more than the {largest} (2**63 - 1) a rating "
                           "may be; rebuild the dataset or delete the file")
    return ratings.astype(np.int64)


def _load_npy(path: Path, fix: str, mmap_mode: str | None = None) -> np.ndarray:
    """The array in the .npy file ``path`` (memory-mapped with ``mmap_mode``), without pickles.

    Raises:
        DatasetError: the file is empty, cut short or not a .npy file, naming it and how to ``fix`` it.
    """
    try:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except EOFError:  # numpy's word for a file that ends before its header does (0 bytes, or cut short)
        raise DatasetError(f"{path} is empty or cut short ({path.stat().st_size:,} bytes), not a .npy file; "
                           f"{fix}") from None
    except (ValueError, OSError) as e:
        raise DatasetError(f"{path} is not a readable .npy file ({e}); {fix}") from None


def load_arrays(data_path: str | os.PathLike, split: str, metadata: PuzzleDatasetMetadata) -> dict[str, dict[str, np.ndarray]]:
    """Load and check every ``<set>__<field>.npy`` of a split.

    inputs/labels are memory-mapped (read-only); the index arrays are read into memory.
    Token ranges are checked with min/max, one pass over the mapped files.

    Returns:
        {set_name: {field: array}} with the fields of ARRAY_FIELDS, and ``ratings`` (int64 [N_puzzles]) where the
        set has a ratings file.
    Raises:
        DatasetError: a file is missing or unreadable, shapes or dtypes disagree with the
            metadata, offsets are not increasing, or a token/identifier is out of range.
    """
    split_dir = Path(data_path) / split
    data, groups = {}, 0
    for set_name in metadata.sets:
        arrays = {}
        for name in ARRAY_FIELDS:
            path = split_dir / f"{set_name}__{name}.npy"
            if not path.is_file():
                raise DatasetError(f"{path} not found; the dataset is incomplete, rebuild it ({_build_hint(data_path)})")
            arrays[name] = _load_npy(path, "rebuild the dataset", mmap_mode="r" if name in ("inputs", "labels") else None)
            if not np.issubdtype(arrays[name].dtype, np.integer):
                raise DatasetError(f"{path}: dtype {arrays[name].dtype} is not an integer type; rebuild the dataset")
        where = f"{split_dir}/{set_name}__"
        inputs, labels = arrays["inputs"], arrays["labels"]
        if inputs.ndim != 2 or inputs.shape[1] != metadata.seq_len:
            raise DatasetError(f"{where}inputs.npy has shape {inputs.shape}, expected [N, seq_len={metadata.seq_len}]")
        if labels.shape != inputs.shape:
            raise DatasetError(f"{where}labels.npy has shape {labels.shape}, expected {inputs.shape} like inputs.npy")
        for name in ("puzzle_identifiers", "puzzle_indices", "group_indices"):
            if arrays[name].ndim != 1:
                raise DatasetError(f"{where}{name}.npy has shape {arrays[name].shape}, expected a 1-D array")
        num_puzzles = len(arrays["puzzle_identifiers"])
        if len(arrays["puzzle_indices"]) != num_puzzles + 1:
            raise DatasetError(f"{where}puzzle_indices.npy has {len(arrays['puzzle_indices'])} entries, "
                               f"expected {num_puzzles + 1} (one more than puzzle_identifiers.npy)")
        _check_offsets(f"{where}puzzle_indices.npy", arrays["puzzle_indices"], len(inputs), "examples")
        _check_offsets(f"{where}group_indices.npy", arrays["group_indices"], num_puzzles, "puzzles")
        groups += len(arrays["group_indices"]) - 1
        if len(inputs):
            if inputs.min() < 0 or inputs.max() >= metadata.vocab_size:
                raise DatasetError(f"{where}inputs.npy holds tokens in [{inputs.min()}, {inputs.max()}], "
                                   f"outside the vocabulary [0, {metadata.vocab_size}); the dataset and its metadata disagree")
            if labels.min() < 0 or labels.max() >= metadata.vocab_size:
                outside = labels[(labels < 0) | (labels >= metadata.vocab_size)]
                if metadata.ignore_label_id is None or np.any(outside != metadata.ignore_label_id):
                    raise DatasetError(f"{where}labels.npy holds tokens in [{labels.min()}, {labels.max()}], outside the "
                                       f"vocabulary [0, {metadata.vocab_size}) and not ignore_label_id={metadata.ignore_label_id}")
        ids = arrays["puzzle_identifiers"]
        if num_puzzles and (ids.min() < 0 or ids.max() >= metadata.num_puzzle_identifiers):
            raise DatasetError(f"{where}puzzle_identifiers.npy holds ids in [{ids.min()}, {ids.max()}], "
                               f"outside [0, num_puzzle_identifiers={metadata.num_puzzle_identifiers})")
        ratings = _load_ratings(split_dir / f"{set_name}__{RATINGS_FIELD}.npy", num_puzzles)
        if ratings is not None:
            arrays[RATINGS_FIELD] = ratings
        data[set_name] = arrays
    if groups != metadata.total_groups:
        raise DatasetError(f"{split_dir}: the group_indices files hold {groups} groups but dataset.json says "
                           f"total_groups={metadata.total_groups}; rebuild the dataset")
    return data


def load_datasets(paths: Sequence[Path], split: str) -> tuple[PuzzleDatasetMetadata, dict, list[int]]:
    """Load one split of several datasets as one: their sets side by side, puzzle identifiers kept unique.

    The sets of dataset i > 0 are named ``<set><i>``, as TRM's loader names them. Unlike TRM, which
    sums the identifier counts but leaves the identifiers as they are (so puzzle 5 of two datasets
    shares one embedding row), dataset i's identifiers are shifted by the identifier counts of the
    datasets before it; the blank identifier stays dataset 0's.

    Returns:
        ``(metadata, {set_name: arrays}, identifier offsets per dataset)``; for one dataset its own metadata.

    Raises:
        DatasetError: as :func:`load_metadata` / :func:`load_arrays`, or the datasets disagree on
            ``seq_len``, ``vocab_size``, ``pad_id``, ``ignore_label_id`` or ``blank_identifier_id``.
    """
    metas = [load_metadata(p, split) for p in paths]
    data, offsets, offset = {}, [], 0
    for i, (path, meta) in enumerate(zip(paths, metas)):
        for name in ("seq_len", "vocab_size", "pad_id", "ignore_label_id", "blank_identifier_id"):
            if getattr(meta, name) != getattr(metas[0], name):
                raise DatasetError(f"data_paths {paths[0]} and {path} disagree on {name} ({getattr(metas[0], name)} vs "
                                   f"{getattr(meta, name)}); datasets trained together need one token format")
        for set_name, arrays in load_arrays(path, split, meta).items():
            if offset:
                arrays["puzzle_identifiers"] = arrays["puzzle_identifiers"] + offset
            data[set_name if i == 0 else f"{set_name}{i}"] = arrays
        offsets.append(offset)
        offset += meta.num_puzzle_identifiers
    if len(metas) == 1:
        return metas[0], data, offsets
    puzzles = sum(len(d["puzzle_identifiers"]) for d in data.values())
    examples = sum(len(d["inputs"]) for d in data.values())
    merged = dataclasses.replace(metas[0], num_puzzle_identifiers=offset, total_groups=sum(m.total_groups for m in metas),
                                 mean_puzzle_examples=examples / max(1, puzzles), sets=list(data))
    return merged, data, offsets


class PuzzleDataset:
    """Batches of a puzzle dataset, in the reference sampling order, resumable.

    Train mode (``split="train"`` unless ``test_set_mode`` says otherwise): one pass over
    the iterator is one *iteration* of ``epochs_per_iter`` epochs. Each epoch visits the groups
    in a fresh random order; for each group one random puzzle is drawn and its examples (in
    random order) are packed into batches of ``global_batch_size`` rows; a puzzle that does
    not fit is cut at the batch end, and the incomplete last batch of the iteration is dropped.
    The RNG of iteration ``i`` is seeded from ``(seed, i)``, so any position can be rebuilt.

    Test mode: examples in file order, ``global_batch_size`` at a time; the last batch is padded.

    Every rank builds the same global batch and keeps rows ``[rank*B, (rank+1)*B)``,
    ``B = global_batch_size // world_size``, so the ranks' slices partition the batch.

    Iterating yields ``(set_name, batch, effective_global_batch_size)``; ``batch`` holds CPU
    tensors ``inputs`` int32 [B, seq_len], ``labels`` int32 [B, seq_len] (ignored positions and
    padding = IGNORE_LABEL_ID) and ``puzzle_identifiers`` int32 [B]. The effective size counts
    the real (unpadded) rows of the global batch: always ``global_batch_size`` in train mode.
    In test mode a dataset with ratings files (``rating_bands`` not empty) adds ``rating_band``
    (RATING_BAND_KEY) int64 [B]: each row's :func:`rating_bands`, NO_BAND for padding and unrated puzzles.

    ``state_dict()`` records the next batch (iteration, batch index); it is exact when batches
    are consumed in this process (not through DataLoader workers, which would run ahead).

    ``data_paths`` is one dataset directory or several, loaded as one (see :func:`load_datasets`).

    Raises:
        DatasetError: bad arguments, a bad dataset (see load_metadata/load_arrays), or a train
            split too small to fill one global batch.
    """

    def __init__(self, data_paths: str | os.PathLike | Sequence[str | os.PathLike], split: str, global_batch_size: int,
                 seed: int = 0, rank: int = 0, world_size: int = 1, epochs_per_iter: int = 1,
                 test_set_mode: bool | None = None):
        if world_size < 1 or not 0 <= rank < world_size:
            raise DatasetError(f"rank must be in [0, world_size={world_size}), got rank={rank}")
        if global_batch_size < 1 or global_batch_size % world_size:
            raise DatasetError(f"global_batch_size {global_batch_size} must be a positive multiple of world_size {world_size}")
        if seed < 0 or epochs_per_iter < 1:
            raise DatasetError(f"seed must be >= 0 and epochs_per_iter >= 1, got seed={seed}, epochs_per_iter={epochs_per_iter}")
        paths = [Path(data_paths)] if isinstance(data_paths, (str, os.PathLike)) else [Path(p) for p in data_paths]
        if not paths:
            raise DatasetError("no dataset given: set data_path (one dataset) or data_paths (several)")
        data_path = paths[0] if len(paths) == 1 else ", ".join(map(str, paths))
        self.data_paths, self.split = paths, split
        self.global_batch_size, self.local_batch_size = global_batch_size, global_batch_size // world_size
        self.seed, self.rank, self.world_size, self.epochs_per_iter = seed, rank, world_size, epochs_per_iter
        self.test_set_mode = split != "train" if test_set_mode is None else test_set_mode
        self.metadata, self._data, self.identifier_offsets = load_datasets(paths, split)
        self.num_examples = sum(len(d["inputs"]) for d in self._data.values())
        # Each puzzle's rating band, for test batches (per-band accuracy, utils/eval/puzzle.py); none unless rated.
        rated = {name: rating_bands(d[RATINGS_FIELD]) for name, d in self._data.items()
                 if RATINGS_FIELD in d and self.test_set_mode}
        self._bands = {name: rated.get(name, np.full(len(d["puzzle_identifiers"]), NO_BAND))
                       for name, d in self._data.items()} if rated else {}
        self.rating_bands: list[int] = sorted(set(np.concatenate(list(rated.values())).tolist())) if rated else []
        self._iteration, self._batch = 0, 0
        self._plan_cache: tuple[int, tuple] | None = None
        if len(self) == 0:
            if self.test_set_mode:
                raise DatasetError(f"split '{split}' of {data_path} has no examples; rebuild the dataset")
            raise DatasetError(f"split '{split}' of {data_path}: {epochs_per_iter} epoch(s) of {self.metadata.total_groups} "
                               f"groups cannot fill one global batch of {global_batch_size}; "
                               "lower global_batch_size or raise epochs_per_iter")

    # --- sampling plans: which puzzles/examples form each global batch of an iteration ---

    def _plan(self, iteration: int) -> tuple:
        """(puzzle sequence per set, list of (set, start, stop)) for one iteration; cached.

        Train: puzzles[set][start:stop] fill the batch. Test: examples [start, stop).
        """
        if self._plan_cache is not None and self._plan_cache[0] == iteration:
            return self._plan_cache[1]
        batches, sequences = [], {}
        if self.test_set_mode:
            for set_name, d in self._data.items():
                n = len(d["inputs"])
                batches += [(set_name, s, min(s + self.global_batch_size, n)) for s in range(0, n, self.global_batch_size)]
        else:
            rng = np.random.default_rng([self.seed, iteration])
            for set_name, d in self._data.items():
                groups, examples = d["group_indices"], d["puzzle_indices"]
                order = np.concatenate([rng.permutation(len(groups) - 1) for _ in range(self.epochs_per_iter)])
                puzzles = rng.integers(groups[order], groups[order + 1])
                sequences[set_name] = puzzles
                ends = np.cumsum(examples[puzzles + 1] - examples[puzzles])  # examples up to and including each puzzle
                start = 0
                while start < len(puzzles):
                    filled = ends[start - 1] if start else 0
                    last = int(np.searchsorted(ends, filled + self.global_batch_size))  # first puzzle that fills it
                    if last >= len(puzzles):
                        break  # incomplete last batch: dropped
                    batches.append((set_name, start, last + 1))
                    start = last + 1
        plan = (sequences, batches)
        self._plan_cache = (iteration, plan)
        return plan

    def __len__(self) -> int:
        """Number of global batches in the current iteration (one pass of the iterator)."""
        return len(self._plan(self._iteration)[1])

    def _train_rows(self, offsets: np.ndarray, iteration: int, index: int, puzzles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Example rows and their puzzles for one global train batch; the last puzzle is cut to fit."""
        starts = offsets[puzzles]
        sizes = offsets[puzzles + 1] - starts
        if np.all(sizes == 1):
            rows = starts
        else:  # each puzzle's examples in random order, from an RNG owned by this batch
            rng = np.random.default_rng([self.seed, iteration, index])
            rows = np.concatenate([s + rng.permutation(n) for s, n in zip(starts, sizes)])
        return rows[:self.global_batch_size], np.repeat(puzzles, sizes)[:self.global_batch_size]

    def _collate(self, d: dict, rows: np.ndarray, puzzles: np.ndarray, bands: np.ndarray | None = None
                 ) -> dict[str, torch.Tensor]:
        pad = self.local_batch_size - len(rows)
        inputs = d["inputs"][rows].astype(np.int32)
        labels = d["labels"][rows].astype(np.int32)
        ids = d["puzzle_identifiers"][puzzles].astype(np.int32)
        if self.metadata.ignore_label_id is not None:
            labels[labels == self.metadata.ignore_label_id] = IGNORE_LABEL_ID
        batch = {
            "inputs": np.pad(inputs, ((0, pad), (0, 0)), constant_values=self.metadata.pad_id),
            "labels": np.pad(labels, ((0, pad), (0, 0)), constant_values=IGNORE_LABEL_ID),
            "puzzle_identifiers": np.pad(ids, (0, pad), constant_values=self.metadata.blank_identifier_id),
        }
        if bands is not None:
            batch[RATING_BAND_KEY] = np.pad(bands[puzzles], (0, pad), constant_values=NO_BAND)
        # torch is imported here, not with the module: the dataset builders read this module for the format alone,
        # and without torch their start (and --help) is about 2 s shorter.
        import torch

        return {k: torch.from_numpy(v) for k, v in batch.items()}

    def _batch_at(self, iteration: int, index: int) -> tuple[str, dict[str, torch.Tensor], int]:
        sequences, batches = self._plan(iteration)
        set_name, start, stop = batches[index]
        d = self._data[set_name]
        local = slice(self.rank * self.local_batch_size, (self.rank + 1) * self.local_batch_size)
        if self.test_set_mode:
            rows = np.arange(start, stop)[local]
            puzzles = np.searchsorted(d["puzzle_indices"], rows, side="right") - 1
            return set_name, self._collate(d, rows, puzzles, self._bands.get(set_name)), stop - start
        rows, puzzles = self._train_rows(d["puzzle_indices"], iteration, index, sequences[set_name][start:stop])
        return set_name, self._collate(d, rows[local], puzzles[local]), self.global_batch_size

    def __iter__(self):
        """Yield the rest of the current iteration's batches, then move to the next iteration."""
        iteration = self._iteration
        num_batches = len(self._plan(iteration)[1])
        if num_batches == 0:  # a random draw of small multi-example puzzles can leave an iteration empty
            self._iteration, self._batch = iteration + 1, 0
        for index in range(self._batch, num_batches):
            item = self._batch_at(iteration, index)
            # Advance before yielding: a state_dict() taken after this batch resumes at the next one.
            self._iteration, self._batch = (iteration + 1, 0) if index + 1 == num_batches else (iteration, index + 1)
            yield item

    # --- resumability ---

    def state_dict(self) -> dict:
        """Sampler position (next batch) plus the settings it depends on; plain ints/bools."""
        return {"iteration": self._iteration, "batch": self._batch, "seed": self.seed,
                "global_batch_size": self.global_batch_size, "epochs_per_iter": self.epochs_per_iter,
                "test_set_mode": self.test_set_mode, "num_examples": self.num_examples}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a ``state_dict()``; the next batch is the one that would have come next.

        ``world_size`` and ``rank`` may differ from the saving run: global batches do not depend on them.

        Raises:
            DatasetError: keys missing, or the state was saved with other settings or another dataset.
        """
        missing = {"iteration", "batch", "seed", "global_batch_size", "epochs_per_iter", "test_set_mode", "num_examples"} - set(state)
        if missing:
            raise DatasetError(f"dataset state lacks {', '.join(sorted(missing))}; it is not from PuzzleDataset.state_dict()")
        for key in ("seed", "global_batch_size", "epochs_per_iter", "test_set_mode", "num_examples"):
            if state[key] != getattr(self, key):
                raise DatasetError(f"dataset state was saved with {key}={state[key]}, this run has {getattr(self, key)}; "
                                   "resume with the same data_path, seed and batch settings")
        iteration, index = int(state["iteration"]), int(state["batch"])
        if iteration < 0 or not 0 <= index < max(1, len(self._plan(iteration)[1])):
            raise DatasetError(f"dataset state position (iteration {iteration}, batch {index}) does not exist in this dataset")
        self._iteration, self._batch = iteration, index
