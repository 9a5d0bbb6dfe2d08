"""Mazes as users have them (device=cpu, no model): any rectangle, the spellings generators print, framed with walls
into the square the models take, cropped back; Maze-Hard's CSV as a file of mazes; one-line errors naming the row
and column. Framing is checked against an independent breadth-first search: it must change no shortest path."""

from __future__ import annotations

import csv
from collections import deque

import numpy as np
import pytest

from utils.data.maze import decode_maze, generate_maze
from utils.data.user_puzzles import (GOAL, OPEN, PATH, START, WALL, PuzzleInputError, count_puzzle_solutions,
                                     crop_maze, format_maze, frame_maze, iter_puzzle_file, maze_problems, parse_maze,
                                     puzzle_text, read_mazes)

# 3 rows x 5 columns, no outer wall: the grid's edge is one.
WIDE = "S #  \n  # #\n#   G\n"
WIDE_GRID = np.array([[START, OPEN, WALL, OPEN, OPEN],
                      [OPEN, OPEN, WALL, OPEN, WALL],
                      [WALL, OPEN, OPEN, OPEN, GOAL]], np.uint8)


def grid_of(tokens: np.ndarray) -> np.ndarray:
    """Square tokens [side²] as uint8 [side, side]."""
    side = int(round(tokens.size ** 0.5))
    return tokens.reshape(side, side)


# ---- an independent re-computation: breadth-first search on the user's own rectangle, the edge a wall


def bfs(grid: np.ndarray) -> tuple[int | None, int, list[tuple[int, int]]]:
    """Over the non-wall cells of ``grid`` (tokens [rows, cols]), 4-neighbour moves: the fewest moves from S to G
    (None when G cannot be reached), the exact number of shortest paths, and one of them (its cells between S and
    G, in order)."""
    rows, cols = grid.shape
    start = tuple(np.argwhere(grid == START)[0])
    goal = tuple(np.argwhere(grid == GOAL)[0])
    distance, count, parent = {start: 0}, {start: 1}, {}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        r, c = cell
        for nxt in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if not (0 <= nxt[0] < rows and 0 <= nxt[1] < cols) or grid[nxt] == WALL:
                continue
            if nxt not in distance:
                distance[nxt], count[nxt], parent[nxt] = distance[cell] + 1, 0, cell
                queue.append(nxt)
            if distance[nxt] == distance[cell] + 1:
                count[nxt] += count[cell]
    if goal not in distance:
        return None, 0, []
    path, cell = [], parent.get(goal)
    while cell is not None and cell != start:
        path.append(cell)
        cell = parent[cell]
    return distance[goal], count[goal], path[::-1]


