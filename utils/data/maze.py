"""Build a maze dataset (Maze-Hard) in the HRM on-disk format (see utils/data/puzzle_dataset.py).

Three sources:
  * by default, the reference CSVs (``train.csv``, ``test.csv``; columns ``source,question,answer,rating``) of
    the Hugging Face dataset ``sapientinc/maze-30x30-hard-1k`` (``--repo``, ``--revision`` pick another),
    downloaded into the Hugging Face cache as the reference builder downloads them (utils/data/hub_source.py).
    Each maze is a size*size string over ``"# SGo"`` (wall, open, start, goal, path), row-major; the answer is
    the question with its shortest path marked ``o`` (S and G stay);
  * ``--source-dir DIR``: a local copy of those CSVs (the same CSVs give byte-identical arrays);
  * ``--generate``: offline generation of hard mazes whose shortest path is unique (see :func:`generate_maze`).

The format follows the reference builder (``sapientinc/HRM`` dataset/build_maze_dataset.py):
``"# SGo"`` -> tokens 1..5 with pad 0 (vocab 6), seq_len = size², ``ignore_label_id`` 0 (the pad,
which never occurs, so every cell is supervised, walls included), one puzzle identifier (0). With
``--aug`` each training maze becomes 8 one-example puzzles, its dihedral transforms t0..t7 in the
reference's order (``dataset/common.py`` ``dihedral_transform``), forming one group; without it, each
maze is its own group. The test set is never augmented. ``dataset.json`` also carries TRM's
``total_puzzles`` field (``SamsungSAILMontreal/TinyRecursiveModels``, same builder), so the TRM loader
reads the output too; like TRM's builder it holds the number of groups.

Example (the reference "Maze-Hard 30x30 1k" with augmentation, the TRM recipe):
    python scripts/build_maze_dataset.py --output-dir data/maze-30x30-hard-1k-aug --aug
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
from utils.cli import ArgumentParser, add_workers_argument

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
                  wall_density: tuple[float, float] = WALL_DENSITY) -> tuple[np.ndarray, np.ndarray]:
    """One hard maze whose shortest path from S to G is unique.

    The HRM paper builds Maze-Hard with the generator of Lehnert et al. 2024 ("Beyond A*": each cell
    is a wall at random, 30-50% walls, random start and goal) and keeps mazes whose shortest path has
    at least 110 steps. This does the same, then makes the path unique:

    1. Walls are drawn independently with a probability drawn uniformly from ``wall_density``.
    2. S is a farthest cell from a random open cell; G is drawn uniformly from the cells at least
       ``min_path_length`` moves from S. Layouts with no such cell are redrawn (about 1 in 200 qualifies).
    3. While some distance k has two or more cells on shortest S-G paths, one of them, drawn at random,
       becomes a wall. The others at distance k still carry a shortest path, so the length stays the
       same and the number of shortest paths falls; at the end there is exactly one.

    Args:
        rng: the random stream.
        size: grid side; the sequence has size² cells.
        min_path_length: at least this many moves from S to G; None: :func:`default_min_path_length`.
        wall_density: (low, high) wall probability range, 0 <= low <= high < 1.
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
        levels = _levels(open_bits, _random_cell(open_bits, size, rng), size)
        if 2 * (len(levels) - 1) < min_path_length:
            continue  # no two cells of this component are further apart than twice this cell's eccentricity
        s = _random_cell(levels[-1], size, rng)
        levels = _levels(open_bits, s, size)
        if len(levels) - 1 >= min_path_length:
            break
    else:
        raise DatasetError(f"no {size}x{size} maze with a shortest path of >= {min_path_length} steps in {MAX_ATTEMPTS} "
                           f"random layouts; lower --min-path-length (default for this size: "
                           f"{default_min_path_length(size)})")
    far = 0
    for level in levels[min_path_length:]:
        far |= level
    g = _random_cell(far, size, rng)
    while True:
        layers = _dag_layers(open_bits, s, g, size)
        ambiguous = [layer for layer in layers if layer & (layer - 1)]  # two or more cells
        if not ambiguous:
            break
        open_bits &= ~_random_cell(ambiguous[int(rng.integers(len(ambiguous)))], size, rng)
    question = np.where(_from_bits(open_bits, size), OPEN, WALL).astype(np.uint8)
    path = _from_bits(sum(layers[1:-1]), size)  # layers are disjoint: the sum is their union
    question[_from_bits(s, size)] = START
    question[_from_bits(g, size)] = GOAL
    answer = np.where(path, PATH, question).astype(np.uint8)
    return question, answer


def maze_key(question: np.ndarray) -> bytes:
    """The same bytes for a maze and each of its 8 dihedral transforms (the smallest of their encodings)."""
    return min(np.ascontiguousarray(dihedral(question, t)).tobytes() for t in range(NUM_DIHEDRAL))


