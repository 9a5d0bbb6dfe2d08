"""Build a Sudoku dataset in the HRM on-disk format (see utils/data/puzzle_dataset.py).

Three sources:
  * by default, the Sudoku-Extreme CSVs (``train.csv``, ``test.csv``; columns ``source,question,answer,rating``)
    of the Hugging Face dataset ``sapientinc/sudoku-extreme`` (``--repo``, ``--revision`` pick another),
    downloaded into the Hugging Face cache as the reference builder downloads them (utils/data/hub_source.py);
  * ``--source-dir DIR``: a local copy of those CSVs (the same CSVs give byte-identical arrays);
  * ``--generate``: offline generation of unique-solution puzzles: a random full grid, then
    clues removed in random order while the solution stays unique (a minimal puzzle), kept when its
    blanks and its rating (utils/data/sudoku/rating.py: the solver's guesses, 0 = naked and hidden
    singles solve it) are within the bounds asked for; with ``--expert``, minimal puzzles found by a local
    search over clue moves (utils/data/sudoku/expert.py), rated at least ``--min-rating`` (default 20).

Each test split also gets ``all__ratings.npy``, one rating per puzzle (utils/data/puzzle_dataset.py), from which
evaluations report exact accuracy per rating band.

Tokens follow the reference builder (``sapientinc/HRM`` dataset/build_sudoku_dataset.py):
pad 0, blank 1, digit d -> d + 1 (vocab 11), seq_len 81, every cell supervised, one puzzle
identifier. Each training puzzle forms a group with its ``--num-aug`` augmentations
(digit permutation, band/row and stack/column shuffles, transpose with p=0.5); every
variant is its own one-example puzzle. The test set is never augmented.

Example (the HRM "Sudoku-Extreme 1k" recipe):
    python scripts/build_sudoku_dataset.py --output-dir data/sudoku-extreme-1k-aug-1000 --subsample-size 1000 \\
        --num-aug 1000
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import fcntl
import itertools
import json
import os
import shutil
import warnings
from functools import partial
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from utils.data import common
from utils.data.sudoku import expert as sudoku_expert
from utils.data.sudoku import grids as sudoku_grids
from utils.data.sudoku import rating as sudoku_rating
from utils.data.sudoku.symmetry import grid_fingerprints
from utils.data.common import (add_output_arguments, add_source_arguments, add_to_metadata, check_output_dir,
                               check_source_and_sizes, csv_source, staged_dataset, write_one_example_split)
from utils.data.puzzle_dataset import RATINGS_FIELD, DatasetError, band_name, rating_bands
from utils.cli import ArgumentParser, add_workers_argument

HUB_REPO = "sapientinc/sudoku-extreme"  # the reference builder's source_repo
SEQ_LEN = 81
VOCAB_SIZE = 11  # pad, blank, digits 1..9
CSV_HEADER = ["source", "question", "answer", "rating"]
MAX_BLANKS = 81 - 17  # no 9x9 Sudoku with fewer than 17 clues has a unique solution
MAX_ATTEMPTS = 200  # full grids tried per puzzle before giving up on the blank and rating bounds
# The highest --min-rating the expert generator takes (on its default scale, utils/data/sudoku/rating.rate): its
# hardest puzzles rate about 500 (docs/data.md), and a floor out of its reach would end only after minutes of
# searching, in its "chains in a row found no puzzle" error.
EXPERT_MAX_FLOOR = 1000
_ALL_DIGITS = 0x3FE  # digits 1..9 as bits 1..9


def _bounds(low: int | None, high: int | None) -> str:
    """``low`` to ``high`` in words, for messages; None is unbounded."""
    if high is None:
        return f">= {low or 0}"
    return f"<= {high}" if low is None else f"{low} to {high}"


# ----------------------------------------------------------------------------------------
# Generation


def generate_puzzle(rng: np.random.Generator, min_blanks: int, max_blanks: int | None = None, minimal: bool = False,
                    min_rating: int = 0, max_rating: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One unique-solution puzzle with ``min_blanks`` to ``max_blanks`` blanks, rated in [min_rating, max_rating].

    A full grid is drawn at random by the solver's search on an empty grid (random digit order at each branch),
    then clues are removed in random order; a removal is kept when no solution gives that cell another digit
    (the puzzle had a unique solution before, so that is exactly "the solution stays unique"). Removal stops
    at ``max_blanks`` unless ``minimal``; otherwise every cell is tried once, which leaves a minimal puzzle
    (no clue can go: a clue whose removal once allowed a second solution still does with fewer clues), with
    53-60 blanks. The puzzle is kept when its blanks are in [min_blanks, max_blanks] and its
    :func:`~utils.data.sudoku.rating.rate` is in [min_rating, max_rating]; else a new grid is drawn.

    Args:
        max_blanks: None: no upper bound (every puzzle is then minimal).
        max_rating: None: no upper bound.
    Returns:
        (question, answer): uint8 [81] digits, 0 = blank in the question.
    Raises:
        DatasetError: no puzzle met the bounds in ``MAX_ATTEMPTS`` grids (the message says which bound).
    """
    stop = MAX_BLANKS + 1 if minimal or max_blanks is None else max_blanks
    max_blanks = MAX_BLANKS if max_blanks is None else max_blanks
    enough_blanks = 0
    for _ in range(MAX_ATTEMPTS):
        answer = sudoku_rating.search([0] * 81, rng=rng).solution
        cells, blanks = list(answer), 0
        for i in rng.permutation(81).tolist():
            if blanks == stop:
                break
            d, cells[i] = cells[i], 0
            if sudoku_rating.search(cells, exclude=(i, d)).count:
                cells[i] = d
            else:
                blanks += 1
        if min_blanks <= blanks <= max_blanks:
            enough_blanks += 1
            r = sudoku_rating.rate(cells)
            if min_rating <= r and (max_rating is None or r <= max_rating):
                return np.array(cells, np.uint8), np.array(answer, np.uint8)
    if not enough_blanks:
        raise DatasetError(f"could not reach {min_blanks} to {max_blanks} blanks in {MAX_ATTEMPTS} random grids; "
                           "minimal puzzles from this generator have 53-60 blanks: widen --min-blanks/--max-blanks")
    raise DatasetError(f"no puzzle rated {_bounds(min_rating, max_rating)} among {enough_blanks} with {min_blanks} to "
                       f"{max_blanks} blanks ({MAX_ATTEMPTS} random grids); about 60% of minimal puzzles rate >= 1, "
                       "fewer rate higher: widen --min-rating/--max-rating")


