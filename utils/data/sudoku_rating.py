"""The Sudoku solver: constraint propagation plus search, for counting solutions, filling grids and rating.

Grids are 81 digits in row-major order, 0 = blank. One solver serves every use: uniqueness checks and
random full grids in the builder (utils/data/sudoku.py), :func:`rate`, the difficulty rating, and the expert
generator's local search (utils/data/sudoku_expert.py).

Propagation applies two rules until neither places a digit: a *naked single* (a blank cell with one
candidate gets it) and a *hidden single* (a digit with one possible cell in a row, column or box goes
there). When the grid is neither solved nor contradicted, the search branches on the first blank cell
with the fewest candidates and tries its digits in increasing order (or in a random order when filling
a grid). Candidates are 9-bit Python ints (bit d-1 = digit d), one mask per row, column and box of the
digits already placed; a branch copies those 81 + 27 ints.

:func:`search` runs one search in plain Python. :func:`run_jobs` (and :func:`search_many`, :func:`rate_many`) run
the same search for hundreds of puzzles side by side with whole-array numpy operations, about ten times faster in
bulk; it reaches the same propagation fixpoints, branches on the same cells and tries the same digits, so every
count, guess count and solution is :func:`search`'s (tests/test_sudoku_rating.py checks both against each other).

The rating follows Sudoku-Extreme (Hugging Face ``sapientinc/sudoku-extreme``; HRM, Wang et al. 2025,
arXiv 2506.21734, Sec. 3), which rates each puzzle by the backtracks a solver (tdoku) needs and keeps the
ones that need search. Ours counts the guesses of the solver above; a Sudoku-Extreme CSV's ``rating`` column
comes from another solver with other rules, so the two scales agree only in spirit.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Generator, Iterable, Sequence

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
        last: the last solution found (the ``limit``-th when there are that many), None when there is none.
    """

    count: int
    solution: list[int] | None
    guesses: int
    last: list[int] | None = None


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
    -1 when they meet a contradiction (or the clues repeat a digit)."""
    start = _start(np.asarray(cells).reshape(81).tolist())
    state = None if start is None else _propagate(*start, _NO_BAN, [i for i in range(81) if not start[0][i]])
    return -1 if state is None else len(state[0])


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


# ----------------------------------------------------------------------------------------
# Many puzzles at once: the same search, vectorized over lanes


_UNIT_TABLE = np.array(_UNIT_CELLS, np.intp)                  # [27, 9] cells of each unit
_CELL_UNIT_TABLE = np.array([_ROW, _COL, _BOX], np.intp)      # [3, 81] units of each cell
_POPCOUNT_TABLE = np.array(_POPCOUNT, np.int8)
_NO_CANDIDATE = 10                                            # above any candidate count: never the branch cell


class _Singles:
    """Naked and hidden singles applied a round at a time to candidate masks int16 [81, L] of L lanes (lanes last,
    so each step works on contiguous rows). Work arrays are allocated once: fresh arrays per step cost more than
    the arithmetic at these sizes."""

    def __init__(self, lanes: int):
        shape = (81, lanes)
        self.count = np.empty(shape, np.int8)
        self.single = np.empty(shape, bool)
        self.masks = np.empty(shape, np.int16)
        self.spread = np.empty(shape, np.int16)
        self.part = np.empty(shape, np.int16)
        self.by_unit = np.empty((9, 27, lanes), np.int16)
        self.once = np.empty((27, lanes), np.int16)
        self.twice = np.empty((27, lanes), np.int16)
        self.both = np.empty((27, lanes), np.int16)

    def _once_twice(self, masks: np.ndarray) -> None:
        """Per unit, the digits in at least one (``once``) and at least two (``twice``) of its cells' masks."""
        np.take(masks, _UNIT_TABLE.T, axis=0, out=self.by_unit)  # [9, 27, L]: the k-th cell of every unit
        once, twice, both = self.once, self.twice, self.both
        once[:] = self.by_unit[0]
        twice[:] = 0
        for x in self.by_unit[1:]:
            np.bitwise_and(once, x, out=both)
            np.bitwise_or(twice, both, out=twice)
            np.bitwise_or(once, x, out=once)

    def _spread(self, per_unit: np.ndarray) -> np.ndarray:
        """int16 [27, L] per unit -> ``self.spread`` int16 [81, L]: the OR over each cell's row, column and box."""
        np.take(per_unit, _CELL_UNIT_TABLE[0], axis=0, out=self.spread)
        for units in _CELL_UNIT_TABLE[1:]:
            np.take(per_unit, units, axis=0, out=self.part)
            np.bitwise_or(self.spread, self.part, out=self.spread)
        return self.spread

    def round(self, cand: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One round from ``cand`` into ``new`` (both int16 [81, L]; a single-bit mask is a placed digit): each
        placed digit leaves its peers' masks, then each digit with one possible cell in a unit is placed there.

        Returns bool [L] twice: the lanes found contradicted (a digit placed twice in a unit, a cell without a
        candidate, a unit digit without a cell, a cell that two hidden singles claim) and the lanes whose
        ``cand`` had every cell placed.
        """
        np.take(_POPCOUNT_TABLE, cand, out=self.count)
        np.equal(self.count, 1, out=self.single)
        solved = self.single.all(0)
        np.multiply(cand, self.single, out=self.masks)  # the placed digits
        self._once_twice(self.masks)
        bad = self.twice.any(0)
        elim = self._spread(self.once)
        np.logical_not(self.single, out=self.single)
        np.multiply(elim, self.single, out=elim)  # placed cells keep their digit
        np.invert(elim, out=elim)
        np.bitwise_and(cand, elim, out=new)
        self._once_twice(new)
        bad |= (self.once != _FULL).any(0) | (new == 0).any(0)
        np.invert(self.twice, out=self.twice)
        np.bitwise_and(self.once, self.twice, out=self.once)  # digits with exactly one cell in the unit
        hidden = self._spread(self.once)
        np.bitwise_and(hidden, new, out=hidden)
        np.take(_POPCOUNT_TABLE, hidden, out=self.count)
        bad |= (self.count > 1).any(0)
        np.copyto(new, hidden, where=self.count == 1)
        return bad, solved


@dataclass(frozen=True)
class Query:
    """One search that a job of :func:`run_jobs` asks for; the arguments of :func:`search` (without ``rng``).

    Attributes:
        cells: 81 digits, 0 = blank (read when the search starts).
        limit: stop after this many solutions.
        exclude: (cell, digit): only solutions in which that cell holds another digit.
    """

    cells: Sequence[int]
    limit: int = 1
    exclude: tuple[int, int] | None = None


_START_MASK = np.array([_FULL] + [1 << d for d in range(9)], np.int16)  # digit (0 = blank) -> candidate mask
_DIGIT_OF_MASK = np.array([m.bit_length() for m in range(512)], np.int64)  # a placed digit's mask -> the digit


class _Task:
    """A running job of :func:`run_jobs`: its generator, whom it answers to, and the answers it waits for."""

    def __init__(self, job: Generator, parent: "_Task | None", slot: int):
        self.job, self.parent, self.slot = job, parent, slot
        self.answers: list = []
        self.waiting = 0
        self.many = False
        self.value = None


def run_jobs(jobs: Iterable[Generator], lanes: int = 256) -> list:
    """Run jobs that ask for searches, many searches side by side; returns the jobs' return values.

    A job is a generator. It yields a :class:`Query` and is sent back its :class:`SearchResult` (count, guesses,
    first and last solution as lists of 81 digits), as if it had called :func:`search`; or it yields a list of
    queries and sub-jobs (generators of the same kind) and is sent back the list of their results and return
    values once all are done. Every search gets exactly :func:`search`'s count, guesses and solutions, so a job's
    course does not depend on how the searches were scheduled.

    Up to ``lanes`` searches run at once, by whole-array operations: a lane holds one search's candidate masks
    and its own stack of branch points, and takes the next waiting query when its search ends. Naked and hidden
    singles are applied a round at a time to all lanes; the singles reach the same fixpoint in any order (each
    rule's deduction stays valid as digits are added), so the branch cells, the digits tried and hence the
    guesses are :func:`search`'s. With hundreds of lanes busy this is about ten times faster than :func:`search`
    one search at a time; with a handful it is slower.

    Args:
        jobs: the generators, not yet started.
        lanes: searches at once.
    Returns:
        each job's return value (``StopIteration.value``), in the order of ``jobs``.
    """
    tasks = [_Task(job, None, k) for k, job in enumerate(jobs)]
    queue: collections.deque = collections.deque()  # (task, slot, query) waiting for a lane

    def resume(task: _Task, reply) -> None:
        """Run ``task`` until it waits for searches or sub-jobs, or ends (then answer its parent)."""
        while True:
            try:
                asked = task.job.send(reply)
            except StopIteration as end:
                task.value = end.value
                if task.parent is not None:
                    answer(task.parent, task.slot, end.value)
                return
            task.many = isinstance(asked, list)
            items = asked if task.many else [asked]
            if not items:
                reply = []
                continue
            task.answers, task.waiting = [None] * len(items), len(items)
            for slot, item in enumerate(items):
                if isinstance(item, Query):
                    queue.append((task, slot, item))
                else:
                    resume(_Task(item, task, slot), None)
            return

    def answer(task: _Task, slot: int, value) -> None:
        task.answers[slot] = value
        task.waiting -= 1
        if not task.waiting:
            resume(task, task.answers if task.many else task.answers[0])

    for task in tasks:
        resume(task, None)
    lanes = max(1, lanes)
    cand = np.zeros((81, lanes), np.int16)        # lanes last: each round works on contiguous rows
    new = np.zeros_like(cand)
    singles = _Singles(lanes)
    stack = np.zeros((lanes, 82, 81), np.int16)   # a branch point per decided cell at most
    stack_cell = np.zeros((lanes, 82), np.intp)
    stack_rest = np.zeros((lanes, 82), np.int16)
    depth = np.zeros(lanes, np.intp)
    guesses = np.zeros(lanes, np.int64)
    count = np.zeros(lanes, np.int64)
    limit = np.zeros(lanes, np.int64)
    busy = np.zeros(lanes, bool)
    asker: list = [None] * lanes                    # (task, slot) of each lane's query
    first: list[list[int] | None] = [None] * lanes  # each lane's first and last solution
    last: list[list[int] | None] = [None] * lanes

    def load(lane: int) -> None:
        """Start the next waiting query in ``lane`` (or leave it idle)."""
        busy[lane] = bool(queue)
        if not queue:
            return
        task, slot, query = queue.popleft()
        cells = np.asarray(query.cells).reshape(81)
        masks = _START_MASK[cells]
        if query.exclude is not None and not cells[query.exclude[0]]:
            masks[query.exclude[0]] &= ~(1 << (query.exclude[1] - 1))
        cand[:, lane] = masks
        asker[lane], limit[lane], first[lane], last[lane] = (task, slot), query.limit, None, None
        depth[lane] = guesses[lane] = count[lane] = 0

    def solution(lane: int) -> list[int]:
        return _DIGIT_OF_MASK[cand[:, lane]].tolist()

    for lane in range(lanes):
        load(lane)
    while busy.any():
        bad, solved = singles.round(cand, new)
        still = busy & ~bad & (new == cand).all(0)  # a fixpoint: solved, or branch
        cand, new = new, cand
        solved &= still
        branch = np.flatnonzero(still & ~solved)
        found = np.flatnonzero(solved)
        count[found] += 1
        for lane in found.tolist():
            last[lane] = solution(lane)
            if count[lane] == 1:
                first[lane] = last[lane]
        done = found[count[found] >= limit[found]]
        back = np.concatenate([np.flatnonzero(busy & bad), found[count[found] < limit[found]]])
        # Branch on the first cell with the fewest candidates, its lowest digit first.
        if len(branch):
            c = cand[:, branch]
            pc = _POPCOUNT_TABLE[c]
            cell = np.where(pc > 1, pc, _NO_CANDIDATE).argmin(0)
            m = c[cell, np.arange(len(branch))]
            low = m & -m
            d = depth[branch]
            stack[branch, d] = c.T
            stack_cell[branch, d] = cell
            stack_rest[branch, d] = m & ~low
            depth[branch] += 1
            cand[cell, branch] = low
            guesses[branch] += 1
        # Backtrack to the newest branch point's next digit; a lane with none left is done.
        if len(back):
            exhausted = back[depth[back] == 0]
            back = back[depth[back] > 0]
            t = depth[back] - 1
            rest = stack_rest[back, t]
            low = rest & -rest
            cand[:, back] = stack[back, t].T
            cand[stack_cell[back, t], back] = low
            stack_rest[back, t] = rest & ~low
            depth[back] -= (rest == low)  # that was its last digit: the branch point is used up
            guesses[back] += 1
            done = np.concatenate([done, exhausted])
        for lane in done.tolist():
            task, slot = asker[lane]
            answer(task, slot, SearchResult(int(count[lane]), first[lane], int(guesses[lane]), last[lane]))
        for lane in done.tolist():  # after every answer: the jobs answered may have queued more
            load(lane)
        if not busy.all():
            for lane in np.flatnonzero(~busy).tolist():
                if not queue:
                    break
                load(lane)
    return [task.value for task in tasks]


def _ask(query: Query) -> Generator[Query, SearchResult, SearchResult]:
    return (yield query)


def search_many(queries: Iterable[Query], lanes: int = 256) -> list[SearchResult]:
    """:func:`search` for each query, many side by side (:func:`run_jobs`): the same results, faster in bulk."""
    return run_jobs((_ask(q) for q in queries), lanes)


def rate_many(puzzles, lanes: int = 256) -> np.ndarray:
    """:func:`rate` of each puzzle, searched side by side (:func:`search_many`).

    Args:
        puzzles: int [N, 81] digits, 0 = blank.
    Returns:
        int64 [N] guess counts.
    Raises:
        ValueError: a puzzle has no solution (or its clues repeat a digit); the message gives its row.
    """
    results = search_many((Query(p) for p in np.asarray(puzzles).reshape(-1, 81)), lanes)
    unsolved = [k for k, r in enumerate(results) if not r.count]
    if unsolved:
        raise ValueError(f"cannot rate a Sudoku without a solution (row {unsolved[0]})")
    return np.array([r.guesses for r in results], np.int64)
