"""The Sudoku solver: constraint propagation plus search, for counting solutions, filling grids and rating.

Grids are 81 digits in row-major order, 0 = blank. One solver serves every use: uniqueness checks and
random full grids in the builder (utils/data/sudoku/build.py), :func:`rate`, the difficulty rating, and the expert
generator's local search (utils/data/sudoku/expert.py).

Propagation applies two rules until neither places a digit: a *naked single* (a blank cell with one
candidate gets it) and a *hidden single* (a digit with one possible cell in a row, column or box goes
there). When the grid is neither solved nor contradicted, the search branches on the first blank cell
with the fewest candidates and tries its digits in increasing order (or in a random order when filling
a grid). Candidates are 9-bit Python ints (bit d-1 = digit d), one mask per row, column and box of the
digits already placed; a branch copies those 81 + 27 ints.

:func:`search` runs the compiled form of that search (utils/data/sudoku/jit.py, numba); :func:`_search_python`
states it as a Python recursion, runs the random fills (their digit order comes from numpy's generator), and is
what the compiled search is checked against (tests/test_sudoku_rating.py: every count, guess count and solution).
:func:`run_jobs` lets a job written as a generator ask for searches (the expert generator's chains).

The rating follows Sudoku-Extreme (Hugging Face ``sapientinc/sudoku-extreme``; HRM, Wang et al. 2025,
arXiv 2506.21734, Sec. 3), which rates each puzzle by the backtracks a solver (tdoku) needs and keeps the
ones that need search. Two scales (:data:`RATING_SCALES`): ``"singles"``, the guesses of the solver above, and
``"tdoku"``, the guesses of tdoku's own search (utils/data/sudoku/tdoku.py: locked candidates and the band
configurations make its propagation much stronger), the scale of a Sudoku-Extreme CSV's ``rating`` column.

Every public entry point that takes cells checks them once (:func:`_grid`, :func:`_grids`: 81 whole numbers 0..9,
0 = blank) and raises ValueError naming the first bad cell; the searches behind it trust what they are given, so a
digit of 10 or -1 cannot reach the bitmasks, where it would be a tenth digit or a negative shift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Iterable, Sequence

import numpy as np

from utils.data.sudoku import jit as sudoku_jit
from utils.data.sudoku import tdoku as sudoku_tdoku

# What each rating scale counts, as dataset.json records it.
RATING_SCALES = {"singles": "solver guesses (utils/data/sudoku/rating.rate)",
                 "tdoku": "tdoku guesses (utils/data/sudoku/rating.rate, scale tdoku: Sudoku-Extreme's scale)"}

_FULL = sudoku_jit.FULL
# The compiled search's tables as Python lists (indexing a list is faster than an array in this loop).
_ROW, _COL, _BOX = sudoku_jit.ROW.tolist(), sudoku_jit.COL.tolist(), sudoku_jit.BOX.tolist()
_UNIT_CELLS = sudoku_jit.UNIT_CELLS.tolist()
_POPCOUNT = sudoku_jit.POPCOUNT.tolist()
_DIGITS = [[d for d in range(1, 10) if m >> (d - 1) & 1] for m in range(512)]
_NO_BAN = [0] * 81
_INT64, _MAX = np.dtype(np.int64), np.maximum.reduce  # looked up once: the cell check runs before every search


@dataclass
class SearchResult:
    """What :func:`search` found.

    Attributes:
        count: solutions found, at most the search's ``limit``.
        solution: the first solution found (81 digits 1..9), None when there is none.
        guesses: digits tried at branch cells during the whole search (0 = propagation alone decided it).
        last: the last solution found (the ``limit``-th when there are that many), None when there is none.
    """

    count: int
    solution: list[int] | None
    guesses: int
    last: list[int] | None = None


def _grids(puzzles) -> np.ndarray:
    """``puzzles`` (int [N, 81], or any shape of whole multiples of 81 cells) as int64 [N, 81], checked.

    Raises:
        ValueError: not whole multiples of 81 cells, or a cell that is not a whole number 0..9 (0 = blank); the
            message names the first bad puzzle and cell (0..80, row-major) and its value.
    """
    given = np.asarray(puzzles)
    if given.size % 81:
        raise ValueError(f"puzzles must be 81 cells each (int [N, 81], 0 = blank), got shape {given.shape}")
    return _checked(given.reshape(-1, 81), many=True)


def _grid(cells) -> np.ndarray:
    """``cells`` (81 digits in any shape: a list, a [81] or [9, 9] array) as int64 [81], checked.

    Raises:
        ValueError: not 81 cells, or a cell that is not a whole number 0..9 (0 = blank); the message names the
            first bad cell (0..80, row-major) and its value.
    """
    grid = np.asarray(cells)
    if grid.shape != (81,):
        if grid.size != 81:
            raise ValueError(f"a Sudoku grid is 81 cells (0 = blank), got {grid.size} (shape {grid.shape})")
        grid = grid.reshape(81)
    # The common case (a list of ints, an int64 array) in one reduction, seen as unsigned so that a negative cell is
    # huge: the dataset builders search thousands of times a second, and the check adds about 2 us to a 20 us search.
    if grid.dtype == _INT64 and _MAX(grid.view(np.uint64)) <= 9:
        return grid
    return _checked(grid.reshape(1, 81), many=False)[0]


def _checked(given: np.ndarray, many: bool) -> np.ndarray:
    """``given`` [N, 81] as int64, when every cell is a whole number 0..9; see :func:`_grids`."""
    if given.dtype.kind in "iu":
        grids = given.astype(np.int64, copy=False)
        bad = None if _MAX(grids.view(np.uint64), axis=None, initial=0) <= 9 else (grids < 0) | (grids > 9)
    else:  # bool, float, str, object: rare, so the slow way
        try:
            grids = given.astype(np.int64)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"Sudoku cells are whole numbers 0..9 (0 = blank), got {given.dtype} values such as "
                             f"{given.flat[0].item()!r}") from None
        with np.errstate(invalid="ignore"):
            bad = (grids != given) | (grids < 0) | (grids > 9)
        bad = bad if bad.any() else None
    if bad is not None:
        puzzle, cell = divmod(int(np.flatnonzero(bad)[0]), 81)
        where = f"puzzles[{puzzle}], cell {cell}" if many else f"cell {cell}"
        raise ValueError(f"{where} (row {cell // 9 + 1}, column {cell % 9 + 1}) is {given[puzzle, cell].item()!r}: "
                         "a Sudoku cell holds 0..9 (0 = blank)")
    return grids


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


def singles_left(cells) -> int:
    """Blank cells left once naked and hidden singles have run to a fixpoint on a puzzle (0: singles solve it);
    -1 when they meet a contradiction (or the clues repeat a digit).

    Raises:
        ValueError: not 81 cells, or a cell outside 0..9 (:func:`_grid`).
    """
    return sudoku_jit.singles_left(_grid(cells))


def _check_scale(scale: str) -> str:
    """``scale``, when it is one of :data:`RATING_SCALES`; else ValueError."""
    if scale not in RATING_SCALES:
        raise ValueError(f"unknown rating scale {scale!r}; choose one of {', '.join(RATING_SCALES)}")
    return scale


def left_open(cells, scale: str = "singles") -> int:
    """What a scale's propagation leaves open on a puzzle before any guess: :func:`singles_left` for "singles",
    tdoku's band configurations left beyond a solved grid's 54 for "tdoku"; 0 when propagation solves it, -1 on a
    contradiction (or clues that repeat a digit). Finer than the guesses among easy puzzles.

    Raises:
        ValueError: an unknown ``scale``; not 81 cells, or a cell outside 0..9 (:func:`_grid`).
    """
    grid = _grid(cells)
    if _check_scale(scale) == "singles":
        return sudoku_jit.singles_left(grid)
    return sudoku_tdoku.open_configurations(grid) if _consistent(grid) else -1


def search(cells, limit: int = 1, exclude: tuple[int, int] | None = None,
           rng: np.random.Generator | None = None, scale: str = "singles") -> SearchResult:
    """Find up to ``limit`` solutions of a grid by propagation and search (see the module docstring).

    Args:
        cells: 81 digits (any int sequence or array), 0 = blank, row-major.
        limit: stop after this many solutions (1: solve; 2: check uniqueness).
        exclude: (cell, digit): only solutions in which that cell holds another digit.
        rng: try a branch cell's digits in a random order drawn from it (increasing order when None).
        scale: whose search, so whose guesses: "singles" (the one above) or "tdoku" (utils/data/sudoku/tdoku.py,
            which takes neither ``exclude`` nor ``rng``). Both find the same solutions, maybe in another order.
    Returns:
        A :class:`SearchResult`; count 0 when the clues repeat a digit in a unit or have no solution.
    Raises:
        ValueError: an unknown ``scale``, or ``exclude``/``rng`` with scale "tdoku"; not 81 cells, or a cell
            outside 0..9 (:func:`_grid`).
    """
    return _search(_grid(cells), limit, exclude, rng, scale)


def _search(grid: np.ndarray, limit: int, exclude: tuple[int, int] | None, rng: np.random.Generator | None,
            scale: str) -> SearchResult:
    """:func:`search` of a checked ``grid`` (int64 [81], :func:`_grid`)."""
    if scale != "singles":
        return _search_tdoku(grid, limit, exclude, rng, scale)
    if rng is None:  # the compiled search (utils/data/sudoku/jit.py): the same results as the recursion below
        ban = np.zeros(81, np.int64)
        if exclude is not None:
            ban[exclude[0]] = 1 << (exclude[1] - 1)
        count, guesses, first, last = sudoku_jit.search(grid, limit, ban)
        return SearchResult(count, first.tolist() if count else None, guesses, last.tolist() if count else None)
    return _search_python(grid, limit, exclude, rng)


def _search_tdoku(grid: np.ndarray, limit: int, exclude, rng, scale: str) -> SearchResult:
    """:func:`search` of a checked ``grid`` with tdoku's search (utils/data/sudoku/tdoku.py), which assumes clues
    that do not clash."""
    _check_scale(scale)
    if exclude is not None or rng is not None:
        raise ValueError("tdoku's search takes neither exclude nor rng")
    if not _consistent(grid):
        return SearchResult(0, None, 0)
    count, guesses, first, last = sudoku_tdoku.search(grid, limit)
    return SearchResult(count, first.tolist() if count else None, guesses, last.tolist() if count else None)


def _search_python(cells, limit: int = 1, exclude: tuple[int, int] | None = None,
                   rng: np.random.Generator | None = None) -> SearchResult:
    """:func:`search` as a Python recursion: the statement of the solver that utils/data/sudoku/jit.py compiles,
    and the only one that can draw a branch's digit order from numpy's ``rng``."""
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
            result.last = cells
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
    Raises:
        ValueError: not 81 cells, or a cell outside 0..9 (:func:`_grid`).
    """
    return search(cells, limit).count


