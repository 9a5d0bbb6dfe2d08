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


def test_a_stopped_generation_resumes_with_the_same_puzzles_and_runs_only_what_was_left(tmp_path, monkeypatch,
                                                                                        capsys):
    whole = generate_expert(8, seed=5, min_rating=FLOOR, search=SMALL)  # runs several tasks of 3 chains
    ran = []
    real_run = sudoku_expert._run_task

    def run_then_stop(chains, **kwargs):
        if len(ran) == 1:  # the second task: the stop comes while it runs
            raise KeyboardInterrupt
        ran.append(chains)
        return real_run(chains, **kwargs)

    monkeypatch.setattr(sudoku_expert, "_run_task", run_then_stop)
    with pytest.raises(KeyboardInterrupt):
        generate_expert(8, seed=5, min_rating=FLOOR, search=SMALL, resume_dir=tmp_path)
    saved = list(tmp_path.glob("stream0-*/chains-*.npz"))
    assert [p.name for p in saved] == [f"chains-{ran[0].start:08d}-{ran[0].stop:08d}.npz"]
    assert not list(tmp_path.glob("**/*.partial.npz"))

    ran.clear()
    monkeypatch.setattr(sudoku_expert, "_run_task", lambda chains, **kw: ran.append(chains) or real_run(chains, **kw))
    questions, answers, seen = generate_expert(8, seed=5, min_rating=FLOOR, search=SMALL, resume_dir=tmp_path)
    assert np.array_equal(questions, whole[0]) and np.array_equal(answers, whole[1]) and seen == whole[2]
    assert ran and saved[0].name not in {f"chains-{r.start:08d}-{r.stop:08d}.npz" for r in ran}
    assert "resuming: 3 chains of stream 0" in capsys.readouterr().out  # and the CPU time counts the earlier run's
    # Other settings never read these chains: a second floor gets a folder of its own.
    generate_expert(1, seed=5, min_rating=FLOOR + 1, search=SMALL, resume_dir=tmp_path)
    assert len(list(tmp_path.glob("stream0-*"))) == 2


def test_one_puzzle_per_grid_gives_as_many_grids_as_puzzles_and_the_build_leaves_no_chains(tmp_path, monkeypatch):
    monkeypatch.setitem(sudoku_expert.SEARCHES, "tdoku", SMALL_TDOKU)
    out = builder.build_dataset(tmp_path / "d", generate=True, expert=True, rating_scale="tdoku", min_rating=FLOOR,
                                train_size=4, test_size=2, seed=3, puzzles_per_grid=1)
    meta = json.loads((out / "train" / "dataset.json").read_text())
    assert meta["grids"]["train_distinct"] == 4 and meta["grids"]["test_distinct"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # the chains folder went with the build


@pytest.mark.parametrize("kwargs, message", [({"puzzles_per_grid": 0}, r"--puzzles-per-grid must be in \[1, 64\]"),
                                             ({"puzzles_per_grid": 65}, r"--puzzles-per-grid must be in \[1, 64\]"),
                                             ({"puzzles_per_grid": 1, "expert": False}, "--generate --expert")])
def test_puzzles_per_grid_is_checked_before_any_work(tmp_path, kwargs, message):
    with pytest.raises(DatasetError, match=message):
        builder.build_dataset(tmp_path / "d", generate=True, **{"expert": True, **kwargs}, train_size=2, test_size=1)
    assert not list(tmp_path.iterdir())


def test_a_file_where_the_chains_folder_goes_is_refused_and_kept(tmp_path):
    (tmp_path / ".d.chains").write_text("mine")
    with pytest.raises(DatasetError, match="is not a folder"):
        builder.build_dataset(tmp_path / "d", generate=True, expert=True, train_size=2, test_size=1)
    assert (tmp_path / ".d.chains").read_text() == "mine" and not (tmp_path / "d").exists()


def test_a_damaged_chains_file_is_run_again_and_a_stopped_write_is_never_read(tmp_path, capsys):
    whole = generate_expert(4, seed=5, min_rating=FLOOR, search=SMALL, resume_dir=tmp_path)
    saved = sorted(tmp_path.glob("stream0-*/chains-*.npz"))
    saved[0].write_bytes(saved[0].read_bytes()[:100])  # cut short, as a full disk would leave it
    (saved[0].parent / "chains-00000099-00000102.partial").write_bytes(b"half")  # a write a stop interrupted
    again = generate_expert(4, seed=5, min_rating=FLOOR, search=SMALL, resume_dir=tmp_path)
    assert np.array_equal(again[0], whole[0]) and f"{saved[0]} is unreadable" in capsys.readouterr().out
    with np.load(saved[0]) as rewritten:
        assert len(rewritten["chain"]) == SMALL.chains_per_task


def test_a_second_build_of_the_same_dataset_is_refused_while_the_first_runs(tmp_path):
    import fcntl

    (tmp_path / ".d.chains").mkdir()
    with open(tmp_path / ".d.chains" / "lock", "w") as held:  # what a running build holds
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(DatasetError, match="another build of .*d is running"):
            builder.build_dataset(tmp_path / "d", generate=True, expert=True, train_size=2, test_size=1)
    assert not (tmp_path / "d").exists() and (tmp_path / ".d.chains" / "lock").exists()
