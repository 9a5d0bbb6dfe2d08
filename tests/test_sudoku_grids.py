"""Canonical forms of Sudoku grids and puzzles under the Sudoku symmetries (utils/data/sudoku/grids.py), on cpu."""

import numpy as np
import pytest

from tests.test_sudoku_dataset import is_valid_solution
from utils.data.sudoku import build as builder
from utils.data.sudoku import grids as sudoku_grids
from utils.data.sudoku import rating as solver

# Peter Norvig's top95.txt, puzzles 74 and 76 (utils/data/sudoku/outside_puzzles/norvig_top95.txt): one puzzle, its bands
# in another order.
TOP95_74 = ".2..........6....3.74.8.........3..2.8..4..1.6..5.........1.78.5....9..........4."
TOP95_76 = "....1.78.5....9..........4..2..........6....3.74.8.........3..2.8..4..1.6..5....."


@pytest.fixture(scope="module")
def grids():
    rng = np.random.default_rng(31)
    return np.array([solver.search([0] * 81, rng=rng).solution for _ in range(12)], np.uint8)


def decoded(form: bytes) -> np.ndarray:
    """The grid a canonical form stands for: its 9 row codes as digits, int [81]."""
    return np.array([int(ch) for code in np.frombuffer(form[:72], np.int64) for ch in f"{code:09d}"])


def first_occurrence_relabelled(grid: np.ndarray) -> np.ndarray:
    """``grid`` with its digits renamed 1, 2, ... in reading order: the smallest relabelling of that layout."""
    names = {}
    return np.array([names.setdefault(int(d), len(names) + 1) for d in grid])


def test_equivalent_grids_share_the_form_and_distinct_ones_do_not(grids):
    forms = sudoku_grids.canonical_grids(grids)
    assert len(set(forms)) == len(grids)  # random grids are (almost surely) not equivalent
    rng = np.random.default_rng(32)
    for _ in range(3):
        moved, _ = builder.shuffle_sudoku(grids, grids, rng)
        assert sudoku_grids.canonical_grids(moved) == forms
    assert sudoku_grids.canonical_grids(grids.reshape(-1, 9, 9).transpose(0, 2, 1).reshape(-1, 81)) == forms


def test_the_form_is_an_equivalent_grid_no_variant_goes_below(grids):
    rng = np.random.default_rng(33)
    for grid, form in zip(grids[:4], sudoku_grids.canonical_grids(grids[:4])):
        smallest = decoded(form)
        assert is_valid_solution(smallest.tolist()) and smallest[:9].tolist() == list(range(1, 10))
        assert sudoku_grids.canonical_grids(smallest[None]) == [form]  # it is a variant of the grid: same class
        variants, _ = builder.shuffle_sudoku(np.repeat(grid[None], 200, 0), np.repeat(grid[None], 200, 0), rng)
        for v in variants:  # a sample of the 3.4 million layouts, each at its smallest labelling
            assert tuple(smallest) <= tuple(first_occurrence_relabelled(v))


def test_puzzle_forms_tell_equivalent_puzzles_from_different_clues():
    a, b = (np.array([0 if ch == "." else int(ch) for ch in p]) for p in (TOP95_74, TOP95_76))
    sa, sb = (np.array(solver.search(p).solution) for p in (a, b))
    fa, fb = sudoku_grids.canonical_puzzles(np.stack([a, b]), np.stack([sa, sb]))
    assert fa == fb
    fewer = a.copy()
    fewer[np.flatnonzero(fewer)[0]] = 0  # the same solution grid, other clues
    ff, = sudoku_grids.canonical_puzzles(fewer[None], sa[None])
    assert ff != fa and ff[:72] == fa[:72]  # the grid part agrees
    rng = np.random.default_rng(34)
    moved_q, moved_a = builder.shuffle_sudoku(np.repeat(a[None], 5, 0), np.repeat(sa[None], 5, 0), rng)
    assert set(sudoku_grids.canonical_puzzles(moved_q, moved_a)) == {fa}


def test_grid_summary_counts_distinct_and_shared_grids(grids):
    rng = np.random.default_rng(35)
    moved, _ = builder.shuffle_sudoku(grids[:3], grids[:3], rng)
    summary = sudoku_grids.grid_summary(np.concatenate([grids[:6], grids[:2]]), np.concatenate([moved, grids[6:8]]))
    assert summary == {"train_distinct": 6, "test_distinct": 5, "test_shared_with_train": 3}
    with pytest.raises(ValueError, match="solved grids"):
        sudoku_grids.canonical_grids(np.zeros((1, 81), np.uint8))