def _generate_one(index: int, seed: int, stream: int, **bounds) -> tuple[np.ndarray, np.ndarray]:
    # Each puzzle has its own RNG, so the output does not depend on --workers.
    return generate_puzzle(np.random.default_rng([seed, stream, index]), **bounds)


def generate_distinct(count: int, seed: int, stream: int, min_blanks: int, max_blanks: int | None = None,
                      workers: int = 1, exclude: set[bytes] | None = None, desc: str = "generate", minimal: bool = False,
                      min_rating: int = 0, max_rating: int | None = None) -> tuple[np.ndarray, np.ndarray, set[bytes]]:
    """Generate ``count`` puzzles whose solution grids are pairwise non-equivalent and not in ``exclude``.

    Puzzle k of ``stream`` is always drawn from the RNG seeded ``[seed, stream, k]`` by :func:`generate_puzzle`
    (with the bounds given here); rejected puzzles are replaced by the next indices. Equivalence is judged by
    ``grid_fingerprints``.

    Returns:
        questions uint8 [count, 81], answers uint8 [count, 81] (digits, 0 = blank),
        and the fingerprints seen (``exclude`` plus the new ones).
    """
    work = partial(_generate_one, seed=seed, stream=stream, min_blanks=min_blanks, max_blanks=max_blanks,
                   minimal=minimal, min_rating=min_rating, max_rating=max_rating)
    return common.generate_distinct(work, lambda q, a: grid_fingerprints(a[None])[0], count, workers, exclude, desc,
                                    unit="puzzle", chunksize=8)


# ----------------------------------------------------------------------------------------
# Augmentation


def _line_permutations(rng: np.random.Generator, m: int) -> np.ndarray:
    """[m, 9] permutations of 9 lines that move whole bands and lines within a band."""
    bands = rng.permuted(np.tile(np.arange(3), (m, 1)), axis=1)
    within = rng.permuted(np.tile(np.arange(3), (m, 3, 1)), axis=2)
    return (bands[:, :, None] * 3 + within).reshape(m, 9)


