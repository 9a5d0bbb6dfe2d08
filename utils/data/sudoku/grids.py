"""Canonical forms of Sudoku solution grids (and puzzles) under the Sudoku symmetries, compiled by numba.

Two grids are equivalent when one becomes the other by relabelling digits, permuting rows within a band, bands,
columns within a stack, stacks, and transposing: 9! x 2 x 6^8 maps. The canonical form is the lexicographically
smallest equivalent grid (rows read as 9-digit numbers). Trying the 3.4 million geometric maps one by one is too
slow, so :func:`canonical_grids` fixes only what the order cannot settle by sorting:

1. the transpose (2), which original row becomes row 0 (9), and the column permutation (6^4 = 1296);
2. the relabelling is then forced: row 0 must read 1 2 ... 9 (the smallest first row, since it holds every digit);
3. the remaining row order is forced too: row 0's band-mates come next, smaller first; the other two bands follow,
   each sorted, the band with the smaller first row first (rows of a grid differ, so sorting is the minimum).

That is 23,328 candidates per grid, most dropped after comparing their row 1 with the best so far: about a
millisecond a grid. Equivalent grids get the same form and different ones different forms (it is a minimum over
the whole group), unlike the cheaper fingerprint of utils/data/sudoku/build.py (``grid_fingerprints``), which can
collide. :func:`canonical_puzzles` does the same for a puzzle with its solution: among the maps that take the
solution to its canonical grid, the smallest image of the puzzle; two unique puzzles are equivalent exactly when
their forms are equal.
"""

from __future__ import annotations

import itertools

import numba
import numpy as np

