"""Maze builder tests: reference CSV reading, hard-maze generation (random and lattice layouts, mixed sizes framed on
one canvas), dihedral augmentation, the on-disk format.

Shortest paths are checked with a separate, deliberately plain BFS that counts shortest paths, and the
dihedral transforms with explicit index formulas, not with the code under test.
"""

import csv
import hashlib
import json
import runpy
import subprocess
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from utils.data import maze
from utils.data.puzzle_dataset import ARRAY_FIELDS, IGNORE_LABEL_ID, DatasetError, PuzzleDataset

REPO = Path(__file__).resolve().parents[1]
WALL, OPEN, START, GOAL, PATH = 1, 2, 3, 4, 5
SIZE, MIN_PATH = 12, 30  # small generated mazes for speed; 30x30 is covered by one test of its own


def bfs(open_cells, source):
    """Distances and numbers of shortest paths from ``source`` over 4-neighbour moves (-1 = unreachable)."""
    n = len(open_cells)
    dist = np.full((n, n), -1)
    count = np.zeros((n, n), np.int64)
    dist[source], count[source] = 0, 1
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if 0 <= nr < n and 0 <= nc < n and open_cells[nr, nc]:
                if dist[nr, nc] < 0:
                    dist[nr, nc] = dist[r, c] + 1
                    queue.append((nr, nc))
                if dist[nr, nc] == dist[r, c] + 1:
                    count[nr, nc] += count[r, c]
    return dist, count


def check_solved_maze(question, answer, min_path=1):
    """The answer marks exactly the unique shortest S-G path of the question; returns its length in moves."""
    (s,), (g,) = zip(*np.nonzero(question == START)), zip(*np.nonzero(question == GOAL))
    assert set(np.unique(question)) <= {WALL, OPEN, START, GOAL}
    assert np.array_equal(np.where(answer == PATH, OPEN, answer), question)  # answer = question + path
    open_cells = question != WALL
    from_s, paths = bfs(open_cells, s)
    from_g, _ = bfs(open_cells, g)
    length = from_s[g]
    assert length >= min_path and paths[g] == 1
    on_shortest = (from_s >= 0) & (from_g >= 0) & (from_s + from_g == length)
    marked = (answer == PATH) | (answer == START) | (answer == GOAL)
    assert np.array_equal(on_shortest, marked) and marked.sum() == length + 1
    assert not (marked & ~open_cells).any()  # no wall on the path
    return length


def dihedral_by_index(grid, t):
    """Reference dihedral transform t of a square grid, one cell at a time (HRM dataset/common.py order)."""
    n = len(grid)
    source = [lambda i, j: (i, j), lambda i, j: (j, n - 1 - i), lambda i, j: (n - 1 - i, n - 1 - j),
              lambda i, j: (n - 1 - j, i), lambda i, j: (i, n - 1 - j), lambda i, j: (n - 1 - i, j),
              lambda i, j: (j, i), lambda i, j: (n - 1 - j, n - 1 - i)][t]
    return np.array([[grid[source(i, j)] for j in range(n)] for i in range(n)])


def open_graph(open_cells):
    """(nodes, edges, connected) of the graph of open cells joined by 4-neighbour moves."""
    nodes = int(open_cells.sum())
    edges = int((open_cells[1:] & open_cells[:-1]).sum() + (open_cells[:, 1:] & open_cells[:, :-1]).sum())
    dist, _ = bfs(open_cells, tuple(np.argwhere(open_cells)[0]))
    return nodes, edges, int((dist >= 0).sum()) == nodes


def has_lattice_posts(open_cells):
    """Some parity (pr, pc) has every cell (r, c) with r % 2 == pr and c % 2 == pc a wall: the posts of a lattice."""
    return any(not open_cells[pr::2, pc::2].any() for pr in (0, 1) for pc in (0, 1))


def crop(grid):
    """The smallest window holding every cell that is not a wall."""
    rows, cols = np.nonzero(grid != WALL)
    return grid[rows.min():rows.max() + 1, cols.min():cols.max() + 1]


def placement_free_forms(grid):
    """A maze's 8 dihedral forms without the walls around them: equal sets for a maze at any place on a canvas."""
    return {(f.shape, f.tobytes()) for f in (crop(dihedral_by_index(grid, t)) for t in range(8))}


