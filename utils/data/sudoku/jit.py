"""The Sudoku search of utils/data/sudoku/rating.py, compiled by numba: the same rules, about 100x faster.

:func:`utils.data.sudoku.rating.search` is the readable statement of the solver (naked then hidden singles to a
fixpoint, then a branch on the first blank cell with the fewest candidates, its digits in increasing order). The
functions here run exactly that search on int arrays with an explicit stack, so every count, guess count and
solution equals the Python recursion's (tests/test_sudoku_rating.py checks both against each other and against a
plain re-implementation with sets). They are what the rating, the uniqueness checks and the expert generator
(utils/data/sudoku/expert.py) call; only a random fill (``search(..., rng=...)``, whose digit order must come from
numpy's generator) runs in Python.

Compiled on first use (a few seconds) and cached next to this file where that folder is writable.
"""

from __future__ import annotations

import numba
import numpy as np

FULL = 0x1FF  # digits 1..9 in bits 0..8
# Units 0..8 are rows, 9..17 columns, 18..26 boxes; each cell's three unit numbers and each unit's nine cells.
ROW = np.array([i // 9 for i in range(81)], np.int64)
COL = np.array([9 + i % 9 for i in range(81)], np.int64)
BOX = np.array([18 + (i // 27) * 3 + (i % 9) // 3 for i in range(81)], np.int64)
UNIT_CELLS = np.array([[i for i in range(81) if u in (ROW[i], COL[i], BOX[i])] for u in range(27)], np.int64)
POPCOUNT = np.array([bin(m).count("1") for m in range(512)], np.int64)
_DIGIT = np.array([m.bit_length() for m in range(512)], np.int64)  # a one-bit mask's digit

CONTRADICTION, SOLVED, BRANCH = -1, 0, 1


@numba.njit(cache=True)
def _place(cells, used, i, bit):
    cells[i] = _DIGIT[bit]
    used[ROW[i]] |= bit
    used[COL[i]] |= bit
    used[BOX[i]] |= bit


@numba.njit(cache=True)
def _start(cells, used):
    """Fill ``used`` int64 [27] (the digits placed in each unit) from ``cells``; False when a clue repeats."""
    used[:] = 0
    for i in range(81):
        if cells[i]:
            bit = 1 << (cells[i] - 1)
            if (used[ROW[i]] | used[COL[i]] | used[BOX[i]]) & bit:
                return False
            _place(cells, used, i, bit)
    return True


@numba.njit(cache=True)
def propagate(cells, used, ban):
    """Naked then hidden singles until neither places a digit (``cells`` int64 [81], ``used`` int64 [27] change in
    place; ``ban`` int64 [81] holds digits a cell may not take). Returns (status, branch cell, its candidate mask):
    CONTRADICTION (a cell without a candidate, a unit digit without a cell, a cell two hidden singles claim),
    SOLVED, or BRANCH with the first blank cell that has the fewest candidates."""
    blank_masks = np.zeros(9, np.int64)
    blank_cells = np.zeros(9, np.int64)
    while True:
        placed = True
        best_n, best_i, best_m, blanks = 10, -1, 0, 0
        while placed:  # naked singles, sweep after sweep; a placement is seen by the cells after it
            placed, best_n, best_i, best_m, blanks = False, 10, -1, 0, 0
            for i in range(81):
                if cells[i]:
                    continue
                m = FULL & ~(used[ROW[i]] | used[COL[i]] | used[BOX[i]] | ban[i])
                n = POPCOUNT[m]
                if n == 1:
                    _place(cells, used, i, m)
                    placed = True
                elif n == 0:
                    return CONTRADICTION, -1, 0
                else:
                    blanks += 1
                    if n < best_n:
                        best_n, best_i, best_m = n, i, m
        if blanks == 0:
            return SOLVED, -1, 0
        placed = False
        for u in range(27):  # hidden singles: the digits that are a candidate of exactly one blank cell of a unit
            need = FULL & ~used[u]
            if not need:
                continue
            once, twice, k = 0, 0, 0
            for j in range(9):
                i = UNIT_CELLS[u, j]
                if not cells[i]:
                    m = FULL & ~(used[ROW[i]] | used[COL[i]] | used[BOX[i]] | ban[i])
                    twice |= once & m
                    once |= m
                    blank_cells[k], blank_masks[k] = i, m
                    k += 1
            if once != need:
                return CONTRADICTION, -1, 0
            hidden = once & ~twice
            for j in range(k):
                bit = blank_masks[j] & hidden
                if bit:
                    if bit & (bit - 1):
                        return CONTRADICTION, -1, 0
                    _place(cells, used, blank_cells[j], bit)
                    placed = True
        if not placed:
            return BRANCH, best_i, best_m


@numba.njit(cache=True)
def search(cells, limit, ban):
    """Up to ``limit`` solutions of ``cells`` (int64 [81], 0 = blank; not changed) by propagation and search, no
    digit of ``ban[i]`` (int64 [81]) in cell i. Returns (count, guesses, first solution int64 [81], last solution
    int64 [81]); the solutions are all 0 when none was found."""
    first, last = np.zeros(81, np.int64), np.zeros(81, np.int64)
    grid, used = cells.copy(), np.zeros(27, np.int64)
    if not _start(grid, used):
        return 0, 0, first, last
    stack_cells = np.zeros((82, 81), np.int64)
    stack_used = np.zeros((82, 27), np.int64)
    stack_cell = np.zeros(82, np.int64)
    stack_rest = np.zeros(82, np.int64)
    depth = count = guesses = 0
    while True:
        status, i, m = propagate(grid, used, ban)
        if status == BRANCH:
            low = m & -m
            stack_cells[depth], stack_used[depth] = grid, used
            stack_cell[depth], stack_rest[depth] = i, m & ~low
            depth += 1
            _place(grid, used, i, low)
            guesses += 1
            continue
        if status == SOLVED:
            count += 1
            if count == 1:
                first[:] = grid
            last[:] = grid
            if count >= limit:
                break
        while depth and not stack_rest[depth - 1]:  # back to the newest branch point with a digit left
            depth -= 1
        if not depth:
            break
        t = depth - 1
        rest = stack_rest[t]
        low = rest & -rest
        stack_rest[t] = rest & ~low
        grid[:], used[:] = stack_cells[t], stack_used[t]
        _place(grid, used, stack_cell[t], low)
        guesses += 1
    return count, guesses, first, last


@numba.njit(cache=True)
def singles_left(cells):
    """Blank cells left once naked and hidden singles reach their fixpoint on ``cells`` (int64 [81]); -1 on a
    contradiction or a repeated clue."""
    grid, used = cells.copy(), np.zeros(27, np.int64)
    if not _start(grid, used):
        return -1
    status, _, _ = propagate(grid, used, np.zeros(81, np.int64))
    if status == CONTRADICTION:
        return -1
    return int((grid == 0).sum())