def is_consistent(cells) -> bool:
    """True when no digit repeats in a row, column or box (blanks ignored).

    Raises:
        ValueError: not 81 cells, or a cell outside 0..9 (:func:`_grid`).
    """
    return _consistent(_grid(cells))


def _consistent(grid: np.ndarray) -> bool:
    """:func:`is_consistent` of a checked ``grid`` (int64 [81])."""
    return _start(grid.tolist()) is not None


def rate(cells, scale: str = "singles") -> int:
    """Difficulty of a puzzle: the guesses the solver makes before its first solution.

    Exactly: the number of digits placed at branch cells (the first blank cell with the fewest candidates
    after naked and hidden singles have run to a fixpoint; digits tried in increasing order) until the
    first solution is found, the right digits included. So 0 means naked and hidden singles alone solve
    the puzzle, and a puzzle whose every branch guessed right on the first try rates its number of
    branch cells. The 0 / > 0 split is the same for every symmetric variant of a puzzle (relabelled,
    shuffled, transposed); the value above 0 depends on the labelling and the cell order. In the spirit
    of Sudoku-Extreme's backtrack count (HRM, arXiv 2506.21734), which keeps puzzles that need search.

    With ``scale="tdoku"``, the branch points of tdoku's search before its first solution
    (utils/data/sudoku/tdoku.py), the number tdoku's ``SolveSudoku(puzzle, 1, ...)`` reports: Sudoku-Extreme's scale.

    Args:
        cells: 81 digits (any int sequence or array), 0 = blank, row-major; meant for a unique puzzle.
        scale: "singles" or "tdoku" (:data:`RATING_SCALES`).
    Returns:
        the guess count, >= 0.
    Raises:
        ValueError: the puzzle has no solution (or its clues repeat a digit); an unknown ``scale``; not 81 cells,
            or a cell outside 0..9 (:func:`_grid`).
    """
    result = search(cells, 1, scale=scale)
    if not result.count:
        raise ValueError("cannot rate a Sudoku without a solution")
    return result.guesses