def digest(root):
    """SHA-256 of both splits' dataset.json and arrays."""
    h = hashlib.sha256()
    for split in ("train", "test"):
        h.update((Path(root) / split / "dataset.json").read_bytes())
        for array in load_split(root, split).values():
            h.update(array.tobytes())
    return h.hexdigest()


def load_split(root, split):
    d = Path(root) / split
    return {name: np.load(d / f"all__{name}.npy") for name in ARRAY_FIELDS}


def write_csv(path, rows, header=("source", "question", "answer", "rating")):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        if header:
            writer.writerow(header)
        writer.writerows(rows)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen") / "maze"
    maze.build_maze_dataset(root, generate=True, size=SIZE, train_size=12, test_size=6, min_path_length=MIN_PATH,
                            aug=True, seed=0)
    return root


# A 4x4 maze and its answer, by hand: S (0,0) -> (1,0) -> (2,0) -> (2,1) -> (2,2) -> (2,3) -> G (3,3).
Q4 = "S###" + " # #" + "    " + "###G"
A4 = "S###" + "o# #" + "oooo" + "###G"
Q4_TOKENS = [[3, 1, 1, 1], [2, 1, 2, 1], [2, 2, 2, 2], [1, 1, 1, 4]]


def test_default_threshold_is_hrm_at_30_and_scales_with_the_chemical_distance():
    assert maze.default_min_path_length(30) == 110
    assert maze.default_min_path_length(10) == 32  # round(110 * (1/3)**1.13) = round(31.79)
    assert maze.default_min_path_length(60) == 241  # round(110 * 2**1.13) = round(240.7)


def test_csv_reading_gives_reference_tokens(tmp_path):
    q2 = "S  G" + "####" * 3
    write_csv(tmp_path / "m.csv", [["x", Q4, A4, "6"], [], ["y", q2, "SooG" + "####" * 3, "3"]])
    questions, answers = maze.read_maze_csv(tmp_path / "m.csv")
    assert questions.dtype == answers.dtype == np.uint8 and questions.shape == (2, 4, 4)
    assert questions[0].tolist() == Q4_TOKENS
    assert answers[0].tolist() == [[3, 1, 1, 1], [5, 1, 2, 1], [5, 5, 5, 5], [1, 1, 1, 4]]
    assert answers[1, 0].tolist() == [3, 5, 5, 4] and maze.decode_maze(questions[1]) == q2
    assert check_solved_maze(questions[0], answers[0]) == 6


@pytest.mark.parametrize("row, message", [
    (["x", Q4[:-1], A4[:-1], "6"], "must be 16 characters"),
    (["x", Q4, A4 + " ", "6"], "must be 16 characters"),
    (["x", Q4.replace(" ", ".", 1), A4.replace(" ", ".", 1), "6"], "may only hold the characters"),
    (["x", Q4.replace(" ", "é", 1), A4.replace(" ", "é", 1), "6"], "may only hold the characters"),
    (["x", Q4, A4.replace("#", " ", 1), "6"], "not the question with path cells marked 'o'"),
    (["x", Q4, Q4.replace("S", "o"), "6"], "not the question with path cells marked 'o'"),
    (["x", A4, A4, "6"], "the question marks path cells"),
    (["x", Q4.replace("S", " "), A4.replace("S", "o"), "6"], "exactly one start 'S', found 0"),
    (["x", Q4.replace("G", " "), A4.replace("G", " "), "6"], "exactly one goal 'G', found 0"),
    (["x", Q4.replace(" ", "S", 1), A4.replace("o", "S", 1), "6"], "exactly one start 'S', found 2"),
    (["x", Q4, A4], "expected 4 columns"),
])
def test_bad_csv_rows_name_the_line(tmp_path, row, message):
    write_csv(tmp_path / "m.csv", [["ok", Q4, A4, "6"], row])
    with pytest.raises(DatasetError, match=rf"m\.csv:3: .*{message}") as info:
        maze.read_maze_csv(tmp_path / "m.csv")
    assert "\n" not in str(info.value)


