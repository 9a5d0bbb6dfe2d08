"""Loader tests on hand-made datasets whose tokens name their example, so every row can be traced."""

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

from utils.data.puzzle_dataset import (IGNORE_LABEL_ID, NO_BAND, RATING_BAND_KEY, DatasetError, PuzzleDataset,
                                      PuzzleDatasetMetadata, load_metadata, rating_bands)

SEQ_LEN = 3


def write_split(root, split, groups, sets=("all",)):
    """Write a split where ``groups[g][p]`` is the example count of puzzle p of group g (per set).

    Example e (counted over the whole split) has inputs [e+1]*3 and labels [e+1, 0, e+1]; 0 is
    pad_id and ignore_label_id. Puzzle p (counted over the split) has identifier p + 1; 0 is the blank id.
    """
    directory = root / split
    directory.mkdir(parents=True)
    example, puzzle = 0, 0
    for set_name in sets:
        sizes = [n for group in groups for n in group]
        examples = np.arange(example, example + sum(sizes)) + 1
        arrays = {
            "inputs": np.repeat(examples[:, None], SEQ_LEN, 1).astype(np.int32),
            "labels": np.stack([examples, np.zeros_like(examples), examples], 1).astype(np.int32),
            "puzzle_identifiers": np.arange(puzzle + 1, puzzle + 1 + len(sizes), dtype=np.int32),
            "puzzle_indices": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32),
            "group_indices": np.concatenate([[0], np.cumsum([len(g) for g in groups])]).astype(np.int32),
        }
        for name, array in arrays.items():
            np.save(directory / f"{set_name}__{name}.npy", array)
        example += sum(sizes)
        puzzle += len(sizes)
    metadata = PuzzleDatasetMetadata(
        pad_id=0, ignore_label_id=0, blank_identifier_id=0, vocab_size=example + 1, seq_len=SEQ_LEN,
        num_puzzle_identifiers=puzzle + 1, total_groups=len(groups) * len(sets), mean_puzzle_examples=1.0, sets=list(sets),
    )
    (directory / "dataset.json").write_text(json.dumps(asdict(metadata)))
    (root / "identifiers.json").write_text(json.dumps(["<blank>"]))
    return directory


def collect(dataset):
    return [(name, {k: v.clone() for k, v in batch.items()}, size) for name, batch, size in dataset]


def example_ids(batch):
    """Example index of each row; -1 for padding."""
    return (batch["inputs"][:, 0] - 1).tolist()


def test_train_batches_are_full_and_drop_the_incomplete_last(tmp_path):
    write_split(tmp_path, "train", [[1]] * 10)
    ds = PuzzleDataset(tmp_path, "train", global_batch_size=4)
    batches = collect(ds)
    assert len(ds) == len(batches) == 2  # 10 groups -> 2 full batches of 4, 2 groups dropped
    seen = []
    for name, batch, size in batches:
        assert name == "all" and size == 4
        assert batch["inputs"].shape == (4, SEQ_LEN) and batch["labels"].shape == (4, SEQ_LEN)
        assert batch["puzzle_identifiers"].shape == (4,)
        assert all(t.dtype == torch.int32 and t.device.type == "cpu" for t in batch.values())
        seen += example_ids(batch)
    assert len(set(seen)) == 8  # no group twice in one epoch


def test_labels_ignore_id_becomes_minus_100_and_identifiers_match_examples(tmp_path):
    write_split(tmp_path, "train", [[2], [3], [1], [2]])
    for _, batch, _ in PuzzleDataset(tmp_path, "train", global_batch_size=2, epochs_per_iter=3):
        token = batch["inputs"][:, 0]
        assert torch.equal(batch["labels"][:, 1], torch.full_like(token, IGNORE_LABEL_ID))
        assert torch.equal(batch["labels"][:, 0], token) and torch.equal(batch["labels"][:, 2], token)
        # example -> puzzle: offsets [0, 2, 5, 6, 8]; identifier = puzzle + 1
        e = token - 1
        puzzle = torch.searchsorted(torch.tensor([0, 2, 5, 6, 8]), e, right=True) - 1
        assert torch.equal(batch["puzzle_identifiers"], (puzzle + 1).int())


