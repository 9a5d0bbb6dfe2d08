"""Sudoku solution grids up to the Sudoku symmetries: the fingerprint by which both Sudoku generators
(utils/data/sudoku/build.py, utils/data/sudoku/expert.py) keep test puzzles apart from training puzzles.

Two solution grids related by a Sudoku symmetry (digit relabelling, row/column permutations, transpose) get the
same fingerprint. For each pair of rows the map "digit in row i -> digit in row j at the same column" is a
permutation whose cycle type survives relabelling and column moves; the sorted multisets over row pairs and over
column pairs, taken as an unordered pair, also survive row moves and the transpose.
"""

from __future__ import annotations

import numpy as np

_PAIR_I, _PAIR_J = np.triu_indices(9, 1)


def grid_fingerprints(answers: np.ndarray) -> list[bytes]:
    """Symmetry-invariant fingerprints of solved grids.

    Args:
        answers: [N, 81] digits 1..9 (any int dtype).
    Returns:
        N bytes objects; equal for equivalent grids (distinct grids rarely collide).
    """
    grids = answers.reshape(-1, 9, 9).astype(np.int64) - 1
    n = len(grids)
    codes = []
    for g in (grids, grids.transpose(0, 2, 1)):
        perm = np.empty((n, 36, 9), np.int64)
        np.put_along_axis(perm, g[:, _PAIR_I, :], g[:, _PAIR_J, :], axis=2)
        start = np.broadcast_to(np.arange(9), perm.shape)
        x, cycle_len = start, np.zeros_like(perm)
        for k in range(1, 10):
            x = np.take_along_axis(perm, x, axis=2)
            cycle_len = np.where((cycle_len == 0) & (x == start), k, cycle_len)
        # Histogram of the 9 elements' cycle lengths, one decimal digit per length.
        codes.append(np.sort((10 ** (cycle_len - 1)).sum(axis=2), axis=1))
    rows, cols = codes
    differs = rows != cols
    first = differs.argmax(axis=1)[:, None]
    rows_first = np.take_along_axis(rows, first, 1) <= np.take_along_axis(cols, first, 1)
    lo, hi = np.where(rows_first, rows, cols), np.where(rows_first, cols, rows)
    return [r.tobytes() for r in np.concatenate([lo, hi], axis=1)]


def random_symmetry(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random element of the group of Sudoku's validity-preserving symmetries: digit relabelling, the rows within
    each band and the bands, the columns within each stack and the stacks, then a transpose with probability 1/2
    (the test-time augmentation of arXiv 2601.19085, Sec. 3; the moves the fingerprint above is invariant to).

    Returns:
        ``order`` [81] int64: cell ``j`` of the transformed grid is cell ``order[j]`` of the original (row-major);
        ``digits`` [10] int64: digit ``d`` becomes ``digits[d]`` (``digits[0] = 0``: a blank stays blank). A
        solution of the transformed puzzle, mapped back by ``argsort(order)`` and ``argsort(digits)``, is a solution
        of the original.
    """
    rows = np.concatenate([3 * band + rng.permutation(3) for band in rng.permutation(3)])
    cols = np.concatenate([3 * stack + rng.permutation(3) for stack in rng.permutation(3)])
    order = (9 * rows[:, None] + cols[None, :])
    if rng.random() < 0.5:
        order = order.T
    return order.reshape(-1).astype(np.int64), np.concatenate([[0], 1 + rng.permutation(9)]).astype(np.int64)