def test_bad_csv_files(tmp_path):
    write_csv(tmp_path / "noheader.csv", [["ok", Q4, A4, "6"]], header=None)
    with pytest.raises(DatasetError, match=r"noheader\.csv:1: expected the header row"):
        maze.read_maze_csv(tmp_path / "noheader.csv")
    write_csv(tmp_path / "oblong.csv", [["ok", Q4[:-4], A4[:-4], "6"]])
    with pytest.raises(DatasetError, match=r"oblong\.csv:2: a maze must be a square"):
        maze.read_maze_csv(tmp_path / "oblong.csv")
    write_csv(tmp_path / "empty.csv", [])
    with pytest.raises(DatasetError, match="no mazes after the header"):
        maze.read_maze_csv(tmp_path / "empty.csv")
    (tmp_path / "latin1.csv").write_bytes(b"source,question,answer,rating\nx,\xe9,\xe9,1\n")
    with pytest.raises(DatasetError, match="is not UTF-8 text"):
        maze.read_maze_csv(tmp_path / "latin1.csv")
    with pytest.raises(DatasetError, match="not found: --source-dir must hold the maze train.csv"):
        maze.read_maze_csv(tmp_path / "missing.csv")


def test_build_from_csv_matches_the_reference_builder(tmp_path):
    """Expected arrays written out by hand from the reference's rules (sapientinc/HRM build_maze_dataset.py)."""
    src = tmp_path / "csv"
    src.mkdir()
    write_csv(src / "train.csv", [["a", Q4, A4, "6"]])
    write_csv(src / "test.csv", [["b", Q4, A4, "6"], ["c", "S  G" + "####" * 3, "SooG" + "####" * 3, "3"]])
    out = maze.build_maze_dataset(tmp_path / "out", source_dir=src, aug=True)
    assert sorted(p.name for p in out.iterdir()) == ["identifiers.json", "test", "train"]
    assert json.loads((out / "identifiers.json").read_text()) == ["<blank>"]
    for split, groups, variants in (("train", 1, 8), ("test", 2, 1)):
        assert (out / split / "dataset.json").read_text() == json.dumps({
            "pad_id": 0, "ignore_label_id": 0, "blank_identifier_id": 0, "vocab_size": 6, "seq_len": 16,
            "num_puzzle_identifiers": 1, "total_groups": groups, "mean_puzzle_examples": 1.0, "total_puzzles": groups,
            "sets": ["all"]})
        a = load_split(out, split)
        n = groups * variants
        assert a["inputs"].dtype == a["labels"].dtype == np.uint8 and a["inputs"].shape == (n, 16)
        assert all(a[k].dtype == np.int32 for k in ("puzzle_identifiers", "puzzle_indices", "group_indices"))
        assert a["puzzle_identifiers"].tolist() == [0] * n
        assert a["puzzle_indices"].tolist() == list(range(n + 1))
        assert a["group_indices"].tolist() == list(range(0, n + 1, variants))
    train = load_split(out, "train")
    # t1 is np.rot90 (counter-clockwise): the top row is the old right column, read top to bottom.
    assert train["inputs"][1].reshape(4, 4).tolist() == [[1, 1, 2, 4], [1, 2, 2, 1], [1, 1, 2, 1], [3, 2, 2, 1]]
    q, ans = np.array(Q4_TOKENS), maze.encode_maze(A4).reshape(4, 4)
    for t in range(8):
        assert np.array_equal(train["inputs"][t].reshape(4, 4), dihedral_by_index(q, t))
        assert np.array_equal(train["labels"][t].reshape(4, 4), dihedral_by_index(ans, t))
    assert load_split(out, "test")["inputs"][0].tolist() == sum(Q4_TOKENS, [])  # the test split is not augmented


def test_train_and_test_sizes_must_agree(tmp_path):
    src = tmp_path / "csv"
    src.mkdir()
    write_csv(src / "train.csv", [["a", Q4, A4, "6"]])
    write_csv(src / "test.csv", [["b", "S  G" + " " * 5, "SooG" + " " * 5, "3"]])
    with pytest.raises(DatasetError, match="train.csv holds 4x4 mazes but test.csv 3x3"):
        maze.build_maze_dataset(tmp_path / "out", source_dir=src)
    assert not (tmp_path / "out").exists()


def test_generated_mazes_are_hard_with_a_unique_shortest_path(generated):
    for split in ("train", "test"):
        a = load_split(generated, split)
        for g in a["group_indices"][:-1]:  # the original (t0) of each group
            q, ans = a["inputs"][g].reshape(SIZE, SIZE), a["labels"][g].reshape(SIZE, SIZE)
            assert (q == START).sum() == 1 and (q == GOAL).sum() == 1
            check_solved_maze(q, ans, MIN_PATH)


