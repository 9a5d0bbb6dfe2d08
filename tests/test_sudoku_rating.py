"""The Sudoku solver and rating (utils/data/sudoku/rating.py) against a plain re-implementation with sets."""

import numpy as np
import pytest

from tests.test_sudoku_dataset import is_valid_solution, plain_count
from utils.data.sudoku import build as builder
from utils.data.sudoku import rating as solver

# The Wikipedia "Sudoku" article's example: naked and hidden singles solve it.
WIKIPEDIA = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
WIKIPEDIA_SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"
# Arto Inkala's "AI Escargot" (2006) and his 2012 "world's hardest Sudoku": both need search.
ESCARGOT = "1....7.9..3..2...8..96..5....53..9...1..8...26....4...3......1..4......7..7...3.."
INKALA_2012 = "8..........36......7..9.2...5...7.......457.....1...3...1....68..85...1..9....4.."


def grid(text):
    return [0 if ch == "." else int(ch) for ch in text]


def units():
    rows = [[r * 9 + c for c in range(9)] for r in range(9)]
    cols = [[r * 9 + c for r in range(9)] for c in range(9)]
    boxes = [[(br + a) * 9 + bc + b for a in range(3) for b in range(3)] for br in (0, 3, 6) for bc in (0, 3, 6)]
    return rows + cols + boxes


UNITS = units()


def plain_rate(cells):
    """Independent guess count: sets of candidates, the rules of sudoku_rating.rate, no bitmasks.

    Returns the guesses before the first solution, or None when there is none.
    """
    guesses = 0

    def candidates(g, i):
        return {d for d in range(1, 10)} - {g[j] for u in UNITS if i in u for j in u}

    def singles(g):
        """Naked then hidden singles to a fixpoint; False on a contradiction."""
        while True:
            empty = [i for i in range(81) if not g[i]]
            cands = {i: candidates(g, i) for i in empty}
            if any(not c for c in cands.values()):
                return False
            naked = [(i, next(iter(c))) for i, c in cands.items() if len(c) == 1]
            if naked:
                i, d = naked[0]
                g[i] = d
                continue
            hidden = None
            for u in UNITS:
                for d in set(range(1, 10)) - {g[j] for j in u}:
                    places = [j for j in u if not g[j] and d in cands[j]]
                    if not places:
                        return False
                    if len(places) == 1 and hidden is None:
                        hidden = places[0], d
            if hidden is None:
                return True
            g[hidden[0]] = hidden[1]

    def recurse(g):
        nonlocal guesses
        if not singles(g):
            return None
        empty = [i for i in range(81) if not g[i]]
        if not empty:
            return g
        i = min(empty, key=lambda j: len(candidates(g, j)))  # the first of the fewest
        for d in sorted(candidates(g, i)):
            guesses += 1
            child = list(g)
            child[i] = d
            solution = recurse(child)
            if solution is not None:
                return solution
        return None

    return guesses if recurse(list(cells)) is not None else None


def test_singles_puzzle_rates_zero_and_is_solved():
    result = solver.search(grid(WIKIPEDIA), limit=2)
    assert result.count == 1 and result.guesses == 0 and result.solution == grid(WIKIPEDIA_SOLUTION)
    assert solver.rate(grid(WIKIPEDIA)) == 0


@pytest.mark.parametrize("puzzle", [ESCARGOT, INKALA_2012])
def test_hard_puzzles_need_search_and_are_solved(puzzle):
    cells = grid(puzzle)
    assert plain_count(cells) == 1 and solver.count_solutions(cells) == 1
    result = solver.search(cells)
    assert is_valid_solution(result.solution) and all(c in (0, s) for c, s in zip(cells, result.solution))
    assert solver.rate(cells) == result.guesses == plain_rate(cells) > 0


def test_rating_matches_the_plain_rater_on_generated_puzzles():
    rng = np.random.default_rng(11)
    ratings = []
    for _ in range(25):
        q, _ = builder.generate_puzzle(rng, 0)
        ratings.append(solver.rate(q))
        assert ratings[-1] == plain_rate(q)
    assert 0 in ratings and max(ratings) > 1  # both kinds were seen


