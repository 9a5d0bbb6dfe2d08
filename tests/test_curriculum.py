"""CGAR's two settings (arXiv 2511.08653): the progressive depth curriculum (utils/train/curriculum.py) and the
hierarchical supervision weighting (models/losses.py), and the training FLOPs a run logs as ``train/pflop``.
All on the CPU."""

import json

import pytest
import torch
from PIL import Image

import pretrain
from models import build_model, validate_arch
from models.losses import puzzle_metrics, supervision_weights
from models.trm.trm_act_v1 import TinyRecursiveReasoningModel_ACTV1_Inner
from scripts import compute_curve
from tests.test_pretrain_trm import TINY_TRM, trm
from utils.checkpoint import safe_load
from utils.config import ConfigError
from utils.run.estimate import step_flops
from utils.train.curriculum import DepthCurriculum, set_depth


def test_depth_follows_the_stages_then_the_architecture():
    curriculum = DepthCurriculum([[0.3, 1, 2], [0.6, 2, 4]], (3, 6), total_steps=100)
    assert [curriculum.depth(s) for s in (0, 29, 30, 59, 60, 99)] == [(1, 2), (1, 2), (2, 4), (2, 4), (3, 6), (3, 6)]
    assert curriculum.segments() == [(0, 30, (1, 2)), (30, 60, (2, 4)), (60, 100, (3, 6))]
    cost = {(1, 2): 1.0, (2, 4): 10.0, (3, 6): 100.0}.__getitem__
    assert curriculum.flops_through(45, cost) == 30 * 1 + 15 * 10
    assert curriculum.flops_through(100, cost) == 30 + 300 + 4000
    none = DepthCurriculum([], (3, 6), total_steps=100)
    assert none.segments() == [(0, 100, (3, 6))] and none.depth(0) == (3, 6)


@pytest.mark.parametrize("stages", [[[0.6, 1, 2], [0.3, 2, 4]], [[0, 1, 1]], [[1.5, 1, 1]], [[0.5, 0, 1]],
                                    [[0.5, 1]], [0.5], [[0.5, 1.5, 2]]])
def test_bad_stages_are_one_line(stages):
    with pytest.raises(ConfigError, match="depth_curriculum"):
        DepthCurriculum(stages, (3, 6), total_steps=10)


def test_supervision_weights_decay_by_segment_and_average_one():
    weights = supervision_weights(torch.tensor([1, 2, 3, 4], dtype=torch.int32), 0.7, halt_max_steps=4)
    z = (1 + 0.7 + 0.49 + 0.343) / 4
    assert weights.tolist() == pytest.approx([1 / z, 0.7 / z, 0.49 / z, 0.343 / z])
    assert weights.mean().item() == pytest.approx(1.0)
    assert supervision_weights(torch.tensor([1, 5]), 1.0, 16).tolist() == [1.0, 1.0]


def test_weighted_losses_scale_each_row_and_log_unweighted():
    torch.manual_seed(0)
    logits, q_halt = torch.randn(3, 5, 4), torch.randn(3)
    data = {"labels": torch.randint(0, 4, (3, 5)), "inputs": torch.zeros(3, 5, dtype=torch.long)}
    steps, halted = torch.tensor([1, 2, 3]), torch.ones(3, dtype=torch.bool)
    plain, lm, qh = puzzle_metrics(logits, q_halt, data, steps, halted)
    ones = puzzle_metrics(logits, q_halt, data, steps, halted, row_weights=torch.ones(3))
    assert ones[1].item() == pytest.approx(lm.item()) and ones[2].item() == pytest.approx(qh.item())
    weights = torch.tensor([2.0, 0.0, 0.0])
    row0 = puzzle_metrics(logits[:1], q_halt[:1], {k: v[:1] for k, v in data.items()}, steps[:1], halted[:1])
    metrics, lm_w, qh_w = puzzle_metrics(logits, q_halt, data, steps, halted, row_weights=weights)
    assert lm_w.item() == pytest.approx(2 * row0[1].item()) and qh_w.item() == pytest.approx(2 * row0[2].item())
    assert metrics["lm_loss"].item() == pytest.approx(plain["lm_loss"].item())