def test_full_size_maze_meets_the_hrm_threshold():
    q, ans = maze.generate_maze(np.random.default_rng(7))
    assert q.shape == (30, 30) and q.dtype == np.uint8
    assert check_solved_maze(q, ans, 110) >= 110


def test_augmentations_are_the_dihedral_transforms_and_stay_valid(generated):
    a = load_split(generated, "train")
    for g in range(len(a["group_indices"]) - 1):
        first = a["group_indices"][g]
        q0, a0 = a["inputs"][first].reshape(SIZE, SIZE), a["labels"][first].reshape(SIZE, SIZE)
        for t in range(8):
            q, ans = a["inputs"][first + t].reshape(SIZE, SIZE), a["labels"][first + t].reshape(SIZE, SIZE)
            assert np.array_equal(q, dihedral_by_index(q0, t)) and np.array_equal(ans, dihedral_by_index(a0, t))
            if g < 3:
                check_solved_maze(q, ans, MIN_PATH)


def test_no_maze_is_repeated_even_up_to_symmetry(generated):
    def all_transforms(grid_row):
        grid = grid_row.reshape(SIZE, SIZE)
        return {dihedral_by_index(grid, t).tobytes() for t in range(8)}

    train, test = load_split(generated, "train"), load_split(generated, "test")
    train_forms = set().union(*(all_transforms(row) for row in train["inputs"]))
    assert not any(all_transforms(row) & train_forms for row in test["inputs"])
    originals = [all_transforms(row) for row in train["inputs"][train["group_indices"][:-1]]]
    assert all(not (x & y) for i, x in enumerate(originals) for y in originals[i + 1:])


def test_generate_distinct_replaces_excluded_mazes():
    q, _, seen = maze.generate_distinct(3, seed=0, stream=5, size=8, min_path_length=12)
    q2, _, _ = maze.generate_distinct(2, seed=0, stream=5, size=8, min_path_length=12, exclude={maze.maze_key(q[0])})
    assert np.array_equal(q2[0], q[1]) and np.array_equal(q2[1], q[2])  # maze 0 was excluded, the next ones move up
    assert maze.maze_key(dihedral_by_index(q[1], 6)) == maze.maze_key(q[1]) != maze.maze_key(q[2])


def test_unreachable_threshold_gives_a_clear_error(monkeypatch):
    monkeypatch.setattr(maze, "MAX_ATTEMPTS", 50)
    with pytest.raises(DatasetError, match="no 4x4 maze with a shortest path of >= 15 steps in 50 random layouts"):
        maze.generate_maze(np.random.default_rng(0), 4, 15)


def test_generation_is_deterministic_for_any_worker_count(generated, tmp_path):
    again = maze.build_maze_dataset(tmp_path / "w2", generate=True, size=SIZE, train_size=12, test_size=6,
                                    min_path_length=MIN_PATH, aug=True, seed=0, workers=2)
    for split in ("train", "test"):
        for name, array in load_split(generated, split).items():
            assert np.array_equal(array, load_split(again, split)[name])


# Digests of builds made by the builder before --min-size, --layout and --cycle-prob existed (numpy 2.4's PCG64
# streams): builds that use none of them must keep writing exactly these files.
DIGEST_BEFORE_FIXTURE = "39c8b01bc102c6e049ffd46ac0ccc71d492d0425ede0ff6d37d5efb1f473ee4a"
DIGEST_BEFORE_CLI_9X9 = "9abb30f435f3fbb0c661020a704213bb8fc0354f7153d33914252fc23f0daf6f"


def test_default_builds_are_byte_identical_to_before_the_new_options(generated, tmp_path):
    assert digest(generated) == DIGEST_BEFORE_FIXTURE
    assert "generation" not in json.loads((generated / "train" / "dataset.json").read_text())
    same = maze.build_maze_dataset(tmp_path / "same", generate=True, size=SIZE, train_size=12, test_size=6,
                                   min_path_length=MIN_PATH, aug=True, seed=0, min_size=SIZE, layout="random")
    assert digest(same) == DIGEST_BEFORE_FIXTURE  # --min-size equal to --size is the single-size build
    cli = maze.main(["--generate", "--size", "9", "--train-size", "5", "--test-size", "2", "--seed", "4",
                     "--output-dir", str(tmp_path / "cli")])
    assert digest(cli) == DIGEST_BEFORE_CLI_9X9


