"""The kept set of mazes from maze generators outside this project (utils/data/maze_outside/) is well formed.

The set checks our maze solver on mazes it was not trained on: they were written by third-party generators from
PyPI (mazelib, maze-dataset, labmaze; SOURCES.md says which, how and with what seeds), so a solver that only learnt
our own builder's quirks shows it there. None of those libraries is needed here: every check is written in this
file. For each ``*.txt`` file (mazes separated by one empty line) every maze must be a rectangular, square grid
(rows an editor shortened are padded with open cells) over ``#``, space, ``S`` and ``G`` or ``E``, with exactly one
start and one goal that a breadth-first search over 4-neighbour moves connects; a ``*_perfect`` file's mazes must
be perfect (the open cells form a tree: one path between any two). Every size 9..31 must appear for both kinds
(``*_perfect`` and ``*_cycles`` files), and the count of mazes by size and file must match SOURCES.md's table.
"""

from collections import Counter, deque
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parent.parent / "utils" / "data" / "maze_outside"
FILES = sorted(FOLDER.glob("*.txt"))
SIZES = range(9, 32)
KINDS = ("perfect", "cycles")


def read_mazes(path: Path) -> list[tuple[int, list[str]]]:
    """The mazes of a file as (first line number, rows), a maze being a run of non-empty lines."""
    mazes, rows, start = [], [], 0
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if line == "":
            if rows:
                mazes.append((start, rows))
            rows = []
        else:
            start = start if rows else number
            rows.append(line)
    if rows:
        mazes.append((start, rows))
    return mazes


def kind_of(path: Path) -> str:
    kind = path.stem.rsplit("_", 1)[-1]
    assert kind in KINDS, f"{path.name}: the name should end in _perfect or _cycles"
    return kind


def maze_problems(rows: list[str], perfect: bool) -> list[str]:
    """What is wrong with one maze (its rows, short ones padded with spaces); empty when nothing is."""
    width = max(map(len, rows))
    grid = [row.ljust(width) for row in rows]
    problems = []
    if len(grid) != width:
        problems.append(f"{len(grid)} rows of {width} columns: not square")
    if not set("".join(grid)) <= set("# SGE"):
        problems.append(f"characters other than '# SGE': {sorted(set(''.join(grid)) - set('# SGE'))}")
    found = {ch: [(r, c) for r, row in enumerate(grid) for c, cell in enumerate(row) if cell == ch] for ch in "SGE"}
    if len(found["S"]) != 1 or len(found["G"]) + len(found["E"]) != 1:
        return problems + [f"{len(found['S'])} S and {len(found['G']) + len(found['E'])} G/E: want one of each"]
    (start,), (goal,) = found["S"], found["G"] + found["E"]

    def open_cell(r: int, c: int) -> bool:
        return 0 <= r < len(grid) and 0 <= c < width and grid[r][c] != "#"

    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        for step in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if open_cell(*step) and step not in seen:
                seen.add(step)
                queue.append(step)
    if goal not in seen:
        problems.append(f"S at {start} does not connect to the goal at {goal}")
    if perfect:
        cells = sum(open_cell(r, c) for r in range(len(grid)) for c in range(width))
        edges = sum(open_cell(r, c) and open_cell(r + 1, c) for r in range(len(grid)) for c in range(width)) + \
            sum(open_cell(r, c) and open_cell(r, c + 1) for r in range(len(grid)) for c in range(width))
        if len(seen) != cells or edges != cells - 1:
            problems.append(f"not perfect: {cells} open cells, {len(seen)} reached from S, {edges} links (a tree "
                            f"has {cells - 1})")
    return problems


def sources_counts() -> dict[str, Counter]:
    """SOURCES.md's table of mazes by size: file name -> Counter(size -> count)."""
    lines = (FOLDER / "SOURCES.md").read_text(encoding="utf-8").splitlines()
    head = next(i for i, line in enumerate(lines) if line.replace(" ", "").startswith("|size|"))
    names = [cell.strip() for cell in lines[head].strip("|").split("|")][1:]
    counts = {name: Counter() for name in names if name.endswith(".txt")}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].isdigit():
            for name, cell in zip(names, cells[1:]):
                if name in counts and int(cell):
                    counts[name][int(cells[0])] = int(cell)
    return counts


def test_the_set_is_there():
    assert FILES, f"no *.txt in {FOLDER}"
    assert (FOLDER / "SOURCES.md").is_file()


@pytest.mark.parametrize("path", FILES, ids=[path.name for path in FILES])
def test_every_maze_is_well_formed(path):
    problems, perfect = [], kind_of(path) == "perfect"
    mazes = read_mazes(path)
    assert mazes, f"{path.name}: no maze"
    for line, rows in mazes:
        problems += [f"{path.name} line {line}: {problem}" for problem in maze_problems(rows, perfect)]
    assert not problems, "\n".join(problems)


def test_every_size_appears_for_both_kinds():
    sizes = {kind: set() for kind in KINDS}
    for path in FILES:
        sizes[kind_of(path)].update(len(rows) for _, rows in read_mazes(path))
    for kind in KINDS:
        missing = sorted(set(SIZES) - sizes[kind])
        assert not missing, f"no {kind} maze of size {missing}"
        assert sizes[kind] <= set(SIZES), f"{kind} mazes of sizes outside 9..31: {sorted(sizes[kind] - set(SIZES))}"


def test_counts_match_sources_table():
    table = sources_counts()
    assert sorted(table) == [path.name for path in FILES], "SOURCES.md's table and the folder's files differ"
    for path in FILES:
        counted = Counter(len(rows) for _, rows in read_mazes(path))
        assert counted == table[path.name], f"{path.name}: mazes by size {dict(sorted(counted.items()))}, " \
                                            f"SOURCES.md says {dict(sorted(table[path.name].items()))}"


def test_both_goal_spellings_and_open_borders_appear():
    """Our reader is exercised on the common spellings: goal G and E, an outer wall and none."""
    goals, open_borders = Counter(), 0
    for path in FILES:
        for _, rows in read_mazes(path):
            grid = [row.ljust(max(map(len, rows))) for row in rows]
            goals["E" if "E" in "".join(grid) else "G"] += 1
            sides = (grid[0], grid[-1], "".join(row[0] for row in grid), "".join(row[-1] for row in grid))
            open_borders += all(side.strip("#") for side in sides)  # each side has an open cell: no outer wall
    assert goals["G"] and goals["E"], f"goal spellings: {dict(goals)}"
    assert open_borders, "no maze without an outer wall"