# ----------------------------------------------------------------------------------------
# Jobs that ask for searches (the expert generator's chains)


@dataclass(frozen=True)
class Query:
    """One search that a job of :func:`run_jobs` asks for; the arguments of :func:`search` (without ``rng``).

    Attributes:
        cells: 81 digits, 0 = blank (read when the search starts).
        limit: stop after this many solutions.
        exclude: (cell, digit): only solutions in which that cell holds another digit.
        scale: whose search counts the guesses (:data:`RATING_SCALES`).
    """

    cells: Sequence[int]
    limit: int = 1
    exclude: tuple[int, int] | None = None
    scale: str = "singles"


def run_jobs(jobs: Iterable[Generator]) -> list:
    """Run jobs that ask for searches; returns the jobs' return values, in the order of ``jobs``.

    A job is a generator. It yields a :class:`Query` and is sent back :func:`search`'s :class:`SearchResult`
    (count, guesses, first and last solution as lists of 81 digits); or it yields a list of queries and sub-jobs
    (generators of the same kind) and is sent back the list of their results and return values. This lets the
    expert generator write a chain's steps as plain code (utils/data/sudoku/expert.py).

    Raises:
        ValueError: a query's cells are not 81 whole numbers 0..9 (:func:`_grid`), or as :func:`search`.
    """
    return [_drive(job) for job in jobs]


