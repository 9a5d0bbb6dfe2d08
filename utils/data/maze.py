"""Build a maze dataset (Maze-Hard) in the HRM on-disk format (see utils/data/puzzle_dataset.py).

Three sources:
  * by default, the reference CSVs (``train.csv``, ``test.csv``; columns ``source,question,answer,rating``) of
    the Hugging Face dataset ``sapientinc/maze-30x30-hard-1k`` (``--repo``, ``--revision`` pick another),
    downloaded into the Hugging Face cache as the reference builder downloads them (utils/data/hub_source.py).
    Each maze is a size*size string over ``"# SGo"`` (wall, open, start, goal, path), row-major; the answer is
    the question with its shortest path marked ``o`` (S and G stay);
  * ``--source-dir DIR``: a local copy of those CSVs (the same CSVs give byte-identical arrays);
  * ``--generate``: offline generation of mazes whose shortest path is unique: Maze-Hard's random walls
    (:func:`generate_maze`), depth-first-search lattice mazes with and without cycles (``--layout lattice``,
    :func:`generate_lattice_maze`) or either at random (``--layout mixed``); of one size, or of sides drawn from
    [``--min-size``, ``--size``] and framed with walls on the size x size canvas (:func:`generate_framed_maze`).

The format follows the reference builder (``sapientinc/HRM`` dataset/build_maze_dataset.py):
``"# SGo"`` -> tokens 1..5 with pad 0 (vocab 6), seq_len = size², ``ignore_label_id`` 0 (the pad,
which never occurs, so every cell is supervised, walls included), one puzzle identifier (0). With
``--aug`` each training maze becomes 8 one-example puzzles, its dihedral transforms t0..t7 in the
reference's order (``dataset/common.py`` ``dihedral_transform``), forming one group; without it, each
maze is its own group. The test set is never augmented. ``dataset.json`` also carries TRM's
``total_puzzles`` field (``SamsungSAILMontreal/TinyRecursiveModels``, same builder), so the TRM loader
reads the output too; like TRM's builder it holds the number of groups.

Examples (the reference "Maze-Hard 30x30 1k" with augmentation, the TRM recipe; mixed sizes and kinds for a
size-agnostic model):
    python scripts/build_maze_dataset.py --output-dir data/maze-30x30-hard-1k-aug --aug
    python scripts/build_maze_dataset.py --generate --layout mixed --size 16 --min-size 6 --train-size 24000 \
        --test-size 256 --aug --workers 2 --output-dir data/maze-mixed-6to16
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
from functools import partial
from pathlib import Path

import numpy as np
from tqdm import tqdm

from utils.data import common
from utils.data.common import (add_output_arguments, add_source_arguments, add_to_metadata, check_output_dir,
                               check_source_and_sizes, csv_source, dihedral, staged_dataset, write_one_example_split)
from utils.data.puzzle_dataset import DatasetError
from utils.cli import ArgumentParser, add_workers_argument, number_in

HUB_REPO = "sapientinc/maze-30x30-hard-1k"  # the reference builder's source_repo
CHARSET = "# SGo"  # token = index + 1; 0 is the pad
WALL, OPEN, START, GOAL, PATH = range(1, 6)
VOCAB_SIZE = len(CHARSET) + 1
CSV_COLUMNS = ("source", "question", "answer", "rating")
NUM_DIHEDRAL = 8

# "Hard" (HRM paper, Maze-Hard): a shortest path of at least 110 steps (moves) on a 30x30 grid.
REFERENCE_SIZE, REFERENCE_MIN_PATH = 30, 110
# The shortest path between far points of a random 2-D site-percolation cluster grows as size**1.13
# (the chemical-distance exponent d_min ~ 1.13); scaling the threshold this way keeps the share of
# random mazes that qualify about the same at every size (about 0.5% for walls at 30-50%).
CHEMICAL_DISTANCE_EXPONENT = 1.13
WALL_DENSITY = (0.3, 0.5)  # Lehnert et al. 2024 (the maze generator HRM's Maze-Hard filters): 30-50% walls
MAX_ATTEMPTS = 20_000  # random wall layouts tried per maze before giving up (about 100x the need at the defaults)

TIES = ("wall", "first")  # --ties: wall cells until the shortest path is unique, or keep them and mark the first
LAYOUTS = ("random", "lattice", "mixed")  # --layout: Maze-Hard's random walls, depth-first lattice mazes, or either
MIXED_LATTICE_SHARE = 0.5  # --layout mixed: the probability that a maze is a lattice maze
# The smallest --min-size: a random 4x4 layout never has the 11-move path its threshold asks for (none in 20,000
# draws), and the smallest lattice maze with two cells apart is 5x5 (a 4x4 one is a 5x5 less two walls).
MIN_SIZE = 5
CYCLE_PROB = 0.5  # --cycle-prob: the probability that a lattice maze is braided (has cycles)
BRAID_FRACTION = (0.03, 0.15)  # a braided maze opens a share drawn from this range of its closed interior walls
LATTICE_NO_OUTER_WALL = 0.25  # an odd-sided lattice maze comes without its outer wall this often
LATTICE_EVEN_PAD = 0.5  # an even-sided one is a smaller lattice plus a wall row and column this often, else a larger
                        # one less its outer wall on two sides: outside generators' mazes come both ways

_TOKEN_OF_BYTE = np.zeros(256, np.uint8)  # byte -> token, 0 = not a maze character
_TOKEN_OF_BYTE[np.frombuffer(CHARSET.encode(), np.uint8)] = np.arange(1, len(CHARSET) + 1)


def default_min_path_length(size: int) -> int:
    """The "hard" threshold in steps: 110 at size 30 (HRM), scaled as ``110 * (size / 30) ** 1.13`` elsewhere."""
    return max(1, round(REFERENCE_MIN_PATH * (size / REFERENCE_SIZE) ** CHEMICAL_DISTANCE_EXPONENT))


def encode_maze(text: str) -> np.ndarray:
    """A maze string over ``"# SGo"`` -> uint8 [len] tokens 1..5 (0 where a character is not in the charset)."""
    return _TOKEN_OF_BYTE[np.frombuffer(text.encode("utf-8"), np.uint8)]


def decode_maze(tokens: np.ndarray) -> str:
    """uint8 tokens 1..5 (any shape) -> the row-major maze string over ``"# SGo"``."""
    return "".join(CHARSET[t - 1] for t in np.asarray(tokens).ravel().tolist())


# ----------------------------------------------------------------------------------------
# Reference CSV


def _check_row(where: str, q: str, a: str, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of one CSV row (question, answer), or a DatasetError naming what is wrong."""
    if len(q) != seq_len or len(a) != seq_len:
        raise DatasetError(f"{where}: question and answer must be {seq_len} characters (the first maze's size), "
                           f"got {len(q)} and {len(a)}")
    tq, ta = encode_maze(q), encode_maze(a)
    if len(tq) != seq_len or len(ta) != seq_len or not (tq.all() and ta.all()):
        raise DatasetError(f"{where}: question/answer may only hold the characters '#', ' ', 'S', 'G', 'o'")
    if (tq == PATH).any():
        raise DatasetError(f"{where}: the question marks path cells 'o'; only the answer may")
    if not np.array_equal(np.where(ta == PATH, OPEN, ta), tq):
        raise DatasetError(f"{where}: the answer is not the question with path cells marked 'o' "
                           f"(first difference at cell {int(np.argmax(np.where(ta == PATH, OPEN, ta) != tq))})")
    for token, name in ((START, "start 'S'"), (GOAL, "goal 'G'")):
        count = int((tq == token).sum())
        if count != 1:
            raise DatasetError(f"{where}: the maze must have exactly one {name}, found {count}")
    return tq, ta


