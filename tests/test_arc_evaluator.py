"""ARC evaluator and saved outputs: voting and pass@K against hand-computed values, submission.json,
score_outputs on rank files, a real two-process gather, and the outputs file's safety checks.

Predictions are written in each row's augmented frame with this file's own encoder and dihedral
formulas (from tests/test_arc_dataset.py), so the evaluator's inverse mapping is checked independently.
"""

import json
import shutil

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.test_arc_dataset import NAME, transform, write_task
from utils.data import arc
from utils.data.puzzle_dataset import DatasetError, PuzzleDataset
from utils.data.saved_outputs import OutputsCollector, OutputsError, load_outputs
from utils.eval.arc import ARC, PASS_KEY, rank_answers, score_outputs
from utils.eval.stats import wilson_interval

PASS_KS = (1, 2, 5, 10, 100, 1000)

# Evaluation tasks: test outputs chosen with several colours so every variant is distinct.
LABELS = {
    "e1": [[[1, 2], [3, 4]]],
    "e2": [[[5, 6, 7]], [[8], [9], [1]]],
    "e3": [[[2, 3], [4, 5]]],
    "e4": [[[6, 7], [8, 9]]],
    "e5": [[[1, 3], [5, 7]]],
    "e6": [[[2, 4], [6, 8]]],
}


def pass_at(metrics):
    """The ``ARC/pass@K`` fractions of the metrics, without their interval fields and ``ARC/tasks``."""
    return {k: v for k, v in metrics.items() if PASS_KEY.fullmatch(k)}


def wrong(label, k):
    """A wrong answer: the label with its first cell recoloured (distinct for k = 0..8)."""
    grid = np.array(label)
    grid[0, 0] = (grid[0, 0] + 1 + k) % 10
    return grid


def encode(grid):
    """Tokens of a grid at the top left: colour + 2, EOS 1 below and to the right (independent of the builder)."""
    canvas = np.zeros((30, 30), np.int64)
    if grid is None:
        return canvas.ravel()  # all padding: crops to nothing
    h, w = grid.shape
    canvas[:h, :w] = grid + 2
    if h < 30:
        canvas[h, :w] = 1
    if w < 30:
        canvas[:h, w] = 1
    return canvas.ravel()


def augment(grid, name):
    """Map a grid in the original frame into the frame of puzzle ``name`` (the builder's forward augmentation)."""
    m = NAME.match(name)
    if m is None or grid is None:
        return grid
    mapping = np.array([int(c) for c in m.group(3)])
    return transform(mapping[np.asarray(grid)], int(m.group(2)))


# (task, test pair) -> per variant index v: (answer in the original frame, or None for "crops to nothing", q_halt logit)
def plan(task, pair, v, label):
    if task == "e1":  # 2-2 vote tie, broken by confidence: the wrong answer's copies are surer
        return (label, -1.0) if v < 2 else (wrong(label, 0), 2.0)
    if task == "e2" and pair == 0:  # 3 votes beat 1 surer vote
        return (label, -3.0) if v < 3 else (wrong(label, 0), 5.0)
    if task == "e2":  # four different wrong answers, ranked by confidence
        return wrong(label, v), float(v)
    if task == "e4":  # unanimous and right
        return label, 0.0
    if task == "e5":  # exact tie (votes and confidence): the answer seen first wins
        return (wrong(label, 0), 0.5) if v < 2 else (label, 0.5)
    if task == "e6":  # the predictions that crop to nothing pool their votes and win, as in the reference
        return (None, 1.0) if v < 3 else (label, 1.0)
    raise AssertionError(task)


EXPECTED_MIXED = {1: (0 + 0.5 + 0 + 1 + 0 + 0) / 6, 2: (1 + 0.5 + 0 + 1 + 1 + 1) / 6}
for _k in PASS_KS[2:]:
    EXPECTED_MIXED[_k] = EXPECTED_MIXED[2]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("arc_eval_src")
    write_task(root / "training", "t1", [([[1, 2]], [[2, 1]])], [([[3, 4]], [[4, 3]])])
    for task, outputs in LABELS.items():
        tests = [([[k + 1, 0], [0, k + 2]], out) for k, out in enumerate(outputs)]  # distinct inputs per pair
        write_task(root / "evaluation", task, [([[1, 0]], [[0, 1]])], tests)
    out = tmp_path_factory.mktemp("arc_eval") / "ds"
    arc.build_arc_dataset(out, "arc-agi-1", source_dir=root, num_aug=3, seed=3)
    return out


