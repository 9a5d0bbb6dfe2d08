"""The Sudoku solver: constraint propagation plus search, for counting solutions, filling grids and rating.

Grids are 81 digits in row-major order, 0 = blank. One solver serves every use: uniqueness checks and
random full grids in the builder (utils/data/sudoku.py), and :func:`rate`, the difficulty rating.

Propagation applies two rules until neither places a digit: a *naked single* (a blank cell with one
candidate gets it) and a *hidden single* (a digit with one possible cell in a row, column or box goes
there). When the grid is neither solved nor contradicted, the search branches on the first blank cell
with the fewest candidates and tries its digits in increasing order (or in a random order when filling
a grid). Candidates are 9-bit Python ints (bit d-1 = digit d), one mask per row, column and box of the
digits already placed; a branch copies those 81 + 27 ints.

The rating follows Sudoku-Extreme (Hugging Face ``sapientinc/sudoku-extreme``; HRM, Wang et al. 2025,
arXiv 2506.21734, Sec. 3), which rates each puzzle by the backtracks a solver (tdoku) needs and keeps the
ones that need search. Ours counts the guesses of the solver above; a Sudoku-Extreme CSV's ``rating`` column
comes from another solver with other rules, so the two scales agree only in spirit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_FULL = 0x1FF  # digits 1..9 in bits 0..8
# Units 0..8 are rows, 9..17 columns, 18..26 boxes; each cell's three unit numbers and each unit's nine cells.
_ROW = [i // 9 for i in range(81)]
_COL = [9 + i % 9 for i in range(81)]
_BOX = [18 + (i // 27) * 3 + (i % 9) // 3 for i in range(81)]
_UNIT_CELLS = [[i for i in range(81) if u in (_ROW[i], _COL[i], _BOX[i])] for u in range(27)]
_POPCOUNT = [bin(m).count("1") for m in range(512)]
_DIGITS = [[d for d in range(1, 10) if m >> (d - 1) & 1] for m in range(512)]
_NO_BAN = [0] * 81


@dataclass
class SearchResult:
    """What :func:`search` found.

    Attributes:
        count: solutions found, at most the search's ``limit``.
        solution: the first solution found (81 digits 1..9), None when there is none.
        guesses: digits tried at branch cells during the whole search (0 = propagation alone decided it).
    """

    count: int
    solution: list[int] | None
    guesses: int


def _start(cells) -> tuple[list[int], list[int]] | None:
    """(digits as a list, the 27 unit masks of placed digits), or None when a clue repeats in a unit."""
    cells = [int(d) for d in cells]
    used = [0] * 27
    for i, d in enumerate(cells):
        if d:
            bit = 1 << (d - 1)
            r, c, b = _ROW[i], _COL[i], _BOX[i]
            if (used[r] | used[c] | used[b]) & bit:
                return None
            used[r] |= bit
            used[c] |= bit
            used[b] |= bit
    return cells, used


def _propagate(cells: list[int], used: list[int], ban: list[int], empties: list[int]):
    """Place naked and hidden singles until neither rule applies; ``cells`` and ``used`` change in place.

    ``ban[i]`` holds digits cell i may not take. Returns None on a contradiction (a cell without a candidate,
    or a digit without a cell in some unit), else (blank cells left, branch cell, its candidate mask); the
    branch cell is -1 when the grid is solved.
    """
    while True:
        # Naked singles, sweep after sweep; a placement is seen by the cells after it in the same sweep.
        placed = True
        while placed:
            placed, rest, best_n, best_i, best_m = False, [], 10, -1, 0
            for i in empties:
                r, c, b = _ROW[i], _COL[i], _BOX[i]
                m = _FULL & ~(used[r] | used[c] | used[b] | ban[i])
                n = _POPCOUNT[m]
                if n == 1:
                    cells[i] = m.bit_length()
                    used[r] |= m
                    used[c] |= m
                    used[b] |= m
                    placed = True
                elif n == 0:
                    return None
                else:
                    rest.append(i)
                    if n < best_n:
                        best_n, best_i, best_m = n, i, m
            empties = rest
        if not empties:
            return empties, -1, 0
        # Hidden singles: in each unit, the digits that are a candidate of exactly one blank cell.
        placed = False
        for u in range(27):
            need = _FULL & ~used[u]
            if not need:
                continue
            once = twice = 0
            masks = []
            for i in _UNIT_CELLS[u]:
                if not cells[i]:
                    m = _FULL & ~(used[_ROW[i]] | used[_COL[i]] | used[_BOX[i]] | ban[i])
                    twice |= once & m
                    once |= m
                    masks.append((i, m))
            if once != need:
                return None
            hidden = once & ~twice  # masks are this unit's own, fresh: its placements below stay legal
            for i, m in masks:
                bit = m & hidden
                if bit:
                    if bit & (bit - 1):  # two digits that must both go in this cell
                        return None
                    r, c, b = _ROW[i], _COL[i], _BOX[i]
                    cells[i] = bit.bit_length()
                    used[r] |= bit
                    used[c] |= bit
                    used[b] |= bit
                    placed = True
        if not placed:
            return empties, best_i, best_m
        empties = [i for i in empties if not cells[i]]


def search(cells, limit: int = 1, exclude: tuple[int, int] | None = None,
           rng: np.random.Generator | None = None) -> SearchResult:
    """Find up to ``limit`` solutions of a grid by propagation and search (see the module docstring).

    Args:
        cells: 81 digits (any int sequence or array), 0 = blank, row-major.
        limit: stop after this many solutions (1: solve; 2: check uniqueness).
        exclude: (cell, digit): only solutions in which that cell holds another digit.
        rng: try a branch cell's digits in a random order drawn from it (increasing order when None).
    Returns:
        A :class:`SearchResult`; count 0 when the clues repeat a digit in a unit or have no solution.
    """
    start = _start(np.asarray(cells).reshape(81).tolist())
    result = SearchResult(0, None, 0)
    if start is None:
        return result
    ban = _NO_BAN
    if exclude is not None:
        ban = list(_NO_BAN)
        ban[exclude[0]] = 1 << (exclude[1] - 1)

    def recurse(cells: list[int], used: list[int], empties: list[int]) -> None:
        state = _propagate(cells, used, ban, empties)
        if state is None:
            return
        empties, i, m = state
        if i < 0:
            result.count += 1
            if result.solution is None:
                result.solution = cells
            return
        empties.remove(i)
        digits = _DIGITS[m]
        if rng is not None:
            digits = [digits[k] for k in rng.permutation(len(digits))]
        for d in digits:
            result.guesses += 1
            child_cells, child_used = list(cells), list(used)
            bit = 1 << (d - 1)
            child_cells[i] = d
            child_used[_ROW[i]] |= bit
            child_used[_COL[i]] |= bit
            child_used[_BOX[i]] |= bit
            recurse(child_cells, child_used, empties)
            if result.count >= limit:
                return

    cells, used = start
    recurse(cells, used, [i for i in range(81) if not cells[i]])
    return result


def count_solutions(cells, limit: int = 2) -> int:
    """Number of solutions of a puzzle, counted up to ``limit``.

    Args:
        cells: 81 digits (any int sequence or array), 0 = blank, row-major.
    Returns:
        0 if the clues repeat a digit in a unit or there is no solution, else min(#solutions, limit).
    """
    return search(cells, limit).count


def is_consistent(cells) -> bool:
    """True when no digit repeats in a row, column or box (blanks ignored)."""
    return _start(cells) is not None


def rate(cells) -> int:
    """Difficulty of a puzzle: the guesses the solver makes before its first solution.

    Exactly: the number of digits placed at branch cells (the first blank cell with the fewest candidates
    after naked and hidden singles have run to a fixpoint; digits tried in increasing order) until the
    first solution is found, the right digits included. So 0 means naked and hidden singles alone solve
    the puzzle, and a puzzle whose every branch guessed right on the first try rates its number of
    branch cells. The 0 / > 0 split is the same for every symmetric variant of a puzzle (relabelled,
    shuffled, transposed); the value above 0 depends on the labelling and the cell order. In the spirit
    of Sudoku-Extreme's backtrack count (HRM, arXiv 2506.21734), which keeps puzzles that need search.

    Args:
        cells: 81 digits (any int sequence or array), 0 = blank, row-major; meant for a unique puzzle.
    Returns:
        the guess count, >= 0.
    Raises:
        ValueError: the puzzle has no solution (or its clues repeat a digit).
    """
    result = search(cells, 1)
    if not result.count:
        raise ValueError("cannot rate a Sudoku without a solution")
    return result.guesses