def shuffle_sudoku(questions: np.ndarray, answers: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Apply one random validity-preserving transform per row, the same to question and answer.

    The transform is the reference one: transpose with p=0.5, then band + row-in-band and
    stack + column-in-stack permutations, then a permutation of digits 1..9 (blank 0 fixed).

    Args:
        questions, answers: uint8 [M, 81] digits, 0 = blank.
    Returns:
        uint8 [M, 81] augmented questions and answers.
    """
    m = len(questions)
    digit_map = np.zeros((m, 10), np.uint8)
    digit_map[:, 1:] = rng.permuted(np.tile(np.arange(1, 10, dtype=np.uint8), (m, 1)), axis=1)
    transpose = (rng.random(m) < 0.5)[:, None, None]
    rows, cols = _line_permutations(rng, m)[:, :, None], _line_permutations(rng, m)[:, None, :]
    # New cell (r, c) reads cell (rows[r], cols[c]) of the possibly transposed grid.
    source = np.where(transpose, cols * 9 + rows, rows * 9 + cols).reshape(m, 81)

    def apply(x: np.ndarray) -> np.ndarray:
        return np.take_along_axis(digit_map, np.take_along_axis(x, source, axis=1).astype(np.intp), axis=1)

    return apply(questions), apply(answers)


# ----------------------------------------------------------------------------------------
# Sudoku-Extreme CSV


def _first_bad_row(bad: np.ndarray) -> int | None:
    rows = np.flatnonzero(bad)
    return int(rows[0]) if rows.size else None


def _check_chunk(path: Path, lines: list[int], q: np.ndarray, a: np.ndarray) -> None:
    """Validate parsed rows (digits, 0 = blank) and name the first bad line."""
    checks = [
        (a == 0, "answer must be 81 digits 1-9 (no blanks)"),
        ((q != 0) & (q != a), "answer disagrees with a question clue"),
    ]
    masks = 1 << a.astype(np.int32).reshape(-1, 9, 9)
    boxes = masks.reshape(-1, 3, 3, 3, 3).transpose(0, 1, 3, 2, 4).reshape(-1, 9, 9)
    for unit, group in (("row", masks), ("column", masks.transpose(0, 2, 1)), ("box", boxes)):
        checks.append((np.bitwise_or.reduce(group, axis=2) != _ALL_DIGITS, f"answer repeats a digit in a {unit}"))
    for bad, message in checks:
        row = _first_bad_row(bad.reshape(len(bad), -1).any(axis=1))
        if row is not None:
            raise DatasetError(f"{path}:{lines[row]}: {message}; fix or drop that row")


_DIGITS = np.full(256, 255, np.uint8)  # byte -> digit, 255 = not allowed
_DIGITS[ord("0"):ord("9") + 1] = np.arange(10)
_DIGITS[ord(".")] = 0
_NOT_DIGITS = "question/answer may only hold digits 1-9 and '.' for blanks"


def _csv_rows(reader, path: Path, min_rating: int | None, max_rating: int | None):
    """Yield ``(line number, question + answer as 162 ASCII bytes, rating)`` for each row of ``reader`` rated in
    [min_rating, max_rating] (None: unbounded), after the per-row checks (columns, lengths, an integer rating);
    blank lines are skipped."""
    low = -np.inf if min_rating is None else min_rating
    high = np.inf if max_rating is None else max_rating
    for row in tqdm(reader, desc=f"read {path.name}", unit="row"):
        where = f"{path}:{reader.line_num}"
        if not row:
            continue
        if len(row) != 4:
            raise DatasetError(f"{where}: expected 4 columns ({','.join(CSV_HEADER)}), got {len(row)}")
        _, q, a, rating = row
        if len(q) != 81 or len(a) != 81:
            raise DatasetError(f"{where}: question and answer must be 81 characters, got {len(q)} and {len(a)}")
        try:
            rating = int(rating)
        except ValueError:
            raise DatasetError(f"{where}: rating {rating!r} is not an integer") from None
        if not low <= rating <= high:
            continue
        if not (q.isascii() and a.isascii()):
            raise DatasetError(f"{where}: {_NOT_DIGITS}")
        yield reader.line_num, (q + a).encode(), rating


def _decode_chunk(path: Path, lines: tuple[int, ...], text: tuple[bytes, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of :func:`_csv_rows` as questions and answers, uint8 [N, 81] digits (0 = blank), checked by
    :func:`_check_chunk`; ``lines`` name the file's line of each row in errors."""
    q, a = np.frombuffer(b"".join(text), np.uint8).reshape(len(lines), 2, 81).transpose(1, 0, 2)
    q, a = _DIGITS[q], _DIGITS[a]
    row = _first_bad_row(((q == 255) | (a == 255)).any(axis=1))
    if row is not None:
        raise DatasetError(f"{path}:{lines[row]}: {_NOT_DIGITS}")
    _check_chunk(path, lines, q, a)
    return q, a


def read_sudoku_csv(path: str | os.PathLike, min_rating: int | None = None, max_rating: int | None = None,
                    chunk_rows: int = 1 << 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read a Sudoku-Extreme CSV (header ``source,question,answer,rating``).

    Questions use ``.`` (or ``0``) for blanks and digits 1-9; answers are 81 digits that
    agree with the clues and form a valid grid; ratings are integers (Sudoku-Extreme's: its
    solver's backtrack count). Rows rated outside [min_rating, max_rating] (None: unbounded)
    are skipped.

    Returns:
        questions, answers: uint8 [N, 81] digits, 0 = blank; ratings: int64 [N].
    Raises:
        DatasetError: missing file, bad header, or a malformed row (message gives file:line).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path} not found: --source-dir must hold Sudoku-Extreme train.csv and test.csv "
                           "(Hugging Face dataset sapientinc/sudoku-extreme)")
    questions, answers, ratings = [], [], []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header != CSV_HEADER:
                raise DatasetError(f"{path}:1: expected the header {','.join(CSV_HEADER)}, got {header}")
            rows = _csv_rows(reader, path, min_rating, max_rating)
            while chunk := list(itertools.islice(rows, chunk_rows)):
                lines, text, rated = zip(*chunk)
                q, a = _decode_chunk(path, lines, text)
                questions.append(q)
                answers.append(a)
                ratings.extend(rated)
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path} is not UTF-8 text ({e.reason}); Sudoku-Extreme CSVs are ASCII: "
                           "re-save the file as UTF-8") from None
    if not questions:
        bounds = min_rating is not None or max_rating is not None
        raise DatasetError(f"{path}: no puzzles" + (f" rated {_bounds(min_rating, max_rating)}: widen --min-rating/--max-rating"
                                                    if bounds else ""))
    return np.concatenate(questions), np.concatenate(answers), np.array(ratings, np.int64)