def _generate_one(index: int, seed: int, stream: int, size: int, min_path_length: int,
                  wall_density: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    # Each maze has its own RNG, so the output does not depend on --workers.
    return generate_maze(np.random.default_rng([seed, stream, index]), size, min_path_length, wall_density)


def generate_distinct(count: int, seed: int, stream: int, size: int, min_path_length: int,
                      wall_density: tuple[float, float] = WALL_DENSITY, workers: int = 1,
                      exclude: set[bytes] | None = None,
                      desc: str = "generate") -> tuple[np.ndarray, np.ndarray, set[bytes]]:
    """Generate ``count`` mazes, no two equal up to a dihedral transform, none in ``exclude``.

    Maze k of ``stream`` is drawn from the RNG seeded ``[seed, stream, k]``; a rejected maze is
    replaced by the next index. Keys are :func:`maze_key`.

    Returns:
        questions, answers uint8 [count, size, size] tokens, and the keys seen (``exclude`` plus the new ones).
    """
    work = partial(_generate_one, seed=seed, stream=stream, size=size, min_path_length=min_path_length,
                   wall_density=wall_density)
    return common.generate_distinct(work, lambda q, a: maze_key(q), count, workers, exclude, desc, unit="maze",
                                    chunksize=4)


# ----------------------------------------------------------------------------------------
# Writing


def _write_split(directory: Path, questions: np.ndarray, answers: np.ndarray, aug: bool) -> None:
    """Write one split: group g is maze g (t0) followed, with ``aug``, by its dihedral transforms t1..t7."""
    n, size, _ = questions.shape
    transforms = range(NUM_DIHEDRAL) if aug else range(1)
    inputs = np.stack([dihedral(questions, t) for t in transforms], axis=1).reshape(-1, size * size)
    labels = np.stack([dihedral(answers, t) for t in transforms], axis=1).reshape(-1, size * size)
    write_one_example_split(directory, inputs, labels, len(transforms), VOCAB_SIZE)


def build_maze_dataset(output_dir: str | os.PathLike, *, source_dir: str | os.PathLike | None = None,
                       generate: bool = False, size: int = REFERENCE_SIZE, train_size: int = 1000, test_size: int = 1000,
                       min_path_length: int | None = None, wall_density: tuple[float, float] = WALL_DENSITY,
                       subsample_size: int | None = None, aug: bool = False, seed: int = 0, workers: int = 1,
                       overwrite: bool = False, repo: str | None = None, revision: str | None = None) -> Path:
    """Build a maze dataset at ``output_dir`` from the reference CSVs (the Hugging Face Hub's, or a local copy) or by
    generation.

    The dataset is written to a temporary sibling directory and renamed into place, so an interrupted
    build never leaves a half-written dataset. Deterministic for a given seed (also for any
    ``workers``). Generated mazes are pairwise distinct up to the 8 dihedral transforms, so no test
    maze is a training maze or an augmentation of one. A Hub build's ``dataset.json`` also records, under
    ``source``, the repo, the commit and each CSV's SHA-256 and rows; its other files are byte-identical to a
    ``source_dir`` build of the same CSVs.

    Args:
        output_dir: dataset root to create (see utils/data/puzzle_dataset.py for the layout).
        source_dir: directory with ``train.csv`` and ``test.csv`` (exclusive with ``generate``). With neither,
            the CSVs of the Hub dataset ``repo`` (default :data:`HUB_REPO`) at ``revision`` (default ``main``),
            fetched into the Hugging Face cache (utils/data/hub_source.py).
        generate: generate ``train_size`` + ``test_size`` mazes of ``size`` x ``size`` (see :func:`generate_maze`).
        min_path_length: generated mazes' shortest path in moves is at least this (None: 110 at size 30, scaled).
        wall_density: (low, high) wall probability range for generation.
        subsample_size: keep this many randomly chosen training mazes (before augmentation).
        aug: 8 dihedral copies of each training maze (the test set is not augmented).
        workers: processes for generation.
        overwrite: replace an existing dataset at ``output_dir``.
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
    if min_path_length is None:
        min_path_length = default_min_path_length(size)
    if not 1 <= min_path_length < size * size:
        raise DatasetError(f"--min-path-length must be in [1, {size * size - 1}] for size {size}, got {min_path_length}")
    low, high = wall_density
    if not 0 <= low <= high < 1:
        raise DatasetError(f"--wall-density must be LOW HIGH with 0 <= LOW <= HIGH < 1, got {low} {high}")
    check_output_dir(output_dir, overwrite)
    source = csv_source(source_dir, generate, repo or HUB_REPO, revision)

    if generate:
        train_q, train_a, test_q, test_a = common.generate_train_test(
            lambda count, stream, exclude, desc: generate_distinct(count, seed, stream, size, min_path_length,
                                                                   wall_density, workers, exclude, desc),
            train_size, test_size, workers, "mazes")
    else:
        train_q, train_a = read_maze_csv(source.directory / "train.csv")
        test_q, test_a = read_maze_csv(source.directory / "test.csv")
        if train_q.shape[1:] != test_q.shape[1:]:
            raise DatasetError(f"{source.directory}: train.csv holds {train_q.shape[1]}x{train_q.shape[2]} mazes but "
                               f"test.csv {test_q.shape[1]}x{test_q.shape[2]}; one model needs one size")
    train_q, train_a = common.subsample_training(train_q, train_a, subsample_size, np.random.default_rng(seed), "mazes")

    with staged_dataset(output_dir, overwrite) as staging:
        _write_split(staging / "train", train_q, train_a, aug)
        _write_split(staging / "test", test_q, test_a, False)
        if source.record is not None:
            for split in ("train", "test"):
                add_to_metadata(staging / split, "source", source.record)
        with open(staging / "identifiers.json", "w") as f:
            json.dump(["<blank>"], f)
    variants = NUM_DIHEDRAL if aug else 1
    print(f"wrote {output_dir}: train {len(train_q)} groups x {variants} puzzles, test {len(test_q)} puzzles "
          f"({train_q.shape[1]}x{train_q.shape[2]})")
    return output_dir


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
               "--output-dir data/maze-gen-12x12",
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
    add_workers_argument(gen, "worker processes")
    args = parser.parse_args(argv)
    return build_maze_dataset(
        args.output_dir, source_dir=args.source_dir, generate=args.generate, size=args.size, train_size=args.train_size,
        test_size=args.test_size, min_path_length=args.min_path_length, wall_density=tuple(args.wall_density),
        subsample_size=args.subsample_size, aug=args.aug, seed=args.seed, workers=args.workers, overwrite=args.overwrite,
        repo=args.repo, revision=args.revision,
    )