def test_needing_search_survives_the_sudoku_symmetries():
    rng = np.random.default_rng(12)
    for _ in range(6):
        q, a = builder.generate_puzzle(rng, 0)
        needs_search = solver.rate(q) > 0
        variants, _ = builder.shuffle_sudoku(np.repeat(q[None], 5, 0), np.repeat(a[None], 5, 0), rng)
        assert all((solver.rate(v) > 0) == needs_search for v in variants)


def test_count_solutions_agrees_with_the_plain_solver():
    rng = np.random.default_rng(8)
    _, sol = builder.generate_puzzle(rng, 0)
    assert solver.count_solutions(sol) == 1 and solver.count_solutions(np.zeros(81, int)) == 2
    clash = sol.copy()
    clash[1] = clash[0]
    assert solver.count_solutions(clash) == 0 and not solver.is_consistent(clash) and solver.is_consistent(sol)
    for blanks in (30, 45, 50, 55, 58, 60, 62, 64):
        q = sol.copy()
        q[rng.choice(81, blanks, replace=False)] = 0
        for limit in (2, 5):  # plain_count may pass its limit; the solver stops at it
            assert solver.count_solutions(q, limit) == min(plain_count(q, limit), limit)


def test_exclude_forbids_one_digit_in_one_cell():
    cells = grid(ESCARGOT)
    blank = cells.index(0)
    assert solver.search(cells, exclude=(blank, solver.search(cells).solution[blank])).count == 0  # unique
    rng = np.random.default_rng(9)
    _, sol = builder.generate_puzzle(rng, 0)
    for blanks in (50, 58, 62):
        q = sol.copy()
        q[rng.choice(81, blanks, replace=False)] = 0
        i = int(np.flatnonzero(q == 0)[0])
        for d in range(1, 10):
            # Solutions with another digit in cell i, counted by the plain solver digit by digit.
            others = 0
            for other in set(range(1, 10)) - {d}:
                q[i] = other
                others += min(plain_count(q, 3), 3) if solver.is_consistent(q) else 0
            q[i] = 0
            assert solver.search(q, limit=3, exclude=(i, d)).count == min(others, 3)


def test_unsolvable_puzzles_cannot_be_rated():
    clash = grid(WIKIPEDIA)
    clash[2] = 5  # a second 5 in the first row
    with pytest.raises(ValueError, match="without a solution"):
        solver.rate(clash)
    no_solution = grid(WIKIPEDIA)
    no_solution[2] = 1  # consistent clues, but the unique solution has 4 there
    assert solver.count_solutions(no_solution) == 0
    with pytest.raises(ValueError, match="without a solution"):
        solver.rate(no_solution)


def test_random_fill_draws_different_valid_grids():
    fills = [solver.search([0] * 81, rng=np.random.default_rng(k)) for k in range(20)]
    assert all(is_valid_solution(f.solution) for f in fills)
    assert len({builder.grid_fingerprints(np.array(f.solution)[None])[0] for f in fills}) == 20  # not relabellings


def test_the_compiled_search_gets_the_counts_guesses_and_solutions_of_the_python_recursion():
    rng = np.random.default_rng(13)
    puzzles = [grid(WIKIPEDIA), grid(ESCARGOT), grid(INKALA_2012), [0] * 81]
    for _ in range(6):
        q, sol = builder.generate_puzzle(rng, 0)
        puzzles.append(q)
        partial = q.copy()
        partial[np.flatnonzero(partial)[:4]] = 0  # several solutions
        puzzles.append(partial)
    clash, unsolvable = grid(WIKIPEDIA), grid(WIKIPEDIA)
    clash[2], unsolvable[2] = 5, 1
    puzzles += [clash, unsolvable]
    for limit in (1, 2, 3):
        queries = [solver.Query(p, limit, (int(np.flatnonzero(np.asarray(p) == 0)[0]), 1 + k % 9) if k % 3 == 1 else None)
                   for k, p in enumerate(puzzles)]
        expected = [solver._search_python(q.cells, q.limit, q.exclude) for q in queries]
        assert solver.search_many(queries) == expected
        assert [solver.singles_left(p) for p in puzzles] == [python_singles_left(p) for p in puzzles]
        assert {r.count for r in expected} >= {0, 1, limit}  # none, unique, and as many as asked for


def python_singles_left(cells) -> int:
    """singles_left by the Python propagation that the compiled one restates."""
    start = solver._start(list(cells))
    state = None if start is None else solver._propagate(*start, solver._NO_BAN, [i for i in range(81) if not start[0][i]])
    return -1 if state is None else len(state[0])


