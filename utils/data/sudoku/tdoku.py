"""tdoku's Sudoku search, restated and compiled by numba: its guess count is Sudoku-Extreme's difficulty scale.

Sudoku-Extreme (HRM, Wang et al. 2025, arXiv 2506.21734) rates puzzles by the guesses of tdoku's solver
(Tom Dillon's ``t-dillon/tdoku``, ``src/solver_dpll_triad_simd.cc``, ``num_guesses_``; BSD-2-Clause). Its
propagation is much stronger than the naked and hidden singles of utils/data/sudoku/rating.py, so a puzzle that
rates 50 on our scale may need 2 guesses there. This module states tdoku's rules over plain int arrays (no SIMD,
no code of tdoku's) and keeps its order of work, which decides the count: tests/test_sudoku_tdoku.py checks every
count against numbers printed by the compiled tdoku and against a plain-Python model with lists.

**The model.** Each box is a 4x4 matrix of 9-bit candidate sets: its 3x3 cells, plus a *negative triad* per
mini-row (column 3: the digits that may be absent from that mini-row) and per mini-column (row 3); lane (3, 3) is a
full set that never changes. For every digit, each row and each column of the matrix holds exactly one true
literal (a digit is in exactly one cell of a mini-row, or absent from it). A cell needs >= 1 candidate and a
negative triad >= 6 (a mini-row holds 3 digits). Each band (3 rows of boxes, or 3 columns) keeps, per digit, which
of the 6 *configurations* may hold: the ways to place the digit in one mini-row (mini-column) of each of its
three boxes (``CONFIG_ELEM``). A band's *positive triads* are the digits each box's mini-row may hold.

**Propagation.** :func:`_restrict_box` removes candidates from a box, then repeats until nothing new: fail on a
set below its minimum; assert every set at its minimum (a naked single, or the 6 digits absent from a mini-row)
and every digit that occurs once in a row or column of the matrix (hidden singles and locked candidates); remove
an asserted cell's digit from the rest of the box and the negative triads of its line; tell its two bands which
configurations died. Then the horizontal band and the vertical band take those eliminations (in an order that
depends on where the message came from). :func:`_eliminate_band` removes configurations, asserts the digits of a
positive triad with exactly 3 candidates (once per call, as tdoku does), and restricts its three boxes to what the
configurations allow, the box the message came from last.

**Search.** Branch on the band (rows first, then columns) with the fewest configurations left over all digits
(ties: the first), on its lowest digit with exactly 2 configurations left, else exactly 3, else the lowest with
more; try that digit's lowest-numbered configuration, then rule it out. **Each branch point is one guess**,
whichever alternative holds. :func:`search` returns the solutions found up to ``limit`` and the guesses made; the
rating of utils/data/sudoku/rating.py's ``rate(..., scale="tdoku")`` is the guesses with ``limit=1``, the number
tdoku's ``SolveSudoku(puzzle, 1, ...)`` reports.

Compiled on first use (about 15 s) and cached next to this file where that folder is writable.
"""

from __future__ import annotations

import numba
import numpy as np

FULL = 0x1FF  # digits 1..9 in bits 0..8
# CONFIG_ELEM[c, p]: the mini-row (horizontal band) or mini-column (vertical band) in which configuration c puts
# a digit in the band's p-th box. Each row is a permutation; together they are all six.
CONFIG_ELEM = np.array([[0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0], [0, 2, 1], [1, 0, 2]], np.int64)
# The minimum number of candidates of each of a box's 16 sets: 1 for a cell, 6 for a negative triad, 0 for (3, 3).
MINIMUM = np.array([1, 1, 1, 6, 1, 1, 1, 6, 1, 1, 1, 6, 6, 6, 6, 0], np.int64)
_LINES = np.array([[r * 4 + c for c in range(4)] for r in range(4)] + [[r * 4 + c for r in range(4)] for c in range(4)],
                  np.int64)
_POPCOUNT = np.array([bin(m).count("1") for m in range(512)], np.int64)

# A state is one int64 array: 9 boxes x 16 sets, then 6 bands (rows 0-2, columns 0-2) x 6 configuration masks,
# then the same for the configurations each band has been told to remove (kept, so a repeat changes nothing).
_CONFIGS = 9 * 16
_ELIMS = _CONFIGS + 36
STATE_SIZE = _ELIMS + 36
# Pending box and band updates. Only an update that removes something starts others (a band 3 boxes, a box 2
# bands), so the stack holds at most 2 per removable bit on the current path (9 x 15 x 9 + 36 x 9 bits) plus 3.
_STACK = 2 * (9 * 15 * 9 + 36 * 9) + 3

