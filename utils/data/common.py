"""Pieces every puzzle-dataset builder shares: the source (a directory, generation, or the Hugging Face Hub), the
output-directory rules, the atomic build, the dihedral transforms, generating distinct puzzles (in parallel,
deterministically), subsampling the training set, and writing a split of one-example puzzles in the HRM on-disk
format (utils/data/puzzle_dataset.py).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm import tqdm

from utils.data.puzzle_dataset import DatasetError
from utils.outputs import OutputPathError, check_writable_dir

# dihedral(dihedral(g, t), DIHEDRAL_INVERSE[t]) == g: rotations by 1 and 3 quarter turns undo each other,
# the flips and (anti-)transposes undo themselves.
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)


def dihedral(grid: np.ndarray, t: int) -> np.ndarray:
    """Dihedral transform ``t`` of the last two axes (TRM ``dataset/common.py`` ``dihedral_transform``; HRM's is the same).

    t0 identity, t1/t2/t3 ``np.rot90`` by 1/2/3 quarter turns (counter-clockwise), t4 left-right flip,
    t5 up-down flip, t6 transpose, t7 anti-transpose (t1 then a left-right flip).

    Args:
        grid: [..., H, W] array (a batch of grids is transformed grid by grid).
        t: 0..7.
    Returns:
        [..., H, W] or [..., W, H] (t1, t3, t6, t7) view or copy.
    Raises:
        ValueError: t is not in 0..7.
    """
    if t in (1, 2, 3):
        return np.rot90(grid, t, axes=(-2, -1))
    if t == 4:
        return np.flip(grid, -1)
    if t == 5:
        return np.flip(grid, -2)
    if t == 6:
        return np.swapaxes(grid, -1, -2)
    if t == 7:
        return np.flip(np.rot90(grid, 1, axes=(-2, -1)), -1)
    if t == 0:
        return grid
    raise ValueError(f"dihedral transform index must be in 0..7, got {t!r}")


def inverse_dihedral(grid: np.ndarray, t: int) -> np.ndarray:
    """Undo :func:`dihedral` ``t``: ``inverse_dihedral(dihedral(g, t), t) == g``."""
    if t not in range(8):
        raise ValueError(f"dihedral transform index must be in 0..7, got {t!r}")
    return dihedral(grid, DIHEDRAL_INVERSE[t])


def check_source_and_sizes(source_dir, generate: bool, source_hint: str, minimums: dict[str, tuple[int, int]],
                           subsample_size: int | None, repo: str | None = None, revision: str | None = None) -> None:
    """The argument checks every puzzle builder shares: at most one source (none: the Hub, see :func:`csv_source`),
    ``repo``/``revision`` only for the Hub, sizes at or above their minimum.

    Args:
        source_hint: what ``--source-dir`` holds and which Hub repo is the default, for the message (e.g.
            "Sudoku-Extreme train.csv/test.csv, Hub repo sapientinc/sudoku-extreme").
        minimums: flag name (underscores) -> (value, smallest allowed).

    Raises:
        DatasetError: naming the flag and the value.
    """
    if source_dir is not None and generate:
        raise DatasetError(f"choose exactly one source: --source-dir DIR, --generate, or neither to download the "
                           f"published CSVs ({source_hint}) from the Hugging Face Hub")
    if (repo is not None or revision is not None) and (source_dir is not None or generate):
        raise DatasetError("--repo and --revision pick the Hugging Face Hub source: drop them, or drop "
                           f"{'--source-dir' if source_dir is not None else '--generate'}")
    for name, (value, low) in minimums.items():
        if value < low:
            raise DatasetError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    if subsample_size is not None and subsample_size < 1:
        raise DatasetError(f"--subsample-size must be >= 1, got {subsample_size}")


@dataclass(frozen=True)
class CsvSource:
    """Where a builder reads its CSVs: ``directory`` (None when it generates), and for a Hub build the ``record``
    of what was fetched (repo, commit, each CSV's SHA-256 and rows), which each split's ``dataset.json`` keeps under
    ``source``."""

    directory: Path | None
    record: dict | None = None


def csv_source(source_dir, generate: bool, repo: str, revision: str | None) -> CsvSource:
    """The CSVs a build reads: ``source_dir``; none with ``generate``; else ``repo`` at ``revision`` fetched from the
    Hugging Face Hub into its cache (:func:`utils.data.hub_source.fetch_csvs`), printed as one ``source:`` line.
    The Hub's files are then read exactly as a ``--source-dir`` with the same CSVs. Call it after
    :func:`check_output_dir`, so a bad output path is refused before a download.

    Raises:
        DatasetError: the Hub's (see :func:`~utils.data.hub_source.fetch_csvs`).
    """
    if generate:
        return CsvSource(None)
    if source_dir is not None:
        return CsvSource(Path(source_dir))
    from utils.data.hub_source import fetch_csvs  # huggingface_hub is imported by Hub builds only

    fetched = fetch_csvs(repo, revision)
    print(fetched.summary(), flush=True)
    return CsvSource(fetched.directory, fetched.record)


def add_source_arguments(parser, csv_help: str, generate_help: str, repo: str) -> None:
    """The builder flags that pick the source: ``--source-dir``, ``--generate``, and ``--repo``/``--revision`` for the
    default, the Hugging Face Hub (``repo`` unless ``--repo`` names another)."""
    source = parser.add_argument_group("source (default: the published CSVs from the Hugging Face Hub)")
    source.add_argument("--source-dir", help=f"read the CSVs from this directory instead: {csv_help}")
    source.add_argument("--generate", action="store_true", help=generate_help)
    source.add_argument("--repo", help=f"the Hub dataset repo to download train.csv and test.csv from (default "
                                       f"{repo}); they stay in the Hugging Face cache (HF_HOME), so HF_HUB_OFFLINE=1 "
                                       "reruns need no network")
    source.add_argument("--revision", help="a branch, tag or commit of the Hub repo (default main); dataset.json "
                                           "records the commit it resolved to")


def add_to_metadata(directory: Path, key: str, value) -> None:
    """Add ``key: value`` to the split's ``dataset.json`` (the reference loaders ignore keys they do not know)."""
    path = directory / "dataset.json"
    metadata = json.loads(path.read_text())
    metadata[key] = value
    path.write_text(json.dumps(metadata))


def check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse to build over a file, a non-empty non-dataset directory, or a dataset without ``overwrite``, or
    where the dataset cannot be written: ``output_dir`` (or its nearest existing ancestor) must take a new
    directory, and so must the parent of an existing one (the build is staged beside it and renamed over it).
    Call it before any work.

    Raises:
        DatasetError: naming the path and the way out.
    """
    if output_dir.exists():
        if not output_dir.is_dir():
            raise DatasetError(f"--output-dir {output_dir} is a file; pick a directory path")
        if any(output_dir.iterdir()):
            if not overwrite:
                raise DatasetError(f"--output-dir {output_dir} is not empty; pass --overwrite to replace it or pick another path")
            if not (output_dir / "identifiers.json").exists():
                raise DatasetError(f"refusing to overwrite {output_dir}: it does not look like a puzzle dataset (no identifiers.json)")
    try:
        check_writable_dir(output_dir, "--output-dir")
        if output_dir.exists():
            check_writable_dir(output_dir.parent, "--output-dir's parent")
    except OutputPathError as e:
        raise DatasetError(str(e)) from None


def _plain_signals() -> None:
    """A generation worker's signals: SIGTERM ends it, SIGINT is left to the parent. A trainer's graceful-stop
    handler, inherited through fork, would otherwise swallow the SIGTERM with which the pool ends its workers,
    and the pool would wait for them forever."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def generate_distinct(work: Callable[[int], tuple[np.ndarray, np.ndarray]], key: Callable[[np.ndarray, np.ndarray], bytes],
                      count: int, workers: int = 1, exclude: set[bytes] | None = None, desc: str = "generate",
                      unit: str = "puzzle", chunksize: int = 8) -> tuple[np.ndarray, np.ndarray, set[bytes]]:
    """``count`` (question, answer) pairs from ``work(0), work(1), ...``, keeping a pair only when its
    ``key`` is new (not in ``exclude`` and not kept before); a rejected index is replaced by the next one.

    Which indices are kept depends only on ``work`` and ``key``, so with ``work(k)`` seeded by ``k`` the
    result is the same for any number of ``workers`` (``work`` must be picklable when ``workers > 1``).

    Returns:
        questions and answers stacked ``[count, ...]``, and the keys seen (``exclude`` plus the new ones).
    """
    seen = set(exclude or ())
    questions, answers = [], []
    next_index = 0
    with (multiprocessing.Pool(workers, _plain_signals) if workers > 1 else contextlib.nullcontext()) as pool, \
            tqdm(total=count, desc=desc, unit=unit) as bar:
        while len(questions) < count:
            indices = range(next_index, next_index + count - len(questions))
            next_index = indices.stop
            for q, a in (pool.imap(work, indices, chunksize=chunksize) if pool else map(work, indices)):
                k = key(q, a)
                if k not in seen:
                    seen.add(k)
                    questions.append(q)
                    answers.append(a)
                    bar.update(1)
    return np.stack(questions), np.stack(answers), seen


def generate_train_test(generate: Callable[..., tuple[np.ndarray, np.ndarray, set[bytes]]], train_size: int,
                        test_size: int, workers: int, noun: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate the training split (stream 0), then the test split (stream 1) excluding every training key,
    so no test puzzle is a training puzzle or equivalent to one; prints the rate.

    ``generate(count, stream, exclude, desc)`` returns (questions, answers, keys seen), as a builder's
    ``generate_distinct`` does. Returns train questions, train answers, test questions, test answers.
    """
    start = time.perf_counter()
    train_q, train_a, seen = generate(train_size, 0, None, "generate train")
    test_q, test_a, _ = generate(test_size, 1, seen, "generate test")
    seconds = time.perf_counter() - start
    print(f"generated {train_size + test_size} {noun} in {seconds:.1f} s "
          f"({(train_size + test_size) / seconds:.1f} {noun}/s, {workers} worker(s))")
    return train_q, train_a, test_q, test_a


def subsample_training(questions: np.ndarray, answers: np.ndarray, subsample_size: int | None,
                       rng: np.random.Generator, noun: str) -> tuple[np.ndarray, np.ndarray]:
    """Keep ``subsample_size`` training pairs drawn without replacement by ``rng`` (all of them, with a note,
    when there are no more than that; unchanged when ``subsample_size`` is None), as the reference builders'
    ``--subsample-size`` does."""
    if subsample_size is None:
        return questions, answers
    if subsample_size >= len(questions):
        print(f"--subsample-size {subsample_size} >= {len(questions)} training {noun}: keeping all")
        return questions, answers
    keep = rng.choice(len(questions), size=subsample_size, replace=False)
    return questions[keep], answers[keep]


@contextlib.contextmanager
def staged_dataset(output_dir: Path) -> Iterator[Path]:
    """Build into a temporary sibling directory, then rename it over ``output_dir``, so an interrupted build
    never leaves a dataset that looks complete. Call :func:`check_output_dir` first: an existing
    ``output_dir`` is replaced."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = output_dir.parent / f".{output_dir.name}.building-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        yield staging
        if output_dir.exists():
            shutil.rmtree(output_dir)
        os.replace(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_one_example_split(directory: Path, inputs: np.ndarray, labels: np.ndarray, variants: int, vocab_size: int,
                            ignore_label_id: int | None = 0) -> None:
    """Write one split of one-example puzzles with one puzzle identifier (0), ``variants`` puzzles to a group.

    This is the layout of the reference Sudoku and maze builders: group g holds rows
    ``g * variants .. (g + 1) * variants - 1`` (an original and its augmentations). ``dataset.json``
    carries HRM's metadata fields plus TRM's ``total_puzzles`` (the number of groups, as TRM's builders
    write it), so both references' loaders read it.

    Args:
        inputs, labels: uint8 [N, seq_len] tokens (pad 0); N a multiple of ``variants``.
    """
    num_puzzles, seq_len = inputs.shape
    groups = num_puzzles // variants
    arrays = {
        "inputs": inputs.astype(np.uint8, copy=False),
        "labels": labels.astype(np.uint8, copy=False),
        "puzzle_identifiers": np.zeros(num_puzzles, np.int32),
        "puzzle_indices": np.arange(num_puzzles + 1, dtype=np.int32),
        "group_indices": np.arange(0, num_puzzles + 1, variants, dtype=np.int32),
    }
    # Keys in the order of TRM's PuzzleDatasetMetadata.
    metadata = {"pad_id": 0, "ignore_label_id": ignore_label_id, "blank_identifier_id": 0, "vocab_size": vocab_size,
                "seq_len": seq_len, "num_puzzle_identifiers": 1, "total_groups": groups, "mean_puzzle_examples": 1.0,
                "total_puzzles": groups, "sets": ["all"]}
    directory.mkdir(parents=True)
    with open(directory / "dataset.json", "w") as f:
        json.dump(metadata, f)
    for name, array in arrays.items():
        np.save(directory / f"all__{name}.npy", array)