def test_jobs_ask_for_searches_and_sub_jobs_and_get_their_answers():
    def count(cells, limit):
        return (yield solver.Query(cells, limit)).count

    def job(k):
        first = yield solver.Query(grid(ESCARGOT))
        many = yield [solver.Query(grid(WIKIPEDIA), 2), count([0] * 81, 1 + k)]
        empty = yield []
        return first.guesses, many[0].count, many[1], empty

    assert solver.run_jobs([job(0), job(2)]) == [(solver.rate(grid(ESCARGOT)), 1, 1, []),
                                                          (solver.rate(grid(ESCARGOT)), 1, 3, [])]


def test_singles_left_counts_the_blanks_singles_cannot_fill():
    assert solver.singles_left(grid(WIKIPEDIA)) == 0
    escargot = grid(ESCARGOT)
    assert 0 < solver.singles_left(escargot) <= escargot.count(0)
    clash = grid(WIKIPEDIA)
    clash[2] = 5
    assert solver.singles_left(clash) == -1


def test_rate_many_is_rate_of_each():
    puzzles = np.array([grid(WIKIPEDIA), grid(ESCARGOT)])
    assert solver.rate_many(puzzles).tolist() == [solver.rate(p) for p in puzzles]
    clash = puzzles.copy()
    clash[1, 2] = clash[1, 0]
    with pytest.raises(ValueError, match="row 1"):
        solver.rate_many(clash)


def _job(cells):
    return (yield solver.Query(cells)).count


ENTRY_POINTS = {"rate": solver.rate, "count_solutions": solver.count_solutions, "search": solver.search,
                "search tdoku": lambda cells: solver.search(cells, scale="tdoku"),
                "is_consistent": solver.is_consistent, "left_open": solver.left_open,
                "left_open tdoku": lambda cells: solver.left_open(cells, "tdoku"), "singles_left": solver.singles_left,
                "run_jobs": lambda cells: solver.run_jobs([_job(cells)])}


def _with(cell: int, value, dtype=None):
    cells = grid(WIKIPEDIA)
    cells[cell] = value
    return cells if dtype is None else np.array(cells, dtype)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("cells,message", [
    (_with(7, 10), "cell 7 (row 1, column 8) is 10: a Sudoku cell holds 0..9 (0 = blank)"),
    (_with(80, -1), "cell 80 (row 9, column 9) is -1: a Sudoku cell holds 0..9 (0 = blank)"),
    (_with(2, 10, np.uint8), "cell 2 (row 1, column 3) is 10: "),
    (_with(40, 2.5, np.float64), "cell 40 (row 5, column 5) is 2.5: "),
    (grid(WIKIPEDIA)[:80], "a Sudoku grid is 81 cells (0 = blank), got 80"),
    (grid(WIKIPEDIA) + [0], "a Sudoku grid is 81 cells (0 = blank), got 82"),
], ids=["10", "-1", "uint8 10", "2.5", "80 cells", "82 cells"])
def test_every_entry_point_refuses_a_cell_outside_0_to_9_and_a_grid_not_of_81_cells(entry, cells, message):
    """Issue 63: a cell of 10 or -1 reached the bitmasks (a tenth digit, a negative shift) and was still answered."""
    with pytest.raises(ValueError) as refused:
        ENTRY_POINTS[entry](cells)
    assert message in str(refused.value)


def test_rate_many_checks_every_puzzle_at_once_and_names_the_bad_one():
    puzzles = np.array([grid(WIKIPEDIA), grid(ESCARGOT), grid(WIKIPEDIA)])
    puzzles[2, 9] = 10
    with pytest.raises(ValueError, match=r"puzzles\[2\], cell 9 \(row 2, column 1\) is 10: a Sudoku cell holds 0..9"):
        solver.rate_many(puzzles)
    with pytest.raises(ValueError, match=r"81 cells each .* got shape \(3, 80\)"):
        solver.rate_many(puzzles[:, :80])
    assert solver.rate_many(np.zeros((0, 81), np.uint8)).tolist() == []
    assert solver.rate_many(puzzles[:2].reshape(2, 9, 9)).tolist() == [solver.rate(p) for p in puzzles[:2]]