# ----------------------------------------------------------------------------------------
# Writing


def _write_split(directory: Path, questions: np.ndarray, answers: np.ndarray, num_aug: int, rng: np.random.Generator) -> None:
    """Write one split: group g holds original puzzle g then its ``num_aug`` augmentations."""
    variants = 1 + num_aug
    inputs = np.empty((len(questions) * variants, SEQ_LEN), np.uint8)
    labels = np.empty_like(inputs)
    for g in tqdm(range(len(questions)), desc=f"write {directory.name}", unit="group", disable=num_aug == 0):
        first = g * variants
        inputs[first], labels[first] = questions[g], answers[g]
        if num_aug:
            inputs[first + 1:first + variants], labels[first + 1:first + variants] = shuffle_sudoku(
                np.repeat(questions[g:g + 1], num_aug, 0), np.repeat(answers[g:g + 1], num_aug, 0), rng)
    # Tokens: blank 0 -> 1, digit d -> d + 1; every cell is supervised (ignore_label_id 0 is the pad).
    write_one_example_split(directory, inputs + 1, labels + 1, variants, VOCAB_SIZE)


def rating_summary(ratings: np.ndarray, scale: str) -> dict:
    """The distribution of a split's ratings, as stored under ``ratings`` in its ``dataset.json``.

    Args:
        ratings: int [N] one rating per original puzzle (augmentations are not rated).
        scale: what the numbers count, e.g. "solver guesses (utils/data/sudoku/rating.rate)".
    Returns:
        {"scale", "min", "median", "max", "histogram"}: the histogram maps "0", "1", "2-3", "4-7", ...
        (powers of two) to puzzle counts, empty bins left out; negative ratings fall in one "<0" bin.
    """
    ratings = np.asarray(ratings, np.int64)
    histogram = {}
    for band in rating_bands(np.sort(ratings)).tolist():  # the bands evaluations report accuracy by
        histogram[band_name(band)] = histogram.get(band_name(band), 0) + 1
    return {"scale": scale, "min": int(ratings.min()), "median": float(np.median(ratings)), "max": int(ratings.max()),
            "histogram": histogram}


