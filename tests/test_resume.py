"""Reliability of pretrain.py: bitwise resume after kill -9, graceful stop, safe checkpoints, the NaN guard."""

import json
import logging
import os
import pickle
import signal
from pathlib import Path

import torch

import evaluate
import pretrain
from models.losses import ACTLossHead
from models.sparse_embedding import SparseEmbeddingSignSGD
from tests.conftest import signal_at
from utils.checkpoint import safe_load
from utils.optimizer_utils import AdamATan2

TINY = ["compile=false", "device=cpu", "arch.hidden_size=32", "arch.num_heads=2", "arch.H_layers=1",
        "arch.L_layers=1", "arch.halt_max_steps=3",
        "arch.expansion=2", "global_batch_size=16", "epochs=4", "eval_interval=2", "log_interval=2",
        "lr_warmup_steps=2", "forward_dtype=float32", "deterministic=true"]




def args(sudoku_dir, run_dir, *extra):
    return ["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", f"checkpoint_path={run_dir}", *TINY, *extra]


def train_steps(run: Path) -> list[int]:
    """The steps of the ``train/*`` points in a run's metrics.jsonl."""
    points = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [p["step"] for p in points if "train/lm_loss" in p]


def assert_same_training_state(a: Path, b: Path) -> None:
    ca, cb = safe_load(a), safe_load(b)
    assert ca["step"] == cb["step"]
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), f"weights differ at {k}"
    sa, sb = ca["optimizers"][0]["state"], cb["optimizers"][0]["state"]
    for i in sa:
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[i][k], sb[i][k]), f"optimizer state {i}.{k} differs"