def read_maze_csv(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read a reference maze CSV (a header row, then ``source,question,answer,rating`` rows).

    As in the reference builder, the header's names and the ``source`` and ``rating`` columns are not
    used. Every maze must have the size of the first one (a square), exactly one S and one G, and an
    answer that is the question plus ``o`` path cells.

    Returns:
        questions, answers: uint8 [N, size, size] tokens (``"# SGo"`` -> 1..5).
    Raises:
        DatasetError: missing or non-UTF-8 file, no header, or a malformed row (message gives file:line).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path} not found: --source-dir must hold the maze train.csv and test.csv "
                           "(Hugging Face dataset sapientinc/maze-30x30-hard-1k)")
    questions, answers, seq_len = [], [], None
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise DatasetError(f"{path}: empty file; expected a header {','.join(CSV_COLUMNS)} and maze rows")
            if len(header) != 4 or (header[1] and not set(header[1]) - set(CHARSET)):
                raise DatasetError(f"{path}:1: expected the header row {','.join(CSV_COLUMNS)}, got {header}")
            for row in tqdm(reader, desc=f"read {path.name}", unit="maze"):
                where = f"{path}:{reader.line_num}"
                if not row:
                    continue  # blank line
                if len(row) != 4:
                    raise DatasetError(f"{where}: expected 4 columns ({','.join(CSV_COLUMNS)}), got {len(row)}")
                q, a = row[1], row[2]
                if seq_len is None:
                    size = math.isqrt(len(q))
                    if size < 2 or size * size != len(q):
                        raise DatasetError(f"{where}: a maze must be a square of size*size characters (size >= 2), "
                                           f"got {len(q)}")
                    seq_len = len(q)
                tq, ta = _check_row(where, q, a, seq_len)
                questions.append(tq)
                answers.append(ta)
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path} is not UTF-8 text ({e.reason}); maze CSVs are ASCII: re-save it as UTF-8") from None
    except csv.Error as e:
        raise DatasetError(f"{path}: not a readable CSV ({e})") from None
    if not questions:
        raise DatasetError(f"{path}: no mazes after the header")
    size = math.isqrt(seq_len)
    return np.stack(questions).reshape(-1, size, size), np.stack(answers).reshape(-1, size, size)


# ----------------------------------------------------------------------------------------
# Generation. The open cells of a maze are one Python int, cell (r, c) at bit r*(size+1) + c; the
# spare column keeps a shift by one bit from wrapping into the next row. A breadth-first search is
# then a few big-integer operations per level, several times faster than a queue over cells.


def _to_bits(cells: np.ndarray) -> int:
    """[size, size] bool -> bit set."""
    size = len(cells)
    padded = np.zeros((size, size + 1), bool)
    padded[:, :size] = cells
    return int.from_bytes(np.packbits(padded.ravel(), bitorder="little").tobytes(), "little")


