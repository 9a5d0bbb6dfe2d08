"""Sudoku builder tests: generation, augmentation, CSV reading, the on-disk format, and the loader round trip.

Uniqueness and validity are checked with a separate, deliberately plain solver (sets, no bitmasks).
"""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from utils.data.sudoku import build as builder
from utils.data.sudoku import rating as sudoku_rating
from utils.data.puzzle_dataset import ARRAY_FIELDS, IGNORE_LABEL_ID, DatasetError, PuzzleDataset

REPO = Path(__file__).resolve().parents[1]
MIN_BLANKS = 50


UNITS = [(i // 9, 9 + i % 9, 18 + i // 27 * 3 + i % 9 // 3) for i in range(81)]  # each cell's row, column, box


def plain_count(grid, limit=2):
    """Independent solution counter: backtracking on the cell with the fewest candidates (the digits no digit in its
    row, column or box uses; each unit's digits kept as a bit mask)."""
    g = [int(d) for d in grid]
    used = [0] * 27
    for i, d in enumerate(g):
        for u in UNITS[i]:
            used[u] |= 1 << d if d else 0

    def candidates(i):
        r, c, b = UNITS[i]
        taken = used[r] | used[c] | used[b]
        return [d for d in range(1, 10) if not taken >> d & 1]

    def recurse():
        empties = [i for i in range(81) if g[i] == 0]
        if not empties:
            return 1
        i, options = min(((i, candidates(i)) for i in empties), key=lambda t: len(t[1]))
        before = [used[u] for u in UNITS[i]]
        total = 0
        for d in options:
            g[i] = d
            for u in UNITS[i]:
                used[u] |= 1 << d
            total += recurse()
            g[i] = 0
            for u, mask in zip(UNITS[i], before):
                used[u] = mask
            if total >= limit:
                break
        return total

    return recurse()


def is_valid_solution(grid):
    g = np.asarray(grid).reshape(9, 9)
    units = list(g) + list(g.T) + [g[r:r + 3, c:c + 3].ravel() for r in (0, 3, 6) for c in (0, 3, 6)]
    return all(sorted(u.tolist()) == list(range(1, 10)) for u in units)


def load_split(root, split):
    d = Path(root) / split
    return {name: np.load(d / f"all__{name}.npy") for name in ARRAY_FIELDS}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen") / "sudoku"
    builder.build_dataset(root, generate=True, train_size=10, test_size=6, min_blanks=MIN_BLANKS, num_aug=3, seed=0)
    return root


def test_on_disk_format_matches_the_reference(generated):
    assert sorted(p.name for p in generated.iterdir()) == ["identifiers.json", "test", "train"]
    assert json.loads((generated / "identifiers.json").read_text()) == ["<blank>"]
    for split, groups, variants in (("train", 10, 4), ("test", 6, 1)):
        d = generated / split
        ratings = ["all__ratings.npy"] if split == "test" else []  # ours, beside the reference files; loaders skip it
        expected = ["dataset.json", *ratings, *(f"all__{f}.npy" for f in ARRAY_FIELDS)]
        assert sorted(p.name for p in d.iterdir()) == sorted(expected)
        metadata = json.loads((d / "dataset.json").read_text())
        assert set(metadata.pop("ratings")) == {"scale", "min", "median", "max", "histogram"}  # ignored by the loaders
        assert metadata == {
            "pad_id": 0, "ignore_label_id": 0, "blank_identifier_id": 0, "vocab_size": 11, "seq_len": 81,
            "num_puzzle_identifiers": 1, "total_groups": groups, "mean_puzzle_examples": 1.0,
            "total_puzzles": groups, "sets": ["all"]}  # TRM's field too: both references' loaders read it
        a = load_split(generated, split)
        n = groups * variants
        assert a["inputs"].dtype == a["labels"].dtype == np.uint8 and a["inputs"].shape == a["labels"].shape == (n, 81)
        for name in ("puzzle_identifiers", "puzzle_indices", "group_indices"):
            assert a[name].dtype == np.int32
        assert np.array_equal(a["puzzle_identifiers"], np.zeros(n))
        assert np.array_equal(a["puzzle_indices"], np.arange(n + 1))  # one example per puzzle
        assert np.array_equal(a["group_indices"], np.arange(0, n + 1, variants))  # original + its augmentations
        assert a["inputs"].min() == 1 and a["inputs"].max() <= 10  # blank 1, digits 2..10, no padding
        assert a["labels"].min() >= 2 and a["labels"].max() == 10  # every cell supervised


def test_generated_puzzles_have_one_solution_and_it_is_the_label(generated):
    for split in ("train", "test"):
        a = load_split(generated, split)
        originals = a["group_indices"][:-1]  # first puzzle of each group, one example each
        for q, sol in zip(a["inputs"][originals] - 1, a["labels"][originals] - 1):
            assert (q == 0).sum() >= MIN_BLANKS
            assert is_valid_solution(sol) and np.all((q == 0) | (q == sol))
            assert plain_count(q) == 1


def test_train_and_test_are_disjoint_even_up_to_symmetry(generated):
    train, test = load_split(generated, "train"), load_split(generated, "test")
    assert not {r.tobytes() for r in train["inputs"]} & {r.tobytes() for r in test["inputs"]}
    assert not {r.tobytes() for r in train["labels"]} & {r.tobytes() for r in test["labels"]}
    train_fp = set(builder.grid_fingerprints(train["labels"] - 1))
    assert not train_fp & set(builder.grid_fingerprints(test["labels"] - 1))


def test_augmentations_are_valid_distinct_puzzles_of_the_same_group(generated):
    a = load_split(generated, "train")
    for g in range(len(a["group_indices"]) - 1):
        first, stop = a["group_indices"][g], a["group_indices"][g + 1]
        q0 = a["inputs"][first] - 1
        for p in range(first + 1, stop):
            q, sol = a["inputs"][p] - 1, a["labels"][p] - 1
            assert is_valid_solution(sol) and np.all((q == 0) | (q == sol))
            assert (q == 0).sum() == (q0 == 0).sum() and not np.array_equal(q, q0)
        if g < 3:  # uniqueness survives the transform (a slower check, so on a few groups)
            assert all(plain_count(a["inputs"][p] - 1) == 1 for p in range(first + 1, stop))


def recover_position_map(seed):
    """Where shuffle_sudoku (seeded ``seed``) sends each cell, found by moving one marked cell at a time."""
    dest = np.empty(81, int)
    for k in range(81):
        marked = np.zeros((1, 81), np.uint8)
        marked[0, k] = 1
        moved, _ = builder.shuffle_sudoku(marked, marked, np.random.default_rng(seed))
        (dest[k],) = np.flatnonzero(moved[0])
    return dest


def band_preserving_permutation(new_of_old):
    """True when a map of the 9 lines is a permutation that keeps each band (3 lines) together."""
    new_of_old = np.asarray(new_of_old)
    return sorted(new_of_old.tolist()) == list(range(9)) and all(len(set(new_of_old[b:b + 3] // 3)) == 1 for b in (0, 3, 6))


def test_shuffle_sudoku_is_a_sudoku_symmetry():
    q, sol = builder.generate_puzzle(np.random.default_rng(3), 40)
    transposed = 0
    for seed in range(40):
        new_row, new_col = np.divmod(recover_position_map(seed), 9)
        new_row, new_col = new_row.reshape(9, 9), new_col.reshape(9, 9)  # indexed by old (row, col)
        is_transposed = bool(np.all(new_row == new_row[0:1, :]))  # new row depends on the old column only
        transposed += is_transposed
        if is_transposed:
            row_map, col_map = new_row[0, :], new_col[:, 0]  # old column -> new row, old row -> new column
            assert np.all(new_col == new_col[:, 0:1])
        else:
            row_map, col_map = new_row[:, 0], new_col[0, :]
            assert np.all(new_row == new_row[:, 0:1]) and np.all(new_col == new_col[0:1, :])
        assert band_preserving_permutation(row_map) and band_preserving_permutation(col_map)
        aq, asol = builder.shuffle_sudoku(q[None], sol[None], np.random.default_rng(seed))
        dest = (new_row * 9 + new_col).ravel()
        relabel = dict(zip(sol.tolist(), asol[0][dest].tolist()))  # old digit -> new digit, must be consistent
        assert sorted(relabel) == sorted(relabel.values()) == list(range(1, 10))
        assert np.array_equal(asol[0][dest], [relabel[d] for d in sol])
        assert np.array_equal(aq[0][dest], [relabel.get(d, 0) for d in q])  # blanks stay blank
    assert 8 <= transposed <= 32  # p = 0.5


def test_fingerprints_survive_symmetries_and_separate_grids():
    rng = np.random.default_rng(5)
    grids = np.stack([builder.generate_puzzle(rng, 0)[1] for _ in range(30)])
    fps = builder.grid_fingerprints(grids)
    assert len(set(fps)) == 30
    for grid, fp in zip(grids[:5], fps):
        _, variants = builder.shuffle_sudoku(np.zeros((20, 81), np.uint8), np.repeat(grid[None], 20, 0), rng)
        assert set(builder.grid_fingerprints(variants)) == {fp}


def test_generate_distinct_replaces_excluded_grids():
    q, a, seen = builder.generate_distinct(3, seed=4, stream=0, min_blanks=0)
    assert len(seen) == 3
    q2, a2, seen2 = builder.generate_distinct(2, seed=4, stream=0, min_blanks=0, exclude=seen)
    # indices 0..2 are excluded, so the next ones are drawn
    assert not {r.tobytes() for r in a} & {r.tobytes() for r in a2} and len(seen2) == 5
    expected = np.stack([builder._generate_one(k, 4, 0, min_blanks=0)[1] for k in (3, 4)])
    assert np.array_equal(a2, expected)


def test_max_blanks_stops_early_with_a_unique_puzzle():
    rng = np.random.default_rng(9)
    for _ in range(3):
        q, sol = builder.generate_puzzle(rng, 30, 35)
        assert 30 <= (q == 0).sum() <= 35 and plain_count(q) == 1 and np.all((q == 0) | (q == sol))
    with pytest.raises(DatasetError, match=r"--max-blanks must be in \[--min-blanks=45, 64\]"):
        builder.build_dataset("unused", generate=True, max_blanks=40)


def test_unreachable_min_blanks_gives_a_clear_error(monkeypatch):
    monkeypatch.setattr(builder, "MAX_ATTEMPTS", 2)
    with pytest.raises(DatasetError, match="could not reach 64 to 64 blanks in 2 random grids; .* widen --min-blanks"):
        builder.generate_puzzle(np.random.default_rng(0), 64)
    with pytest.raises(DatasetError, match="no puzzle rated >= 1000 among 2 with 0 to 64 blanks .* widen --min-rating"):
        builder.generate_puzzle(np.random.default_rng(0), 0, min_rating=1000)


def test_generation_is_deterministic_for_any_worker_count(generated, tmp_path):
    again = builder.build_dataset(tmp_path / "again", generate=True, train_size=10, test_size=6,
                                  min_blanks=MIN_BLANKS, num_aug=3, seed=0, workers=2)
    for split in ("train", "test"):
        first, second = load_split(generated, split), load_split(again, split)
        assert all(np.array_equal(first[k], second[k]) for k in first)


@pytest.fixture(scope="module")
def rated(tmp_path_factory):
    root = tmp_path_factory.mktemp("rated") / "sudoku"
    builder.build_dataset(root, generate=True, train_size=8, test_size=4, minimal=True, min_rating=2, max_rating=12,
                          num_aug=1, seed=3)
    return root


def originals(root, split):
    a = load_split(root, split)
    first = a["group_indices"][:-1]
    return a["inputs"][first] - 1, a["labels"][first] - 1


def test_rated_generation_keeps_the_bounds_and_stores_the_distribution(rated):
    for split in ("train", "test"):
        questions, answers = originals(rated, split)
        ratings = [sudoku_rating.rate(q) for q in questions]
        assert all(2 <= r <= 12 for r in ratings)
        assert all(plain_count(q) == 1 and np.all((q == 0) | (q == a)) for q, a in zip(questions, answers))
        stored = json.loads((rated / split / "dataset.json").read_text())["ratings"]
        assert stored == builder.rating_summary(np.array(ratings), "solver guesses (utils/data/sudoku/rating.rate)")
        assert sum(stored["histogram"].values()) == len(questions) and stored["min"] >= 2


def is_minimal(q):
    """Every clue is needed: blanking any one of them lets the plain solver find a second solution."""
    for i in np.flatnonzero(q):
        fewer = q.copy()
        fewer[i] = 0
        if plain_count(fewer) < 2:
            return False
    return True


@pytest.mark.slow
def test_minimal_puzzles_are_minimal(rated):
    questions, _ = originals(rated, "test")
    assert all(is_minimal(q) for q in questions)
    rng = np.random.default_rng(6)
    q, _ = builder.generate_puzzle(rng, 0, 56, minimal=True)  # --max-blanks then selects among minimal puzzles
    assert (q == 0).sum() <= 56 and is_minimal(q)
    q, _ = builder.generate_puzzle(rng, 40, 40)  # without --minimal it stops at 40 blanks: clues to spare
    assert not is_minimal(q)


def test_max_rating_keeps_easy_puzzles():
    rng = np.random.default_rng(7)
    for _ in range(3):
        q, _ = builder.generate_puzzle(rng, 0, max_rating=0)
        assert sudoku_rating.rate(q) == 0 and plain_count(q) == 1


def test_rated_generation_is_deterministic_for_any_worker_count(rated, tmp_path):
    again = builder.build_dataset(tmp_path / "again", generate=True, train_size=8, test_size=4, minimal=True,
                                  min_rating=2, max_rating=12, num_aug=1, seed=3, workers=2)
    for split in ("train", "test"):
        for name in [f"all__{f}.npy" for f in ARRAY_FIELDS] + ["dataset.json"]:
            assert (rated / split / name).read_bytes() == (again / split / name).read_bytes()


def csv_rows(n, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        q, a = builder.generate_puzzle(rng, 40)
        rows.append([f"src{k}", "".join(str(d) if d else "." for d in q), "".join(map(str, a)), str(k)])
    return rows


def write_csv(path, rows, header=("source", "question", "answer", "rating")):
    path.write_text("\n".join(",".join(r) for r in [list(header)] + rows) + "\n")


def test_csv_round_trip(tmp_path):
    source = tmp_path / "raw"
    source.mkdir()
    train, test = csv_rows(6, 1), csv_rows(4, 2)
    write_csv(source / "train.csv", train)
    write_csv(source / "test.csv", test)
    with pytest.warns(FutureWarning, match="--min-difficulty .* is deprecated: use --min-rating"):
        root = builder.build_dataset(tmp_path / "ds", source_dir=source, min_difficulty=2, subsample_size=3, num_aug=2,
                                     seed=0)

    def tokens(text):
        return [1 if ch == "." else int(ch) + 1 for ch in text]

    t = load_split(root, "test")  # ratings 0..3: rows 2 and 3 kept, in file order, not augmented
    assert t["inputs"].tolist() == [tokens(r[1]) for r in test[2:]] and t["labels"].tolist() == [tokens(r[2]) for r in test[2:]]
    tr = load_split(root, "train")  # ratings 0..5: 3 of rows 2..5 kept, each with 2 augmentations
    originals = tr["group_indices"][:-1]
    assert len(originals) == 3 and np.array_equal(originals, [0, 3, 6])
    kept = {(tuple(tokens(r[1])), tuple(tokens(r[2]))) for r in train[2:]}
    chosen = {(tuple(tr["inputs"][i]), tuple(tr["labels"][i])) for i in originals}
    assert chosen <= kept and len(chosen) == 3
    # The stored distribution is the CSV's rating column of the rows kept (ratings are row numbers here).
    chosen_ratings = sorted(int(r[3]) for r in train[2:] if (tuple(tokens(r[1])), tuple(tokens(r[2]))) in chosen)
    assert json.loads((root / "train" / "dataset.json").read_text())["ratings"] == builder.rating_summary(
        np.array(chosen_ratings), "rating column of the source CSV")
    assert json.loads((root / "test" / "dataset.json").read_text())["ratings"]["histogram"] == {"2-3": 2}


def test_csv_rating_bounds(tmp_path):
    path = tmp_path / "train.csv"
    rows = csv_rows(6, 4)  # ratings 0..5
    write_csv(path, rows)
    q, a, r = builder.read_sudoku_csv(path, min_rating=1, max_rating=3)
    assert r.tolist() == [1, 2, 3] and q.shape == a.shape == (3, 81)
    assert [int("".join(map(str, row))) for row in a] == [int(row[2]) for row in rows[1:4]]
    assert builder.read_sudoku_csv(path)[2].tolist() == list(range(6))
    assert builder.read_sudoku_csv(path, max_rating=0)[2].tolist() == [0]
    with pytest.raises(DatasetError, match=r"train.csv: no puzzles rated 7 to 9: widen --min-rating/--max-rating"):
        builder.read_sudoku_csv(path, min_rating=7, max_rating=9)


def set_field(rows, row, column, value):
    rows[row][column] = value


def contradict_a_clue(rows):
    q, a = rows[1][1], list(rows[1][2])
    i = next(k for k, ch in enumerate(q) if ch != ".")
    a[i] = str(int(a[i]) % 9 + 1)
    rows[1][2] = "".join(a)


def swap_two_blank_cells_of_a_row(rows):
    """Keeps the clues and the row valid but repeats digits in two columns."""
    q, a = rows[1][1], list(rows[1][2])
    for r in range(9):
        blanks = [r * 9 + c for c in range(9) if q[r * 9 + c] == "."]
        if len(blanks) >= 2:
            i, j = blanks[:2]
            a[i], a[j] = a[j], a[i]
            rows[1][2] = "".join(a)
            return


@pytest.fixture(scope="module")
def valid_rows():
    return csv_rows(4, 3)


@pytest.mark.parametrize("line, corrupt, message", [
    (1, None, "expected the header source,question,answer,rating"),
    (3, lambda rows: rows[1].pop(), "expected 4 columns"),
    (3, lambda rows: set_field(rows, 1, 1, rows[1][1][:80]), "must be 81 characters, got 80 and 81"),
    (3, lambda rows: set_field(rows, 1, 1, "x" + rows[1][1][1:]), "may only hold digits 1-9 and '.'"),
    (3, lambda rows: set_field(rows, 1, 1, "\u00e9" + rows[1][1][1:]), "may only hold digits 1-9 and '.'"),
    (3, lambda rows: set_field(rows, 1, 2, "." + rows[1][2][1:]), "answer must be 81 digits 1-9"),
    (3, contradict_a_clue, "answer disagrees with a question clue"),
    (3, swap_two_blank_cells_of_a_row, "answer repeats a digit in a column"),
    (4, lambda rows: set_field(rows, 2, 3, "hard"), "rating 'hard' is not an integer"),
])
@pytest.mark.parametrize("chunk_rows", [2, 1 << 16])
def test_malformed_csv_names_the_line(tmp_path, valid_rows, line, corrupt, message, chunk_rows):
    rows = [list(r) for r in valid_rows]
    path = tmp_path / "train.csv"
    if corrupt is None:
        write_csv(path, rows, header=("source", "puzzle", "solution", "rating"))
    else:
        corrupt(rows)
        write_csv(path, rows)
    with pytest.raises(DatasetError, match=f"train.csv:{line}: .*{message}"):
        builder.read_sudoku_csv(path, min_rating=0, chunk_rows=chunk_rows)


def test_build_argument_errors(tmp_path):
    # Neither --source-dir nor --generate is the Hugging Face Hub (tests/test_hub_data.py): never two sources.
    with pytest.raises(DatasetError, match="choose exactly one source"):
        builder.build_dataset(tmp_path / "x", source_dir=tmp_path, generate=True)
    for source in ({"generate": True}, {"source_dir": tmp_path}):
        with pytest.raises(DatasetError, match="--repo and --revision pick the Hugging Face Hub source"):
            builder.build_dataset(tmp_path / "x", repo="owner/data", **source)
    with pytest.raises(DatasetError, match="--min-difficulty is the old name of --min-rating: give one, not both"):
        builder.build_dataset(tmp_path / "x", generate=True, min_difficulty=3, min_rating=2)
    with pytest.raises(DatasetError, match="--min-rating must be >= 0, got -1"):
        builder.build_dataset(tmp_path / "x", generate=True, min_rating=-1)
    with pytest.raises(DatasetError, match="--max-rating must be >= --min-rating=0, got -2"):
        builder.build_dataset(tmp_path / "x", generate=True, max_rating=-2)
    with pytest.raises(DatasetError, match="--max-rating must be >= --min-rating=5, got 3"):
        builder.build_dataset(tmp_path / "x", source_dir=tmp_path, min_rating=5, max_rating=3)
    with pytest.raises(DatasetError, match="--minimal shapes generated puzzles: use it with --generate"):
        builder.build_dataset(tmp_path / "x", source_dir=tmp_path, minimal=True)
    with pytest.raises(DatasetError, match=r"--min-blanks must be in \[0, 64\]"):
        builder.build_dataset(tmp_path / "x", generate=True, min_blanks=70)
    with pytest.raises(DatasetError, match="--num-aug must be >= 0"):
        builder.build_dataset(tmp_path / "x", generate=True, num_aug=-1)
    with pytest.raises(DatasetError, match="train.csv not found"):
        builder.build_dataset(tmp_path / "x", source_dir=tmp_path)
    assert not (tmp_path / "x").exists()


def test_output_dir_is_protected(tmp_path):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(DatasetError, match="not empty; pass --overwrite"):
        builder.build_dataset(other, generate=True, train_size=1, test_size=1)
    with pytest.raises(DatasetError, match="does not look like a puzzle dataset"):
        builder.build_dataset(other, generate=True, train_size=1, test_size=1, overwrite=True)
    assert (other / "todo.txt").read_text() == "keep me"
    root = builder.build_dataset(tmp_path / "ds", generate=True, train_size=1, test_size=1, seed=1)
    builder.build_dataset(root, generate=True, train_size=2, test_size=1, seed=1, overwrite=True)
    assert len(load_split(root, "train")["inputs"]) == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_cli(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_info:
        builder.main(["--help"])
    assert exit_info.value.code == 0 and "--generate" in capsys.readouterr().out
    with pytest.raises(DatasetError, match="choose exactly one source"):  # callers such as pretrain.py get the error
        builder.main(["--generate", "--source-dir", str(tmp_path), "--output-dir", str(tmp_path / "x")])
    # Run as a script, an error is one line and exit status 2, as for the trainers.
    monkeypatch.setattr(sys, "argv", ["build_sudoku_dataset.py", "--generate", "--source-dir", str(tmp_path),
                                      "--output-dir", str(tmp_path / "x")])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / "build_sudoku_dataset.py"), run_name="__main__")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: choose exactly one source: --source-dir DIR, --generate, or neither to download the published CSVs "
        "(Sudoku-Extreme train.csv/test.csv of sapientinc/sudoku-extreme) from the Hugging Face Hub")
    for flags, message in ((["--min-rating", "5", "--max-rating", "2"], "--max-rating must be >= --min-rating=5, got 2"),
                           (["--min-rating", "-1"], "--min-rating must be >= 0, got -1")):
        monkeypatch.setattr(sys, "argv", ["build_sudoku_dataset.py", "--generate", "--output-dir", str(tmp_path / "x"), *flags])
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(str(REPO / "scripts" / "build_sudoku_dataset.py"), run_name="__main__")
        assert exit_info.value.code == 2 and capsys.readouterr().err.strip() == f"error: {message}"
    # As a real script process (its own sys.path setup), end to end.
    out = tmp_path / "cli"
    result = subprocess.run([sys.executable, "scripts/build_sudoku_dataset.py", "--generate", "--train-size", "2",
                             "--test-size", "1", "--num-aug", "1", "--output-dir", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(load_split(out, "train")["inputs"]) == 4 and "puzzles/s" in result.stdout


def test_loader_reads_the_built_dataset(generated):
    train = PuzzleDataset(generated, "train", global_batch_size=4, seed=0)
    batches = list(train)
    assert len(batches) == 2  # 10 groups, one puzzle each per epoch -> 2 full batches of 4
    for name, batch, size in batches:
        assert name == "all" and size == 4 and batch["inputs"].shape == (4, 81)
        assert batch["inputs"].min() >= 1 and batch["inputs"].max() <= 10
        assert batch["labels"].min() >= 2 and batch["labels"].max() <= 10  # every cell supervised, none ignored
        assert (batch["puzzle_identifiers"] == 0).all()
    test = list(PuzzleDataset(generated, "test", global_batch_size=4))
    assert [size for _, _, size in test] == [4, 2]
    assert (test[1][1]["labels"][2:] == IGNORE_LABEL_ID).all() and (test[1][1]["inputs"][2:] == 0).all()


def test_generation_workers_started_inside_a_training_run_end_on_sigterm():
    # A trainer builds its missing dataset while its graceful-stop handler is installed; forked generation
    # workers used to inherit it and swallow the SIGTERM with which the pool ends them, which could hang the build.
    # Each work item reports whether SIGTERM in its worker process has the default action.
    code = ("import signal\n"
            "import numpy as np\n"
            "from utils.data.common import generate_distinct\n"
            "from utils.run.stop import GracefulStop\n"
            "def work(k):\n"
            "    return np.array([k]), np.array([signal.getsignal(signal.SIGTERM) == signal.SIG_DFL])\n"
            "with GracefulStop():\n"
            "    _, plain, _ = generate_distinct(work, lambda q, a: q.tobytes(), 6, workers=2)\n"
            "print(int(plain.all()))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.split()[-1] == "1", result.stderr
    assert "received" not in result.stderr


# ---- issue 53: the output folder at publish time, symlinks, an impossible floor (device=cpu) -------------------------

def _run_builder_script(argv, monkeypatch, capsys) -> str:
    """scripts/build_sudoku_dataset.py run in this process; asserts exit status 2 and returns its one error line."""
    monkeypatch.setattr(sys, "argv", ["build_sudoku_dataset.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / "build_sudoku_dataset.py"), run_name="__main__")
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 2 and len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    return errors[0]


def test_campaign5_p02_publishing_keeps_what_appeared_in_the_output_dir_and_the_later_of_two_builds_fails(
        tmp_path, monkeypatch):
    write = builder._write_split
    out = tmp_path / "ds"

    def user_file_appears(directory, *args):  # while the build writes its splits, a user's file appears in out
        out.mkdir(exist_ok=True)
        (out / "notes.txt").write_text("mine")
        return write(directory, *args)

    monkeypatch.setattr(builder, "_write_split", user_file_appears)
    with pytest.raises(DatasetError, match=r"is not empty; pass --overwrite .* \(it changed while this build ran, so "
                                           r"the new dataset was not published\)"):
        builder.build_dataset(out, generate=True, train_size=1, test_size=1)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"

    raced = tmp_path / "raced"

    def another_build_finishes_first(directory, *args):
        monkeypatch.setattr(builder, "_write_split", write)
        builder.build_dataset(raced, generate=True, train_size=2, test_size=1, seed=1)
        return write(directory, *args)

    monkeypatch.setattr(builder, "_write_split", another_build_finishes_first)
    with pytest.raises(DatasetError, match=f"--output-dir {raced} is not empty"):
        builder.build_dataset(raced, generate=True, train_size=1, test_size=1)
    assert len(load_split(raced, "train")["inputs"]) == 2  # the earlier build's dataset, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_campaign5_p17_overwrite_onto_a_symlinked_dataset_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (real / "identifiers.json").write_text('["<blank>"]')  # what check_output_dir takes for a dataset
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setattr(builder, "_source_puzzles", lambda *a, **k: pytest.fail("the build started its work"))
    line = _run_builder_script(["--generate", "--overwrite", "--train-size", "1", "--test-size", "1",
                                "--output-dir", str(link)], monkeypatch, capsys)
    assert line == (f"error: --output-dir {link} is a symbolic link (to {real}); a build replaces the folder the path "
                    "names: give the folder itself, or a new path")
    assert link.is_symlink() and sorted(p.name for p in real.iterdir()) == ["identifiers.json"]


def test_campaign5_p15_an_expert_floor_out_of_reach_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(builder, "_source_puzzles", lambda *a, **k: pytest.fail("the build started its work"))
    line = _run_builder_script(["--generate", "--expert", "--min-rating", "100000", "--output-dir",
                                str(tmp_path / "x")], monkeypatch, capsys)
    assert line.startswith("error: --min-rating 100000 is out of the expert generator's reach") and \
        f"give at most {builder.EXPERT_MAX_FLOOR}" in line
