"""The rating on tdoku's scale (utils/data/sudoku/tdoku.py, utils/data/sudoku/rating.py scale "tdoku"), on cpu:
against numbers printed by the compiled tdoku and against a plain-Python model of the same rules."""

import numpy as np
import pytest

from tests.test_sudoku_dataset import is_valid_solution
from utils.data.sudoku import build as builder
from utils.data.sudoku import rating as solver

# Printed by tdoku itself: t-dillon/tdoku at commit af42618 (src/solver_dpll_triad_simd.cc), built with its own
# CMakeLists.txt (target tdoku_static, -O3 -march=native) and called as SolveSudoku(puzzle, limit, 0, ...):
# (puzzle, solutions and guesses with limit 1, solutions and guesses with limit 2).
TDOKU_BINARY = [
    ("1....7.9..3..2...8..96..5....53..9...1..8...26....4...3......1..4......7..7...3..", 1, 4, 1, 19),  # AI Escargot
    ("8..........36......7..9.2...5...7.......457.....1...3...1....68..85...1..9....4..", 1, 57, 1, 88),  # Inkala 2012
    ("1.......2.9.4...5...6...7...5.9.3.......7.......85..4.7.....6...3...9.8...2.....1", 1, 48, 1, 77),  # Easter M.
    (".......39.....1..5..3.5.8....8.9...6.7...2...1..4.......9.8..5..2....6..4..7.....", 1, 48, 1, 85),  # G. Nugget
    (".......12........3..23..4....18....5.6..7.8.......9.....85.....9...4.5..47...6...", 1, 143, 1, 157),  # Pl. Bl.
    ("12.3....435....1....4........54..2..6...7.........8.9...31..5.......9.7.....6...8", 1, 67, 1, 72),  # Red Dwarf
    ("1..4..8...4..3...9..9..6.5..5.3..........16......7...2..4.1.9..7..8....4.2...4.8.", 1, 30, 1, 31),  # AI Labyr.
    ("..1..4.......6.3.5...9.....8.....7.3.......285...7.6..3...8...6..92......4...1...", 1, 13, 1, 63),  # tarek 052
    ("4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......", 1, 0, 1, 0),  # top95 #1
    ("53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79", 1, 0, 1, 0),  # Wikipedia
    ("............8...23.........78.6....9....3.8...5.2..6......8........4.35.674.5..1.", 1, 13, 2, 13),  # 2+ sol.
    (".......6.7...1..9...3.9..........18..7.85......5...4..43...7.......439..1........", 1, 11, 2, 11),
    ("...........9.73..5.....26..85.......9...3...4.3...6.1..2...4.3.7..6............87", 1, 10, 2, 11),
    ("." * 81, 1, 36, 2, 36),
]


def grid(text):
    return [0 if ch == "." else int(ch) for ch in text]


# ----------------------------------------------------------------------------------------
# A plain model of tdoku's rules: lists of candidate sets, one function per rule, recursion for the order of work.

FULL = 0x1FF
ELEM = [[0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0], [0, 2, 1], [1, 0, 2]]  # configuration -> box of the band -> line
MINIMUM = [1, 1, 1, 6] * 3 + [6, 6, 6, 0]


def bits(m):
    return bin(m).count("1")