def rows_of(dataset):
    """(row, puzzle name, task, test pair index, variant index) for every test row, in file order."""
    names = json.loads((dataset / "identifiers.json").read_text())
    ids = np.load(dataset / "test" / "all__puzzle_identifiers.npy")
    offsets = np.load(dataset / "test" / "all__puzzle_indices.npy")
    rows, variant = [], {}
    for p, pid in enumerate(ids):
        name = names[pid]
        task = NAME.match(name).group(1) if NAME.match(name) else name
        v = variant[task] = variant.get(task, -1) + 1
        rows += [(r, name, task, r - offsets[p], v) for r in range(offsets[p], offsets[p + 1])]
    return rows


def collect(dataset, make_pred, batch_size=8, world_size=1):
    """Run the test split through PuzzleDataset like the trainer; per rank the collected outputs dict."""
    rows = {r: (name, task, pair, v) for r, name, task, pair, v in rows_of(dataset)}
    collectors = [OutputsCollector() for _ in range(world_size)]
    for rank, collector in enumerate(collectors):
        loader = PuzzleDataset(dataset, "test", batch_size, rank=rank, world_size=world_size)
        row = 0
        for _, batch, effective in loader:
            preds, q = [], []
            for i, identifier in enumerate(batch["puzzle_identifiers"].tolist()):
                global_row = row + rank * (batch_size // world_size) + i
                if identifier == 0:  # padding: garbage
                    preds.append(np.full(900, 5))
                    q.append(9.0)
                    continue
                tokens, logit = make_pred(global_row, *rows[global_row], batch)
                preds.append(tokens)
                q.append(logit)
            row += batch_size
            collector.update_batch(batch, {"preds": torch.tensor(np.stack(preds)),
                                     "q_halt_logits": torch.tensor(q, dtype=torch.float32)})
    return collectors


def mixed_pred(row, name, task, pair, v, batch):
    label = LABELS[task][pair]
    if task == "e3":
        return np.zeros(900, np.int64), 0.0  # replaced below: e3 rows are dropped from the file
    answer, logit = plan(task, pair, v, np.array(label))
    return encode(augment(answer, name)), logit


def save_mixed(dataset, directory, world_size=1):
    files = []
    for rank, collector in enumerate(collect(dataset, mixed_pred, world_size=world_size)):
        path = collector.save(directory, step=7, rank=rank)
        outputs = torch.load(path, weights_only=True)
        names = json.loads((dataset / "identifiers.json").read_text())
        keep = torch.tensor([names[i].split("|||")[0] != "e3" for i in outputs["puzzle_identifiers"].tolist()])
        torch.save({k: v[keep] for k, v in outputs.items()}, path)  # e3 has no prediction at all
        files.append(path)
    return files


def test_saved_outputs_format(dataset, tmp_path):
    collectors = collect(dataset, lambda row, name, task, pair, v, batch: (np.zeros(900, np.int64), 0.0))
    path = collectors[0].save(tmp_path, step=12, rank=0)
    assert path.name == "step_12_all_preds.0"
    outputs = torch.load(path, weights_only=True)
    assert list(outputs) == ["inputs", "labels", "puzzle_identifiers", "preds", "q_halt_logits"]
    rows = len(np.load(dataset / "test" / "all__inputs.npy"))
    padded = -(-rows // 8) * 8  # the last batch is padded, and padding rows are kept
    assert outputs["inputs"].shape == (padded, 900) and outputs["inputs"].dtype == torch.int32
    assert outputs["labels"].dtype == torch.int32 and outputs["puzzle_identifiers"].dtype == torch.int32
    assert outputs["preds"].dtype == torch.int64 and outputs["q_halt_logits"].dtype == torch.float32
    assert (outputs["puzzle_identifiers"][rows:] == 0).all() and (outputs["puzzle_identifiers"][:rows] != 0).all()
    assert collectors[0].save(tmp_path, step=13, rank=0) is None  # nothing collected since


def test_oracle_scores_one_and_all_wrong_scores_zero(dataset, tmp_path):
    labels = np.load(dataset / "test" / "all__labels.npy").astype(np.int64)
    oracle = collect(dataset, lambda row, *_: (labels[row], 0.0))[0].save(tmp_path / "oracle", 1, 0)
    metrics = score_outputs([oracle], dataset, submission_path=tmp_path / "sub.json", report_path=tmp_path / "rep.json")
    assert pass_at(metrics) == {f"ARC/pass@{k}": 1.0 for k in PASS_KS}
    assert json.loads((tmp_path / "rep.json").read_text()) == {f"pass@{k}": 1.0 for k in PASS_KS}
    submission = json.loads((tmp_path / "sub.json").read_text())
    for task, outputs in LABELS.items():
        assert submission[task] == [{"attempt_1": o, "attempt_2": o} for o in outputs]  # one answer, repeated
    nothing = collect(dataset, lambda *_: (np.zeros(900, np.int64), 0.0))[0].save(tmp_path / "zero", 1, 0)
    assert pass_at(score_outputs([nothing], dataset)) == {f"ARC/pass@{k}": 0.0 for k in PASS_KS}
    inputs = np.load(dataset / "test" / "all__inputs.npy").astype(np.int64)  # echo the input: always wrong here
    echo = collect(dataset, lambda row, *_: (inputs[row], 0.0))[0].save(tmp_path / "echo", 1, 0)
    assert pass_at(score_outputs([echo], dataset)) == {f"ARC/pass@{k}": 0.0 for k in PASS_KS}


def test_mixed_votes_by_hand(dataset, tmp_path):
    files = save_mixed(dataset, tmp_path)
    metrics = score_outputs(files, dataset, submission_path=tmp_path / "submission.json")
    assert pass_at(metrics) == pytest.approx({f"ARC/pass@{k}": EXPECTED_MIXED[k] for k in PASS_KS}, abs=1e-12)
    # the interval of each pass@K over the 6 tasks, the task scores taken as proportions
    assert metrics["ARC/tasks"] == 6.0
    assert (metrics["ARC/pass@1_ci95_low"], metrics["ARC/pass@1_ci95_high"]) == \
        pytest.approx(wilson_interval(EXPECTED_MIXED[1] * 6, 6), abs=1e-12)
    submission = json.loads((tmp_path / "submission.json").read_text())
    assert list(submission) == list(json.loads((dataset / "test_puzzles.json").read_text()))
    lab = {t: [np.array(o) for o in outs] for t, outs in LABELS.items()}
    expect = {
        "e1": [(wrong(lab["e1"][0], 0), lab["e1"][0])],
        "e2": [(lab["e2"][0], wrong(lab["e2"][0], 0)), (wrong(lab["e2"][1], 3), wrong(lab["e2"][1], 2))],
        "e3": [([[0]], [[0]])],  # no prediction: a placeholder keeps the file complete
        "e4": [(lab["e4"][0], lab["e4"][0])],
        "e5": [(wrong(lab["e5"][0], 0), lab["e5"][0])],
        "e6": [([], lab["e6"][0])],  # the empty answer is written as the reference writes it
    }
    for task, attempts in expect.items():
        assert submission[task] == [{"attempt_1": np.asarray(a).tolist(), "attempt_2": np.asarray(b).tolist()}
                                    for a, b in attempts], task


def test_rank_files_give_the_same_scores_in_any_order(dataset, tmp_path):
    files = save_mixed(dataset, tmp_path, world_size=2)
    assert [f.name for f in files] == ["step_7_all_preds.0", "step_7_all_preds.1"]
    forward = score_outputs(files, dataset)
    assert score_outputs(files[::-1], dataset) == forward  # files are put in rank order
    assert pass_at(forward) == pytest.approx({f"ARC/pass@{k}": EXPECTED_MIXED[k] for k in PASS_KS}, abs=1e-12)


def test_padding_rows_ignored_and_votes_accumulate(dataset, tmp_path):
    labels = np.load(dataset / "test" / "all__labels.npy").astype(np.int64)
    batch = load_outputs(collect(dataset, lambda row, *_: (labels[row], 0.0))[0].save(tmp_path, 1, 0))
    evaluator = ARC(dataset)
    evaluator.begin_eval()
    evaluator.update_batch(batch, batch)
    assert evaluator.result(None, rank=0, world_size=1)["ARC/pass@1"] == 1.0
    wrong_batch = dict(batch, preds=torch.zeros_like(batch["preds"]),
                       q_halt_logits=torch.full_like(batch["q_halt_logits"], 9.0))
    evaluator.begin_eval()  # aggregated voting (the reference default): the earlier right votes stay, a tie on count
    evaluator.update_batch(wrong_batch, wrong_batch)
    assert pass_at(evaluator.result(None, 0, 1)) == {f"ARC/pass@{k}": (0.0 if k == 1 else 1.0) for k in PASS_KS}
    fresh = ARC(dataset, aggregated_voting=False)
    fresh.update_batch(batch, batch)
    fresh.begin_eval()
    fresh.update_batch(wrong_batch, wrong_batch)
    assert fresh.result(None, 0, 1)["ARC/pass@1000"] == 0.0


def test_rank_answers_order():
    # a, c, d: 2 votes, mean exactly 0.5 each -> the order they arrived in; e: 2 votes, surer; b: 1 vote, surest
    votes = {b"a": [0.5, 0.5], b"b": [0.9], b"c": [0.25, 0.75], b"d": [0.75, 0.25], b"e": [0.5, 0.625]}
    assert rank_answers(votes) == [(b"e", 2, 0.5625), (b"a", 2, 0.5), (b"c", 2, 0.5), (b"d", 2, 0.5), (b"b", 1, 0.9)]


def _distributed_worker(rank, world_size, init_file, files, dataset, save_dir, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        outputs = load_outputs([files[rank]])
        evaluator = ARC(dataset)
        evaluator.begin_eval()
        evaluator.update_batch(outputs, outputs)
        metrics = evaluator.result(save_dir, rank=rank, world_size=world_size)
        results[rank] = metrics
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="this torch build has no torch.distributed")
def test_result_gathers_across_two_processes(dataset, tmp_path):
    files = [str(f) for f in save_mixed(dataset, tmp_path, world_size=2)]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_distributed_worker, args=(2, str(tmp_path / "init"), files, str(dataset), str(tmp_path / "sub"), results),
                 nprocs=2, join=True)
        results = dict(results)
    assert results[1] is None
    assert pass_at(results[0]) == pytest.approx({f"ARC/pass@{k}": EXPECTED_MIXED[k] for k in PASS_KS}, abs=1e-12)
    single = tmp_path / "single.json"
    score_outputs(files, dataset, submission_path=single)
    assert json.loads((tmp_path / "sub" / "submission.json").read_text()) == json.loads(single.read_text())


# ---------------------------------------------------------------- outputs files: bad input


class Payload:
    """Not a tensor: a file holding it needs pickled code to load."""


def test_load_outputs_errors(tmp_path):
    good = {"inputs": torch.zeros(3, 900, dtype=torch.int32), "q_halt_logits": torch.zeros(3)}
    torch.save(good, tmp_path / "step_1_all_preds.0")
    with pytest.raises(OutputsError, match="not found"):
        load_outputs([tmp_path / "missing"])
    torch.save({"inputs": torch.zeros(1), "x": Payload()}, tmp_path / "unsafe.pt")
    with pytest.raises(OutputsError, match="Payload object, not only tensors; refusing to run pickled code"):
        load_outputs([tmp_path / "unsafe.pt"])
    (tmp_path / "junk").write_bytes(b"not a torch file")
    with pytest.raises(OutputsError, match="not a readable"):
        load_outputs([tmp_path / "junk"])
    (tmp_path / "cut").write_bytes((tmp_path / "step_1_all_preds.0").read_bytes()[:300])
    with pytest.raises(OutputsError, match="truncated"):
        load_outputs([tmp_path / "cut"])
    torch.save(dict(good, q_halt_logits=torch.zeros(3, dtype=torch.float64)), tmp_path / "step_1_all_preds.1")
    with pytest.raises(OutputsError, match="q_halt_logits"):
        load_outputs([tmp_path / "step_1_all_preds.0", tmp_path / "step_1_all_preds.1"])
    torch.save(good, tmp_path / "step_2_all_preds.1")
    with pytest.raises(OutputsError, match="different evaluations"):
        load_outputs([tmp_path / "step_1_all_preds.0", tmp_path / "step_2_all_preds.1"])
    torch.save({"inputs": torch.zeros(3, 900), "preds": torch.zeros(2, 900)}, tmp_path / "rows")
    with pytest.raises(OutputsError, match="first"):
        load_outputs([tmp_path / "rows"])
    assert load_outputs(tmp_path / "step_1_all_preds.0")["inputs"].shape == (3, 900)


def test_score_outputs_errors(dataset, tmp_path):
    torch.save({"inputs": torch.zeros(2, 900, dtype=torch.int32)}, tmp_path / "partial")
    with pytest.raises(OutputsError, match="eval_save_outputs"):
        score_outputs([tmp_path / "partial"], dataset)
    outputs = {"inputs": torch.zeros(1, 900, dtype=torch.int32), "preds": torch.zeros(1, 900, dtype=torch.int64),
               "puzzle_identifiers": torch.tensor([10 ** 6], dtype=torch.int32), "q_halt_logits": torch.zeros(1)}
    torch.save(outputs, tmp_path / "foreign")
    with pytest.raises(OutputsError, match="another dataset"):
        score_outputs([tmp_path / "foreign"], dataset)
    broken = tmp_path / "broken"
    shutil.copytree(dataset, broken)
    (broken / "identifiers.json").unlink()
    with pytest.raises(DatasetError, match="identifiers.json not found"):
        ARC(broken)