def test_framed_mazes_are_solved_inside_their_frame_and_cover_the_sizes():
    sides = set()
    for i in range(50):
        layout = "random" if i % 2 else "lattice"
        q, ans, (top, left, side) = maze.generate_framed_maze(np.random.default_rng([3, i]), 10, 6, layout)
        assert q.shape == ans.shape == (10, 10) and q.dtype == ans.dtype == np.uint8
        assert 6 <= side <= 10 and 0 <= top <= 10 - side and 0 <= left <= 10 - side
        inside = np.zeros((10, 10), bool)
        inside[top:top + side, left:left + side] = True
        assert (q[~inside] == WALL).all() and (ans[~inside] == WALL).all()
        length = check_solved_maze(q, ans)  # on the whole canvas: the path cannot leave the frame
        assert check_solved_maze(q[inside].reshape(side, side), ans[inside].reshape(side, side)) == length
        if layout == "random":
            assert length >= maze.default_min_path_length(side)
        sides.add(side)
    assert sides == set(range(6, 11))


def test_min_path_length_scales_to_each_side():
    assert maze.side_min_path_length(None, 16, 9) == maze.default_min_path_length(9)
    assert maze.side_min_path_length(40, 16, 16) == 40
    assert maze.side_min_path_length(40, 16, 8) == 18  # round(40 * 0.5**1.13) = round(18.24)
    for i in range(6):
        q, ans, (_, _, side) = maze.generate_framed_maze(np.random.default_rng([4, i]), 12, 6, "random", 30)
        assert check_solved_maze(q, ans) >= maze.side_min_path_length(30, 12, side)


def test_carved_lattice_is_a_spanning_tree_of_its_cells():
    for cells in (1, 2, 5, 8):
        grid = maze.carve_lattice(np.random.default_rng(cells), cells)
        assert grid.shape == (2 * cells + 1, 2 * cells + 1) and grid.dtype == bool
        assert grid[1::2, 1::2].all() and not grid[::2, ::2].any()  # every cell open, every post a wall
        assert not (grid[0].any() or grid[-1].any() or grid[:, 0].any() or grid[:, -1].any())  # the outer wall
        nodes, edges, connected = open_graph(grid)
        assert connected and edges == nodes - 1  # a tree: one path between any two cells


def test_braiding_opens_interior_walls_between_cells_and_makes_cycles():
    grid = maze.carve_lattice(np.random.default_rng(0), 7)
    braided = maze.braid_lattice(np.random.default_rng(1), grid, 0.1)
    opened = braided & ~grid
    rows, cols = np.nonzero(opened)
    assert len(rows) == round(0.1 * 36)  # a perfect 7x7-cell maze keeps (7 - 1)² walls between cells
    assert ((rows % 2) != (cols % 2)).all() and rows.min() > 0 and cols.min() > 0 and max(rows.max(), cols.max()) < 14
    nodes, edges, connected = open_graph(braided)
    assert connected and edges - (nodes - 1) == len(rows)  # each opened wall closes one independent cycle
    tiny = maze.carve_lattice(np.random.default_rng(0), 2)
    assert (maze.braid_lattice(np.random.default_rng(0), tiny, 0.0) & ~tiny).sum() == 1  # at least one, when any


def test_lattice_mazes_with_and_without_outer_wall():
    walled = {8: set(), 9: set()}
    for side in (8, 9):
        for i in range(16):
            q, ans = maze.generate_lattice_maze(np.random.default_rng([5, side, i]), side, cycle_prob=0.0)
            open_cells = q != WALL
            assert q.shape == (side, side) and has_lattice_posts(open_cells)
            nodes, edges, connected = open_graph(open_cells)
            assert connected and edges == nodes - 1  # perfect: nothing for the uniqueness step to wall
            check_solved_maze(q, ans)
            border = np.concatenate([open_cells[0], open_cells[-1], open_cells[:, 0], open_cells[:, -1]])
            walled[side].add(not border.any())
    assert walled == {8: {True, False}, 9: {True, False}}  # both layouts occur at an even and at an odd side