def _check_bounds(min_blanks: int, max_blanks: int | None, min_rating: int | None, max_rating: int | None,
                  min_difficulty: int | None, minimal: bool, generate: bool, expert: bool = False,
                  rating_scale: str = "singles") -> int | None:
    """``min_rating`` after folding in its deprecated name ``min_difficulty``; raises DatasetError for blank or
    rating bounds out of range or out of order, for ``minimal`` or ``expert`` without ``generate``, for bounds
    that ``expert`` does not take, and for a rating scale other than "singles" without ``expert``."""
    if rating_scale not in sudoku_rating.RATING_SCALES:
        raise DatasetError(f"--rating-scale must be one of {', '.join(sudoku_rating.RATING_SCALES)}, "
                           f"got {rating_scale!r}")
    if rating_scale != "singles" and not expert:
        raise DatasetError(f"--rating-scale {rating_scale} sets what the expert generator climbs on: use it with "
                           "--generate --expert")
    if not 0 <= min_blanks <= MAX_BLANKS:
        raise DatasetError(f"--min-blanks must be in [0, {MAX_BLANKS}] (a unique Sudoku needs 17 clues), got {min_blanks}")
    if max_blanks is not None and not min_blanks <= max_blanks <= MAX_BLANKS:
        raise DatasetError(f"--max-blanks must be in [--min-blanks={min_blanks}, {MAX_BLANKS}], got {max_blanks}")
    if min_difficulty is not None:
        if min_rating is not None and min_rating != min_difficulty:
            raise DatasetError(f"--min-difficulty is the old name of --min-rating: give one, not both "
                               f"({min_difficulty} and {min_rating})")
        warnings.warn("--min-difficulty (min_difficulty) is deprecated: use --min-rating (min_rating)", FutureWarning,
                      stacklevel=3)  # the caller of build_dataset
        min_rating = min_difficulty
    if min_rating is not None and min_rating < 0:
        raise DatasetError(f"--min-rating must be >= 0, got {min_rating}")
    if max_rating is not None and max_rating < (min_rating or 0):
        raise DatasetError(f"--max-rating must be >= --min-rating={min_rating or 0}, got {max_rating}")
    if minimal and not generate:
        raise DatasetError("--minimal shapes generated puzzles: use it with --generate, not with CSVs")
    if expert and not generate:
        raise DatasetError("--expert generates puzzles: use it with --generate, not with CSVs")
    if expert and (max_blanks is not None or max_rating is not None):
        raise DatasetError("--expert makes minimal puzzles rated >= --min-rating: drop --max-blanks and --max-rating")
    if expert and rating_scale == "singles" and (min_rating or 0) > EXPERT_MAX_FLOOR:
        raise DatasetError(f"--min-rating {min_rating} is out of the expert generator's reach: its hardest puzzles "
                           f"rate about 500 on this scale, the hardest known ones less (Easter Monster 178); give at "
                           f"most {EXPERT_MAX_FLOOR} (the default is {sudoku_expert.MIN_RATING})")
    return min_rating


MAX_PER_GRID = 64  # puzzles a chain keeps at most: a chain rarely finds more before its patience runs out


def _check_per_grid(puzzles_per_grid: int | None, expert: bool) -> None:
    """Raises DatasetError for ``puzzles_per_grid`` without ``expert`` or outside 1..:data:`MAX_PER_GRID`."""
    if puzzles_per_grid is None:
        return
    if not expert:
        raise DatasetError("--puzzles-per-grid sets how many puzzles an expert chain keeps: use it with "
                           "--generate --expert")
    if not 1 <= puzzles_per_grid <= MAX_PER_GRID:
        raise DatasetError(f"--puzzles-per-grid must be in [1, {MAX_PER_GRID}], got {puzzles_per_grid}")


def _source_puzzles(source_dir, generate: bool, train_size: int, test_size: int, min_blanks: int,
                    max_blanks: int | None, minimal: bool, min_rating: int | None, max_rating: int | None, seed: int,
                    workers: int, expert: bool = False, rating_scale: str = "singles",
                    puzzles_per_grid: int | None = None,
                    resume_dir: Path | None = None) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray],
                                                             tuple[np.ndarray, np.ndarray, np.ndarray], str]:
    """Training and test puzzles, generated or read from ``source_dir``'s CSVs: ``(train, test, scale)``, each
    split ``(questions, answers, ratings)`` (uint8 [N, 81], uint8 [N, 81], int64 [N]), and the name of the rating
    scale for ``dataset.json``."""
    if generate:
        if expert:  # whole solution grids go to one split: no test puzzle is equivalent to a training puzzle
            floor = sudoku_expert.MIN_RATINGS[rating_scale] if min_rating is None else min_rating
            search = sudoku_expert.SEARCHES[rating_scale]
            if puzzles_per_grid is not None:
                search = dataclasses.replace(search, per_grid=puzzles_per_grid)
            make = partial(sudoku_expert.generate_expert, seed=seed, min_rating=floor, workers=workers,
                           search=search, resume_dir=resume_dir)
        else:
            make = partial(generate_distinct, seed=seed, min_blanks=min_blanks, max_blanks=max_blanks,
                               workers=workers, minimal=minimal, min_rating=min_rating or 0, max_rating=max_rating)
        train_q, train_a, test_q, test_a = common.generate_train_test(
            lambda count, stream, exclude, desc: make(count, stream=stream, exclude=exclude, desc=desc),
            train_size, test_size, workers, "expert puzzles" if expert else "puzzles")
        train_r, test_r = sudoku_rating.rate_many(train_q, rating_scale), sudoku_rating.rate_many(test_q, rating_scale)
        return (train_q, train_a, train_r), (test_q, test_a, test_r), sudoku_rating.RATING_SCALES[rating_scale]
    source_dir = Path(source_dir)
    return (read_sudoku_csv(source_dir / "train.csv", min_rating, max_rating),
            read_sudoku_csv(source_dir / "test.csv", min_rating, max_rating), "rating column of the source CSV")