def test_kill_9_then_resume_is_bitwise_identical(sudoku_dir, tmp_path, warm_pretrain):
    """Each run a fork of one warm interpreter (tests/warm_trainer.py), killed by the signal a kill -9 sends."""
    straight = warm_pretrain.run(args(sudoku_dir, tmp_path / "straight"))
    assert straight.returncode == 0, straight.stderr
    killed = warm_pretrain.run(args(sudoku_dir, tmp_path / "killed"), **signal_at("train", 12, "SIGKILL"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert train_steps(tmp_path / "killed")[-1] == 10  # killed in step 12 (points every 2 steps): not before, not after

    resumed = warm_pretrain.run(args(sudoku_dir, tmp_path / "killed", "resume=auto"))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr and "step_8.pt" in resumed.stderr
    assert_same_training_state(tmp_path / "straight" / "step_16.pt", tmp_path / "killed" / "step_16.pt")
    steps = train_steps(tmp_path / "killed")
    assert steps == sorted(set(steps))  # metrics.jsonl continues from the checkpoint, no step twice


def test_sigint_finishes_the_step_checkpoints_and_says_how_to_resume(sudoku_dir, tmp_path, warm_pretrain):
    run = tmp_path / "run"
    stopped = warm_pretrain.run(args(sudoku_dir, run, "epochs=40", "eval_interval=20"),
                                **signal_at("train", 5, "SIGINT"))
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr  # non-zero: a scheduler requeues a stopped run
    assert "resume with: python pretrain.py" in stopped.stderr
    assert [p.name for p in run.glob("step_*.pt")] == ["step_5.pt"]  # the step it was in, finished: no more
    assert safe_load(run / "step_5.pt")["train_loader"]["batch"] > 0  # mid-iteration position


def test_resume_auto_ignores_files_it_did_not_write_and_an_explicit_bad_file_is_an_error(sudoku_dir, tmp_path, caplog,
                                                                                          capsys):
    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    assert pretrain.main(args(sudoku_dir, run, "epochs=2", "eval_interval=2")) == 0
    (run / "step_99.pt").write_bytes(b"PK\x03\x04 truncated")
    assert pretrain.main(args(sudoku_dir, run, "resume=auto")) == 0
    assert "resumed from" in caplog.text and "step_8.pt" in caplog.text
    capsys.readouterr()
    assert pretrain.main(args(sudoku_dir, tmp_path / "other", f"resume={run / 'step_99.pt'}")) == 2
    assert "step_99.pt is truncated or corrupt" in capsys.readouterr().err


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoint_needing_arbitrary_code_is_refused(sudoku_dir, tmp_path, capsys):
    bad = tmp_path / "step_1.pt"
    torch.save({"model": _Exploit()}, bad, pickle_module=pickle)
    assert pretrain.main(args(sudoku_dir, tmp_path / "run", f"resume={bad}")) == 2
    assert "refusing to load" in capsys.readouterr().err
    assert evaluate.main(["--device", "cpu", "--checkpoint", str(bad)]) == 2
    assert "refusing to load" in capsys.readouterr().err


def test_checkpoint_from_another_architecture_is_a_clear_error(sudoku_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert pretrain.main(args(sudoku_dir, run, "epochs=2", "eval_interval=2")) == 0
    code = pretrain.main(args(sudoku_dir, tmp_path / "wide", "arch.hidden_size=64", f"resume={run / 'step_8.pt'}"))
    assert code == 2
    err = capsys.readouterr().err
    assert "holds another architecture (hidden_size: saved 32, now 64" in err
    assert not (tmp_path / "wide" / "run.json").exists()  # a refused resume claims nothing


def test_a_trm_config_resuming_an_hrm_run_names_the_architecture_and_leaves_its_record(sudoku_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert pretrain.main(args(sudoku_dir, run, "epochs=2", "eval_interval=2")) == 0
    record = (run / "run.json").read_bytes()
    code = pretrain.main(args(sudoku_dir, run, "arch=trm", "resume=auto", "ema=true"))
    assert code == 2
    err = capsys.readouterr().err
    assert "holds another architecture (name: saved 'hrm_v1', now 'trm'" in err
    assert (run / "run.json").read_bytes() == record


def _poison(monkeypatch, bad_calls):
    """Make ACTLossHead return a NaN loss on the given (1-based) training calls."""
    real_forward = ACTLossHead.forward
    calls = {"n": 0}

    def forward(self, carry, batch):
        out = list(real_forward(self, carry, batch))
        if self.training:
            calls["n"] += 1
            if bad_calls == "all" or calls["n"] in bad_calls:
                out[1] = out[1] * float("nan")
        return tuple(out)

    monkeypatch.setattr(ACTLossHead, "forward", forward)


def _count_steps(monkeypatch):
    counts = {"adam": 0, "emb": 0}
    real_adam, real_emb = AdamATan2.step, SparseEmbeddingSignSGD.step

    def adam_step(self, *a, **kw):
        counts["adam"] += 1
        return real_adam(self, *a, **kw)

    def emb_step(self, *a, **kw):
        counts["emb"] += 1
        return real_emb(self, *a, **kw)

    monkeypatch.setattr(AdamATan2, "step", adam_step)
    monkeypatch.setattr(SparseEmbeddingSignSGD, "step", emb_step)
    return counts


def test_nan_steps_are_skipped_counted_and_logged(sudoku_dir, tmp_path, monkeypatch, caplog):
    _poison(monkeypatch, {3, 4})
    counts = _count_steps(monkeypatch)
    run = tmp_path / "run"
    assert pretrain.main(args(sudoku_dir, run)) == 0
    assert counts == {"adam": 16, "emb": 14}  # 16 steps, 2 undone: AdamATan2's undone, sign-SGD's never made
    assert "step 3: non-finite loss" in caplog.text and "the update was undone" in caplog.text
    points = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert points[-2]["train/nonfinite_steps"] == 2
    assert all(torch.isfinite(v).all() for v in safe_load(run / "step_16.pt")["model"].values() if v.is_floating_point())


def test_too_many_nan_steps_in_a_row_stops_with_advice(sudoku_dir, tmp_path, monkeypatch, capsys):
    _poison(monkeypatch, "all")
    counts = _count_steps(monkeypatch)
    assert pretrain.main(args(sudoku_dir, tmp_path / "run", "max_nonfinite_steps=3")) == 1
    assert counts == {"adam": 3, "emb": 0}
    err = capsys.readouterr().err
    assert "stopping at step 3: 3 non-finite steps in a row (last: loss" in err and "Try a lower lr" in err