# Branch points on the current path: each rules out at least one of the 6 x 6 x 9 configurations beyond the
# 54 that remain at the end.
_DEPTH = 6 * 6 * 9 - 54 + 1

_BOX, _BAND = 0, 1


@numba.njit(cache=True)
def _new_state() -> np.ndarray:
    state = np.zeros(STATE_SIZE, np.int64)
    state[:_ELIMS] = FULL
    return state


@numba.njit(cache=True)
def _popcount(m):
    return _POPCOUNT[m & FULL]


@numba.njit(cache=True)
def _tell_bands(state, box, asserted, pos_rows, pos_cols):
    """Record in the box's two bands the configurations its assertions kill: a digit absent from mini-row e (an
    asserted negative triad) kills the configurations that put it there; a digit placed in mini-row e kills those
    that put it elsewhere."""
    bi, bj = box // 3, box % 3
    for vertical in range(2):
        band = bj + 3 if vertical else bi
        peer = bi if vertical else bj
        for c in range(6):
            e = CONFIG_ELEM[c, peer]
            if vertical:
                absent, here = asserted[12 + e], pos_cols
            else:
                absent, here = asserted[e * 4 + 3], pos_rows
            state[_ELIMS + band * 6 + c] |= absent | here[(e + 1) % 3] | here[(e + 2) % 3]


@numba.njit(cache=True)
def _restrict_box(state, box, allowed, asserted, placed, pos_rows, pos_cols) -> int:
    """Keep only ``allowed`` (int64 [16]) in box ``box`` and run the box's rules to a fixpoint (module docstring).
    Returns -1 on a contradiction, 0 when nothing changed, 1 when the box changed (its bands must then be told).
    ``asserted``, ``placed``, ``pos_rows``, ``pos_cols`` are scratch arrays."""
    base = box * 16
    changed = False
    for k in range(16):
        if state[base + k] & ~allowed[k]:
            changed = True
    if not changed:
        return 0
    elim = np.empty(16, np.int64)
    for k in range(16):
        elim[k] = state[base + k] & ~allowed[k]
    while True:
        for k in range(16):
            state[base + k] &= ~elim[k]
        for k in range(16):
            n = _popcount(state[base + k])
            if n < MINIMUM[k]:
                return -1
            asserted[k] = state[base + k] if n == MINIMUM[k] else 0
        for line in range(8):  # a digit that occurs once in a row or column of the matrix is its true literal
            once, twice = 0, 0
            for j in range(4):
                m = state[base + _LINES[line, j]]
                twice |= once & m
                once |= m
            for j in range(4):
                k = _LINES[line, j]
                asserted[k] |= state[base + k] & ~twice
        every = 0
        for r in range(3):
            pos_rows[r] = 0
            pos_cols[r] = 0
        for r in range(3):
            for c in range(3):
                m = asserted[r * 4 + c]
                placed[r * 4 + c] = m
                every |= m
                pos_rows[r] |= m
                pos_cols[c] |= m
        for r in range(3):
            for c in range(3):
                k = r * 4 + c
                # An asserted cell loses every other digit; the other cells lose every asserted digit.
                elim[k] |= (every | (0xFFFF if placed[k] else 0)) ^ placed[k]
            elim[r * 4 + 3] |= pos_rows[r]
            elim[12 + r] |= pos_cols[r]
        _tell_bands(state, box, asserted, pos_rows, pos_cols)
        more = False
        for k in range(16):
            if elim[k] & state[base + k]:
                more = True
        if not more:
            return 1


@numba.njit(cache=True)
def _triads(state, band, triads):
    """``triads[p, e]``: the digits that box p of ``band`` may hold in its mini-row (-column) e."""
    triads[:, :] = 0
    for c in range(6):
        m = state[_CONFIGS + band * 6 + c]
        for p in range(3):
            triads[p, CONFIG_ELEM[c, p]] |= m