@contextlib.contextmanager
def _chains_folder(output_dir: Path) -> Iterator[Path]:
    """The folder where an expert build keeps its finished chains until the dataset is written (a hidden sibling of
    ``output_dir``), locked for this build while the block runs: a second build of the same dataset would otherwise
    run the same chains and race this one to every file. The lock goes with the process, however it ends.

    Raises:
        DatasetError: something other than a folder is there, or another build holds the lock.
    """
    folder = output_dir.parent / f".{output_dir.name}.chains"
    if folder.exists() and not folder.is_dir():
        raise DatasetError(f"{folder} is not a folder: an expert build keeps its finished chains there to resume; "
                           "move it away or choose another --output-dir")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DatasetError(f"another build of {output_dir} is running (it holds {folder / 'lock'}): wait for it "
                               "to end, or stop it and run this command again to resume") from None
        yield folder


def _print_ratings(summaries: dict[str, dict]) -> None:
    """One line per split: the rating scale, min, median, max and histogram of :func:`rating_summary`."""
    for split, summary in summaries.items():
        bins = ", ".join(f"{name}: {count}" for name, count in summary["histogram"].items())
        print(f"ratings {split}, {summary['scale']}: min {summary['min']}, median {summary['median']:g}, "
              f"max {summary['max']}; histogram {bins}")


def build_dataset(output_dir: str | os.PathLike, *, source_dir: str | os.PathLike | None = None, generate: bool = False,
                  train_size: int = 1000, test_size: int = 1000, min_blanks: int = 45, max_blanks: int | None = None,
                  minimal: bool = False, min_rating: int | None = None, max_rating: int | None = None,
                  min_difficulty: int | None = None, subsample_size: int | None = None, num_aug: int = 0, seed: int = 0,
                  workers: int = 1, overwrite: bool = False, repo: str | None = None,
                  revision: str | None = None, expert: bool = False, rating_scale: str = "singles",
                  puzzles_per_grid: int | None = None) -> Path:
    """Build a Sudoku dataset at ``output_dir`` from Sudoku-Extreme CSVs (the Hugging Face Hub's, or a local copy) or
    by generation.

    The dataset is written to a temporary sibling directory and renamed into place, so an
    interrupted build never leaves a half-written dataset. Deterministic for a given seed
    (also for any ``workers``). Generated test grids are never equivalent (under the Sudoku
    symmetries) to a training grid, so no test puzzle is a training puzzle or an augmentation of one.
    Each split's ``dataset.json`` also holds its rating distribution (:func:`rating_summary`; generated
    puzzles rated by :func:`utils.data.sudoku.rating.rate`, CSV rows by their ``rating`` column), which is
    printed at the end; an ``expert`` build's also records under ``grids`` its distinct solution grids and the
    test grids equivalent to a training grid (0), by exact canonical forms (utils/data/sudoku/grids.py). A Hub
    build's ``dataset.json`` also records, under ``source``, the repo, the commit and each CSV's SHA-256 and rows;
    its other files are byte-identical to a ``source_dir`` build of the same CSVs.

    Args:
        output_dir: dataset root to create (see utils/data/puzzle_dataset.py for the layout).
        source_dir: directory with ``train.csv`` and ``test.csv`` (exclusive with ``generate``). With neither,
            the CSVs of the Hub dataset ``repo`` (default :data:`HUB_REPO`) at ``revision`` (default ``main``),
            fetched into the Hugging Face cache (utils/data/hub_source.py).
        generate: generate ``train_size`` + ``test_size`` puzzles with ``min_blanks`` to ``max_blanks``
            blanks (``max_blanks`` None: as many as uniqueness allows, 53-60).
        minimal: ``generate`` only: remove every clue that uniqueness allows (the default without
            ``max_blanks``); ``min_blanks``/``max_blanks`` then only select among minimal puzzles.
        expert: ``generate`` only: expert puzzles (utils/data/sudoku/expert.py), minimal and rated at least
            ``min_rating`` (default 20, ratings then have a median near 60); about a second of CPU each.
        rating_scale: ``expert`` only: "tdoku" climbs on, floors and records tdoku's guesses (Sudoku-Extreme's
            scale; default floor 10) instead of "singles", this project's solver's (utils/data/sudoku/rating.py).
        puzzles_per_grid: ``expert`` only: puzzles kept per solution grid (None: the search's 8); 1 gives as many
            distinct grids as puzzles. An expert build is resumable: its finished chains are kept in the hidden
            sibling folder ``.<output_dir name>.chains`` until the dataset is written, and a rerun of the same
            command takes them instead of running them again.
        min_rating, max_rating: keep puzzles rated in this range (None: unbounded): generated ones by
            rejection, CSV rows by their ``rating`` column.
        min_difficulty: deprecated name of ``min_rating``.
        subsample_size: keep this many randomly chosen training puzzles (before augmentation).
        num_aug: augmented variants per training puzzle (the test set is not augmented).
        workers: processes for generation.
        overwrite: replace an existing dataset at ``output_dir``.
    Returns:
        ``output_dir`` as a Path.
    Raises:
        DatasetError: bad arguments, bad CSV content, unreachable bounds, a non-empty ``output_dir``, or a Hub
            fetch that failed (no such repo, revision or file; the Hub out of reach with nothing cached).
    """
    output_dir = Path(output_dir)
    check_source_and_sizes(source_dir, generate, f"Sudoku-Extreme train.csv/test.csv of {repo or HUB_REPO}",
                           {"train_size": (train_size, 1), "test_size": (test_size, 1), "num_aug": (num_aug, 0),
                            "seed": (seed, 0), "workers": (workers, 1)}, subsample_size, repo, revision)
    min_rating = _check_bounds(min_blanks, max_blanks, min_rating, max_rating, min_difficulty, minimal, generate,
                               expert, rating_scale)
    _check_per_grid(puzzles_per_grid, expert)
    check_output_dir(output_dir, overwrite)
    with _chains_folder(output_dir) if expert else contextlib.nullcontext() as resume_dir:
        source = csv_source(source_dir, generate, repo or HUB_REPO, revision)
        subsample_rng, augment_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        (train_q, train_a, train_r), (test_q, test_a, test_r), scale = _source_puzzles(
            source.directory, generate, train_size, test_size, min_blanks, max_blanks, minimal, min_rating,
            max_rating, seed, workers, expert, rating_scale, puzzles_per_grid, resume_dir)
        # Subsample indices, so the ratings follow the puzzles (the same draw as subsampling the puzzles).
        keep, _ = common.subsample_training(np.arange(len(train_q)), np.arange(len(train_q)), subsample_size,
                                            subsample_rng, "puzzles")
        train = train_q[keep], train_a[keep], train_r[keep]
        _write_dataset(output_dir, overwrite, train, (test_q, test_a, test_r), scale, num_aug, augment_rng,
                       sudoku_grids.grid_summary(train[1], test_a) if expert else None, source.record)
        if resume_dir is not None:
            shutil.rmtree(resume_dir)  # the chains are in the dataset now
    return output_dir


