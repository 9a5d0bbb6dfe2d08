"""Expert Sudoku generation (utils/data/sudoku/expert.py), with a small search so that it runs in seconds on cpu:
unique solutions, the rating floor, the same puzzles for a seed on any number of workers, and whole solution grids
kept out of a second set."""

import json

import numpy as np
import pytest

from utils.data.sudoku import build as builder
from utils.data.sudoku import expert as sudoku_expert
from utils.data.sudoku import grids as sudoku_grids
from utils.data.sudoku import rating as sudoku_rating
from utils.data.puzzle_dataset import DatasetError
from utils.data.sudoku.expert import ExpertSearch, generate_expert

# Small trees and few moves: the real defaults (trees of 60, ratings near 60) take about a second a puzzle.
SMALL = ExpertSearch(tree_target=4, per_grid=2, moves=4, patience=40, chains_per_task=3, give_up=12)
FLOOR = 2


@pytest.fixture(scope="module")
def made():
    return generate_expert(4, seed=5, min_rating=FLOOR, search=SMALL)


def test_expert_puzzles_are_unique_rated_and_minimal(made):
    questions, answers, seen = made
    assert questions.shape == answers.shape == (4, 81) and questions.dtype == np.uint8
    for q, a in zip(questions, answers):
        result = sudoku_rating.search(q, limit=2)
        assert result.count == 1 and result.solution == a.tolist()
        assert result.guesses >= SMALL.tree_target and sudoku_rating.rate(q) >= FLOOR
        for i in np.flatnonzero(q):  # no clue can go: the puzzles are minimal
            without = q.copy()
            without[i] = 0
            assert sudoku_rating.count_solutions(without) == 2
    grids = builder.grid_fingerprints(answers)
    # Grids of chains past the count (the third of the task) are not claimed: the test set may still use them.
    assert set(grids) == seen and max(grids.count(g) for g in grids) <= SMALL.per_grid


def test_a_seed_gives_the_same_puzzles_on_any_number_of_workers_and_fewer_are_the_first(made):
    again = generate_expert(4, seed=5, min_rating=FLOOR, workers=2, search=SMALL)
    assert np.array_equal(again[0], made[0]) and np.array_equal(again[1], made[1])
    fewer = generate_expert(2, seed=5, min_rating=FLOOR, search=SMALL)  # 2 chains, not a task of 3
    assert np.array_equal(fewer[0], made[0][:2]) and np.array_equal(fewer[1], made[1][:2])
    other = generate_expert(2, seed=6, min_rating=FLOOR, search=SMALL)
    assert not np.array_equal(other[0], made[0][:2])


def test_a_second_set_shares_no_solution_grid_with_the_first(made):
    questions, answers, seen = made
    test_q, test_a, both = generate_expert(2, seed=5, stream=1, min_rating=FLOOR, exclude=seen, search=SMALL)
    assert not set(builder.grid_fingerprints(test_a)) & seen and both >= seen
    # The same stream with the first set's grids excluded skips exactly those chains.
    later, _, _ = generate_expert(2, seed=5, min_rating=FLOOR, exclude=seen, search=SMALL)
    assert not {q.tobytes() for q in later} & {q.tobytes() for q in questions}


def test_an_unreachable_floor_stops_with_an_error():
    hopeless = ExpertSearch(tree_target=2, per_grid=1, moves=2, patience=4, chains_per_task=2, give_up=2)
    with pytest.raises(DatasetError, match="--min-rating"):
        generate_expert(1, seed=0, min_rating=100000, search=hopeless)


# The climb on tdoku's scale, small enough to run in seconds (TDOKU_SEARCH's trees of 20 take about a second a puzzle).
SMALL_TDOKU = ExpertSearch(tree_target=4, per_grid=2, moves=4, patience=40, chains_per_task=3, give_up=12,
                           rating_scale="tdoku", max_drop=2)


def test_the_climb_on_tdokus_scale_keeps_puzzles_hard_there():
    questions, answers, seen = generate_expert(3, seed=7, min_rating=FLOOR, search=SMALL_TDOKU)
    for q, a in zip(questions, answers):
        tree = sudoku_rating.search(q, limit=2, scale="tdoku")
        assert tree.count == 1 and tree.solution == a.tolist() and tree.guesses >= SMALL_TDOKU.tree_target
        assert sudoku_rating.rate(q, scale="tdoku") >= FLOOR
        for i in np.flatnonzero(q):  # minimal, as on our scale
            without = q.copy()
            without[i] = 0
            assert sudoku_rating.count_solutions(without) == 2
    again = generate_expert(3, seed=7, min_rating=FLOOR, workers=2, search=SMALL_TDOKU)
    assert np.array_equal(again[0], questions) and again[2] == seen


def test_a_tdoku_scale_build_records_its_scale_and_no_shared_grids(tmp_path, monkeypatch):
    monkeypatch.setitem(sudoku_expert.SEARCHES, "tdoku", SMALL_TDOKU)
    out = builder.build_dataset(tmp_path / "d", generate=True, expert=True, rating_scale="tdoku", min_rating=FLOOR,
                                train_size=4, test_size=2, seed=3)
    for split in ("train", "test"):
        meta = json.loads((out / split / "dataset.json").read_text())
        assert meta["ratings"]["scale"] == sudoku_rating.RATING_SCALES["tdoku"] and meta["ratings"]["min"] >= FLOOR
        assert meta["grids"]["test_shared_with_train"] == 0 and meta["grids"]["train_distinct"] >= 2
    test_q = np.load(out / "test" / "all__inputs.npy").astype(np.int64) - 1
    assert np.load(out / "test" / "all__ratings.npy").tolist() == sudoku_rating.rate_many(test_q, "tdoku").tolist()
    train_a = np.load(out / "train" / "all__labels.npy").astype(np.int64) - 1
    test_a = np.load(out / "test" / "all__labels.npy").astype(np.int64) - 1
    assert not set(sudoku_grids.canonical_grids(train_a)) & set(sudoku_grids.canonical_grids(test_a))


def test_a_rating_scale_other_than_ours_needs_the_expert_generator(tmp_path):
    with pytest.raises(DatasetError, match="--generate --expert"):
        builder.build_dataset(tmp_path / "d", generate=True, rating_scale="tdoku", train_size=2, test_size=1)
    with pytest.raises(DatasetError, match="--rating-scale must be one of"):
        builder.build_dataset(tmp_path / "d", generate=True, expert=True, rating_scale="hodoku", train_size=2,
                              test_size=1)
    assert not (tmp_path / "d").exists()
