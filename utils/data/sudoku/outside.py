"""The outside yardstick: a Sudoku test split of published hard puzzles that this project did not write.

The lists ship as plain text in utils/data/sudoku/outside_puzzles/, each with a header that says where it comes from:
Peter Norvig's ``top95.txt`` and ``hardest.txt`` (norvig.com) and famous named puzzles (AI Escargot, Arto Inkala's
2010 and 2012 puzzles, Easter Monster, Golden Nugget, Platinum Blonde, ...). A list file holds one puzzle per line,
81 characters row by row (``1``-``9``, ``.`` or ``0`` for a blank), optionally followed by a name; ``#`` lines
are comments, and those of a file are its recorded source.

:func:`build_outside` checks every puzzle (its clues keep the rules and it has exactly one solution, by
utils/data/sudoku/rating.py's solver), drops the puzzles that repeat one before them, in this list or an earlier
one, identically or up to the Sudoku symmetries (by canonical forms, utils/data/sudoku/grids.py), rates the rest
on both scales (utils/data/sudoku/rating.py ``RATING_SCALES``) and writes a test split in the format of the other
Sudoku builders (utils/data/sudoku/build.py's writer; tokens blank 1, digit d -> d + 1). Evaluations read only the test
split (``evaluate.py --data-path``), so no training split is written. ``all__ratings.npy`` holds tdoku's ratings
(Sudoku-Extreme's scale, the one puzzles from outside are usually rated on), and ``test/dataset.json`` records,
under ``outside``, each list's source and counts, the duplicates dropped, and each puzzle with its list, line,
name, ratings and solution count.

    python scripts/build_outside_sudoku.py --output-dir data/sudoku-outside
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from utils.cli import ArgumentParser
from utils.data.sudoku import grids as sudoku_grids
from utils.data.sudoku import rating as sudoku_rating
from utils.data.common import add_output_arguments, add_to_metadata, check_output_dir, staged_dataset
from utils.data.puzzle_dataset import RATINGS_FIELD, DatasetError
from utils.data.sudoku.build import _write_split, rating_summary
from utils.data.user_puzzles import PuzzleInputError, parse_sudoku

LISTS_DIR = Path(__file__).resolve().with_name("outside_puzzles")
DEFAULT_LISTS = tuple(LISTS_DIR / name for name in ("norvig_top95.txt", "norvig_hardest.txt", "named_hard.txt"))
SCALE = "tdoku"  # the scale of all__ratings.npy and of dataset.json's "ratings"


@dataclass(frozen=True)
class Entry:
    """One puzzle of a list file.

    Attributes:
        list: the list's name (its file name without ``.txt``).
        line: its line in the file (1-based).
        puzzle: uint8 [81] digits, 0 = blank.
        name: the name after the puzzle on its line ("" when none).
    """

    list: str
    line: int
    puzzle: np.ndarray
    name: str


def read_list(path: Path) -> tuple[str, list[Entry]]:
    """``(source, entries)`` of a list file: its ``#`` lines joined, and its puzzles in file order.

    Raises:
        DatasetError: the file is missing or a folder, not UTF-8, or holds no puzzle; a line that is not a puzzle (message
            ``file:line: ...`` with the row and column of a bad character, or the unit a clue repeats in).
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DatasetError(f"{path} not found: give list files of Sudoku puzzles, one per line") from None
    except IsADirectoryError:
        raise DatasetError(f"{path} is a folder: give list files of Sudoku puzzles (one per line), such as "
                           f"{path}/*.txt") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path} is not UTF-8 text ({e.reason}): save it as UTF-8") from None
    source, entries = [], []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if text.startswith("#"):
            source.append(text.lstrip("#").strip())
        elif text:
            token, _, name = text.partition(" ")
            try:
                tokens = parse_sudoku(token, f"{path}:{number}")
            except PuzzleInputError as e:  # its message already names the file, line, row and column
                raise DatasetError(str(e)) from None
            entries.append(Entry(path.stem, number, (tokens - 1).astype(np.uint8), name.strip()))
    if not entries:
        raise DatasetError(f"{path} holds no puzzle: one per line, 81 characters (1-9, . or 0 for a blank)")
    return " ".join(source), entries


def _solve_unique(entry: Entry, path: Path) -> np.ndarray:
    """The solution of a puzzle that must have exactly one (uint8 [81]).

    Raises:
        DatasetError: none, or more than one (``file:line``).
    """
    found = sudoku_rating.search(entry.puzzle, limit=2)
    if found.count != 1:
        what = "no solution" if found.count == 0 else "more than one solution"
        raise DatasetError(f"{path}:{entry.line}: the puzzle has {what}; an outside yardstick needs puzzles with "
                           "exactly one: fix or drop that line")
    return np.array(found.solution, np.uint8)