def test_a_run_trains_shallow_first_evaluates_full_depth_and_counts_its_flops(sudoku_dir, tmp_path, monkeypatch,
                                                                              capsys):
    seen = []
    original = TinyRecursiveReasoningModel_ACTV1_Inner.forward

    def spy(self, carry, batch):
        if batch["inputs"].device.type != "meta":  # not the FLOP count's traces
            seen.append((self.training, self.config.H_cycles, self.config.L_cycles))
        return original(self, carry, batch)

    monkeypatch.setattr(TinyRecursiveReasoningModel_ACTV1_Inner, "forward", spy)
    # TINY_TRM: H_cycles=2, L_cycles=2, 16 steps, evaluations after steps 8 and 16.
    shallow, full = tmp_path / "shallow", tmp_path / "full"
    assert pretrain.main(trm(sudoku_dir, shallow, "depth_curriculum=[[0.5,1,1]]", "supervision_decay=0.7")) == 0
    train_depths = [(h, l) for training, h, l in seen if training]
    assert train_depths == [(1, 1)] * 8 + [(2, 2)] * 8
    assert {(h, l) for training, h, l in seen if not training} == {(2, 2)}
    assert pretrain.main(trm(sudoku_dir, full)) == 0

    def points(run):
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    # Independent count: FlopCounterMode on a meta model at each depth, 8 steps each.
    arch = validate_arch(safe_load(full / "step_16.pt")["config"]["arch"])
    metadata = json.loads((sudoku_dir / "train" / "dataset.json").read_text())
    meta = build_model(arch, batch_size=16, seq_len=metadata["seq_len"], vocab_size=metadata["vocab_size"],
                       num_puzzle_identifiers=metadata["num_puzzle_identifiers"], dtype=torch.float32, device="meta")
    per_step = {}
    for depth in ((1, 1), (2, 2)):
        set_depth(meta.model, depth)
        per_step[depth] = step_flops(meta, 16, metadata["seq_len"])
    expected = 8 * per_step[(1, 1)] + 8 * per_step[(2, 2)]
    assert per_step[(1, 1)] < per_step[(2, 2)]
    last_shallow = [p for p in points(shallow) if "train/pflop" in p][-1]
    assert last_shallow["step"] == 16 and last_shallow["train/pflop"] == pytest.approx(expected / 1e15)
    evals = [p["eval/train_pflop"] for p in points(shallow) if "eval/train_pflop" in p]
    assert evals == pytest.approx([8 * per_step[(1, 1)] / 1e15, expected / 1e15])
    last_full = [p for p in points(full) if "train/pflop" in p][-1]
    assert last_full["train/pflop"] == pytest.approx(16 * per_step[(2, 2)] / 1e15)

    picture = tmp_path / "curve.png"
    capsys.readouterr()
    assert compute_curve.main(["--run", f"full={full}", "--run", f"shallow={shallow}", "--metric",
                               "eval/blank_accuracy", "--picture", str(picture)]) == 0
    printed = capsys.readouterr().out
    assert f"| shallow | 16 | {expected / 1e15:.4g} |" in printed and "full: final eval/blank_accuracy" in printed
    assert ("shallow: reached" in printed) != ("shallow: never reached" in printed)
    assert Image.open(picture).size == (880, 520)


def test_a_bad_curriculum_is_refused_before_any_data(tmp_path, capsys):
    code = pretrain.main(["--config-name=cfg_pretrain_cpu", f"data_path={tmp_path / 'none'}", *TINY_TRM,
                          "depth_curriculum=[[0.5,0,1]]"])
    assert code == 2 and "depth_curriculum" in capsys.readouterr().err


def test_compute_curve_refuses_runs_without_a_flop_count(tmp_path, capsys):
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.jsonl").write_text('{"step": 8, "eval/exact_accuracy": 0.5}\n')
    assert compute_curve.main(["--run", f"old={old}"]) == 2
    assert "no evaluation logged eval/train_pflop" in capsys.readouterr().err
    assert compute_curve.main(["--run", str(old)]) == 2
    assert "give LABEL=RUN_DIR" in capsys.readouterr().err