class Model:
    """State: ``boxes[b]`` 16 sets (row-major 4x4: cells, a negative triad per mini-row and per mini-column);
    ``configs[k]`` / ``told[k]`` 6 digit masks for bands k = 0-2 (rows of boxes) and 3-5 (columns)."""

    def __init__(self, puzzle):
        self.boxes = [[FULL] * 16 for _ in range(9)]
        self.configs = [[FULL] * 6 for _ in range(6)]
        self.told = [[0] * 6 for _ in range(6)]
        for i, d in enumerate(puzzle):
            if d:
                self.clue(i // 9, i % 9, 1 << (d - 1))
        self.ok = all(self.band(band, peer) for band, peer in ((0, 1), (3, 1), (1, 2), (4, 2), (2, 0), (5, 0)))

    def copy(self):
        other = Model.__new__(Model)
        other.boxes = [list(b) for b in self.boxes]
        other.configs = [list(c) for c in self.configs]
        other.told = [list(t) for t in self.told]
        return other

    def clue(self, r, c, bit):
        box, lane = (r // 3) * 3 + c // 3, (r % 3) * 4 + c % 3
        for j in range(15):
            if j == lane:
                self.boxes[box][j] &= bit
            elif (j // 4 < 3 and j % 4 < 3) or j // 4 == lane // 4 or j % 4 == lane % 4:
                self.boxes[box][j] &= ~bit
        for k in range(6):
            if ELEM[k][c // 3] != r % 3:
                self.told[r // 3][k] |= bit
            if ELEM[k][r // 3] != c % 3:
                self.told[3 + c // 3][k] |= bit

    def box(self, b, allowed, from_vertical):
        cells = self.boxes[b]
        elim = [cells[k] & ~allowed[k] for k in range(16)]
        if not any(elim):
            return True
        while True:
            for k in range(16):
                cells[k] &= ~elim[k]
            if any(bits(cells[k]) < MINIMUM[k] for k in range(16)):
                return False
            sure = [cells[k] if bits(cells[k]) == MINIMUM[k] else 0 for k in range(16)]
            for line in [[r * 4 + c for c in range(4)] for r in range(4)] + [[r * 4 + c for r in range(4)]
                                                                            for c in range(4)]:
                for k in line:  # the digits that occur in no other set of the line
                    others = 0
                    for j in line:
                        if j != k:
                            others |= cells[j]
                    sure[k] |= cells[k] & ~others
            placed = [sure[k] if k < 12 and k % 4 < 3 else 0 for k in range(16)]
            every = 0
            for m in placed:
                every |= m
            in_row = [placed[r * 4] | placed[r * 4 + 1] | placed[r * 4 + 2] for r in range(3)]
            in_col = [placed[c] | placed[4 + c] | placed[8 + c] for c in range(3)]
            for r in range(3):
                for c in range(3):
                    k = r * 4 + c
                    elim[k] |= (every | (0xFFFF if placed[k] else 0)) ^ placed[k]
                elim[r * 4 + 3] |= in_row[r]
                elim[12 + r] |= in_col[r]
            for band, peer, absent, present in ((b // 3, b % 3, [sure[3], sure[7], sure[11]], in_row),
                                                (3 + b % 3, b // 3, sure[12:15], in_col)):
                for k in range(6):
                    e = ELEM[k][peer]
                    self.told[band][k] |= absent[e] | present[(e + 1) % 3] | present[(e + 2) % 3]
            if not any(elim[k] & cells[k] for k in range(16)):
                break
        rows, cols = (b // 3, b % 3), (3 + b % 3, b // 3)
        first, second = (rows, cols) if from_vertical else (cols, rows)
        return self.band(*first) and self.band(*second)

    def triads(self, band):
        t = [[0] * 3 for _ in range(3)]
        for k in range(6):
            for p in range(3):
                t[p][ELEM[k][p]] |= self.configs[band][k]
        return t

    def band(self, band, from_peer=0):
        configs, told = self.configs[band], self.told[band]
        if not any(configs[k] & told[k] for k in range(6)):
            return True
        for k in range(6):
            configs[k] &= ~told[k]
        t = self.triads(band)
        for k in range(6):
            for p in range(3):
                for e in range(3):
                    if e != ELEM[k][p] and bits(t[p][e]) == 3:
                        configs[k] &= ~t[p][e]
        t = self.triads(band)
        vertical, index = divmod(band, 3)
        for p in ((from_peer + 1) % 3, (from_peer + 2) % 3, from_peer):
            allowed = [FULL] * 16
            for e in range(3):
                for j in range(3):
                    allowed[j * 4 + e if vertical else e * 4 + j] = t[p][e]
                allowed[12 + e if vertical else e * 4 + 3] = t[p][(e + 1) % 3] | t[p][(e + 2) % 3]
            if not self.box(p * 3 + index if vertical else index * 3 + p, allowed, vertical):
                return False
        return True


def model_search(puzzle, limit):
    """(solutions up to ``limit``, guesses) by the model."""
    found = [0, 0]

    def run(state):
        sizes = [sum(bits(c) for c in state.configs[k]) for k in range(6)]
        open_bands = [k for k in range(6) if sizes[k] >= 10]
        if not open_bands:
            found[0] += 1
            return
        band = min(open_bands, key=lambda k: (sizes[k], k))
        per_digit = [sum(1 for c in state.configs[band] if c >> d & 1) for d in range(9)]
        order = [d for want in (2, 3) for d in range(9) if per_digit[d] == want]
        digit = (order or [d for d in range(9) if per_digit[d] > 3])[0]
        holding = [k for k in range(6) if state.configs[band][k] >> digit & 1]
        found[1] += 1
        child = state.copy()
        for k in holding[1:]:
            child.told[band][k] |= 1 << digit
        if child.band(band):
            run(child)
            if found[0] == limit:
                return
        state.told[band][holding[0]] |= 1 << digit
        if state.band(band):
            run(state)

    state = Model(puzzle)
    if state.ok:
        run(state)
    return tuple(found)


# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("puzzle,count1,guesses1,count2,guesses2", TDOKU_BINARY)
def test_counts_equal_the_compiled_tdokus(puzzle, count1, guesses1, count2, guesses2):
    cells = grid(puzzle)
    one, two = solver.search(cells, 1, scale="tdoku"), solver.search(cells, 2, scale="tdoku")
    assert (one.count, one.guesses, two.count, two.guesses) == (count1, guesses1, count2, guesses2)
    assert is_valid_solution(one.solution) and all(c in (0, s) for c, s in zip(cells, one.solution))
    if count2 == 1:
        assert solver.rate(cells, scale="tdoku") == guesses1
        assert one.solution == solver.search(cells).solution


def test_the_plain_model_reproduces_tdokus_numbers():
    for puzzle, *numbers in [TDOKU_BINARY[k] for k in (0, 6, 7, 10, 11, 13)]:  # the quick ones, both kinds
        assert (*model_search(grid(puzzle), 1), *model_search(grid(puzzle), 2)) == tuple(numbers)


def test_the_compiled_search_equals_the_plain_model_on_generated_puzzles():
    rng = np.random.default_rng(21)
    puzzles = [grid(p) for p, *_ in TDOKU_BINARY[:3]]
    for _ in range(12):
        q, _ = builder.generate_puzzle(rng, 0)
        puzzles.append(q.tolist())
        several = q.copy()
        several[np.flatnonzero(several)[:3]] = 0  # several solutions
        puzzles.append(several.tolist())
    for p in puzzles:
        for limit in (1, 2):
            found = solver.search(p, limit, scale="tdoku")
            assert (found.count, found.guesses) == model_search(p, limit)
            assert found.count == solver.search(p, limit).count  # the same solutions are counted


def test_rate_many_and_left_open_on_tdokus_scale():
    puzzles = np.array([grid(p) for p, *_ in TDOKU_BINARY[:10]])
    assert solver.rate_many(puzzles, "tdoku").tolist() == [row[2] for row in TDOKU_BINARY[:10]]
    assert solver.rate_many(puzzles).tolist() == [solver.rate(p) for p in puzzles]  # the default scale is ours
    wikipedia = grid(TDOKU_BINARY[9][0])
    assert solver.left_open(wikipedia, "tdoku") == 0 and solver.left_open(grid(TDOKU_BINARY[0][0]), "tdoku") > 0
    assert solver.left_open(wikipedia) == solver.singles_left(wikipedia)
    clash = list(wikipedia)
    clash[2] = 5
    assert solver.left_open(clash, "tdoku") == -1 and solver.search(clash, scale="tdoku").count == 0


def test_bad_scale_arguments_are_refused():
    cells = grid(TDOKU_BINARY[0][0])
    with pytest.raises(ValueError, match="unknown rating scale"):
        solver.rate(cells, scale="sudoku-explainer")
    with pytest.raises(ValueError, match="exclude"):
        solver.search(cells, exclude=(1, 2), scale="tdoku")
    with pytest.raises(ValueError, match="unknown rating scale"):
        solver.left_open(cells, "nope")
    unsolvable = grid(TDOKU_BINARY[9][0])
    unsolvable[2] = 1  # consistent clues without a solution
    with pytest.raises(ValueError, match="without a solution"):
        solver.rate(unsolvable, scale="tdoku")