_PERM3 = np.array(list(itertools.permutations(range(3))), np.int64)
# Every column permutation that keeps stacks whole: a stack order, then an order within each stack.
COLUMN_MAPS = np.array([[s[k // 3] * 3 + w[k // 3][k % 3] for k in range(9)]
                        for s in _PERM3 for w in itertools.product(_PERM3, repeat=3)], np.int64)
_POW10 = np.array([10 ** (8 - k) for k in range(9)], np.int64)


@numba.njit(cache=True)
def _row_code(row, cols, label):
    """Row ``row`` (int64 [9]) read through column map ``cols`` and relabelling ``label``, as a 9-digit number."""
    code = 0
    for k in range(9):
        code = code * 10 + label[row[cols[k]]]
    return code


@numba.njit(cache=True)
def _arrange(codes, r0):
    """The smallest row order with original row ``r0`` first (module docstring, step 3), as the 9 row indices."""
    band = r0 // 3
    order = np.empty(9, np.int64)
    order[0] = r0
    a, b = band * 3 + (r0 - band * 3 + 1) % 3, band * 3 + (r0 - band * 3 + 2) % 3
    if codes[a] < codes[b]:
        order[1], order[2] = a, b
    else:
        order[1], order[2] = b, a
    sorted_bands = np.empty((2, 3), np.int64)
    n = 0
    for other in range(3):
        if other == band:
            continue
        rows = np.array([other * 3, other * 3 + 1, other * 3 + 2])
        for i in range(3):  # three rows: a small insertion sort by code
            for j in range(2 - i):
                if codes[rows[j]] > codes[rows[j + 1]]:
                    rows[j], rows[j + 1] = rows[j + 1], rows[j]
        sorted_bands[n] = rows
        n += 1
    first, second = (0, 1) if codes[sorted_bands[0, 0]] < codes[sorted_bands[1, 0]] else (1, 0)
    order[3:6] = sorted_bands[first]
    order[6:9] = sorted_bands[second]
    return order


@numba.njit(cache=True)
def _canonical(grid, puzzle, with_puzzle, out_grid, out_puzzle):
    """Canonical form of ``grid`` (int64 [9, 9], digits 1..9) into ``out_grid`` (int64 [9]: rows as numbers) and,
    when ``with_puzzle``, the smallest image of ``puzzle`` (int64 [9, 9], 0 = blank) under the maps that reach it
    into ``out_puzzle`` (int64 [9])."""
    best = np.full(9, 1 << 62, np.int64)
    best[0] = 123456789  # every candidate's row 0 (step 2)
    best_p = np.full(9, 1 << 62, np.int64)
    label = np.zeros(10, np.int64)
    codes = np.empty(9, np.int64)
    g = np.empty((9, 9), np.int64)
    p = np.empty((9, 9), np.int64)
    cand_p = np.empty(9, np.int64)
    for transpose in range(2):
        for i in range(9):
            for j in range(9):
                g[i, j] = grid[j, i] if transpose else grid[i, j]
                p[i, j] = puzzle[j, i] if transpose else puzzle[i, j]
        for r0 in range(9):
            band = r0 // 3
            mate_a, mate_b = band * 3 + (r0 % 3 + 1) % 3, band * 3 + (r0 % 3 + 2) % 3
            for m in range(COLUMN_MAPS.shape[0]):
                cols = COLUMN_MAPS[m]
                for k in range(9):
                    label[g[r0, cols[k]]] = k + 1
                # Row 1 of this candidate is the smaller band-mate; most candidates lose right there.
                row1 = min(_row_code(g[mate_a], cols, label), _row_code(g[mate_b], cols, label))
                if row1 > best[1]:
                    continue
                for r in range(9):
                    codes[r] = _row_code(g[r], cols, label)
                order = _arrange(codes, r0)
                cmp = 0
                for k in range(1, 9):
                    if codes[order[k]] != best[k]:
                        cmp = -1 if codes[order[k]] < best[k] else 1
                        break
                if cmp > 0:
                    continue
                if with_puzzle:
                    label[0] = 0
                    for k in range(9):
                        code = 0
                        for c in range(9):
                            code = code * 10 + label[p[order[k], cols[c]]]
                        cand_p[k] = code
                    if cmp == 0:
                        for k in range(9):
                            if cand_p[k] != best_p[k]:
                                cmp = -1 if cand_p[k] < best_p[k] else 1
                                break
                    if cmp < 0:
                        best_p[:] = cand_p
                if cmp < 0:
                    for k in range(9):
                        best[k] = codes[order[k]]
    out_grid[:] = best
    out_puzzle[:] = best_p


def _forms(grids: np.ndarray, puzzles: np.ndarray | None) -> tuple[list[bytes], list[bytes]]:
    grids = np.asarray(grids).reshape(-1, 9, 9).astype(np.int64)
    with_puzzle = puzzles is not None
    puzzles = np.asarray(puzzles).reshape(-1, 9, 9).astype(np.int64) if with_puzzle else np.zeros_like(grids)
    if grids.min(initial=1) < 1 or grids.max(initial=9) > 9:
        raise ValueError("canonical forms need solved grids: digits 1-9, no blanks")
    grid_forms, puzzle_forms = [], []
    out_grid, out_puzzle = np.empty(9, np.int64), np.empty(9, np.int64)
    for grid, puzzle in zip(grids, puzzles):
        _canonical(grid, puzzle, with_puzzle, out_grid, out_puzzle)
        grid_forms.append(out_grid.tobytes())
        puzzle_forms.append(out_puzzle.tobytes())
    return grid_forms, puzzle_forms


def canonical_grids(grids) -> list[bytes]:
    """The canonical form of each solved grid (see the module docstring), as bytes (9 int64 row codes).

    Args:
        grids: int [N, 81] (or [N, 9, 9]) digits 1..9.
    Returns:
        N bytes objects, equal exactly for equivalent grids.
    Raises:
        ValueError: a cell outside 1..9.
    """
    return _forms(grids, None)[0]


def canonical_puzzles(puzzles, solutions) -> list[bytes]:
    """The canonical form of each puzzle with its solution: its canonical grid, then the smallest image of the
    puzzle under the maps that take the solution there (bytes of 18 int64 row codes).

    Args:
        puzzles: int [N, 81] digits, 0 = blank; solutions: int [N, 81] digits 1..9, a solution of each puzzle.
    Returns:
        N bytes objects; for puzzles with a unique solution, equal exactly for equivalent puzzles.
    Raises:
        ValueError: a solution cell outside 1..9.
    """
    grids, images = _forms(solutions, puzzles)
    return [g + p for g, p in zip(grids, images)]


def grid_summary(train_answers, test_answers) -> dict[str, int]:
    """What a dataset's ``dataset.json`` records about its solution grids (by :func:`canonical_grids`).

    Args:
        train_answers, test_answers: int [N, 81] solved grids of the two splits.
    Returns:
        {"train_distinct", "test_distinct", "test_shared_with_train"}: distinct grids per split, and the test
        split's grids equivalent to a training grid.
    """
    train, test = set(canonical_grids(train_answers)), set(canonical_grids(test_answers))
    return {"train_distinct": len(train), "test_distinct": len(test), "test_shared_with_train": len(train & test)}