def random_grid(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A random maze, tokens uint8 [rows, cols]: walls at a random density, S and G on two distinct cells."""
    grid = np.where(rng.random((rows, cols)) < rng.uniform(0.1, 0.45), WALL, OPEN).astype(np.uint8)
    s, g = rng.choice(rows * cols, 2, replace=False)
    grid.flat[s], grid.flat[g] = START, GOAL
    return grid


def text_of(grid: np.ndarray, wall: str = "#", open_: str = " ", goal: str = "G") -> str:
    """A grid (tokens [rows, cols]) as the text a user writes, in the given spellings."""
    chars = {WALL: wall, OPEN: open_, START: "S", GOAL: goal}
    return "\n".join("".join(chars[t] for t in row) for row in grid.tolist()) + "\n"


def lattice_maze(rng: np.random.Generator, n: int) -> np.ndarray:
    """A perfect maze as lattice generators write it: a (2n+1)-square of walls and cells, passages carved by a
    depth-first walk; S top-left, G bottom-right. Tokens uint8 [2n+1, 2n+1]."""
    grid = np.full((2 * n + 1, 2 * n + 1), WALL, np.uint8)
    seen, stack = {(0, 0)}, [(0, 0)]
    grid[1, 1] = OPEN
    while stack:
        r, c = stack[-1]
        options = [(r + dr, c + dc) for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))
                   if 0 <= r + dr < n and 0 <= c + dc < n and (r + dr, c + dc) not in seen]
        if not options:
            stack.pop()
            continue
        nr, nc = options[rng.integers(len(options))]
        grid[2 * nr + 1, 2 * nc + 1] = grid[r + nr + 1, c + nc + 1] = OPEN
        seen.add((nr, nc))
        stack.append((nr, nc))
    grid[1, 1], grid[2 * n - 1, 2 * n - 1] = START, GOAL
    return grid


# ---- spellings and shapes


@pytest.mark.parametrize("wall,open_,goal", [("#", " ", "G"), ("*", " ", "G"), ("\u2588", " ", "G"), ("#", ".", "G"),
                                             ("#", " ", "E"), ("\u2588", ".", "E"), ("*", ".", "E")])
def test_every_spelling_reads_as_the_reference_tokens(wall, open_, goal):
    tokens, shape = parse_maze(text_of(WIDE_GRID, wall, open_, goal), "m")
    assert shape == (3, 5) and tokens.dtype == np.uint8 and tokens.shape == (25,)
    assert np.array_equal(crop_maze(tokens, shape), WIDE_GRID.ravel())
    mixed = "S.*  \n .\u2588 #\n#   E\n"  # spellings may be mixed within a maze
    assert np.array_equal(parse_maze(mixed, "m")[0], tokens)


def test_rectangles_both_ways_are_framed_with_walls_on_the_right_or_bottom():
    tokens, shape = parse_maze(WIDE, "m")
    square = grid_of(tokens)
    assert shape == (3, 5) and square.shape == (5, 5)
    assert np.array_equal(square[:3], WIDE_GRID) and (square[3:] == WALL).all()  # framed at the bottom
    tall, tall_shape = parse_maze(text_of(WIDE_GRID.T), "m")
    assert tall_shape == (5, 3) and np.array_equal(grid_of(tall)[:, :3], WIDE_GRID.T)
    assert (grid_of(tall)[:, 3:] == WALL).all()  # framed on the right
    assert format_maze(tokens, shape) == WIDE.rstrip("\n")
    assert format_maze(tall, tall_shape) == text_of(WIDE_GRID.T).rstrip("\n")
    assert format_maze(tokens) == WIDE.rstrip("\n") + "\n#####\n#####"  # the square as the model sees it
    assert format_maze(crop_maze(tokens, shape), shape) == format_maze(tokens, shape)  # the rectangle as it is
    assert puzzle_text("maze", tokens, shape) == WIDE.rstrip("\n")
    wide = random_grid(np.random.default_rng(0), 12, 20)
    assert parse_maze(text_of(wide), "m")[1] == (12, 20) and parse_maze(text_of(wide), "m")[0].size == 400


@pytest.mark.parametrize("n", [4, 10, 15])  # 9x9, 21x21 and 31x31, as lattice generators write them
def test_odd_lattice_mazes_are_just_grids(n):
    grid = lattice_maze(np.random.default_rng(n), n)
    tokens, shape = parse_maze(text_of(grid, wall="\u2588", goal="E"), "lattice")
    assert shape == (2 * n + 1, 2 * n + 1) and np.array_equal(tokens, grid.ravel())
    assert count_puzzle_solutions("maze", tokens) == 1  # a perfect maze: one path between any two cells


def test_short_rows_are_open_to_the_right_and_empty_lines_around_a_maze_are_no_rows():
    tokens, shape = parse_maze("\n\r\nS #\r\n  # #\r\n#   G\r\n\r\n", "m")  # an editor stripped row 1's trailing spaces
    assert shape == (3, 5) and np.array_equal(crop_maze(tokens, shape), WIDE_GRID.ravel())
    assert parse_maze("\ufeff" + WIDE, "m")[1] == (3, 5)  # a byte-order mark is no cell
    assert parse_maze("S\n G\n", "m")[1] == (2, 2)  # the widest row sets the width


# ---- framing and cropping


def test_crop_of_frame_is_the_maze_for_random_shapes():
    rng = np.random.default_rng(1)
    for _ in range(200):
        s = int(rng.integers(1, 20))
        tokens = rng.integers(1, 6, s * s).astype(np.uint8)
        side = s + int(rng.integers(0, 8))
        framed = frame_maze(tokens, side)
        assert framed.shape == (side * side,) and framed.dtype == np.uint8
        assert np.array_equal(crop_maze(framed, (s, s)), tokens)
        assert (grid_of(framed)[s:] == WALL).all() and (grid_of(framed)[:, s:] == WALL).all()
        rows, cols = int(rng.integers(2, 16)), int(rng.integers(2, 16))
        grid = random_grid(rng, rows, cols)
        parsed, shape = parse_maze(text_of(grid), "m")
        assert shape == (rows, cols) and parsed.size == max(rows, cols) ** 2
        assert np.array_equal(crop_maze(parsed, shape), grid.ravel())
        assert np.array_equal(crop_maze(frame_maze(parsed, side + 16), shape), grid.ravel())
    cropped = crop_maze(framed, (s, s))
    cropped[0] = 0
    assert framed[0] == tokens[0] != 0  # a copy: writing to it leaves the square alone


def test_frame_and_crop_refuse_what_does_not_fit():
    square = np.full(16, WALL, np.uint8)
    with pytest.raises(ValueError, match="a 4x4 maze does not fit a side of 3"):
        frame_maze(square, 3)
    with pytest.raises(ValueError, match="a square row by row, got 15"):
        frame_maze(square[:15], 10)
    with pytest.raises(ValueError, match="a 5x2 maze is not within a 4x4 square"):
        crop_maze(square, (5, 2))
    assert np.array_equal(frame_maze(square, 4), square)


def test_framing_changes_no_shortest_path_against_an_independent_search():
    """On random grids of many sizes and shapes: the number of shortest S-G paths counted on the framed square (and on
    a larger frame, as a fixed-size model gets it) is the independent search's on the rectangle, and the answer built
    from that search, marked on the framed square, is consistent, one cell fewer is broken."""
    rng = np.random.default_rng(2)
    seen = {0: 0, 1: 0, 2: 0}
    for trial in range(400):
        rows, cols = int(rng.integers(2, 18)), int(rng.integers(2, 18))
        grid = random_grid(rng, rows, cols)
        tokens, shape = parse_maze(text_of(grid), f"grid {trial}")
        moves, paths, path = bfs(grid)
        bigger = frame_maze(tokens, max(rows, cols) + int(rng.integers(1, 6)))
        assert count_puzzle_solutions("maze", tokens) == min(paths, 2) == count_puzzle_solutions("maze", bigger)
        seen[min(paths, 2)] += 1
        if moves is None:
            assert maze_problems(tokens, tokens) == ["S and G are not connected in this maze: no path can be marked"]
            continue
        answer = grid_of(tokens).copy()
        for cell in path:
            answer[cell] = PATH
        assert len(path) == moves - 1
        assert maze_problems(answer.ravel(), tokens) == []
        assert maze_problems(frame_maze(answer.ravel(), int(bigger.size ** 0.5)), bigger) == []
        if path:
            answer[path[len(path) // 2]] = OPEN
            assert maze_problems(answer.ravel(), tokens) == ["broken: the marked cells do not connect S to G"]
    assert min(seen.values()) > 20, seen  # unreachable, unique and several shortest paths all drawn


# ---- files: text blocks, Maze-Hard's CSV, read_mazes


def maze_hard_csv(path, rows: list[tuple[str, str]], bom: bool = True) -> None:
    """A CSV as the Hugging Face dataset sapientinc/maze-30x30-hard-1k writes it, CRLF line ends."""
    with open(path, "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["source", "question", "answer", "rating"])
        writer.writerows([("lehnert", q, a, 120) for q, a in rows])


def generated(seed: int, size: int) -> tuple[str, str, np.ndarray, np.ndarray]:
    """A generated maze as its CSV question and answer strings and their tokens [size²]."""
    question, answer = generate_maze(np.random.default_rng([3, seed]), size)
    return decode_maze(question), decode_maze(answer), question.ravel(), answer.ravel()


def test_maze_hard_csv_rows_are_read_with_their_answers_as_labels(tmp_path):
    mazes = [generated(0, 30), generated(1, 30), generated(2, 6)]
    source = tmp_path / "test.csv"
    maze_hard_csv(source, [(q, a) for q, a, _, _ in mazes])
    entries = list(iter_puzzle_file("maze", source))
    assert [(e.line, e.error, e.shape) for e in entries] == [(2, None, (30, 30)), (3, None, (30, 30)),
                                                             (4, None, (6, 6))]
    for entry, (question, _, tq, ta) in zip(entries, mazes):
        assert entry.text == question and np.array_equal(entry.tokens, tq) and np.array_equal(entry.label, ta)
        assert maze_problems(entry.label, entry.tokens) == [] and count_puzzle_solutions("maze", entry.tokens) == 1
    read = read_mazes(str(source))
    assert [(name, shape) for name, _, shape in read] == [("test.csv line 2", (30, 30)), ("test.csv line 3", (30, 30)),
                                                          ("test.csv line 4", (6, 6))]
    assert np.array_equal(read[2][1], mazes[2][2])
    unlabelled = tmp_path / "questions.csv"
    unlabelled.write_text(f"question\n{mazes[2][0]}\n")
    (entry,) = iter_puzzle_file("maze", unlabelled)
    assert entry.error is None and entry.label is None and entry.shape == (6, 6)


def test_bad_csv_rows_are_yielded_as_errors_and_the_rest_read(tmp_path):
    q, a, _, _ = generated(4, 6)
    wall = q.index("#")
    opened = q[:wall] + " " + q[wall + 1:]
    bad = [(q[:-1], a[:-1]),  # 35 characters: no square
           (q, a[:-1]),  # the answer one short
           (q, opened.replace("S", "o", 0)[:wall] + "o" + a[wall + 1:]),  # the answer marks a wall as path
           (q.replace(" ", "o", 1), a),  # the question marks a path
           ("", a),  # no question
           ("x" * 140_000, ""),  # over csv's field size limit
           (q, a)]  # and a good one after all of them
    source = tmp_path / "bad.csv"
    maze_hard_csv(source, bad, bom=False)
    entries = list(iter_puzzle_file("maze", source))
    assert [e.tokens is None for e in entries] == [True] * 6 + [False]
    errors = [e.error for e in entries[:6]]
    assert errors[0] == ("bad.csv line 2: a question of 35 characters; a Maze-Hard question is a square maze written "
                         "row by row, side x side characters (900 for 30x30)")
    assert errors[1].startswith("bad.csv line 3, its answer: 35 characters, the question 36;")
    row, column = wall // 6 + 1, wall % 6 + 1
    assert errors[2].startswith(f"bad.csv line 4, its answer: row {row}, column {column}: 'o' where the question "
                                "has '#'")
    first_open = q.index(" ")
    assert errors[3].startswith(f"bad.csv line 5: row {first_open // 6 + 1}, column {first_open % 6 + 1}: 'o' is not #")
    assert errors[4].startswith("bad.csv line 6: a question of 0 characters")
    assert errors[5].startswith("bad.csv line 7: not a CSV row (field larger than field limit")
    assert entries[6].line == 8 and entries[6].error is None and entries[6].label is not None
    with pytest.raises(PuzzleInputError, match="bad.csv line 2: a question of 35 characters"):
        read_mazes(str(source))


def test_a_text_file_of_mazes_gives_each_its_shape(tmp_path):
    source = tmp_path / "mine.txt"
    source.write_text(WIDE + "\n" + text_of(WIDE_GRID.T, wall="*", open_=".", goal="E") + "\n\nS\n")
    good, tall, bad = iter_puzzle_file("maze", source)
    assert (good.line, good.shape, tall.line, tall.shape) == (1, (3, 5), 5, (5, 3))
    assert bad.line == 12 and bad.tokens is None and bad.shape is None and "mine.txt line 12: 1 row(s)" in bad.error
    with pytest.raises(PuzzleInputError, match="mine.txt line 12: 1 row"):
        read_mazes(str(source))
    source.write_text(WIDE + "\n" + text_of(WIDE_GRID.T))
    assert [(n, s) for n, _, s in read_mazes(str(source))] == [("mine.txt line 1", (3, 5)), ("mine.txt line 5", (5, 3))]
    source.write_text(WIDE)
    ((name, tokens, shape),) = read_mazes(str(source))
    assert name == "mine" and shape == (3, 5) and np.array_equal(tokens, parse_maze(WIDE, "m")[0])
    sudoku = tmp_path / "s.txt"
    sudoku.write_text("." * 81 + "\n")
    assert next(iter_puzzle_file("sudoku", sudoku)).shape is None


def test_read_mazes_names_what_is_wrong_with_the_file(tmp_path):
    with pytest.raises(PuzzleInputError, match="nothere.txt: no such file; give the path of a text file of mazes"):
        read_mazes(str(tmp_path / "nothere.txt"))
    with pytest.raises(PuzzleInputError, match="is a directory; give a text file of mazes"):
        read_mazes(str(tmp_path))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("S \xe9\n  G\n".encode("latin-1"))
    with pytest.raises(PuzzleInputError, match="latin.txt: cannot be read as UTF-8 text .*; save it as UTF-8"):
        read_mazes(str(latin))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(PuzzleInputError, match="empty.txt holds no maze; write one as rows of #"):
        read_mazes(str(empty))


# ---- one-line errors naming the row and column


@pytest.mark.parametrize("text,message", [
    ("S o\n  G\n", "m: row 1, column 3: 'o' is not #, * or the block U+2588 (wall), a space or . (open), S (start), "
                   "G or E (goal); o marks the path, only in an answer"),
    ("S  \n  g\n", "m: row 2, column 3: 'g' is not #, * or the block U+2588 (wall), a space or . (open), S (start), "
                   "G or E (goal); letters are read case-sensitively: write S, G or E"),
    ("S  \n \tG\n", "m: row 2, column 2: '\\t' is not #"),
    ("S+ \n  G\n", "m: row 1, column 2: '+' is not #"),
    ("S S\n  G\n", "m: 2 S cells (row 1, column 1; row 1, column 3); a maze has exactly one S and one goal (G or E)"),
    ("S G\n  E\n", "m: 2 goal (G or E) cells (row 1, column 3; row 2, column 3)"),
    ("S  \n   \n", "m: no goal (G or E) cell; a maze has exactly one S and one goal (G or E)"),
    ("SG\n", "m: 1 row(s) of up to 2 characters; a maze is a grid of at least 2x2 (one line per row, any rectangle)"),
    ("S\nG\n", "m: 2 row(s) of up to 1 characters; a maze is a grid of at least 2x2"),
    ("S  #\n\n # G\n", "m: 3 row(s) of up to 4 characters (row 2 has 0: an editor that strips trailing spaces "
                      "empties a row of open cells, and an empty line ends a maze; write the row's open cells as "
                      "spaces or dots)"),
], ids=["a path in a question", "lower case", "a tab", "another character", "two S", "G and E", "no goal", "one row",
        "one column", "an emptied row"])
def test_errors_are_one_line_naming_the_maze_row_and_column(text, message):
    with pytest.raises(PuzzleInputError) as error:
        parse_maze(text, "m")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