def collect(paths) -> tuple[list[dict], list[Entry], np.ndarray, list[dict]]:
    """Read, check and deduplicate the lists, in order.

    Returns:
        lists (one record per file: name, file, source, puzzles in file, kept), the kept entries (named by the
        first name any copy has), their solutions uint8 [N, 81], and the duplicates dropped (list, line, puzzle,
        name, how: "identical" or "equivalent", and the kept puzzle it repeats).
    Raises:
        DatasetError: as :func:`read_list` and :func:`_solve_unique`.
    """
    lists, kept, solutions, duplicates, first = [], [], [], [], {}
    for path in map(Path, paths):
        source, entries = read_list(path)
        record = {"name": path.stem, "file": _shown(path), "source": source, "in_file": len(entries), "kept": 0}
        answers = np.stack([_solve_unique(e, path) for e in entries])
        forms = sudoku_grids.canonical_puzzles(np.stack([e.puzzle for e in entries]), answers)
        for entry, answer, form in zip(entries, answers, forms):
            if form in first:
                earlier = kept[first[form]]
                how = "identical" if np.array_equal(earlier.puzzle, entry.puzzle) else "equivalent"
                duplicates.append({"list": entry.list, "line": entry.line, "puzzle": _text(entry.puzzle),
                                   "name": entry.name, "how": how,
                                   "same_as": {"list": earlier.list, "line": earlier.line}})
                if entry.name and not earlier.name:  # e.g. AI Escargot, unnamed in hardest.txt
                    kept[first[form]] = dataclasses.replace(earlier, name=entry.name)
                continue
            first[form] = len(kept)
            kept.append(entry)
            solutions.append(answer)
            record["kept"] += 1
        lists.append(record)
    return lists, kept, np.stack(solutions), duplicates


def _text(puzzle: np.ndarray) -> str:
    return "".join(str(d) if d else "." for d in puzzle.tolist())


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (so dataset.json does not name this machine)."""
    root = LISTS_DIR.parents[2]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def build_outside(output_dir: str | os.PathLike, lists=DEFAULT_LISTS, overwrite: bool = False) -> Path:
    """Build the outside yardstick's test split at ``output_dir`` (see the module docstring).

    Args:
        output_dir: dataset root to create (a new or empty folder; an existing dataset with ``overwrite``).
        lists: list files, read in this order (a puzzle repeating an earlier one is dropped).
        overwrite: replace an existing dataset at ``output_dir``.
    Returns:
        ``output_dir`` as a Path.
    Raises:
        DatasetError: a bad list file or puzzle (``file:line``), or an ``output_dir`` that may not take it.
    """
    output_dir = Path(output_dir)
    check_output_dir(output_dir, overwrite)
    records, entries, answers, duplicates = collect(lists)
    questions = np.stack([e.puzzle for e in entries])
    ratings = {scale: sudoku_rating.rate_many(questions, scale) for scale in sudoku_rating.RATING_SCALES}
    puzzles = [{"list": e.list, "line": e.line, "name": e.name, "puzzle": _text(e.puzzle), "solutions": 1,
                **{f"rating_{scale}": int(r[k]) for scale, r in ratings.items()}} for k, e in enumerate(entries)]
    outside = {"lists": records, "duplicates_dropped": duplicates, "every_solution_unique": True, "puzzles": puzzles}
    with staged_dataset(output_dir, overwrite) as staging:
        _write_split(staging / "test", questions, answers, 0, np.random.default_rng(0))  # no augmentation: no draws
        np.save(staging / "test" / f"all__{RATINGS_FIELD}.npy", ratings[SCALE])
        add_to_metadata(staging / "test", "ratings", rating_summary(ratings[SCALE], sudoku_rating.RATING_SCALES[SCALE]))
        add_to_metadata(staging / "test", "ratings_singles",
                        rating_summary(ratings["singles"], sudoku_rating.RATING_SCALES["singles"]))
        add_to_metadata(staging / "test", "grids", {"test_distinct": len(set(sudoku_grids.canonical_grids(answers)))})
        add_to_metadata(staging / "test", "outside", outside)
        with open(staging / "identifiers.json", "w") as f:
            json.dump(["<blank>"], f)
    counts = ", ".join(f"{r['name']} {r['kept']} of {r['in_file']}" for r in records)
    print(f"wrote {output_dir}: test {len(entries)} puzzles ({counts}; {len(duplicates)} duplicates dropped), "
          "each with exactly one solution")
    for scale, r in ratings.items():
        print(f"ratings, {sudoku_rating.RATING_SCALES[scale]}: min {r.min()}, median {np.median(r):g}, max {r.max()}")
    return output_dir


def main(argv: list[str] | None = None) -> Path:
    """Command-line entry point; returns the dataset path.

    Raises:
        DatasetError: as :func:`build_outside` (run as a script, it is printed as one line, exit status 2).
    """
    parser = ArgumentParser(description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="example:\n  python scripts/build_outside_sudoku.py "
                                   "--output-dir data/sudoku-outside")
    add_output_arguments(parser, "dataset directory to create (test split only)")
    parser.add_argument("--lists", nargs="+", type=Path, default=list(DEFAULT_LISTS),
                        help="list files, one puzzle per line (81 characters, then an optional name; # comments "
                             "give the source); default: the three in utils/data/sudoku/outside_puzzles/")
    args = parser.parse_args(argv)
    return build_outside(args.output_dir, args.lists, args.overwrite)