def test_braided_lattice_mazes_are_solved_uniquely():
    cycles = 0
    for i in range(12):
        q, ans = maze.generate_lattice_maze(np.random.default_rng([6, i]), 13, cycle_prob=1.0)
        assert has_lattice_posts(q != WALL)
        check_solved_maze(q, ans)
        nodes, edges, _ = open_graph(q != WALL)
        cycles += edges >= nodes  # a cycle the uniqueness step left (off the shortest path)
    assert cycles > 0


def test_mixed_build_is_deterministic_deduplicated_and_records_its_settings(tmp_path):
    kwargs = dict(generate=True, size=10, min_size=6, layout="mixed", train_size=16, test_size=8, aug=True, seed=2)
    one = maze.build_maze_dataset(tmp_path / "w1", workers=1, **kwargs)
    two = maze.build_maze_dataset(tmp_path / "w2", workers=2, **kwargs)
    assert digest(one) == digest(two)
    for split in ("train", "test"):
        assert json.loads((one / split / "dataset.json").read_text())["generation"] == {
            "layout": "mixed", "size": 10, "min_size": 6, "min_path_length": None, "seed": 2, "ties": "wall",
            "wall_density": [0.3, 0.5], "cycle_prob": 0.5}
    train, test = load_split(one, "train"), load_split(one, "test")
    assert train["inputs"].shape == (16 * 8, 100)
    for q, ans in zip(train["inputs"][::3], train["labels"][::3]):  # originals and augmentations alike
        check_solved_maze(q.reshape(10, 10), ans.reshape(10, 10))
    originals = [placement_free_forms(q.reshape(10, 10)) for q in train["inputs"][::8]]
    assert all(not (x & y) for i, x in enumerate(originals) for y in originals[i + 1:])
    seen = set().union(*originals)
    assert not any(placement_free_forms(q.reshape(10, 10)) & seen for q in test["inputs"])


def test_framed_mazes_are_deduplicated_wherever_they_sit():
    q, _, _ = maze.generate_distinct(3, seed=0, stream=5, size=10, min_path_length=None, min_size=6, layout="mixed")
    inner = crop(q[0])
    moved = np.full((10, 10), WALL, np.uint8)
    moved[10 - inner.shape[0]:, 10 - inner.shape[1]:] = inner[:, ::-1]  # to the bottom-right corner, mirrored
    assert not np.array_equal(moved, q[0])
    q2, _, _ = maze.generate_distinct(2, seed=0, stream=5, size=10, min_path_length=None, min_size=6, layout="mixed",
                                      exclude={maze.maze_key(maze.unframe(moved))})
    assert np.array_equal(q2[0], q[1]) and np.array_equal(q2[1], q[2])  # maze 0, moved, was excluded


def test_lattice_single_size_build_fills_the_canvas(tmp_path):
    out = maze.build_maze_dataset(tmp_path / "l31", generate=True, size=31, layout="lattice", train_size=3, test_size=2)
    assert json.loads((out / "test" / "dataset.json").read_text())["generation"] == {
        "layout": "lattice", "size": 31, "min_size": 31, "min_path_length": None, "seed": 0, "ties": "wall",
        "cycle_prob": 0.5}
    a = load_split(out, "train")
    assert a["inputs"].shape == (3, 31 * 31)
    for q, ans in zip(a["inputs"], a["labels"]):
        q, ans = q.reshape(31, 31), ans.reshape(31, 31)
        assert has_lattice_posts(q != WALL) and check_solved_maze(q, ans) >= 31
        assert (crop(q).shape[0] >= 29) and (crop(q).shape[1] >= 29)  # no frame: the maze fills the canvas


