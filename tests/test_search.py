"""Test-time search (utils/solve/search.py): every kind of view maps back exactly, keeps the puzzle's rules, and the
trajectories start from the references' answer; latent noise (models/act.py) changes nothing where its std is 0.
On the CPU, with the bundled models."""

import numpy as np
import pytest
import torch

from models.act import LatentNoise
from utils.data.sudoku import rating as sudoku_rating
from utils.data.user_puzzles import maze_problems, sudoku_problems
from utils.eval.reasoning import TestTimeCompute, reason
from utils.solve.search import VIEW_KINDS, Search, View, draw_view, run_trajectories, trajectory_views
from utils.solve.solving import open_model

CPU = torch.device("cpu")
HELD_OUT = "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5...."


def sudoku_pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random full grid and a puzzle of it (about half its cells blank), as tokens [81]."""
    solution = np.array(sudoku_rating._search_python([0] * 81, rng=rng).solution)
    puzzle = np.where(rng.random(81) < 0.5, solution, 0)
    return np.where(puzzle > 0, puzzle + 1, 1), solution + 1


@pytest.mark.parametrize("kind", VIEW_KINDS)
@pytest.mark.parametrize("task, cells, vocab", [("sudoku", 81, 11), ("maze", 100, 6)])
def test_every_view_maps_back_exactly(kind, task, cells, vocab):
    rng = np.random.default_rng(0)
    for _ in range(200):  # random group elements on random grids, every token of the vocabulary among them
        view, grid = draw_view(task, kind, cells, vocab, rng), rng.integers(0, vocab, cells)
        assert np.array_equal(view.back(view.apply(grid)), grid)
        assert np.array_equal(view.apply(view.back(grid)), grid)
        assert sorted(view.order) == list(range(cells)) and sorted(view.tokens) == list(range(vocab))
    if kind == "none":
        assert np.array_equal(view.order, np.arange(cells)) and np.array_equal(view.tokens, np.arange(vocab))


@pytest.mark.parametrize("kind", ["symmetry", "dihedral"])
def test_a_sudoku_view_keeps_the_rules_and_relabels_only_digits(kind):
    rng = np.random.default_rng(1)
    for _ in range(50):
        puzzle, solution = sudoku_pair(rng)
        view = draw_view("sudoku", kind, 81, 11, rng)
        seen, solved = view.apply(puzzle), view.apply(solution)
        assert sudoku_problems(solved, seen) == []  # the view's solution solves the view of the puzzle
        assert sudoku_problems(view.back(solved), puzzle) == []
        assert view.tokens[0] == 0 and view.tokens[1] == 1  # padding and blanks stay what they are
        assert (seen == 1).sum() == (puzzle == 1).sum()
    moved = [draw_view("sudoku", "symmetry", 81, 11, rng) for _ in range(20)]
    assert any(not np.array_equal(v.tokens, np.arange(11)) for v in moved)  # digits are relabelled
    assert len({v.order.tobytes() for v in moved}) == 20  # and cells moved, each time otherwise


def test_a_maze_view_keeps_the_rules():
    from utils.data.maze import generate_maze

    rng = np.random.default_rng(2)
    for _ in range(20):
        question, answer = generate_maze(rng, size=10)
        question, answer = question.reshape(-1), answer.reshape(-1)
        view = draw_view("maze", "symmetry", 100, 6, rng)
        assert np.array_equal(view.tokens, np.arange(6))  # a maze's tokens are never relabelled
        assert maze_problems(view.apply(answer), view.apply(question)) == []


def test_a_trajectorys_view_does_not_depend_on_how_trajectories_are_batched():
    tokens = np.ones(81, np.uint8)
    search = Search(4)
    together = trajectory_views("sudoku", search, tokens, 11, 0, 6, seed=3)
    apart = trajectory_views("sudoku", search, tokens, 11, 0, 2, 3) + trajectory_views("sudoku", search, tokens, 11,
                                                                                       2, 4, 3)
    assert all(np.array_equal(a.order, b.order) and np.array_equal(a.tokens, b.tokens)
               for a, b in zip(together, apart))
    assert np.array_equal(together[0].order, np.arange(81))  # trajectory 0 sees the puzzle as given


def test_trajectory_0_is_the_references_answer_whatever_noise_the_others_get():
    trained = open_model(None, "sudoku", 81, 1, CPU, torch.float32)
    tokens = np.array([1 if c == "." else int(c) + 1 for c in HELD_OUT], np.uint8)
    inputs = torch.from_numpy(tokens[None].astype(np.int32))
    plain = reason(trained.head, trained.head, {"inputs": inputs, "labels": inputs.long(),
                                                "puzzle_identifiers": torch.zeros(1, dtype=torch.int32)},
                   TestTimeCompute(segments=4, keep_segments=True))
    for search in (Search(4, "symmetry", 0.3, 0.5), Search(4, "none", 0.0, 0.0, "end")):
        segments = list(run_trajectories(trained, "sudoku", tokens, search, 0, 3, 0, CPU))
        assert [s.t for s in segments] == [1, 2, 3, 4] and trained.head.model.inner.latent_noise is None
        for s in segments:
            assert np.array_equal(s.grids[0], plain["segment_preds"][0, s.t - 1].numpy())
            assert (s.passes is None) == (search.check == "end" and s.t < 4)
            if s.passes is not None:
                assert list(s.passes) == [not sudoku_problems(g, tokens) for g in s.grids]


def test_latent_noise_of_std_0_leaves_a_row_bitwise_alone():
    z = torch.randn(3, 5, 8, dtype=torch.bfloat16)
    noise = LatentNoise(torch.tensor([0.0, 1.0, 0.0]), torch.Generator().manual_seed(0))
    out = noise(z)
    assert torch.equal(out[0], z[0]) and torch.equal(out[2], z[2]) and not torch.equal(out[1], z[1])
    assert out.dtype == torch.bfloat16


def test_a_search_out_of_range_is_refused():
    for bad in (dict(segments=0), dict(segments=4, views="rotate"), dict(segments=4, check="never"),
                dict(segments=4, latent_noise=-1.0)):
        with pytest.raises(ValueError):
            Search(**bad)
    assert Search(4, "symmetry", 0.1).describe() == ("4 segments, symmetry views, latent noise 0.1, checked every "
                                                     "segment")
    assert View.identity(4, 3).back(np.array([2, 0, 1, 2])).tolist() == [2, 0, 1, 2]
