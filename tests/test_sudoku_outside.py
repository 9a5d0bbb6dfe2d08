"""The outside yardstick (utils/data/sudoku/outside.py, scripts/build_outside_sudoku.py), on cpu: built from the
shipped lists, its counts, sources, unique solutions and rules; bad list files are refused with one line."""

import json

import numpy as np
import pytest

from tests.test_sudoku_dataset import is_valid_solution
from utils.data.sudoku import outside as sudoku_outside
from utils.data.sudoku import rating as solver
from utils.data.puzzle_dataset import DatasetError, PuzzleDataset

NAMED = {"AI Escargot", "Arto Inkala's 2012 puzzle (\"world's hardest\")", "Arto Inkala's 2010 puzzle",
         "Easter Monster", "Golden Nugget", "Platinum Blonde"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("outside") / "sudoku-outside"
    sudoku_outside.main(["--output-dir", str(out)])
    return out


def test_the_yardstick_holds_each_list_once_with_its_source(built):
    meta = json.loads((built / "test" / "dataset.json").read_text())
    outside = meta["outside"]
    counts = {r["name"]: (r["in_file"], r["kept"]) for r in outside["lists"]}
    assert counts == {"norvig_top95": (95, 94), "norvig_hardest": (11, 11), "named_hard": (36, 32)}
    assert all("Read from" in r["source"] or "From " in r["source"] for r in outside["lists"])
    assert "norvig.com/top95.txt" in outside["lists"][0]["source"] and "norvig.com/hardest.txt" in \
        outside["lists"][1]["source"]
    # top95's puzzles 74 and 76 are one puzzle; four named ones repeat an earlier list or line.
    assert [(d["list"], d["how"]) for d in outside["duplicates_dropped"]] == \
        [("norvig_top95", "equivalent")] + [("named_hard", "identical")] * 4
    puzzles = outside["puzzles"]
    assert len(puzzles) == meta["total_puzzles"] == 137 >= 100 and meta["grids"] == {"test_distinct": 137}
    assert NAMED <= {p["name"] for p in puzzles} and outside["every_solution_unique"]


def test_every_puzzle_has_one_solution_that_obeys_the_rules(built):
    split = built / "test"
    inputs, labels = np.load(split / "all__inputs.npy"), np.load(split / "all__labels.npy")
    questions, answers = inputs.astype(np.int64) - 1, labels.astype(np.int64) - 1  # tokens: blank 1, digit d + 1
    meta = json.loads((split / "dataset.json").read_text())
    for q, a, record in zip(questions, answers, meta["outside"]["puzzles"]):
        assert "".join(str(d) if d else "." for d in q) == record["puzzle"]
        assert is_valid_solution(a.tolist()) and np.all((q == 0) | (q == a))
        assert solver.count_solutions(q, limit=2) == 1 and record["solutions"] == 1
    ratings = np.load(split / "all__ratings.npy")
    assert ratings.tolist() == [p["rating_tdoku"] for p in meta["outside"]["puzzles"]]
    assert ratings.tolist() == solver.rate_many(questions, "tdoku").tolist()
    assert [p["rating_singles"] for p in meta["outside"]["puzzles"]] == solver.rate_many(questions).tolist()
    assert meta["ratings"]["scale"] == solver.RATING_SCALES["tdoku"] and meta["ratings"]["median"] >= 4
    loader = PuzzleDataset(built, "test", 64)  # the evaluator's loader reads it
    assert loader.num_examples == 137 and loader.metadata.vocab_size == 11


def test_bad_list_files_are_refused_with_file_and_line(tmp_path):
    cases = {
        "several.txt": ("# too few clues\n" + "." * 81 + "\n", "several.txt:2: the puzzle has more than one"),
        "letters.txt": ("1" + "x" * 80 + " name\n", "letters.txt:1: row 1, column 2"),
        "empty.txt": ("# only a comment\n", "holds no puzzle"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(DatasetError, match=message):
            sudoku_outside.build_outside(tmp_path / f"out-{name}", [path])
        assert not (tmp_path / f"out-{name}").exists()  # nothing written
    with pytest.raises(DatasetError, match="not found"):
        sudoku_outside.build_outside(tmp_path / "out", [tmp_path / "missing.txt"])


def test_a_list_of_ones_own_builds_and_an_existing_dataset_needs_overwrite(built, tmp_path):
    own = tmp_path / "mine.txt"
    escargot = "1....7.9..3..2...8..96..5....53..9...1..8...26....4...3......1..4......7..7...3.."
    own.write_text(f"# my list\n{escargot} AI Escargot\n{escargot.replace('.', '0')} again\n")
    out = sudoku_outside.build_outside(tmp_path / "mine", [own])
    meta = json.loads((out / "test" / "dataset.json").read_text())["outside"]
    assert meta["lists"] == [{"name": "mine", "file": str(own), "source": "my list", "in_file": 2, "kept": 1}]
    assert meta["duplicates_dropped"][0]["how"] == "identical" and meta["puzzles"][0]["rating_tdoku"] == 4
    with pytest.raises(DatasetError, match="--overwrite"):
        sudoku_outside.build_outside(out, [own])
    sudoku_outside.build_outside(out, [own], overwrite=True)