def test_build_argument_errors(tmp_path):
    out = tmp_path / "x"
    for kwargs, message in [({"generate": True, "source_dir": tmp_path}, "choose exactly one source"),
                            ({"generate": True, "revision": "v1"}, "--repo and --revision pick the Hugging Face Hub"),
                            ({"generate": True, "size": 1}, "--size must be >= 2"),
                            ({"generate": True, "size": 5, "min_path_length": 25},
                             r"--min-path-length must be in \[1, 24\]"),
                            ({"generate": True, "wall_density": (0.5, 0.3)}, "--wall-density must be LOW HIGH"),
                            ({"generate": True, "subsample_size": 0}, "--subsample-size must be >= 1"),
                            ({"generate": True, "size": 8, "min_size": 9},
                             r"--min-size must be in \[5, --size 8\], got 9"),
                            ({"generate": True, "size": 8, "min_size": 4},
                             r"--min-size must be in \[5, --size 8\], got 4"),
                            ({"generate": True, "layout": "perfect"}, "--layout must be one of random, lattice, mixed"),
                            ({"generate": True, "layout": "lattice", "cycle_prob": 1.5},
                             r"--cycle-prob must be in \[0, 1\]"),
                            ({"generate": True, "cycle_prob": 0.0}, "--cycle-prob shapes lattice mazes: add --layout"),
                            ({"generate": True, "size": 4, "layout": "lattice"}, "--layout lattice needs --size 5 or more"),
                            ({"source_dir": tmp_path, "layout": "mixed"},
                             "--min-size, --layout and --ties shape generated mazes")]:
        with pytest.raises(DatasetError, match=message) as info:
            maze.build_maze_dataset(out, **kwargs)
        assert "\n" not in str(info.value)
    assert not out.exists()
    with pytest.raises(DatasetError, match="a lattice maze needs a side of 4 or more"):
        maze.generate_lattice_maze(np.random.default_rng(0), 3)