def test_one_random_puzzle_per_group_per_epoch(tmp_path):
    write_split(tmp_path, "train", [[1, 1, 1]] * 6)  # group g holds examples 3g..3g+2
    ds = PuzzleDataset(tmp_path, "train", global_batch_size=3, epochs_per_iter=4, seed=5)
    rows = [e for _, batch, _ in ds for e in example_ids(batch)]
    assert len(rows) == 24  # 4 epochs x 6 groups, exactly 8 batches
    groups = [e // 3 for e in rows]
    for epoch in range(4):
        assert sorted(groups[epoch * 6:(epoch + 1) * 6]) == list(range(6))
    assert len({e % 3 for e in rows}) == 3  # the puzzle within a group varies
    assert groups[:6] != groups[6:12] or groups[6:12] != groups[12:18]  # each epoch reshuffles


def test_multi_example_puzzles_are_packed_and_cut_at_the_batch_end(tmp_path):
    write_split(tmp_path, "train", [[3]] * 7)  # puzzle g = examples 3g..3g+2
    ds = PuzzleDataset(tmp_path, "train", global_batch_size=4, seed=1)
    batches = [example_ids(b) for _, b, _ in ds]
    # Each batch: one whole puzzle (3 examples) + 1 example of the next, which is then dropped;
    # 7 groups -> 3 batches, and the 7th group's 3 examples cannot fill a 4th batch.
    assert len(batches) == 3
    used = []
    for rows in batches:
        first, second = rows[0] // 3, rows[3] // 3
        assert sorted(rows[:3]) == [3 * first, 3 * first + 1, 3 * first + 2] and first != second
        used += [first, second]
    assert len(set(used)) == 6


def test_rank_slices_partition_the_world_size_1_batch(tmp_path):
    write_split(tmp_path, "train", [[2, 1], [1], [3, 2], [1, 1, 1], [2]] * 3)
    write_split(tmp_path, "test", [[2], [1], [3]] * 3)
    for split in ("train", "test"):
        reference = collect(PuzzleDataset(tmp_path, split, global_batch_size=8, seed=3, epochs_per_iter=2))
        for world_size in (2, 4):
            ranks = [collect(PuzzleDataset(tmp_path, split, 8, seed=3, rank=r, world_size=world_size, epochs_per_iter=2))
                     for r in range(world_size)]
            assert all(len(r) == len(reference) for r in ranks)
            for i, (name, batch, size) in enumerate(reference):
                for key in batch:
                    assert torch.equal(torch.cat([r[i][1][key] for r in ranks]), batch[key])
                assert all(r[i][0] == name and r[i][2] == size for r in ranks)
                assert all(r[i][1]["inputs"].shape[0] == 8 // world_size for r in ranks)


def test_test_mode_covers_every_example_once_with_padding(tmp_path):
    write_split(tmp_path, "test", [[2], [1], [3], [4]], sets=("a", "b"))  # 10 examples per set
    for world_size in (1, 2):
        seen = {"a": [], "b": []}
        for rank in range(world_size):
            ds = PuzzleDataset(tmp_path, "test", global_batch_size=4, rank=rank, world_size=world_size)
            assert len(ds) == 6
            batches = collect(ds)
            assert [size for _, _, size in batches] == [4, 4, 2, 4, 4, 2]
            for name, batch, _ in batches:
                assert batch["inputs"].shape == (4 // world_size, SEQ_LEN)
                e = batch["inputs"][:, 0] - 1
                real, pad = e >= 0, e < 0
                seen[name] += e[real].tolist()
                assert torch.all(batch["inputs"][pad] == 0) and torch.all(batch["labels"][pad] == IGNORE_LABEL_ID)
                assert torch.all(batch["puzzle_identifiers"][pad] == 0)
                offsets = torch.tensor([0, 2, 3, 6, 10]) + (10 if name == "b" else 0)
                puzzle = torch.searchsorted(offsets, e[real], right=True) - 1 + (4 if name == "b" else 0)
                assert torch.equal(batch["puzzle_identifiers"][real], (puzzle + 1).int())
        # in file order, each example once; with 2 ranks, rank 1's half of each last batch is padding
        assert seen["a"] == list(range(10)) if world_size == 1 else sorted(seen["a"]) == list(range(10))
        assert sorted(seen["b"]) == list(range(10, 20))


def test_train_mode_iterates_every_set(tmp_path):
    write_split(tmp_path, "train", [[1]] * 4, sets=("a", "b"))
    names = [name for name, _, _ in PuzzleDataset(tmp_path, "train", global_batch_size=2)]
    assert names == ["a", "a", "b", "b"]


def test_same_seed_same_batches_other_seed_or_iteration_differs(tmp_path):
    def flat(batches):
        return [e for _, batch, _ in batches for e in example_ids(batch)]

    write_split(tmp_path / "multi", "train", [[1, 2], [3], [1]] * 10)
    a, b = PuzzleDataset(tmp_path / "multi", "train", 6, seed=7), PuzzleDataset(tmp_path / "multi", "train", 6, seed=7)
    assert flat(collect(a)) == flat(collect(b))
    write_split(tmp_path / "single", "train", [[1], [1, 1]] * 10)
    ds = PuzzleDataset(tmp_path / "single", "train", 6, seed=7)
    first, second = flat(collect(ds)), flat(collect(ds))  # iterations 0 and 1
    other = flat(collect(PuzzleDataset(tmp_path / "single", "train", 6, seed=8)))
    assert second != first and other != first


def test_resume_continues_with_exactly_the_same_batches(tmp_path):
    write_split(tmp_path, "train", [[1, 2], [3, 1], [1], [2, 2, 1]] * 5)
    full = PuzzleDataset(tmp_path, "train", global_batch_size=4, seed=11)
    per_iter = len(full)
    stream, states = [], []
    for _ in range(3):  # 3 iterations, recording the state after every batch
        for item in full:
            stream.append(item)
            states.append(full.state_dict())
    assert len(stream) >= 3 * 3 and full.state_dict()["iteration"] == 3
    for k in (0, 1, per_iter - 1, per_iter, len(stream) - 2):  # mid-iteration and right at boundaries
        resumed = PuzzleDataset(tmp_path, "train", global_batch_size=4, seed=11, rank=1, world_size=2)
        resumed.load_state_dict(json.loads(json.dumps(states[k])))  # survives a JSON/torch.save round trip
        rest = []
        while len(rest) < len(stream) - k - 1:
            rest += collect(resumed)
        for (_, want, want_size), (_, got, got_size) in zip(stream[k + 1:], rest):
            assert got_size == want_size
            for key in want:
                assert torch.equal(got[key], want[key][2:])  # rank 1 of 2 holds rows 2..3


def test_breaking_out_mid_iteration_resumes_in_process(tmp_path):
    write_split(tmp_path, "train", [[1]] * 12)
    reference = [example_ids(b) for _, b, _ in PuzzleDataset(tmp_path, "train", 2, seed=2)]
    ds = PuzzleDataset(tmp_path, "train", 2, seed=2)
    got = []
    for _, batch, _ in ds:
        got.append(example_ids(batch))
        if len(got) == 2:
            break
    got += [example_ids(b) for _, b, _ in ds]
    assert got == reference


def test_an_empty_iteration_still_advances(tmp_path):
    write_split(tmp_path, "train", [[1, 3]])  # one group: a 1-example and a 3-example puzzle
    for seed in range(50):  # the constructor refuses seeds whose iteration 0 draws the small puzzle
        try:
            ds = PuzzleDataset(tmp_path, "train", global_batch_size=3, seed=seed)
            break
        except DatasetError:
            continue
    counts = []
    for i in range(10):
        counts.append(len(list(ds)))
        assert ds.state_dict()["iteration"] == i + 1
    assert counts[0] == 1 and 0 in counts


def test_load_state_dict_rejects_other_settings(tmp_path):
    write_split(tmp_path, "train", [[1]] * 12)
    state = PuzzleDataset(tmp_path, "train", 4, seed=1).state_dict()
    with pytest.raises(DatasetError, match="seed=1"):
        PuzzleDataset(tmp_path, "train", 4, seed=2).load_state_dict(state)
    with pytest.raises(DatasetError, match="global_batch_size=4"):
        PuzzleDataset(tmp_path, "train", 6, seed=1).load_state_dict(state)
    with pytest.raises(DatasetError, match="lacks batch"):
        PuzzleDataset(tmp_path, "train", 4, seed=1).load_state_dict({k: v for k, v in state.items() if k != "batch"})
    with pytest.raises(DatasetError, match="does not exist"):
        PuzzleDataset(tmp_path, "train", 4, seed=1).load_state_dict({**state, "batch": 99})


def test_missing_data_path_says_how_to_build(tmp_path):
    with pytest.raises(DatasetError, match=r"not found: build it with python scripts/build_sudoku_dataset.py --generate --output-dir"):
        PuzzleDataset(tmp_path / "nope", "train", 4)
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(DatasetError, match="has no 'test' split"):
        load_metadata(tmp_path / "empty", "test")


def test_metadata_missing_or_bad_fields_are_named(tmp_path):
    directory = write_split(tmp_path, "train", [[1]] * 4)
    meta = json.loads((directory / "dataset.json").read_text())
    (directory / "dataset.json").write_text(json.dumps({k: v for k, v in meta.items() if k not in ("seq_len", "sets")}))
    with pytest.raises(DatasetError, match="lacks field\\(s\\) seq_len, sets"):
        load_metadata(tmp_path, "train")
    (directory / "dataset.json").write_text(json.dumps({**meta, "vocab_size": "11"}))
    with pytest.raises(DatasetError, match="vocab_size must be an integer"):
        load_metadata(tmp_path, "train")
    (directory / "dataset.json").write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_metadata(tmp_path, "train")
    (directory / "dataset.json").write_text(json.dumps({**meta, "total_puzzles": 4}))  # TRM's extra field is fine
    assert load_metadata(tmp_path, "train").total_groups == 4


def save(name, array):
    """A corruption: overwrite ``all__<name>.npy`` with ``array``."""
    return lambda d: np.save(d / f"all__{name}.npy", array)


@pytest.mark.parametrize("corrupt, message", [
    (save("inputs", np.zeros((4, SEQ_LEN + 1), np.int32)), r"inputs.npy has shape \(4, 4\), expected \[N, seq_len=3\]"),
    (save("labels", np.zeros((3, SEQ_LEN), np.int32)), "labels.npy has shape"),
    (save("inputs", np.full((4, SEQ_LEN), 9, np.int32)), r"tokens in \[9, 9\], outside the vocabulary \[0, 5\)"),
    (save("labels", np.full((4, SEQ_LEN), -5, np.int32)), "labels.npy holds tokens"),
    (save("inputs", np.zeros((4, SEQ_LEN), np.float32)), "not an integer type"),
    (save("puzzle_indices", np.array([0, 2, 1, 3, 4], np.int32)), "must rise strictly from 0 to 4"),
    (save("group_indices", np.array([0, 4], np.int32)), "hold 1 groups but dataset.json says total_groups=4"),
    (save("puzzle_identifiers", np.full(4, 7, np.int32)), r"outside \[0, num_puzzle_identifiers=5\)"),
    (lambda d: (d / "all__labels.npy").unlink(), "all__labels.npy not found"),
    (lambda d: (d / "all__inputs.npy").write_bytes(b"garbage"), "not a readable .npy file"),
])
def test_inconsistent_arrays_are_refused(tmp_path, corrupt, message):
    corrupt(write_split(tmp_path, "train", [[1]] * 4))
    with pytest.raises(DatasetError, match=message):
        PuzzleDataset(tmp_path, "train", 2)


def test_bad_batch_settings(tmp_path):
    write_split(tmp_path, "train", [[1]] * 4)
    with pytest.raises(DatasetError, match="multiple of world_size 3"):
        PuzzleDataset(tmp_path, "train", 4, world_size=3)
    with pytest.raises(DatasetError, match="rank must be in"):
        PuzzleDataset(tmp_path, "train", 4, rank=2, world_size=2)
    with pytest.raises(DatasetError, match="cannot fill one global batch of 8"):
        PuzzleDataset(tmp_path, "train", 8)
    assert len(PuzzleDataset(tmp_path, "train", 8, epochs_per_iter=2)) == 1


def test_ratings_reach_test_batches_of_their_own_puzzles_only(tmp_path):
    """A ratings file gives each test row its puzzle's rating band (multi-example puzzles, two sets, padding);
    training batches and datasets without ratings keep the reference's three fields."""
    for split in ("train", "test"):
        directory = write_split(tmp_path, split, [[2], [1, 3]], sets=("all", "extra"))
        np.save(directory / "all__ratings.npy", np.array([0, 5, 40]))  # puzzles 0..2 of set "all"; "extra" has none
    test = PuzzleDataset(tmp_path, "test", global_batch_size=4)
    assert test.rating_bands == [0, 4, 32]
    rows = {}
    for name, batch, _ in test:
        for example, band in zip(example_ids(batch), batch[RATING_BAND_KEY].tolist()):
            rows.setdefault(name, []).append((example, band))
    per_puzzle = rating_bands([0, 5, 40])
    assert rows["all"] == [(0, per_puzzle[0]), (1, per_puzzle[0]), (2, per_puzzle[1]),
                           (3, per_puzzle[2]), (4, per_puzzle[2]), (5, per_puzzle[2]), (-1, NO_BAND), (-1, NO_BAND)]
    assert {band for _, band in rows["extra"]} == {NO_BAND}
    train = PuzzleDataset(tmp_path, "train", global_batch_size=2)
    assert train.rating_bands == [] and all(set(b) == {"inputs", "labels", "puzzle_identifiers"} for _, b, _ in train)