def _drive(job: Generator):
    reply = None
    while True:
        try:
            asked = job.send(reply)
        except StopIteration as end:
            return end.value
        if isinstance(asked, list):
            reply = [_answer(item) if isinstance(item, Query) else _drive(item) for item in asked]
        else:
            reply = _answer(asked)


def _answer(query: Query) -> SearchResult:
    return search(query.cells, query.limit, query.exclude, scale=query.scale)


def search_many(queries: Iterable[Query]) -> list[SearchResult]:
    """:func:`search` for each query."""
    return [_answer(q) for q in queries]


def rate_many(puzzles, scale: str = "singles") -> np.ndarray:
    """:func:`rate` of each puzzle.

    Args:
        puzzles: int [N, 81] digits, 0 = blank.
        scale: "singles" or "tdoku" (:data:`RATING_SCALES`).
    Returns:
        int64 [N] guess counts.
    Raises:
        ValueError: a puzzle has no solution (or its clues repeat a digit); the message gives its row. Puzzles that
            are not 81 cells each, or a cell outside 0..9 (:func:`_grids`), checked for all rows at once first.
    """
    results = [_search(grid, 1, None, None, scale) for grid in _grids(puzzles)]
    unsolved = [k for k, r in enumerate(results) if not r.count]
    if unsolved:
        raise ValueError(f"cannot rate a Sudoku without a solution (row {unsolved[0]})")
    return np.array([r.guesses for r in results], np.int64)