def test_output_dir_is_protected_and_overwrite_replaces(tmp_path, generated):
    out = tmp_path / "maze"
    maze.build_maze_dataset(out, generate=True, size=6, train_size=2, test_size=1, min_path_length=8)
    before = (out / "train" / "all__inputs.npy").read_bytes()
    with pytest.raises(DatasetError, match="is not empty; pass --overwrite"):
        maze.build_maze_dataset(out, generate=True, size=6, train_size=2, test_size=1, min_path_length=8, seed=1)
    assert (out / "train" / "all__inputs.npy").read_bytes() == before
    maze.build_maze_dataset(out, generate=True, size=6, train_size=3, test_size=1, min_path_length=8, overwrite=True)
    assert len(load_split(out, "train")["inputs"]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maze"]  # no staging directory left behind


def test_subsample_keeps_distinct_training_mazes(tmp_path, generated):
    src = tmp_path / "csv"
    src.mkdir()
    a = load_split(generated, "train")
    originals = a["group_indices"][:-1]
    rows = [["g", maze.decode_maze(a["inputs"][i]), maze.decode_maze(a["labels"][i]), "0"] for i in originals]
    write_csv(src / "train.csv", rows)
    write_csv(src / "test.csv", rows[:1])
    out = maze.build_maze_dataset(tmp_path / "sub", source_dir=src, subsample_size=5, seed=3)
    kept = load_split(out, "train")["inputs"]
    assert len(kept) == 5 and len({r.tobytes() for r in kept}) == 5
    assert {r.tobytes() for r in kept} <= {a["inputs"][i].tobytes() for i in originals}  # CSV round trip


def test_loader_reads_both_splits_with_every_cell_supervised(generated):
    train = PuzzleDataset(generated, "train", global_batch_size=8)
    assert train.metadata.vocab_size == 6 and train.metadata.seq_len == SIZE * SIZE
    _, batch, size = next(iter(train))
    assert batch["inputs"].shape == batch["labels"].shape == (8, SIZE * SIZE) and size == 8
    assert (batch["labels"] != IGNORE_LABEL_ID).all() and batch["labels"].min() >= 1
    test = PuzzleDataset(generated, "test", global_batch_size=4)
    batches = list(test)
    assert [b[2] for b in batches] == [4, 2]  # 6 test mazes, sequential, last batch padded
    assert np.array_equal(batches[0][1]["inputs"].numpy(), load_split(generated, "test")["inputs"][:4])


@pytest.mark.slow
def test_cli(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as info:
        maze.main(["--help"])
    help_text = capsys.readouterr().out
    assert info.value.code == 0
    assert all(flag in help_text for flag in ("--min-path-length", "--min-size", "--layout", "--cycle-prob"))
    for argv, message in [(["--generate", "--size", "1"], "error: --size must be >= 2, got 1"),
                          (["--source-dir", str(tmp_path / "none")],
                           f"error: {tmp_path / 'none' / 'train.csv'} not found"),
                          (["--generate", "--size", "x"], "error: argument --size: invalid int value: 'x'"),
                          (["--generate", "--size", "16", "--min-size", "17"],
                           "error: --min-size must be in [5, --size 16], got 17"),
                          (["--generate", "--min-size", "3"], "error: --min-size must be in [5, --size 30], got 3"),
                          (["--generate", "--layout", "maze"], "error: argument --layout: invalid choice: 'maze'"),
                          (["--generate", "--layout", "lattice", "--cycle-prob", "2"],
                           "error: argument --cycle-prob: '2': give a number in [0, 1]"),
                          (["--generate", "--cycle-prob", "0"], "error: --cycle-prob shapes lattice mazes"),
                          (["--layout", "lattice"], "error: --min-size, --layout and --ties shape generated mazes")]:
        monkeypatch.setattr(sys, "argv", ["build_maze_dataset.py", *argv, "--output-dir", str(tmp_path / "x")])
        with pytest.raises(SystemExit) as info:
            runpy.run_path(str(REPO / "scripts" / "build_maze_dataset.py"), run_name="__main__")
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()
    # As a real script process (its own sys.path setup), end to end.
    out = tmp_path / "cli"
    result = subprocess.run([sys.executable, "scripts/build_maze_dataset.py", "--generate", "--size", "8",
                             "--train-size", "2", "--test-size", "1", "--aug", "--output-dir", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(load_split(out, "train")["inputs"]) == 16 and "mazes/s" in result.stdout


def first_path_by_search(question):
    """The move string (u, l, d, r) of the S-G shortest path first in the order up, left, down, right, by listing every
    shortest path (a plain depth-first search over the distances from S and from G): the rule mark_first_path
    follows, computed another way."""
    (s,), (g,) = zip(*np.nonzero(question == START)), zip(*np.nonzero(question == GOAL))
    open_cells = question != WALL
    from_s, _ = bfs(open_cells, s)
    from_g, _ = bfs(open_cells, g)
    length, paths = from_s[g], []

    def walk(cell, moves):
        if cell == g:
            paths.append(moves)
            return
        for name, (dr, dc) in zip("uldr", ((-1, 0), (0, -1), (1, 0), (0, 1))):
            r, c = cell[0] + dr, cell[1] + dc
            if (0 <= r < len(question) and 0 <= c < len(question) and from_s[r, c] == from_s[cell] + 1
                    and from_g[r, c] == length - from_s[r, c]):
                walk((r, c), moves + name)
    walk(s, "")
    return min(paths, key=lambda moves: ["uldr".index(m) for m in moves]), len(paths)


def moves_of(answer):
    """The moves from S to G along the marked cells of a solved maze."""
    (s,), (g,) = zip(*np.nonzero(answer == START)), zip(*np.nonzero(answer == GOAL))
    cell, seen, moves = s, {s}, ""
    while cell != g:
        for name, (dr, dc) in zip("uldr", ((-1, 0), (0, -1), (1, 0), (0, 1))):
            r, c = cell[0] + dr, cell[1] + dc
            if (r, c) not in seen and 0 <= r < len(answer) and 0 <= c < len(answer) and answer[r, c] in (PATH, GOAL):
                cell, moves = (r, c), moves + name
                seen.add(cell)
                break
    return moves


def test_ties_first_marks_the_first_shortest_path_of_each_view():
    """--ties first keeps mazes with several shortest paths and marks the first in the order up, left, down, right;
    each dihedral view gets its own first path (the rule turns with the maze, the label must not)."""
    from utils.data.common import dihedral

    several = 0
    for seed in range(40):
        question, answer, _ = maze.generate_framed_maze(np.random.default_rng(seed), 12, 6, "mixed", ties="first")
        for t in range(maze.NUM_DIHEDRAL):
            view = dihedral(question, t)
            first, count = first_path_by_search(view)
            several += count > 1 and t == 0
            assert moves_of(maze.mark_first_path(view)) == first
        assert np.array_equal(answer, maze.mark_first_path(question))
    assert several >= 10  # most mixed mazes keep several shortest paths


def test_ties_first_dataset_labels_each_augmented_view(tmp_path):
    out = maze.build_maze_dataset(tmp_path / "ties", generate=True, size=10, min_size=6, layout="mixed", train_size=6,
                                  test_size=2, aug=True, ties="first")
    inputs = np.load(out / "train" / "all__inputs.npy").reshape(-1, 10, 10)
    labels = np.load(out / "train" / "all__labels.npy").reshape(-1, 10, 10)
    for question, label in zip(inputs, labels):
        assert np.array_equal(label, maze.mark_first_path(question))
    record = json.loads((out / "train" / "dataset.json").read_text())["generation"]
    assert record["ties"] == "first"