@numba.njit(cache=True)
def _apply_band(state, band, triads) -> bool:
    """Remove the band's pending eliminations and assert its positive triads with exactly 3 candidates (one pass);
    ``triads`` ends as the band's positive triads. False when there was nothing to remove."""
    base, told = _CONFIGS + band * 6, _ELIMS + band * 6
    new = False
    for c in range(6):
        if state[base + c] & state[told + c]:
            new = True
    if not new:
        return False
    for c in range(6):
        state[base + c] &= ~state[told + c]
    _triads(state, band, triads)
    drop = np.zeros(6, np.int64)
    for p in range(3):
        for e in range(3):
            m = triads[p, e]
            if _popcount(m) == 3:  # three slots, three digits: each lives here, so not in the box's other lines
                for c in range(6):
                    if CONFIG_ELEM[c, p] != e:
                        drop[c] |= m
    for c in range(6):
        state[base + c] &= ~drop[c]
    _triads(state, band, triads)
    return True


@numba.njit(cache=True)
def _allowed_by_band(triads_p, vertical, allowed):
    """What a band's positive triads of one box (int64 [3]) allow in that box's 16 sets."""
    allowed[:] = FULL
    for e in range(3):
        other = triads_p[(e + 1) % 3] | triads_p[(e + 2) % 3]  # digits that may be absent from line e
        for j in range(3):
            if vertical:
                allowed[j * 4 + e] = triads_p[e]
            else:
                allowed[e * 4 + j] = triads_p[e]
        if vertical:
            allowed[12 + e] = other
        else:
            allowed[e * 4 + 3] = other


