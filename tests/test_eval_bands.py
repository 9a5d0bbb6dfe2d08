"""Exact accuracy per rating band (utils/eval/puzzle.py, evaluate.py), for datasets whose test split has a ratings file
(utils/data/puzzle_dataset.py): checked on cpu against a re-count from the answers themselves, and absent without
ratings."""

import json

import numpy as np
import pytest
import torch

from evaluate import print_metrics
from models import build_model, validate_arch
from utils.data.common import write_one_example_split
from utils.data.puzzle_dataset import NO_BAND, RATING_BAND_KEY, DatasetError, PuzzleDataset, band_name, rating_bands
from utils.distributed import Dist
from utils.eval.puzzle import evaluate_puzzles
from utils.eval.stats import wilson_interval

SEQ, VOCAB, BATCH = 16, 6, 4  # a 4 x 4 grid; 11 puzzles make three batches, the last one padded
RATINGS = [0, 1, 2, 3, 5, 9, 17, 40, 0, 3, 100]
EXACT = [True, False, True, True, False, True, True, False, False, False, True]


@pytest.fixture(scope="module")
def head():
    torch.manual_seed(0)
    arch = validate_arch({"name": "trm", "puzzle_emb_len": 0, "hidden_size": 32, "num_heads": 2, "H_layers": 1,
                          "L_layers": 1, "H_cycles": 1, "L_cycles": 1, "expansion": 2, "halt_max_steps": 2,
                          "puzzle_emb_ndim": 0, "halt_exploration_prob": 0.1, "pos_encodings": "rope"})
    return build_model(arch, batch_size=BATCH, seq_len=SEQ, vocab_size=VOCAB, num_puzzle_identifiers=1,
                       dtype=torch.float32, device="cpu").eval()


class Answers:
    """A consumer that keeps each real row's predicted tokens and labels (padding rows dropped)."""

    def __init__(self):
        self.preds, self.labels = [], []

    def update_batch(self, batch, preds):
        real = (batch["labels"] != -100).any(-1)
        self.preds.append(preds["preds"][real])
        self.labels.append(batch["labels"][real])


def write_dataset(root, inputs, labels, ratings=None):
    write_one_example_split(root / "test", inputs, labels, 1, VOCAB)
    (root / "identifiers.json").write_text(json.dumps(["<blank>"]))
    if ratings is not None:
        np.save(root / "test" / "all__ratings.npy", np.array(ratings, np.int64))
    return root


def evaluate(head, root):
    answers = Answers()
    metrics = evaluate_puzzles(head, head, PuzzleDataset(root, "test", BATCH), torch.device("cpu"), Dist(),
                               progress=False, consumers=[answers])
    return metrics, torch.cat(answers.preds), torch.cat(answers.labels)


def plain_band(rating):
    """The band names of rating_summary's histogram, written out by hand."""
    for low, high in ((0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 127)):
        if low <= rating <= high:
            return str(low) if low == high else f"{low}-{high}"
    raise AssertionError(rating)


@pytest.fixture(scope="module")
def rated(head, tmp_path_factory):
    """A rated dataset whose labels are the model's own answers on the rows of EXACT and differ elsewhere."""
    inputs = np.random.default_rng(0).integers(1, VOCAB, (len(RATINGS), SEQ)).astype(np.uint8)
    _, preds, _ = evaluate(head, write_dataset(tmp_path_factory.mktemp("probe"), inputs, inputs))
    labels = preds.numpy().astype(np.uint8)
    for row, exact in enumerate(EXACT):
        if not exact:
            labels[row, 0] = labels[row, 0] % (VOCAB - 1) + 1  # any other token: this answer is wrong
    root = write_dataset(tmp_path_factory.mktemp("rated"), inputs, labels, RATINGS)
    return root, inputs, labels


@pytest.fixture(scope="module")
def scored(head, rated):
    """The metrics of the rated dataset, and the answers and labels they were counted from."""
    return evaluate(head, rated[0])


def test_accuracy_per_rating_band_matches_a_recount_of_the_answers(scored):
    metrics, preds, labels = scored
    exact = ((preds == labels) | (labels == -100)).all(-1).tolist()
    assert exact == EXACT  # the answers are the ones the dataset was built around
    bands = {}
    for rating, right in zip(RATINGS, exact):
        bands.setdefault(plain_band(rating), []).append(right)
    assert [k for k in metrics if k.startswith("exact_accuracy/rating_") and "_ci95_" not in k] == [
        f"exact_accuracy/rating_{name}" for name in ("0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64-127")]
    for name, rights in bands.items():
        n, k = len(rights), sum(rights)
        assert metrics[f"count/rating_{name}"] == n
        assert metrics[f"exact_accuracy/rating_{name}"] == pytest.approx(k / n)
        low, high = wilson_interval(k, n)
        assert metrics[f"exact_accuracy/rating_{name}_ci95_low"] == pytest.approx(low)
        assert metrics[f"exact_accuracy/rating_{name}_ci95_high"] == pytest.approx(high)
    assert metrics["count"] == len(RATINGS) and metrics["exact_accuracy"] == pytest.approx(sum(EXACT) / len(EXACT))