def _write_dataset(output_dir: Path, overwrite: bool, train: tuple, test: tuple, scale: str, num_aug: int,
                   augment_rng: np.random.Generator, grids: dict | None, source_record: dict | None) -> None:
    """Write both splits (``(questions, answers, ratings)`` each) with their rating summaries, the expert build's
    grid summary and the Hub source's record, through a staging folder; print what was written."""
    summaries = {"train": rating_summary(train[2], scale), "test": rating_summary(test[2], scale)}
    with staged_dataset(output_dir, overwrite) as staging:
        _write_split(staging / "train", train[0], train[1], num_aug, augment_rng)
        _write_split(staging / "test", test[0], test[1], 0, augment_rng)
        np.save(staging / "test" / f"all__{RATINGS_FIELD}.npy", test[2])  # accuracy by rating band
        for split, summary in summaries.items():
            add_to_metadata(staging / split, "ratings", summary)
            if grids is not None:
                add_to_metadata(staging / split, "grids", grids)
            if source_record is not None:
                add_to_metadata(staging / split, "source", source_record)
        with open(staging / "identifiers.json", "w") as f:
            json.dump(["<blank>"], f)
    print(f"wrote {output_dir}: train {len(train[0])} groups x {1 + num_aug} puzzles, test {len(test[0])} puzzles")
    _print_ratings(summaries)
    if grids is not None:
        print(f"solution grids (up to symmetry): train {grids['train_distinct']}, test {grids['test_distinct']}, "
              f"test grids equivalent to a training grid {grids['test_shared_with_train']}")