@numba.njit(cache=True)
def _propagate(state, band, from_peer, work) -> bool:
    """Run band ``band``'s pending eliminations and everything they set off, in tdoku's order (its recursion, kept
    as an explicit stack: each step works before it starts the next ones, so the stack visits them in the same
    order). False on a contradiction. ``work`` is a (kinds int64 [S], args int64 [S, 18]) scratch pair."""
    kinds, args = work
    top = 0
    kinds[0], args[0, 0], args[0, 1] = _BAND, band, from_peer
    top = 1
    triads = np.zeros((3, 3), np.int64)
    asserted = np.zeros(16, np.int64)
    placed = np.zeros(16, np.int64)
    pos_rows = np.zeros(3, np.int64)
    pos_cols = np.zeros(3, np.int64)
    while top:
        top -= 1
        if kinds[top] == _BAND:
            band, from_peer = args[top, 0], args[top, 1]
            if not _apply_band(state, band, triads):
                continue
            vertical, index = band // 3, band % 3
            # The boxes in the order (from_peer + 1, from_peer + 2, from_peer), pushed last first.
            for step in range(2, -1, -1):
                p = (from_peer + 1 + step) % 3
                kinds[top] = _BOX
                args[top, 0] = p * 3 + index if vertical else index * 3 + p
                args[top, 1] = vertical
                _allowed_by_band(triads[p], vertical, args[top, 2:18])
                top += 1
        else:
            box, vertical = args[top, 0], args[top, 1]
            changed = _restrict_box(state, box, args[top, 2:18], asserted, placed, pos_rows, pos_cols)
            if changed < 0:
                return False
            if changed:
                row_band, col_band = box // 3, 3 + box % 3
                # Row band first when the message came from a column band, and the other way round.
                first, first_peer = (row_band, box % 3) if vertical else (col_band, box // 3)
                second, second_peer = (col_band, box // 3) if vertical else (row_band, box % 3)
                kinds[top], args[top, 0], args[top, 1] = _BAND, second, second_peer
                kinds[top + 1], args[top + 1, 0], args[top + 1, 1] = _BAND, first, first_peer
                top += 2
    return True


@numba.njit(cache=True)
def _start(cells, work):
    """The state of a puzzle (``cells`` int64 [81], 0 = blank) after tdoku's start: each clue removed from its box
    and its bands told, then the six bands propagated in tdoku's order. Returns (state, False on a contradiction)."""
    state = _new_state()
    for i in range(81):
        d = cells[i]
        if not d:
            continue
        bit = 1 << (d - 1)
        r, c = i // 9, i % 9
        bi, bj, ei, ej = r // 3, c // 3, r % 3, c % 3
        base = (bi * 3 + bj) * 16
        lane = ei * 4 + ej
        for j in range(15):
            if j == lane:
                state[base + j] &= bit | ~FULL
            elif j // 4 < 3 and j % 4 < 3:
                state[base + j] &= ~bit
            elif j // 4 == ei or j % 4 == ej:
                state[base + j] &= ~bit
        for k in range(6):
            if CONFIG_ELEM[k, bj] != ei:
                state[_ELIMS + bi * 6 + k] |= bit
            if CONFIG_ELEM[k, bi] != ej:
                state[_ELIMS + (3 + bj) * 6 + k] |= bit
    for band, peer in ((0, 1), (3, 1), (1, 2), (4, 2), (2, 0), (5, 0)):
        if not _propagate(state, band, peer, work):
            return state, False
    return state, True


@numba.njit(cache=True)
def _choose(state):
    """(band, digit bit) to branch on, band -1 when every band is fixed (solved)."""
    best, best_n = -1, 1 << 30
    for band in range(6):
        n = 0
        for c in range(6):
            n += _popcount(state[_CONFIGS + band * 6 + c])
        if 10 <= n < best_n:  # 9: one configuration per digit, the band is fixed
            best, best_n = band, n
    if best < 0:
        return -1, 0
    two, three, more = 0, 0, 0
    for d in range(9):
        bit = 1 << d
        n = 0
        for c in range(6):
            if state[_CONFIGS + best * 6 + c] & bit:
                n += 1
        if n == 2:
            two |= bit
        elif n == 3:
            three |= bit
        elif n > 3:
            more |= bit
    pick = two if two else (three if three else more)
    return best, pick & -pick


@numba.njit(cache=True)
def _solution(state, out):
    for i in range(81):
        r, c = i // 9, i % 9
        m = state[((r // 3) * 3 + c // 3) * 16 + (r % 3) * 4 + c % 3]
        low = m & -m
        d = 0
        while low:
            low >>= 1
            d += 1
        out[i] = d


@numba.njit(cache=True)
def search(cells, limit):
    """Up to ``limit`` solutions of ``cells`` (int64 [81], 0 = blank; not changed) by tdoku's search (module
    docstring). Returns (count, guesses, first solution int64 [81], last solution int64 [81]); the solutions are
    all 0 when none was found. Meant for puzzles whose clues do not repeat a digit in a unit (check that first)."""
    first, last = np.zeros(81, np.int64), np.zeros(81, np.int64)
    work = (np.empty(_STACK, np.int64), np.empty((_STACK, 18), np.int64))
    state, ok = _start(cells, work)
    if not ok:
        return 0, 0, first, last
    # Branch points waiting for their second alternative: the state before the branch, its band and digit.
    saved = np.empty((_DEPTH, STATE_SIZE), np.int64)
    saved_band = np.empty(_DEPTH, np.int64)
    saved_bit = np.empty(_DEPTH, np.int64)
    depth = count = guesses = 0
    while True:
        band, bit = _choose(state)
        if band < 0:
            count += 1
            if count == 1:
                _solution(state, first)
            _solution(state, last)
            if count >= limit:
                break
            alive = False
        else:
            guesses += 1
            saved[depth] = state
            saved_band[depth] = band
            saved_bit[depth] = bit
            depth += 1
            keep = -1  # the digit's first configuration: rule out the others
            for c in range(6):
                if state[_CONFIGS + band * 6 + c] & bit:
                    if keep < 0:
                        keep = c
                    else:
                        state[_ELIMS + band * 6 + c] |= bit
            alive = _propagate(state, band, 0, work)
        while not alive and depth:  # the newest branch point's second alternative: its first configuration ruled out
            depth -= 1
            state = saved[depth].copy()
            band, bit = saved_band[depth], saved_bit[depth]
            for c in range(6):
                if state[_CONFIGS + band * 6 + c] & bit:
                    state[_ELIMS + band * 6 + c] |= bit
                    break
            alive = _propagate(state, band, 0, work)
        if not alive:
            break
    return count, guesses, first, last


@numba.njit(cache=True)
def open_configurations(cells) -> int:
    """Band configurations that tdoku's start leaves open beyond the 54 of a solved grid (0: propagation alone
    solves ``cells``, int64 [81]); -1 on a contradiction. A finer measure than the guesses among easy puzzles."""
    work = (np.empty(_STACK, np.int64), np.empty((_STACK, 18), np.int64))
    state, ok = _start(cells, work)
    if not ok:
        return -1
    n = 0
    for k in range(36):
        n += _popcount(state[_CONFIGS + k])
    return n - 54