def _from_bits(bits: int, size: int) -> np.ndarray:
    """Bit set -> [size, size] bool."""
    n = size * (size + 1)
    raw = np.frombuffer(bits.to_bytes((n + 7) // 8, "little"), np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].reshape(size, size + 1)[:, :size].astype(bool)


def _random_cell(bits: int, size: int, rng: np.random.Generator) -> int:
    """One set bit of ``bits`` (non-empty), uniformly at random, as a one-bit mask."""
    rows, cols = np.nonzero(_from_bits(bits, size))
    k = int(rng.integers(len(rows)))
    return 1 << (int(rows[k]) * (size + 1) + int(cols[k]))


def _levels(open_bits: int, start: int, size: int, depth: int | None = None) -> list[int]:
    """Breadth-first levels from ``start``: ``levels[k]`` is the set of open cells at distance k (4-neighbour moves).

    Stops after level ``depth`` or when no cell is left to reach.
    """
    stride = size + 1
    unseen = open_bits & ~start
    front, levels = start, [start]
    while depth is None or len(levels) <= depth:
        front = ((front << 1) | (front >> 1) | (front << stride) | (front >> stride)) & unseen
        if not front:
            break
        unseen ^= front
        levels.append(front)
    return levels


def _dag_layers(open_bits: int, s: int, g: int, size: int) -> list[int]:
    """Cells on shortest s-g paths by distance from s: D + 1 disjoint bit sets ([] when g is unreachable).

    Layer k holds the cells at distance k from s and D - k from g; the shortest path is unique exactly
    when every layer has one cell.
    """
    from_start = _levels(open_bits, s, size)
    distance = next((k for k, level in enumerate(from_start) if level & g), None)
    if distance is None:
        return []
    from_goal = _levels(open_bits, g, size, distance)
    return [from_start[k] & from_goal[distance - k] for k in range(distance + 1)]


def generate_maze(rng: np.random.Generator, size: int = REFERENCE_SIZE, min_path_length: int | None = None,
                  wall_density: tuple[float, float] = WALL_DENSITY, ties: str = "wall") -> tuple[np.ndarray, np.ndarray]:
    """One hard maze whose shortest path from S to G is unique (the ``random`` layout).

    The HRM paper builds Maze-Hard with the generator of Lehnert et al. 2024 ("Beyond A*": each cell
    is a wall at random, 30-50% walls, random start and goal) and keeps mazes whose shortest path has
    at least 110 steps. This does the same, then makes the path unique:

    1. Walls are drawn independently with a probability drawn uniformly from ``wall_density``.
    2. S is a farthest cell from a random open cell; G is drawn uniformly from the cells at least
       ``min_path_length`` moves from S. Layouts with no such cell are redrawn (about 1 in 200 qualifies).
    3. While some distance k has two or more cells on shortest S-G paths, one of them, drawn at random,
       becomes a wall. The others at distance k still carry a shortest path, so the length stays the
       same and the number of shortest paths falls; at the end there is exactly one. (With ``ties`` ``first``
       instead, the maze is kept with all its shortest paths and the first is marked: :func:`mark_first_path`.)

    Args:
        rng: the random stream.
        size: grid side; the sequence has size² cells.
        min_path_length: at least this many moves from S to G; None: :func:`default_min_path_length`.
        wall_density: (low, high) wall probability range, 0 <= low <= high < 1.
        ties: ``wall`` (step 3) or ``first`` (:data:`TIES`).
    Returns:
        (question, answer): uint8 [size, size] tokens (1 wall, 2 open, 3 S, 4 G); the answer marks the
        cells of the path between S and G with 5.
    Raises:
        DatasetError: no qualifying layout in ``MAX_ATTEMPTS`` draws (the threshold is too high for the size).
    """
    min_path_length = default_min_path_length(size) if min_path_length is None else min_path_length
    for _ in range(MAX_ATTEMPTS):
        cells = rng.random((size, size)) >= rng.uniform(*wall_density)
        if cells.sum() <= min_path_length:
            continue
        open_bits = _to_bits(cells)
        ends = _pick_ends(open_bits, open_bits, size, min_path_length, rng)
        if ends is not None:
            break
    else:
        raise DatasetError(f"no {size}x{size} maze with a shortest path of >= {min_path_length} steps in {MAX_ATTEMPTS} "
                           f"random layouts; lower --min-path-length (default for this size: "
                           f"{default_min_path_length(size)})")
    return _solve(open_bits, *ends, size, rng, ties)


def _pick_ends(open_bits: int, ends: int, size: int, min_path_length: int, rng: np.random.Generator,
               farthest_if_none: bool = False) -> tuple[int, int] | None:
    """S and G (one-bit masks) among the cells ``ends`` (a subset of ``open_bits``), or None.

    S is a farthest end from a random end (the first sweep of the double-sweep diameter bound); G is drawn
    uniformly from the ends at least ``min_path_length`` moves from S. When no end is that far: None, so the
    caller redraws the walls (the random layout), or with ``farthest_if_none`` a random farthest end (the lattice
    layout, which keeps every maze). Without ``farthest_if_none``, a layout is given up after the first sweep when
    no two of its cells can be that far apart (the distance between any two is at most twice the first end's
    eccentricity), which saves most of the second sweep on the many layouts that fail.
    """
    levels = _levels(open_bits, _random_cell(ends, size, rng), size)
    if not farthest_if_none and 2 * (len(levels) - 1) < min_path_length:
        return None
    s = _random_cell(next(level & ends for level in reversed(levels) if level & ends), size, rng)
    levels = _levels(open_bits, s, size)
    far = 0
    for level in levels[min_path_length:]:
        far |= level & ends
    if not far:
        if not farthest_if_none:
            return None
        far = next(level & ends for level in reversed(levels) if level & ends)
    return s, _random_cell(far, size, rng)


def _solve_uniquely(open_bits: int, s: int, g: int, size: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Wall cells until the shortest s-g path is unique (step 3 of :func:`generate_maze`); the maze and its answer.

    Returns:
        (question, answer): uint8 [size, size] tokens, as :func:`generate_maze`.
    """
    while True:
        layers = _dag_layers(open_bits, s, g, size)
        ambiguous = [layer for layer in layers if layer & (layer - 1)]  # two or more cells
        if not ambiguous:
            break
        open_bits &= ~_random_cell(ambiguous[int(rng.integers(len(ambiguous)))], size, rng)
    question = _question(open_bits, s, g, size)
    path = _from_bits(sum(layers[1:-1]), size)  # layers are disjoint: the sum is their union
    return question, np.where(path, PATH, question).astype(np.uint8)


def _question(open_bits: int, s: int, g: int, size: int) -> np.ndarray:
    """uint8 [size, size] tokens: the open cells of ``open_bits`` with S at ``s`` and G at ``g``, walls elsewhere."""
    question = np.where(_from_bits(open_bits, size), OPEN, WALL).astype(np.uint8)
    question[_from_bits(s, size)] = START
    question[_from_bits(g, size)] = GOAL
    return question


def _solve(open_bits: int, s: int, g: int, size: int, rng: np.random.Generator,
           ties: str) -> tuple[np.ndarray, np.ndarray]:
    """The maze and its answer: with ``ties`` ``wall`` its shortest path made unique (:func:`_solve_uniquely`),
    with ``first`` the maze kept as it is and its first shortest path marked (:func:`mark_first_path`)."""
    if ties == "wall":
        return _solve_uniquely(open_bits, s, g, size, rng)
    question = _question(open_bits, s, g, size)
    return question, mark_first_path(question)


# The order in which mark_first_path prefers the next cell of a path: up, left, down, right.
FIRST_PATH_MOVES = ("up", "left", "down", "right")


def mark_first_path(question: np.ndarray) -> np.ndarray:
    """The answer to a maze marking its *first* shortest S-G path: from S, each next cell is the first of the current
    cell's neighbours in the order of :data:`FIRST_PATH_MOVES` that lies on a shortest path to G (its distance from
    S one more, to G one less). A maze with several shortest paths then has one answer, a rule a local, recurrent
    model can follow (a breadth-first wave from G, then a walk from S); the rule turns with the maze, so a view of
    the maze has its own first path (:func:`_write_split` marks each).

    Args:
        question: uint8 [n, n] tokens with one S and one G that connect (1 wall, 2 open, 3 S, 4 G).
    Returns:
        uint8 [n, n]: ``question`` with the path's cells between S and G marked 5.
    Raises:
        DatasetError: S and G do not connect.
    """
    size = len(question)
    open_bits = _to_bits(question != WALL)
    s, g = (_to_bits(question == token) for token in (START, GOAL))
    layers = _dag_layers(open_bits, s, g, size)
    if not layers:
        raise DatasetError("mark_first_path: S and G do not connect")
    stride, cell, path = size + 1, s, 0
    for layer in layers[1:-1]:
        # The spare column of the bit layout keeps a move left or right from wrapping into another row.
        cell = next(step for step in (cell >> stride, cell >> 1, cell << stride, cell << 1) if step & layer)
        path |= cell
    return np.where(_from_bits(path, size), PATH, question).astype(np.uint8)


# Lattice mazes: cells at odd coordinates of a (2n+1)-grid, the cells between them passages or walls, the
# even-even points always walls (posts).


def carve_lattice(rng: np.random.Generator, cells: int) -> np.ndarray:
    """A perfect maze on ``cells`` x ``cells`` lattice cells: a randomized depth-first search (the recursive
    backtracker, run with an explicit stack), so the open cells form a tree (Buck, *Mazes for Programmers*, 2015).

    Args:
        cells: lattice cells per side, >= 1.
    Returns:
        bool [2*cells + 1, 2*cells + 1], True where open: every cell (odd row and column), the passages the search
        carved between them; the outer wall, the posts and the other walls False.
    """
    grid = np.zeros((2 * cells + 1, 2 * cells + 1), bool)
    visited = [[False] * cells for _ in range(cells)]
    r, c = divmod(int(rng.integers(cells * cells)), cells)
    stack = [(r, c)]
    visited[r][c] = grid[2 * r + 1, 2 * c + 1] = True
    picks = iter(rng.random(cells * cells).tolist())  # one draw per carved passage, cells² - 1 of them
    while stack:
        r, c = stack[-1]
        fresh = [(r + dr, c + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))
                 if 0 <= r + dr < cells and 0 <= c + dc < cells and not visited[r + dr][c + dc]]
        if not fresh:
            stack.pop()  # a dead end: back up to the last cell with an unvisited neighbour
            continue
        nr, nc = fresh[int(next(picks) * len(fresh))]
        visited[nr][nc] = True
        grid[2 * nr + 1, 2 * nc + 1] = grid[r + nr + 1, c + nc + 1] = True  # the cell and the passage to it
        stack.append((nr, nc))
    return grid


def braid_lattice(rng: np.random.Generator, grid: np.ndarray, fraction: float) -> np.ndarray:
    """Open ``fraction`` (at least one) of the walls that separate two cells of a lattice maze: each makes a cycle.

    Args:
        grid: bool [2n+1, 2n+1] lattice maze (as :func:`carve_lattice`).
        fraction: share of the closed interior walls to open, in [0, 1].
    Returns:
        bool [2n+1, 2n+1], a copy with the chosen walls open (unchanged when no interior wall is closed).
    """
    grid = grid.copy()
    rows, cols = np.nonzero(~grid)
    inner = (rows > 0) & (rows < len(grid) - 1) & (cols > 0) & (cols < len(grid) - 1)
    between = inner & ((rows % 2) != (cols % 2))  # one odd coordinate: a wall between two cells, not a post
    rows, cols = rows[between], cols[between]
    if len(rows):
        chosen = rng.choice(len(rows), size=max(1, round(fraction * len(rows))), replace=False)
        grid[rows[chosen], cols[chosen]] = True
    return grid


def _lattice_layout(rng: np.random.Generator, side: int, cycle_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """A lattice maze of exactly ``side`` x ``side`` (>= 4), with or without its outer wall.

    An odd side is the side-lattice (outer wall on all four sides), or with probability
    :data:`LATTICE_NO_OUTER_WALL` the (side + 2)-lattice less its whole outer wall. An even side is, with
    probability :data:`LATTICE_EVEN_PAD`, the (side - 1)-lattice with a wall row and a wall column added on a random
    side each (when side - 1 >= 5: a 3-lattice has one cell), else the (side + 1)-lattice less its outer wall on one
    random side of each axis. With probability ``cycle_prob`` the maze is braided (:func:`braid_lattice`, a share of
    :data:`BRAID_FRACTION`).

    Returns:
        open, cells: bool [side, side]; the open cells, and the lattice's cells (where S and G may go).
    """
    if side % 2:
        pad = False
        span = side + 2 if rng.random() < LATTICE_NO_OUTER_WALL else side
    else:
        pad = side - 1 >= 5 and rng.random() < LATTICE_EVEN_PAD
        span = side - 1 if pad else side + 1
    grid = carve_lattice(rng, (span - 1) // 2)
    if rng.random() < cycle_prob:
        grid = braid_lattice(rng, grid, rng.uniform(*BRAID_FRACTION))
    cells = np.zeros_like(grid)
    cells[1::2, 1::2] = True
    if span != side:
        top, left = (int(x) for x in rng.integers(2, size=2)) if side % 2 == 0 else (1, 1)
        if pad:  # a wall row above or below, a wall column left or right
            width = ((top, 1 - top), (left, 1 - left))
            grid, cells = np.pad(grid, width), np.pad(cells, width)
        else:  # drop the outer wall's first or last row and column (both, for an odd side)
            grid, cells = grid[top:top + side, left:left + side], cells[top:top + side, left:left + side]
    return grid, cells


def generate_lattice_maze(rng: np.random.Generator, size: int, min_path_length: int | None = None,
                          cycle_prob: float = CYCLE_PROB, ties: str = "wall") -> tuple[np.ndarray, np.ndarray]:
    """One lattice maze (the ``lattice`` layout) whose shortest path from S to G is unique.

    The layout is :func:`_lattice_layout`'s: a perfect maze by randomized depth-first search (long corridors, one
    path between any two cells), braided with probability ``cycle_prob``, with or without its outer wall. S and G
    go on lattice cells, as :func:`generate_maze` picks them: S a farthest cell from a random cell, G drawn from the
    cells at least ``min_path_length`` moves from S, or among the farthest when none is (no layout is redrawn). A
    braided maze's shortest path is then made unique as :func:`generate_maze` does it (or with ``ties`` ``first``
    kept, its first shortest path marked); a perfect maze's already is.

    Args:
        rng: the random stream.
        size: grid side, >= 4.
        min_path_length: G is at least this many moves from S where the maze allows; None:
            :func:`default_min_path_length`.
        cycle_prob: probability of braiding, in [0, 1].
    Returns:
        (question, answer): uint8 [size, size] tokens, as :func:`generate_maze`.
    """
    if size < 4:
        raise DatasetError(f"a lattice maze needs a side of 4 or more (two cells apart), got {size}")
    min_path_length = default_min_path_length(size) if min_path_length is None else min_path_length
    grid, cells = _lattice_layout(rng, size, cycle_prob)
    open_bits = _to_bits(grid)
    ends = _pick_ends(open_bits, _to_bits(cells & grid), size, min_path_length, rng, farthest_if_none=True)
    return _solve(open_bits, *ends, size, rng, ties)


def side_min_path_length(min_path_length: int | None, size: int, side: int) -> int:
    """The threshold for a maze of side ``side`` framed on a ``size`` canvas: ``min_path_length`` (the threshold at
    ``size``) scaled as the default scales, ``round(L * (side / size) ** 1.13)`` (at least 1); None:
    :func:`default_min_path_length` of ``side``."""
    if min_path_length is None:
        return default_min_path_length(side)
    return max(1, round(min_path_length * (side / size) ** CHEMICAL_DISTANCE_EXPONENT))


def generate_framed_maze(rng: np.random.Generator, size: int, min_size: int | None = None, layout: str = "random",
                         min_path_length: int | None = None, wall_density: tuple[float, float] = WALL_DENSITY,
                         cycle_prob: float = CYCLE_PROB,
                         ties: str = "wall") -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    """One maze of a random side in [``min_size``, ``size``] and of ``layout``, framed with walls on a size x size canvas.

    The side is drawn uniformly, then the layout (``mixed``: lattice with probability :data:`MIXED_LATTICE_SHARE`),
    the maze (:func:`generate_maze` or :func:`generate_lattice_maze`, at :func:`side_min_path_length`), and its
    top-left corner on the canvas, uniformly. Walls around a maze change none of its paths, so the answer stays its
    unique shortest path. With ``min_size`` None or ``size`` nothing is drawn but the maze: ``layout`` random then
    gives exactly ``generate_maze(rng, size, min_path_length, wall_density)``.

    Returns:
        (question, answer, (top, left, side)): uint8 [size, size] tokens as :func:`generate_maze`, wall (1) outside
        rows top..top+side-1 and columns left..left+side-1, where the maze is.
    """
    side = size if min_size is None or min_size == size else int(rng.integers(min_size, size + 1))
    lattice = layout == "lattice" or (layout == "mixed" and rng.random() < MIXED_LATTICE_SHARE)
    threshold = side_min_path_length(min_path_length, size, side)
    if lattice:
        question, answer = generate_lattice_maze(rng, side, threshold, cycle_prob, ties)
    else:
        question, answer = generate_maze(rng, side, threshold, wall_density, ties)
    if side == size:
        return question, answer, (0, 0, size)
    top, left = (int(x) for x in rng.integers(size - side + 1, size=2))
    framed = np.full((2, size, size), WALL, np.uint8)
    framed[:, top:top + side, left:left + side] = question, answer
    return framed[0], framed[1], (top, left, side)


def maze_key(question: np.ndarray) -> bytes:
    """The same bytes for a maze and each of its 8 dihedral transforms (the smallest of their encodings).

    ``question``: [H, W] tokens, square or not (the shape is part of the key, so a 2x3 maze never meets a 3x2 one
    with the same bytes).
    """
    return min(f"{h}x{w}:".encode() + np.ascontiguousarray(grid).tobytes()
               for grid in (dihedral(question, t) for t in range(NUM_DIHEDRAL)) for h, w in [grid.shape])


def unframe(question: np.ndarray) -> np.ndarray:
    """[size, size] tokens -> the smallest [H, W] window holding every cell that is not a wall: the maze without the
    frame of walls it sits in (and without its own outer wall, which is part of no path either)."""
    rows, cols = np.flatnonzero((question != WALL).any(1)), np.flatnonzero((question != WALL).any(0))
    return question[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]


def _generate_one(index: int, seed: int, stream: int, **settings) -> tuple[np.ndarray, np.ndarray]:
    # Each maze has its own RNG, so the output does not depend on --workers.
    question, answer, _ = generate_framed_maze(np.random.default_rng([seed, stream, index]), **settings)
    return question, answer


def generate_distinct(count: int, seed: int, stream: int, size: int, min_path_length: int | None,
                      wall_density: tuple[float, float] = WALL_DENSITY, workers: int = 1,
                      exclude: set[bytes] | None = None, desc: str = "generate", *, min_size: int | None = None,
                      layout: str = "random", cycle_prob: float = CYCLE_PROB,
                      ties: str = "wall") -> tuple[np.ndarray, np.ndarray, set[bytes]]:
    """Generate ``count`` mazes (:func:`generate_framed_maze`), no two equal up to a dihedral transform, none in
    ``exclude``.

    Maze k of ``stream`` is drawn from the RNG seeded ``[seed, stream, k]``; a rejected maze is
    replaced by the next index. Keys are :func:`maze_key`, of the maze :func:`unframe` gives when sides vary, so
    the same maze at two places on the canvas is one maze (and a test maze is never a training maze moved).

    Returns:
        questions, answers uint8 [count, size, size] tokens, and the keys seen (``exclude`` plus the new ones).
    """
    work = partial(_generate_one, seed=seed, stream=stream, size=size, min_size=min_size, layout=layout,
                   min_path_length=min_path_length, wall_density=wall_density, cycle_prob=cycle_prob, ties=ties)
    framed = min_size is not None and min_size != size
    key = (lambda q, a: maze_key(unframe(q))) if framed else (lambda q, a: maze_key(q))
    return common.generate_distinct(work, key, count, workers, exclude, desc, unit="maze", chunksize=4)


# ----------------------------------------------------------------------------------------
# Writing


def _write_split(directory: Path, questions: np.ndarray, answers: np.ndarray, aug: bool, ties: str = "wall") -> None:
    """Write one split: group g is maze g (t0) followed, with ``aug``, by its dihedral transforms t1..t7 (with
    ``ties`` ``first``, each view's answer its own first shortest path, :func:`mark_first_path`)."""
    n, size, _ = questions.shape
    transforms = range(NUM_DIHEDRAL) if aug else range(1)
    views = [dihedral(questions, t) for t in transforms]
    inputs = np.stack(views, axis=1).reshape(-1, size * size)
    if ties == "first":
        labels = np.stack([[mark_first_path(q) for q in view] for view in views], axis=1).reshape(-1, size * size)
    else:
        labels = np.stack([dihedral(answers, t) for t in transforms], axis=1).reshape(-1, size * size)
    write_one_example_split(directory, inputs, labels, len(transforms), VOCAB_SIZE)


def build_maze_dataset(output_dir: str | os.PathLike, *, source_dir: str | os.PathLike | None = None,
                       generate: bool = False, size: int = REFERENCE_SIZE, train_size: int = 1000, test_size: int = 1000,
                       min_path_length: int | None = None, wall_density: tuple[float, float] = WALL_DENSITY,
                       subsample_size: int | None = None, aug: bool = False, seed: int = 0, workers: int = 1,
                       overwrite: bool = False, repo: str | None = None, revision: str | None = None,
                       min_size: int | None = None, layout: str = "random", cycle_prob: float | None = None,
                       ties: str = "wall") -> Path:
    """Build a maze dataset at ``output_dir`` from the reference CSVs (the Hugging Face Hub's, or a local copy) or by
    generation.

    The dataset is written to a temporary sibling directory and renamed into place, so an interrupted
    build never leaves a half-written dataset. Deterministic for a given seed (also for any
    ``workers``). Generated mazes are pairwise distinct up to the 8 dihedral transforms, so no test
    maze is a training maze or an augmentation of one. A Hub build's ``dataset.json`` also records, under
    ``source``, the repo, the commit and each CSV's SHA-256 and rows; its other files are byte-identical to a
    ``source_dir`` build of the same CSVs. A generated build with ``min_size`` < ``size`` or a ``layout`` other than
    random records its settings in each split's ``dataset.json`` under ``generation`` (layout, size, min_size,
    min_path_length, wall_density and/or cycle_prob, seed); a default build's files are as before these options.

    Args:
        output_dir: dataset root to create (see utils/data/puzzle_dataset.py for the layout).
        source_dir: directory with ``train.csv`` and ``test.csv`` (exclusive with ``generate``). With neither,
            the CSVs of the Hub dataset ``repo`` (default :data:`HUB_REPO`) at ``revision`` (default ``main``),
            fetched into the Hugging Face cache (utils/data/hub_source.py).
        generate: generate ``train_size`` + ``test_size`` mazes on a ``size`` x ``size`` canvas
            (:func:`generate_framed_maze`).
        min_path_length: generated mazes' shortest path in moves is at least this (None: 110 at size 30, scaled); with
            ``min_size``, the threshold at ``size``, scaled to each maze's side (:func:`side_min_path_length`).
        wall_density: (low, high) wall probability range for generation (random mazes).
        subsample_size: keep this many randomly chosen training mazes (before augmentation).
        aug: 8 dihedral copies of each training maze (the test set is not augmented).
        workers: processes for generation.
        overwrite: replace an existing dataset at ``output_dir``.
        min_size: generated mazes' sides are drawn from [``min_size``, ``size``] and framed with walls on the size x
            size canvas (None: all ``size``); ``MIN_SIZE`` or more.
        layout: ``random`` (Maze-Hard: :func:`generate_maze`), ``lattice`` (:func:`generate_lattice_maze`) or ``mixed``
            (each maze either, with probability 1/2).
        cycle_prob: the probability that a lattice maze has cycles, in [0, 1] (None: :data:`CYCLE_PROB`); lattice and
            mixed kinds only.
        ties: ``wall`` (cells walled until the shortest path is unique, as Maze-Hard's answers are) or ``first``
            (mazes kept with all their shortest paths, the first marked: :func:`mark_first_path`).
    Returns:
        ``output_dir`` as a Path.
    Raises:
        DatasetError: bad arguments, bad CSV content, a non-empty ``output_dir``, or a Hub fetch that failed (no such
            repo, revision or file; the Hub out of reach with nothing cached).
    """
    output_dir = Path(output_dir)
    check_source_and_sizes(source_dir, generate, f"maze train.csv/test.csv of {repo or HUB_REPO}",
                           {"train_size": (train_size, 1), "test_size": (test_size, 1), "size": (size, 2),
                            "seed": (seed, 0), "workers": (workers, 1)}, subsample_size, repo, revision)
    threshold = default_min_path_length(size) if min_path_length is None else min_path_length
    if not 1 <= threshold < size * size:
        raise DatasetError(f"--min-path-length must be in [1, {size * size - 1}] for size {size}, got {threshold}")
    low, high = wall_density
    if not 0 <= low <= high < 1:
        raise DatasetError(f"--wall-density must be LOW HIGH with 0 <= LOW <= HIGH < 1, got {low} {high}")
    generation = _generation_record(generate, size, min_size, layout, cycle_prob, min_path_length, wall_density, seed,
                                    ties)
    cycle_prob = CYCLE_PROB if cycle_prob is None else cycle_prob
    check_output_dir(output_dir, overwrite)
    source = csv_source(source_dir, generate, repo or HUB_REPO, revision)

    if generate:
        train_q, train_a, test_q, test_a = common.generate_train_test(
            lambda count, stream, exclude, desc: generate_distinct(
                count, seed, stream, size, min_path_length, wall_density, workers, exclude, desc, min_size=min_size,
                layout=layout, cycle_prob=cycle_prob, ties=ties),
            train_size, test_size, workers, "mazes")
    else:
        train_q, train_a = read_maze_csv(source.directory / "train.csv")
        test_q, test_a = read_maze_csv(source.directory / "test.csv")
        if train_q.shape[1:] != test_q.shape[1:]:
            raise DatasetError(f"{source.directory}: train.csv holds {train_q.shape[1]}x{train_q.shape[2]} mazes but "
                               f"test.csv {test_q.shape[1]}x{test_q.shape[2]}; one model needs one size")
    train_q, train_a = common.subsample_training(train_q, train_a, subsample_size, np.random.default_rng(seed), "mazes")

    with staged_dataset(output_dir, overwrite) as staging:
        _write_split(staging / "train", train_q, train_a, aug, ties)
        _write_split(staging / "test", test_q, test_a, False, ties)
        if source.record is not None:
            for split in ("train", "test"):
                add_to_metadata(staging / split, "source", source.record)
        if generation is not None:
            for split in ("train", "test"):
                add_to_metadata(staging / split, "generation", generation)
        with open(staging / "identifiers.json", "w") as f:
            json.dump(["<blank>"], f)
    variants = NUM_DIHEDRAL if aug else 1
    print(f"wrote {output_dir}: train {len(train_q)} groups x {variants} puzzles, test {len(test_q)} puzzles "
          f"({train_q.shape[1]}x{train_q.shape[2]})")
    return output_dir


def _generation_record(generate: bool, size: int, min_size: int | None, layout: str, cycle_prob: float | None,
                       min_path_length: int | None, wall_density: tuple[float, float], seed: int,
                       ties: str = "wall") -> dict | None:
    """Check the options of mixed sizes and kinds; the settings ``dataset.json`` records with them, those that matter
    for reading results (None when the options are unused, so a default build's files stay as they were).

    Raises:
        DatasetError: naming the option and the range.
    """
    if layout not in LAYOUTS:
        raise DatasetError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if cycle_prob is not None and not 0 <= cycle_prob <= 1:
        raise DatasetError(f"--cycle-prob must be in [0, 1], got {cycle_prob}")
    if cycle_prob is not None and layout == "random":
        raise DatasetError("--cycle-prob shapes lattice mazes: add --layout lattice or --layout mixed, or drop it")
    if ties not in TIES:
        raise DatasetError(f"--ties must be one of {', '.join(TIES)}, got {ties!r}")
    if min_size is None and layout == "random" and ties == "wall":
        return None
    if not generate:
        raise DatasetError("--min-size, --layout and --ties shape generated mazes: add --generate, or drop them")
    if min_size is not None and not MIN_SIZE <= min_size <= size:
        raise DatasetError(f"--min-size must be in [{MIN_SIZE}, --size {size}], got {min_size}")
    if layout != "random" and size < MIN_SIZE:
        raise DatasetError(f"--layout {layout} needs --size {MIN_SIZE} or more, got {size}")
    min_size = size if min_size is None else min_size
    if min_size == size and layout == "random" and ties == "wall":
        return None
    record = {"layout": layout, "size": size, "min_size": min_size, "min_path_length": min_path_length, "seed": seed,
              "ties": ties}
    if layout != "lattice":
        record["wall_density"] = list(wall_density)
    if layout != "random":
        record["cycle_prob"] = CYCLE_PROB if cycle_prob is None else cycle_prob
    return record


def main(argv: list[str] | None = None) -> Path:
    """Command-line entry point; returns the dataset path.

    Raises:
        DatasetError: as ``build_maze_dataset`` (the script prints it as one ``error:`` line, exit status 2).
    """
    parser = ArgumentParser(
        prog="build_maze_dataset.py",
        description="Build a maze dataset (Maze-Hard) in the HRM on-disk format, from the reference CSVs "
                    "(downloaded from the Hugging Face Hub, sapientinc/maze-30x30-hard-1k, as the reference builder "
                    "does, or a local copy) or by generating hard mazes with a unique shortest path offline.",
        epilog="examples:\n"
               "  python scripts/build_maze_dataset.py --output-dir data/maze-30x30-hard-1k-aug --aug\n"
               "  python scripts/build_maze_dataset.py --source-dir data/raw/maze-30x30-hard-1k "
               "--output-dir data/maze-30x30-hard-1k --aug\n"
               "  python scripts/build_maze_dataset.py --generate --output-dir data/maze-gen-30x30-1k --aug --workers 2\n"
               "  python scripts/build_maze_dataset.py --generate --size 12 --train-size 200 --test-size 50 "
               "--output-dir data/maze-gen-12x12\n"
               "  python scripts/build_maze_dataset.py --generate --layout mixed --size 16 --min-size 6 "
               "--train-size 24000 --test-size 256 --aug --workers 2 --output-dir data/maze-mixed-6to16",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_source_arguments(parser, "the reference train.csv and test.csv (columns source,question,answer,rating; mazes "
                                 "over '# SGo', path marked 'o')", "generate hard mazes offline instead", HUB_REPO)
    add_output_arguments(parser)
    parser.add_argument("--aug", action="store_true",
                        help="add the 8 dihedral transforms of each training maze, 8 one-example puzzles per group "
                             "(the reference --aug; the test set is never augmented)")
    parser.add_argument("--subsample-size", type=int, help="keep this many random training mazes")
    parser.add_argument("--seed", type=int, default=0, help="seed for generation and subsampling (default 0)")
    gen = parser.add_argument_group("generation (--generate only)")
    gen.add_argument("--size", type=int, default=REFERENCE_SIZE, help="grid side, seq_len = size^2 (default 30)")
    gen.add_argument("--train-size", type=int, default=1000, help="training mazes (default 1000)")
    gen.add_argument("--test-size", type=int, default=1000, help="test mazes (default 1000)")
    gen.add_argument("--min-path-length", type=int,
                     help="a maze is hard when its shortest path has at least this many moves (default: 110 at "
                          "size 30 as in the HRM paper; round(110 * (size/30)^1.13) for other sizes)")
    gen.add_argument("--wall-density", type=float, nargs=2, metavar=("LOW", "HIGH"), default=WALL_DENSITY,
                     help="each maze's wall probability is drawn from [LOW, HIGH] (default 0.3 0.5, as Lehnert et al.)")
    gen.add_argument("--min-size", type=int,
                     help=f"draw each maze's side from [MIN_SIZE, SIZE] and frame it with walls at a random place on "
                          f"the size x size canvas ({MIN_SIZE} or more; default: --size, one size); --min-path-length "
                          "is then the threshold at --size, scaled to each side")
    gen.add_argument("--layout", choices=LAYOUTS, default="random",
                     help="random: Maze-Hard's random walls (default); lattice: depth-first-search mazes on the "
                          "(2n+1)-grid of cells and walls, some with cycles, with and without an outer wall; mixed: "
                          "each maze either, at random")
    gen.add_argument("--cycle-prob", type=number_in(0, 1),
                     help=f"--layout lattice or mixed: the probability that a lattice maze is braided, 3-15%% of its "
                          f"interior walls opened, making cycles (default {CYCLE_PROB})")
    gen.add_argument("--ties", choices=TIES, default="wall",
                     help="wall: wall cells until the shortest path is unique, as Maze-Hard's answers are (default); "
                          "first: keep every shortest path and mark the first, each step preferring up, left, down, "
                          "right (mazes with cycles, as other generators write them, have several)")
    add_workers_argument(gen, "worker processes")
    args = parser.parse_args(argv)
    return build_maze_dataset(
        args.output_dir, source_dir=args.source_dir, generate=args.generate, size=args.size, train_size=args.train_size,
        test_size=args.test_size, min_path_length=args.min_path_length, wall_density=tuple(args.wall_density),
        subsample_size=args.subsample_size, aug=args.aug, seed=args.seed, workers=args.workers, overwrite=args.overwrite,
        repo=args.repo, revision=args.revision, min_size=args.min_size, layout=args.layout, cycle_prob=args.cycle_prob,
        ties=args.ties,
    )