def main(argv: list[str] | None = None) -> Path:
    """Command-line entry point; returns the dataset path.

    Raises:
        DatasetError: as ``build_dataset`` (run as a script, it is printed as one line, exit status 2).
    """
    parser = ArgumentParser(
        description=__doc__.split("\n\n")[0] + " Downloads the Sudoku-Extreme CSVs from the Hugging Face Hub (as the "
                    "reference builder does), reads a local copy, or generates unique-solution puzzles offline.",
        epilog="examples:\n"
               "  python scripts/build_sudoku_dataset.py --output-dir data/sudoku-extreme-1k-aug-1000 "
               "--subsample-size 1000 --num-aug 1000\n"
               "  python scripts/build_sudoku_dataset.py --source-dir data/raw/sudoku-extreme "
               "--output-dir data/sudoku-extreme-1k-aug-1000 --subsample-size 1000 --num-aug 1000\n"
               "  python scripts/build_sudoku_dataset.py --generate --output-dir data/sudoku-gen-1k-aug-1000 --num-aug 1000\n"
               "  python scripts/build_sudoku_dataset.py --generate --minimal --min-rating 1 --output-dir data/sudoku-gen-hard-1k "
               "--workers 2\n"
               "  python scripts/build_sudoku_dataset.py --generate --expert --train-size 3000 --test-size 256 "
               "--output-dir data/sudoku-expert-3k --workers 2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_source_arguments(parser, "Sudoku-Extreme train.csv and test.csv (columns source,question,answer,rating; "
                                 "'.' = blank)", "generate unique-solution puzzles offline instead", HUB_REPO)
    add_output_arguments(parser)
    parser.add_argument("--subsample-size", type=int, help="keep this many random training puzzles (e.g. 1000 for the 1k recipe)")
    parser.add_argument("--num-aug", type=int, default=0,
                        help="augmented variants per training puzzle (default 0; the 1k recipe uses 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed for generation, subsampling and augmentation (default 0)")
    parser.add_argument("--min-rating", type=int,
                        help="keep puzzles rated >= this: generated ones by the solver's guess count (0 = naked and "
                             "hidden singles solve it; 1 keeps puzzles that need search; with --expert the floor, "
                             "default 20), CSV rows by their rating column")
    parser.add_argument("--max-rating", type=int, help="keep puzzles rated <= this (same scales as --min-rating)")
    parser.add_argument("--min-difficulty", type=int, help="deprecated: the old name of --min-rating")
    parser.add_argument("--train-size", type=int, default=1000, help="--generate only: training puzzles (default 1000)")
    parser.add_argument("--test-size", type=int, default=1000, help="--generate only: test puzzles (default 1000)")
    parser.add_argument("--min-blanks", type=int, default=45,
                        help=f"--generate only: at least this many blanks per puzzle, 0..{MAX_BLANKS} (default 45; "
                             "minimal puzzles have 53-60)")
    parser.add_argument("--max-blanks", type=int,
                        help="--generate only: stop removing clues at this many blanks for easier puzzles "
                             "(default: remove all that uniqueness allows); with --minimal, keep only minimal puzzles "
                             "with at most this many")
    parser.add_argument("--minimal", action="store_true",
                        help="--generate only: minimal puzzles, no clue removable with the solution staying unique "
                             "(the default without --max-blanks)")
    parser.add_argument("--expert", action="store_true",
                        help="--generate only: expert puzzles, minimal ones found by a local search over clue moves "
                             "(utils/data/sudoku/expert.py), rated >= --min-rating (default 20) with a median near 60; "
                             "about a second of CPU each")
    add_workers_argument(parser, "--generate only: worker processes")
    parser.add_argument("--rating-scale", choices=sorted(sudoku_rating.RATING_SCALES), default="singles",
                        help="--expert only: whose guesses the climb, --min-rating and the recorded ratings count: "
                             "singles (this project's solver, default) or tdoku (Sudoku-Extreme's scale; default "
                             "--min-rating 10)")
    parser.add_argument("--puzzles-per-grid", type=int,
                        help=f"--expert only: puzzles kept per solution grid, 1..{MAX_PER_GRID} (default 8); 1 gives "
                             "as many distinct grids as puzzles. Expert builds resume: rerun the same command after a "
                             "stop")
    args = parser.parse_args(argv)
    return build_dataset(
        args.output_dir, source_dir=args.source_dir, generate=args.generate, train_size=args.train_size,
        test_size=args.test_size, min_blanks=args.min_blanks, max_blanks=args.max_blanks, minimal=args.minimal,
        min_rating=args.min_rating, max_rating=args.max_rating, min_difficulty=args.min_difficulty,
        subsample_size=args.subsample_size, num_aug=args.num_aug, seed=args.seed, workers=args.workers,
        overwrite=args.overwrite, repo=args.repo, revision=args.revision, expert=args.expert,
        rating_scale=args.rating_scale, puzzles_per_grid=args.puzzles_per_grid,
    )