def test_a_dataset_without_ratings_reports_only_overall(head, rated, scored, tmp_path):
    _, inputs, labels = rated
    plain, _, _ = evaluate(head, write_dataset(tmp_path, inputs, labels))
    with_bands = scored[0]
    assert not [k for k in plain if "/rating_" in k]
    assert plain == {k: v for k, v in with_bands.items() if "/rating_" not in k}  # bands change nothing overall


def test_the_report_prints_each_band_with_its_interval(scored, capsys):
    metrics = scored[0]
    print_metrics("title", metrics, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    band = next(line for line in lines if "exact_accuracy[rating 2-3]" in line)
    low, high = wilson_interval(2, 3)
    assert band.strip() == f"exact_accuracy[rating 2-3]: {2 / 3:.4f} (95% CI {low:.2f}-{high:.2f}, n=3)"
    assert not [line for line in lines if "count/rating" in line]
    print_metrics("title", metrics, as_json=True)
    assert json.loads(capsys.readouterr().out)["count/rating_2-3"] == 3


def test_bands_are_the_histogram_bins_of_the_builders():
    ratings = np.array([-4, 0, 1, 2, 3, 4, 7, 8, 15, 16, 1000, 2**40 - 1])
    assert [band_name(b) for b in rating_bands(ratings)] == [
        "<0", "0", "1", "2-3", "2-3", "4-7", "4-7", "8-15", "8-15", "16-31", "512-1023", f"{2**39}-{2**40 - 1}"]


def test_test_batches_carry_bands_and_padding_has_none(rated):
    loader = PuzzleDataset(rated[0], "test", BATCH)
    assert loader.rating_bands == [0, 1, 2, 4, 8, 16, 32, 64]
    bands = torch.cat([batch[RATING_BAND_KEY] for _, batch, _ in loader]).tolist()
    assert bands[:len(RATINGS)] == rating_bands(RATINGS).tolist() and set(bands[len(RATINGS):]) == {NO_BAND}


def test_a_ratings_file_of_the_wrong_length_is_refused(rated, tmp_path):
    _, inputs, labels = rated
    root = write_dataset(tmp_path, inputs, labels, RATINGS[:-1])
    with pytest.raises(DatasetError, match="one integer rating per puzzle"):
        PuzzleDataset(root, "test", BATCH)


# ---- fault campaign 5 ---------------------------------------------------------------------------------------------

TOP = 2**63 - 1  # the largest rating int64 holds


def test_campaign5_p08_the_largest_ratings_keep_their_band():
    ratings = np.array([TOP, 2**62, 2**62 - 1, 2**53 + 1, 2**53 - 1], np.int64)  # float64 rounds the first and third up
    assert rating_bands(ratings).tolist() == [2**62, 2**62, 2**61, 2**53, 2**52]
    assert band_name(2**62) == f"{2**62}-{TOP}"


def test_campaign5_p08_a_rating_of_2_63_minus_1_is_in_the_report_and_uint64_ratings_do_not_wrap(head, rated, tmp_path):
    _, inputs, labels = rated
    ratings = [*RATINGS[:-1], TOP]  # was dropped from every band: its band overflowed into the padding's
    metrics, _, _ = evaluate(head, write_dataset(tmp_path / "top", inputs, labels, ratings))
    assert metrics[f"count/rating_{2**62}-{TOP}"] == 1
    assert sum(v for k, v in metrics.items() if k.startswith("count/rating_")) == len(RATINGS)
    # uint64 ratings: read as they are, never wrapped into "<0"; one past int64 is refused, naming the file
    root = write_dataset(tmp_path / "unsigned", inputs, labels)
    np.save(root / "test" / "all__ratings.npy", np.array(ratings, np.uint64))
    assert PuzzleDataset(root, "test", BATCH).rating_bands == [0, 1, 2, 4, 8, 16, 32, 2**62]
    np.save(root / "test" / "all__ratings.npy", np.array([*RATINGS[:-1], 2**64 - 1], np.uint64))
    with pytest.raises(DatasetError, match=f"all__ratings.npy holds ratings up to {2**64 - 1}, more than the {TOP}"):
        PuzzleDataset(root, "test", BATCH)


def test_campaign5_p18_an_empty_ratings_file_is_one_line_naming_it_and_the_fix(rated, tmp_path):
    _, inputs, labels = rated
    root = write_dataset(tmp_path, inputs, labels)
    ratings = root / "test" / "all__ratings.npy"
    ratings.write_bytes(b"")  # was: EOFError: No data left in file
    with pytest.raises(DatasetError) as refused:
        PuzzleDataset(root, "test", BATCH)
    assert str(refused.value) == (f"{ratings} is empty or cut short (0 bytes), not a .npy file; rebuild the dataset, "
                                  "or delete the file (the ratings are optional)")
    ratings.unlink()
    (root / "test" / "all__labels.npy").write_bytes(b"")  # the same for the dataset's own arrays
    with pytest.raises(DatasetError, match="all__labels.npy is empty or cut short .0 bytes., not a .npy file; rebuild"):
        PuzzleDataset(root, "test", BATCH)
