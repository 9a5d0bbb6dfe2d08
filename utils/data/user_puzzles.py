"""Puzzles as a user writes them, turned into model tokens, and the checks an answer must pass.

- **Sudoku**: 81 characters, row by row, ``1``-``9`` for givens and ``.`` or ``0`` for blanks (white space
  ignored); or a file of them: a Sudoku-Extreme CSV (its ``question`` column) or one puzzle per line. Tokens as
  the Sudoku builder writes them (utils/data/sudoku/build.py): blank 1, digit d -> d + 1 (vocab 11).
- **Maze**: a text grid, one line per row, any rectangle from 2x2 up, with or without an outer wall (the grid's edge
  acts as one): walls ``#``, ``*`` or ``█``, open cells a space or ``.``, one start ``S`` and one goal ``G`` or
  ``E``; lines an editor shortened by stripping trailing spaces are padded with open cells. Or a file of them: mazes
  separated by empty lines, or a Maze-Hard CSV (its ``question`` column). Tokens as the maze builder writes them
  (utils/data/maze.py, the reference's charset ``"# SGo"`` -> 1..5; ``o`` marks the path in an answer), on a square:
  a rows x cols maze is framed with walls on the right or bottom into a square of side max(rows, cols), which changes
  no shortest path and is what the models and the checks here take (:func:`crop_maze` gives the rectangle back).

Every error names the puzzle, the row and column, and the fix.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import math
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from utils.errors import UserError

SUDOKU_CELLS = 81
MAZE_CHARSET = "# SGo"  # token = index + 1
WALL, OPEN, START, GOAL, PATH = 1, 2, 3, 4, 5
# How generators and people write a maze's cells: walls as # (the reference's), * or a full block (text printers of
# lattice mazes); mazelib and others write E for the end. Read case-sensitively: s is no start. The text naming
# them is ASCII, so a message naming them prints on any terminal.
MAZE_SPELLINGS = {"#": WALL, "*": WALL, "\u2588": WALL, " ": OPEN, ".": OPEN, "S": START, "G": GOAL, "E": GOAL}
MAZE_SPELLINGS_TEXT = "#, * or the block U+2588 (wall), a space or . (open), S (start), G or E (goal)"
BOM = "\ufeff"  # a UTF-8 byte-order mark, which Windows Notepad writes at the start of a file: not a cell


class PuzzleInputError(UserError):
    """A puzzle the user gave is malformed (length, a character, a conflict among its givens)."""


def _units() -> list[tuple[str, np.ndarray]]:
    """The 27 Sudoku units as (name, the 9 cell indices)."""
    cells = np.arange(SUDOKU_CELLS).reshape(9, 9)
    units = [(f"row {r + 1}", cells[r]) for r in range(9)] + [(f"column {c + 1}", cells[:, c]) for c in range(9)]
    units += [(f"box {b + 1}", cells[b // 3 * 3:b // 3 * 3 + 3, b % 3 * 3:b % 3 * 3 + 3].ravel()) for b in range(9)]
    return units


def parse_sudoku(text: str, where: str) -> np.ndarray:
    """One Sudoku as tokens, uint8 [81] (blank 1, digit d -> d + 1).

    Raises:
        PuzzleInputError: not 81 cells, a character other than 1-9, ``.`` or ``0`` (named by row and column), or
            givens that already break a rule (a digit twice in a row, column or box).
    """
    cells = "".join(text.removeprefix(BOM).split())
    if len(cells) != SUDOKU_CELLS:
        raise PuzzleInputError(f"{where}: {len(cells)} cells; a Sudoku is 81 characters, row by row, 1-9 for givens "
                               "and . or 0 for blanks")
    digits = np.zeros(SUDOKU_CELLS, np.uint8)
    for i, ch in enumerate(cells):
        if ch in "123456789":
            digits[i] = int(ch)
        elif ch not in ".0":
            raise PuzzleInputError(f"{where}: row {i // 9 + 1}, column {i % 9 + 1}: {ch!r} is not a digit 1-9 or a "
                                   "blank (. or 0)")
    for name, unit in _units():
        given = digits[unit][digits[unit] > 0]
        twice = [d for d in set(given.tolist()) if (given == d).sum() > 1]
        if twice:
            raise PuzzleInputError(f"{where}: {name} already holds {twice[0]} twice, so the puzzle has no solution; "
                                   "check its givens")
    return np.where(digits > 0, digits + 1, 1).astype(np.uint8)


def sudoku_file(spec: str) -> Optional[Path]:
    """The file ``--sudoku SPEC`` names, or None where ``spec`` is the puzzle itself (checked before anything loads).

    Raises:
        PuzzleInputError: a directory, or a path (a name ending .csv or .txt, or one with a folder) that is not there.
    """
    path = Path(spec)
    if path.is_dir():
        raise PuzzleInputError(f"{spec} is a directory; give a Sudoku (81 characters) or a file of them")
    if path.is_file():
        return path
    if spec.endswith((".csv", ".txt")) or os.sep in spec:
        raise PuzzleInputError(f"{spec}: no such file; give a Sudoku (81 characters) or the path of a file of them")
    return None


def read_sudokus(spec: str) -> list[tuple[str, np.ndarray]]:
    """``(name, tokens [81])`` for each Sudoku ``spec`` gives: a file (a CSV with a ``question`` column, or one puzzle
    per line) or the puzzle itself.

    Raises:
        PuzzleInputError: a malformed puzzle, an empty file, or a file that is not UTF-8 text.
    """
    path = sudoku_file(spec)
    if path is None:
        return [("puzzle 1", parse_sudoku(spec, "the puzzle"))]
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (UnicodeDecodeError, OSError) as e:
        raise PuzzleInputError(f"{path}: cannot be read as UTF-8 text ({e}); save it as UTF-8") from None
    lines = text.splitlines()
    rows = list(csv.DictReader(io.StringIO(text))) if lines and "question" in lines[0].split(",") else None
    entries = [(f"{path.name} row {i + 2}", row["question"]) for i, row in enumerate(rows)] if rows is not None else \
        [(f"{path.name} line {i + 1}", line) for i, line in enumerate(lines) if line.strip()]
    if not entries:
        raise PuzzleInputError(f"{path} holds no puzzle; write one 81-character puzzle per line")
    return [(name, parse_sudoku(puzzle, name)) for name, puzzle in entries]


@dataclass(frozen=True)
class FileEntry:
    """One puzzle of a file (:func:`iter_puzzle_file`).

    Attributes:
        line: the puzzle's first line in the file (1-based).
        text: the puzzle as written (a maze's rows joined by newlines).
        tokens: uint8 [S], None for a bad entry.
        error: for a bad entry, one line saying what is wrong with it; None otherwise.
        label: the answer the file gives (a Sudoku-Extreme or Maze-Hard CSV's ``answer`` column), tokens uint8 [S],
            or None.
        shape: a maze's own (rows, cols) (its tokens are the square framed around it, :func:`parse_maze`); None for
            a Sudoku or a bad entry.
    """

    line: int
    text: str
    tokens: Optional[np.ndarray]
    error: Optional[str] = None
    label: Optional[np.ndarray] = None
    shape: Optional[tuple[int, int]] = None


def iter_puzzle_file(task: str, path: Path) -> Iterator[FileEntry]:
    """The puzzles of a file, read as they are needed (a file of a million lines streams): Sudoku one per line (a
    ``#`` line is a comment; an 81-character puzzle may be followed by a space and its name), or a CSV with a
    ``question`` column (Sudoku-Extreme's: its ``answer`` column becomes the label); mazes separated by empty lines
    (a line of spaces is a maze row), or a CSV with a ``question`` column (Maze-Hard's: each a square maze row by row
    over ``"# SGo"``, its ``answer`` the label), each with its ``shape``. A UTF-8 byte-order mark and CRLF line ends
    are accepted; a bad entry (or bytes that are not UTF-8) is yielded with its ``error``, never raised, so the rest
    can be answered.

    Raises:
        PuzzleInputError: the file cannot be opened, or is not text (a NUL byte in its first 8 KiB: an image, a
            program, a compressed file), which would otherwise be answered as lines of garbage.
    """
    try:
        with open(path, "rb") as raw:
            binary = b"\0" in raw.read(8192)
        handle = open(path, encoding="utf-8-sig", errors="replace", newline="")
    except OSError as e:
        raise PuzzleInputError(f"{path}: cannot be read ({e.strerror}); give a text file of puzzles") from None
    if binary:
        handle.close()
        raise PuzzleInputError(f"{path} is not a text file (it holds NUL bytes): give a text file of puzzles, "
                               "one a line")
    with handle:
        first = handle.readline()
        handle.seek(0)
        is_csv = "question" in [c.strip() for c in first.rstrip("\r\n").split(",")]
        if task == "sudoku" and is_csv:
            yield from _sudoku_csv(handle, path)
        elif task == "sudoku":
            for number, line in enumerate(handle, 1):
                text = line.strip()
                if text and not text.startswith("#"):  # a comment line is no puzzle
                    first = text.split(maxsplit=1)[0]  # an 81-character puzzle may be followed by its name
                    yield _entry(task, number, first if len(first) == SUDOKU_CELLS else text,
                                 f"{path.name} line {number}")
        else:
            yield from _maze_csv(handle, path) if is_csv else _maze_blocks(handle, path)


def _csv_rows(handle, path: Path) -> Iterator[tuple[int, Optional[dict], Optional[str]]]:
    """``(line, row, None)`` for each row of a CSV file with a header, or ``(line, None, error)`` for a row the reader
    cannot take (a field past the CSV reader's limit of 131,072 characters, a NUL), so that one such row never stops
    the rest of the file."""
    reader = csv.DictReader(handle)
    while True:
        line = reader.line_num + 1  # the row's first line: csv's count is not advanced when a row fails
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            yield line, None, f"{path.name} line {line}: not a CSV row ({e}); give its puzzle in a text file instead"
            continue
        yield reader.line_num, row, None


def _sudoku_csv(handle, path: Path) -> Iterator[FileEntry]:
    """The rows of a Sudoku CSV with a ``question`` column, each with its ``answer`` as the label where it has one."""
    for line, row, error in _csv_rows(handle, path):
        if error is not None:
            yield FileEntry(line, "", None, error)
            continue
        where = f"{path.name} line {line}"
        entry = _entry("sudoku", line, row.get("question") or "", where)
        answer = (row.get("answer") or "").strip()
        if entry.tokens is not None and answer:
            try:
                entry = dataclasses.replace(entry, label=parse_sudoku(answer, f"{where}, its answer"))
            except PuzzleInputError as e:
                entry = dataclasses.replace(entry, tokens=None, error=str(e))
        yield entry


def _maze_blocks(handle, path: Path) -> Iterator[FileEntry]:
    """The mazes of a file: runs of non-empty lines (a line of spaces counts), each its own entry."""
    block, start = [], 0
    for number, line in enumerate(itertools.chain(handle, [""]), 1):
        line = line.rstrip("\r\n")
        if line:
            start = start or number
            block.append(line)
        elif block:
            yield _entry("maze", start, "\n".join(block), f"{path.name} line {start}")
            block, start = [], 0


def _maze_csv(handle, path: Path) -> Iterator[FileEntry]:
    """The rows of a maze CSV with a ``question`` column (Maze-Hard's ``source,question,answer,rating``: each question
    a square maze row by row), each with its ``answer`` as the label where it has one."""
    for line, row, error in _csv_rows(handle, path):
        if error is not None:
            yield FileEntry(line, "", None, error)
            continue
        where = f"{path.name} line {line}"
        question, answer = row.get("question") or "", row.get("answer") or ""  # spaces are open cells: kept
        try:
            tokens, shape = _parse_maze_row(question, where)
            label = _maze_label(answer, question, tokens, f"{where}, its answer") if answer.strip() else None
        except PuzzleInputError as e:
            yield FileEntry(line, question, None, str(e))
            continue
        yield FileEntry(line, question, tokens, label=label, shape=shape)


def _parse_maze_row(question: str, where: str) -> tuple[np.ndarray, tuple[int, int]]:
    """A Maze-Hard question (a square maze as one string, row by row) as :func:`parse_maze` gives it."""
    side = math.isqrt(len(question))
    if side < 2 or side * side != len(question):
        raise PuzzleInputError(f"{where}: a question of {len(question)} characters; a Maze-Hard question is a square "
                               "maze written row by row, side x side characters (900 for 30x30)")
    return _maze_grid([question[r * side:(r + 1) * side] for r in range(side)], where)


def _maze_label(answer: str, question: str, tokens: np.ndarray, where: str) -> np.ndarray:
    """A Maze-Hard answer as tokens uint8 [side²]: the question (``tokens`` [side²]) with path cells marked ``o``.

    Raises:
        PuzzleInputError: another length than the question's, or a cell that is neither the question's nor an open
            cell marked ``o`` (named by row and column).
    """
    if len(answer) != len(question):
        raise PuzzleInputError(f"{where}: {len(answer)} characters, the question {len(question)}; the answer is the "
                               "question with its path cells marked o")
    side = math.isqrt(len(question))
    label = tokens.copy()
    for i, (a, q) in enumerate(zip(answer, question)):
        if a == q:
            continue
        if a != "o" or tokens[i] != OPEN:
            raise PuzzleInputError(f"{where}: row {i // side + 1}, column {i % side + 1}: {a!r} where the question "
                                   f"has {q!r}; the answer is the question with its path cells (open ones) marked o")
        label[i] = PATH
    return label


def _entry(task: str, line: int, text: str, where: str) -> FileEntry:
    try:
        tokens, shape = (parse_sudoku(text, where), None) if task == "sudoku" else parse_maze(text, where)
    except PuzzleInputError as e:
        return FileEntry(line, text, None, str(e))
    return FileEntry(line, text, tokens, shape=shape)


def maze_file(spec: str) -> Path:
    """The file ``--maze SPEC`` names (checked before anything loads).

    Raises:
        PuzzleInputError: a directory, or no such file.
    """
    path = Path(spec)
    if path.is_dir():
        raise PuzzleInputError(f"{spec} is a directory; give a text file of mazes (rows of # walls and spaces, one S "
                               "and one G) or a Maze-Hard CSV")
    if not path.is_file():
        raise PuzzleInputError(f"{spec}: no such file; give the path of a text file of mazes (rows of # walls and "
                               "spaces, one S and one G) or a Maze-Hard CSV")
    return path


def read_mazes(spec: str) -> list[tuple[str, np.ndarray, tuple[int, int]]]:
    """``(name, tokens uint8 [side²], (rows, cols))`` for each maze of the file ``spec``: a text file of one or more
    mazes separated by empty lines, or a Maze-Hard CSV (a ``question`` column). The tokens are framed as
    :func:`parse_maze` frames them; the name is the file's stem for a text file of one maze, else ``FILE line N``.

    Raises:
        PuzzleInputError: no such file, a directory, not UTF-8 text, no maze in it, or a malformed maze (the first,
            named by its line, row and column).
    """
    path = maze_file(spec)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (UnicodeDecodeError, OSError) as e:
        raise PuzzleInputError(f"{path}: cannot be read as UTF-8 text ({e}); save it as UTF-8") from None
    lines = text.splitlines()
    is_csv = bool(lines) and "question" in [c.strip() for c in lines[0].split(",")]
    entries = list((_maze_csv if is_csv else _maze_blocks)(io.StringIO(text), path))
    if not entries:
        raise PuzzleInputError(f"{path} holds no maze; write one as rows of # (wall) and spaces (open) with one S and "
                               "one G")
    bad = next((e for e in entries if e.error is not None), None)
    if bad is not None:
        raise PuzzleInputError(bad.error)
    if len(entries) == 1 and not is_csv:
        return [(path.stem, entries[0].tokens, entries[0].shape)]
    return [(f"{path.name} line {e.line}", e.tokens, e.shape) for e in entries]


def sudoku_problems(answer: np.ndarray, puzzle: np.ndarray) -> list[str]:
    """What makes ``answer`` (tokens [81]) not a solution of ``puzzle`` (tokens [81]); empty when it is one.

    Checks that every cell holds a digit, every row, column and box holds 1-9 once, and the givens are kept.
    """
    digits = answer.astype(np.int64) - 1
    problems = [f"{(digits < 1).sum()} cell(s) without a digit"] if (digits < 1).any() else []
    for name, unit in _units():
        missing = sorted(set(range(1, 10)) - set(digits[unit].tolist()))
        if missing:
            problems.append(f"{name} lacks {', '.join(map(str, missing))}")
    changed = np.flatnonzero((puzzle >= 2) & (answer != puzzle))
    if changed.size:
        problems.append(f"{changed.size} given(s) changed (first at row {changed[0] // 9 + 1}, column {changed[0] % 9 + 1})")
    return problems


def parse_maze(text: str, where: str) -> tuple[np.ndarray, tuple[int, int]]:
    """One maze as tokens uint8 [side * side] and its own shape (rows, cols): a rows x cols grid framed with walls on
    the right or bottom into a square of side max(rows, cols) (:func:`crop_maze` takes the rectangle back).

    A row shorter than the widest (an editor stripped its trailing spaces) is open to the right; empty lines before
    and after the maze are no rows. Framing changes no shortest path: the grid's edge already acts as a wall.

    Raises:
        PuzzleInputError: smaller than 2x2, an empty line inside it, a character other than the spellings
            :data:`MAZE_SPELLINGS` reads (named by row and column), or not exactly one S and one goal (G or E).
    """
    lines = text.removeprefix(BOM).splitlines()
    while lines and not lines[-1]:  # empty lines end the text; a line of spaces is a row of open cells
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return _maze_grid(lines, where)


def _maze_grid(lines: list[str], where: str) -> tuple[np.ndarray, tuple[int, int]]:
    """:func:`parse_maze` of a maze's rows (``lines``, none of them a line end)."""
    rows, width = len(lines), max(map(len, lines), default=0)
    short = [r + 1 for r, line in enumerate(lines) if len(line) < width]
    if rows < 2 or width < 2:
        note = (f" (row {short[0]} has {len(lines[short[0] - 1])}: an editor that strips trailing spaces shortens a "
                "row; shorter rows are read as open to the right, but a row of open cells needs its spaces or dots)"
                if short else "")
        raise PuzzleInputError(f"{where}: {rows} row(s) of up to {width} characters{note}; a maze is a grid of at "
                               "least 2x2 (one line per row, any rectangle) with one S and one goal (G or E)")
    empty = [r for r in short if not lines[r - 1]]
    if empty:  # a row of open cells an editor emptied; in a file of mazes an empty line would end this one there
        raise PuzzleInputError(f"{where}: {rows} row(s) of up to {width} characters (row {empty[0]} has 0: an editor "
                               "that strips trailing spaces empties a row of open cells, and an empty line ends a "
                               "maze; write the row's open cells as spaces or dots)")
    grid = np.full((rows, width), OPEN, np.uint8)  # shorter rows: open to the right
    for r, line in enumerate(lines):
        for c, ch in enumerate(line):
            token = MAZE_SPELLINGS.get(ch)
            if token is None:
                raise PuzzleInputError(f"{where}: row {r + 1}, column {c + 1}: {ch!r} is not {MAZE_SPELLINGS_TEXT}"
                                       f"{_spelling_hint(ch)}")
            grid[r, c] = token
    for token, name in ((START, "S"), (GOAL, "goal (G or E)")):
        cells = np.argwhere(grid == token)
        if len(cells) != 1:
            at = "; ".join(f"row {r + 1}, column {c + 1}" for r, c in cells[:2].tolist()) + ("; ..." * (len(cells) > 2))
            found = f"{len(cells)} {name} cells ({at})" if len(cells) else f"no {name} cell"
            raise PuzzleInputError(f"{where}: {found}; a maze has exactly one S and one goal (G or E)")
    side = max(rows, width)
    framed = np.full((side, side), WALL, np.uint8)
    framed[:rows, :width] = grid
    return framed.ravel(), (rows, width)


def _spelling_hint(ch: str) -> str:
    """Why a character a user may well have meant is not read (empty for others)."""
    if ch == "o":
        return "; o marks the path, only in an answer"
    if ch in "sge":
        return "; letters are read case-sensitively: write S, G or E"
    if ch == "\t":
        return "; a tab is no cell: write spaces"
    if ch == "\ufffd":
        return "; these bytes are not UTF-8 text: save the file as UTF-8"
    return ""


def _maze_side(tokens: np.ndarray, name: str) -> int:
    """The side of a square maze's tokens [side²]; ValueError if they are not a square."""
    side = math.isqrt(tokens.size)
    if side * side != tokens.size:
        raise ValueError(f"{name}: a maze's tokens are a square row by row, got {tokens.size}")
    return side


def frame_maze(tokens: np.ndarray, side: int) -> np.ndarray:
    """A square maze (tokens [s²]) framed with walls on the right and bottom into a square of ``side`` (tokens
    [side²], the same dtype): a smaller maze for a model of a fixed size (one trained on 10x10). Walls added at the
    edge change no shortest path; :func:`crop_maze` with shape (s, s) gives the maze back.

    Raises:
        ValueError: ``tokens`` not a square, or ``side`` < s.
    """
    s = _maze_side(tokens, "frame_maze")
    if side < s:
        raise ValueError(f"frame_maze: a {s}x{s} maze does not fit a side of {side}")
    framed = np.full((side, side), WALL, tokens.dtype)
    framed[:s, :s] = tokens.reshape(s, s)
    return framed.ravel()


def crop_maze(tokens: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A maze's own rectangle (tokens [rows * cols], a copy) out of the square it was framed into (tokens [side²]):
    its top-left ``shape`` = (rows, cols).

    Raises:
        ValueError: ``tokens`` not a square, or ``shape`` not within it.
    """
    side = _maze_side(tokens, "crop_maze")
    rows, cols = shape
    if not (1 <= rows <= side and 1 <= cols <= side):
        raise ValueError(f"crop_maze: a {rows}x{cols} maze is not within a {side}x{side} square")
    return tokens.reshape(side, side)[:rows, :cols].flatten()


def maze_problems(answer: np.ndarray, maze: np.ndarray) -> list[str]:
    """What makes ``answer`` (tokens [size²]) not the solution of ``maze`` (tokens [size²]); empty when it is one.

    The solution is the maze with exactly the cells of one shortest S-to-G path marked ``o`` (4-neighbour moves over
    the open cells, S and G themselves not marked), as the maze builder writes answers (utils/data/maze.py) and the
    reference's Maze-Hard CSVs hold them. Each problem is one line: walls, S or G changed; open cells marked other
    than open or path; the marked cells do not connect S to G (broken); they do, but over more moves than the
    shortest path (breadth-first search over the maze's open cells); marked cells off that S-to-G path (a dead end,
    or a second branch of a loop).
    """
    size = int(np.sqrt(maze.size))
    problems = []
    kept = (maze != OPEN)
    if (answer[kept] != maze[kept]).any():
        problems.append(f"{int((answer[kept] != maze[kept]).sum())} wall/S/G cell(s) changed")
    if not np.isin(answer[~kept], (OPEN, PATH)).all():
        problems.append("open cells marked as something other than open or path")
    marked = (answer == PATH) & ~kept
    start, goal = (divmod(int(np.flatnonzero(maze == token)[0]), size) for token in (START, GOAL))
    shortest = _moves(maze.reshape(size, size) != WALL, start, goal)
    if shortest is None:
        return problems + ["S and G are not connected in this maze: no path can be marked"]
    walked = _moves((marked | (maze == START) | (maze == GOAL)).reshape(size, size), start, goal)
    if walked is None:
        return problems + ["broken: the marked cells do not connect S to G"]
    if walked > shortest:
        problems.append(f"not the shortest: the marked path takes {walked} moves from S to G, the shortest {shortest}")
    extra = int(marked.sum()) - (walked - 1)
    if extra:
        problems.append(f"extra cells: {extra} marked cell(s) off the path from S to G (a dead end or a second branch)")
    return problems


def count_puzzle_solutions(task: str, tokens: np.ndarray) -> int:
    """How many solutions a puzzle has, counted up to 2 (2: more than one): a Sudoku's (``tokens`` [81]) by the exact
    search of utils/data/sudoku/rating.py, a maze's (``tokens`` [size²]) as its shortest S-to-G paths (the answer a
    maze asks for, :func:`maze_problems`), 0 when S and G are not connected.

    Raises:
        ValueError: a ``task`` other than sudoku or maze.
    """
    if task == "sudoku":
        from utils.data.sudoku.rating import count_solutions  # its compiled search loads only here

        return count_solutions(np.where(tokens >= 2, tokens.astype(np.int64) - 1, 0), limit=2)
    if task != "maze":
        raise ValueError(f"count_puzzle_solutions: task {task!r} is not sudoku or maze")
    size = int(np.sqrt(tokens.size))
    start, goal = (divmod(int(np.flatnonzero(tokens == token)[0]), size) for token in (START, GOAL))
    return _shortest_paths((tokens != WALL).reshape(size, size), start, goal)


def _shortest_paths(walkable: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> int:
    """The number of shortest 4-neighbour paths from ``start`` to ``goal`` over the True cells of ``walkable``,
    counted up to 2 (0: not connected)."""
    return _breadth_first(walkable, start, goal)[1]


def _moves(walkable: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> int | None:
    """The fewest 4-neighbour moves from ``start`` to ``goal`` over the True cells of ``walkable`` (bool [size, size]);
    None when ``goal`` cannot be reached."""
    return _breadth_first(walkable, start, goal)[0]


def _breadth_first(walkable: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> tuple[int | None, int]:
    """Breadth-first search from ``start`` over the True cells of ``walkable`` (bool [size, size]), 4-neighbour moves:
    the fewest moves to ``goal`` (None when it cannot be reached) and the number of paths of that length, counted up
    to 2 (0 when it cannot be reached). Stops once every cell at ``goal``'s distance has been counted into it."""
    size = len(walkable)
    distance, paths, queue = {start: 0}, {start: 1}, deque([start])
    while queue:
        r, c = queue.popleft()
        if goal in distance and distance[r, c] >= distance[goal]:
            break  # every path into goal comes from a cell one move closer, all counted by now
        for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if not (0 <= nr < size and 0 <= nc < size and walkable[nr, nc]):
                continue
            if (nr, nc) not in distance:
                distance[nr, nc] = distance[r, c] + 1
                paths[nr, nc] = 0
                queue.append((nr, nc))
            if distance[nr, nc] == distance[r, c] + 1:
                paths[nr, nc] = min(2, paths[nr, nc] + paths[r, c])
    return distance.get(goal), paths.get(goal, 0)


def puzzle_text(task: str, tokens: np.ndarray, shape: Optional[tuple[int, int]] = None) -> str:
    """A puzzle or an answer (tokens [S]) as plain text: a Sudoku as its 81 characters row by row (``.`` blank), a
    maze as :func:`format_maze`'s rows (of its own ``shape`` where given)."""
    return "".join(_sudoku_digits(tokens)) if task == "sudoku" else format_maze(tokens, shape)


def _sudoku_digits(tokens: np.ndarray) -> list[str]:
    """Each cell of a Sudoku (tokens [81]) as one character: its digit, or ``.`` for a blank (or padding)."""
    return [str(t - 1) if 2 <= t <= 10 else "." for t in tokens.tolist()]


def format_sudoku(tokens: np.ndarray) -> str:
    """A Sudoku (tokens [81]) as 9 text rows with box separators; blanks as ``.``."""
    digits = _sudoku_digits(tokens)
    rows = []
    for r in range(9):
        row = digits[r * 9:r * 9 + 9]
        rows.append(" | ".join(" ".join(row[b:b + 3]) for b in (0, 3, 6)))
        if r in (2, 5):
            rows.append("------+-------+------")
    return "\n".join(rows)


def format_maze(tokens: np.ndarray, shape: Optional[tuple[int, int]] = None) -> str:
    """A maze as text rows over ``# SGo``: a square (tokens [side²]) as it is, or with ``shape`` = (rows, cols) the
    maze's own rectangle, cropped from the square it was framed into (tokens [side²]) or given as it is (tokens
    [rows * cols])."""
    if shape is None:
        rows = cols = _maze_side(tokens, "format_maze")
    else:
        rows, cols = shape
        tokens = tokens if tokens.size == rows * cols else crop_maze(tokens, shape)
    index = tokens.astype(np.int64) - 1
    index[(index < 0) | (index >= len(MAZE_CHARSET))] = len(MAZE_CHARSET)  # padding or out of range: "?"
    chars = np.array(list(MAZE_CHARSET + "?"))[index]
    return "\n".join("".join(row) for row in chars.reshape(rows, cols))
