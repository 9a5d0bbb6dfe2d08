"""Maze builder tests: reference CSV reading, hard-maze generation, dihedral augmentation, the on-disk format.

Shortest paths are checked with a separate, deliberately plain BFS that counts shortest paths, and the
dihedral transforms with explicit index formulas, not with the code under test.
"""

import csv
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


def test_build_argument_errors(tmp_path):
    out = tmp_path / "x"
    for kwargs, message in [({"generate": True, "source_dir": tmp_path}, "choose exactly one source"),
                            ({"generate": True, "revision": "v1"}, "--repo and --revision pick the Hugging Face Hub"),
                            ({"generate": True, "size": 1}, "--size must be >= 2"),
                            ({"generate": True, "size": 5, "min_path_length": 25},
                             r"--min-path-length must be in \[1, 24\]"),
                            ({"generate": True, "wall_density": (0.5, 0.3)}, "--wall-density must be LOW HIGH"),
                            ({"generate": True, "subsample_size": 0}, "--subsample-size must be >= 1")]:
        with pytest.raises(DatasetError, match=message):
            maze.build_maze_dataset(out, **kwargs)
    assert not out.exists()


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
    assert info.value.code == 0 and "--min-path-length" in capsys.readouterr().out
    for argv, message in [(["--generate", "--size", "1"], "error: --size must be >= 2, got 1"),
                          (["--source-dir", str(tmp_path / "none")],
                           f"error: {tmp_path / 'none' / 'train.csv'} not found"),
                          (["--generate", "--size", "x"], "error: argument --size: invalid int value: 'x'")]:
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
