"""The shared run lifecycle (utils/run/): a run owns its directory, resume never loses work, storage faults,
the non-finite guard, the settings layers, the lr schedule and the metrics writer (W&B included)."""

import io
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import pretrain
from models.hrm.hrm_act_v1 import HierarchicalReasoningModel_ACTV1_Inner
from tests import signal_hook
from tests.conftest import signal_at
from utils.distributed import Dist
from utils.errors import UserError
from utils.train import arc_adapt
from utils import checkpoint as checkpoint_mod
from utils.run import estimate as estimate_mod
from utils.run import points
from utils.train import puzzle_trainer
from utils.run import run_dir as run_dir_mod
from utils.checkpoint import safe_load
from utils.run.metrics import MetricsWriter
from utils.run.schedule import LRSchedule

ROOT = Path(__file__).resolve().parent.parent

# One H and one L cycle: these tests are about the run's files, output and exit status, not the model's depth (its
# cycles: tests/test_curriculum.py); two by two cycles (HRM) or three by six (TRM) would double a run's CPU time or more.
TINY = ["compile=false", "device=cpu", "arch.hidden_size=32", "arch.num_heads=2", "arch.H_layers=1", "arch.L_layers=1",
        "arch.H_cycles=1", "arch.L_cycles=1", "arch.halt_max_steps=2", "arch.expansion=2", "global_batch_size=16",
        "epochs=4", "eval_interval=2", "log_interval=2", "lr_warmup_steps=2", "forward_dtype=float32"]


def train(sudoku_dir, *extra):
    return pretrain.main(["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", *TINY, *extra])


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def steps_in(metrics: Path) -> list[int]:
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()]


# ---- the lr schedule --------------------------------------------------------------------------------

def reference_cosine(current_step, base_lr, num_warmup_steps, num_training_steps, min_ratio, num_cycles=0.5):
    """sapientinc/HRM pretrain.py cosine_schedule_with_warmup_lr_lambda, re-derived from its formula."""
    if current_step < num_warmup_steps:
        return base_lr * float(current_step) / float(max(1, num_warmup_steps))
    progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return base_lr * (min_ratio + max(0.0, (1 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))))


@pytest.mark.parametrize("warmup,total,min_ratio", [(10, 110, 0.1), (10, 110, 1.0), (0, 50, 0.0), (5, 5, 0.5)])
def test_cosine_schedule_is_the_reference_formula(warmup, total, min_ratio):
    schedule = LRSchedule(3e-4, warmup, total, min_ratio=min_ratio)
    for step in range(0, total + 3):
        assert schedule.lr(step) == pytest.approx(reference_cosine(step, 3e-4, warmup, total, min_ratio), rel=1e-12, abs=0)


def test_step_schedule_follows_mmcv_linear_warmup_and_milestones():
    s = LRSchedule(1e-5, 4, 0, kind="step", milestones=(10, 20), gamma=0.1, warmup_ratio=0.001)
    # mmcv: the update after `done` earlier ones gets regular * (1 - (1 - done / warmup) * (1 - ratio)).
    assert s.lr(1) == pytest.approx(1e-5 * 0.001)
    assert s.lr(3) == pytest.approx(1e-5 * (1 - (1 - 2 / 4) * 0.999))
    assert s.lr(5) == pytest.approx(1e-5) and s.lr(10) == pytest.approx(1e-5)
    assert s.lr(11) == pytest.approx(1e-6) and s.lr(21) == pytest.approx(1e-7)


# ---- a run owns its directory --------------------------------------------------------------------------

def test_second_run_is_refused_and_strays_survive_pruning(sudoku_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(sudoku_dir, f"checkpoint_path={run}", "keep_last_checkpoints=1") == 0
    first = sorted(p.name for p in run.glob("step_*.pt"))
    assert first == ["step_16.pt"] and json.loads((run / "run.json").read_text())["checkpoints"] == ["step_16.pt"]
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}

    capsys.readouterr()
    assert train(sudoku_dir, f"checkpoint_path={run}") == 2
    line = one_error_line(capsys)
    assert "already holds run" in line and "resume=auto" in line
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before  # nothing touched

    stray = run / "step_999.pt"
    stray.write_bytes(b"someone else's file")
    notes = run / "notes.txt"
    notes.write_text("mine")
    assert train(sudoku_dir, f"checkpoint_path={run}", "epochs=8", "eval_interval=2", "resume=auto",
                 "keep_last_checkpoints=1") == 0
    assert stray.read_bytes() == b"someone else's file" and notes.read_text() == "mine"
    assert sorted(p.name for p in run.glob("step_*.pt")) == ["step_32.pt", "step_999.pt"]
    assert safe_load(run / "step_32.pt")["step"] == 32  # resumed from its own step_16.pt, not the stray


def test_resume_auto_skips_an_empty_newest_checkpoint_and_cleans_only_recorded_temporary_files(sudoku_dir, tmp_path,
                                                                                               caplog):
    run = tmp_path / "run"
    assert train(sudoku_dir, f"checkpoint_path={run}", "epochs=4", "eval_interval=2") == 0
    (run / "step_16.pt").write_bytes(b"")  # a write cut short
    record = json.loads((run / "run.json").read_text())
    record["pending"] = {"name": "step_24.pt", "tmp": f".step_24.pt.{record['run_id']}.abc123xy.tmp"}
    (run / "run.json").write_text(json.dumps(record))  # a kill during the write of step_24.pt
    orphan = run / record["pending"]["tmp"]
    orphan.write_bytes(b"partial")
    notes = run / ".mynotes.backup1.tmp"  # a user's file with a temporary-looking name
    notes.write_text("keep")
    caplog.set_level(logging.INFO)
    assert train(sudoku_dir, f"checkpoint_path={run}", "epochs=8", "eval_interval=2", "resume=auto") == 0
    assert "skipping checkpoint" in caplog.text and "step_16.pt is empty" in caplog.text
    assert "resumed from" in caplog.text and "step_8.pt" in caplog.text
    assert not orphan.exists() and notes.read_text() == "keep"
    points = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points if "train/lm_loss" in p] == list(range(2, 33, 2))  # no step twice
    assert [p["step"] for p in points if "eval/accuracy" in p] == [8, 16, 24, 32]
    assert safe_load(run / "step_32.pt")["step"] == 32


def test_resume_auto_finds_the_timestamped_run_of_the_same_settings(sudoku_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    assert train(sudoku_dir, "project_name=proj", "epochs=2", "eval_interval=2") == 0
    runs = list((tmp_path / "checkpoints" / "proj").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("hrm_v1-")
    caplog.set_level(logging.INFO)
    assert train(sudoku_dir, "project_name=proj", "epochs=2", "eval_interval=2", "resume=auto") == 0
    assert list((tmp_path / "checkpoints" / "proj").iterdir()) == runs and "resumed from" in caplog.text
    # Other settings are another run: resume=auto starts it fresh in a new directory.
    assert train(sudoku_dir, "project_name=proj", "epochs=2", "eval_interval=2", "lr=5e-4", "resume=auto",
                 "run_name=other") == 0
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "proj").iterdir())[-1] == "other"
    # A run the user names lives under its name: resume=auto does not continue another run of the same settings.
    assert train(sudoku_dir, "project_name=proj", "epochs=2", "eval_interval=2", "resume=auto", "run_name=named") == 0
    assert (tmp_path / "checkpoints" / "proj" / "named" / "step_8.pt").is_file()


# ---- storage faults ---------------------------------------------------------------------------------------

def test_unwritable_or_full_run_directory_fails_before_training(sudoku_dir, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert train(sudoku_dir, f"checkpoint_path={blocker / 'run'}") == 2
    assert "cannot create run directory" in one_error_line(capsys)

    real_open = run_dir_mod.os.open

    def read_only(path, *a, **kw):
        if str(path).endswith("run.lock"):
            raise PermissionError(30, "Read-only file system")
        return real_open(path, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(run_dir_mod.os, "open", read_only)
        assert train(sudoku_dir, f"checkpoint_path={tmp_path / 'ro'}") == 2
    assert "is not writable (Read-only file system)" in one_error_line(capsys)
    assert not (tmp_path / "ro").exists()  # a failed start leaves nothing behind

    usage = type("Usage", (), {"free": 1000, "total": 10**9, "used": 0})
    monkeypatch.setattr(run_dir_mod.shutil, "disk_usage", lambda path: usage)
    assert train(sudoku_dir, f"checkpoint_path={tmp_path / 'full'}") == 2
    # keep_last_checkpoints=3, but this run writes 2 (one per evaluation) and a stop may add one
    assert "0 MiB free, but 3 checkpoints need about" in one_error_line(capsys)


def full_disk_after(real, good_writes: int, counted=lambda f: True):
    """``real(obj, file, ...)`` (``torch.save``, ``Image.save``) that, after ``good_writes`` counted writes, writes a
    few bytes and fails as a full disk does."""
    calls = {"n": 0}

    def write(obj, f, *a, **kw):
        calls["n"] += counted(f)
        if calls["n"] > good_writes:
            f.write(b"partial")
            raise OSError(28, "No space left on device")
        return real(obj, f, *a, **kw)
    return write


# The writes: step_8.pt, best.pt (the first evaluation is the best so far), step_16.pt, ...
@pytest.mark.parametrize("fail_on,name,resumable", [(1, "step_8.pt", False), (2, "best.pt", True),
                                                    (3, "step_16.pt", True)])
def test_a_failed_write_mid_run_keeps_the_last_checkpoint_and_exits_1(sudoku_dir, tmp_path, monkeypatch, capsys,
                                                                    fail_on, name, resumable):
    monkeypatch.setattr(checkpoint_mod.torch, "save", full_disk_after(torch.save, fail_on - 1))
    run = tmp_path / "run"
    assert train(sudoku_dir, f"checkpoint_path={run}") == 1
    line = one_error_line(capsys)
    assert f"could not write checkpoint {run / name} (No space left on device)" in line
    assert "MiB" in line and ("resume with: python pretrain.py" in line) == resumable
    assert not list(run.glob(".step_*"))  # no partial file left
    if resumable:
        assert safe_load(run / "step_8.pt")["step"] == 8


# ---- non-finite values ------------------------------------------------------------------------------------

def test_a_nonfinite_carry_row_is_reset_and_training_goes_on(sudoku_dir, tmp_path, monkeypatch, caplog):
    real, calls = HierarchicalReasoningModel_ACTV1_Inner.forward, {"n": 0}

    def poisoned(self, carry, batch):
        new_carry, logits, q = real(self, carry, batch)
        calls["n"] += 1
        if self.training and calls["n"] == 5:  # one segment goes bad in rows 0 and 3
            z_H = new_carry.z_H.clone()
            z_H[[0, 3]] = float("nan")
            new_carry = type(new_carry)(z_H, new_carry.z_L)
        return new_carry, logits, q

    monkeypatch.setattr(HierarchicalReasoningModel_ACTV1_Inner, "forward", poisoned)
    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    assert train(sudoku_dir, f"checkpoint_path={run}") == 0
    assert "the ACT carry went non-finite in 2 row(s)" in caplog.text
    final = safe_load(run / "step_16.pt")
    carry = final["ranks"][0]["carry"]["inner"]
    assert torch.isfinite(carry["z_H"]).all() and torch.isfinite(carry["z_L"]).all()
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" in line]
    assert all(math.isfinite(p["eval/accuracy"]) for p in evals)


# ---- settings layers ----------------------------------------------------------------------------------------

def setup_for(*argv):
    return puzzle_trainer.resolve_setup(puzzle_trainer.parse_args(list(argv)), Dist())


def test_settings_merge_defaults_profile_recipe_command_line(caplog):
    # cfg_pretrain leaves global_batch_size to the defaults, so the cpu profile fills it ...
    s = setup_for("--config-name=cfg_pretrain", "hardware=cpu", "device=cpu")
    assert s.cfg.global_batch_size == 64 and s.plan.sources["global_batch_size"] == "hardware profile cpu"
    # ... a recipe's own value beats the profile (the Apple laptop recipe keeps its 384) ...
    s = setup_for("--config-name=cfg_pretrain_apple_silicon", "hardware=apple_silicon", "device=cpu")
    assert s.cfg.global_batch_size == 384
    assert s.plan.sources["global_batch_size"] == "config/cfg_pretrain_apple_silicon.yaml"
    # ... and the command line beats everything.
    s = setup_for("--config-name=cfg_pretrain_apple_silicon", "hardware=apple_silicon", "device=cpu", "global_batch_size=8")
    assert s.cfg.global_batch_size == 8 and s.plan.sources["global_batch_size"] == "command line"
    caplog.set_level(logging.INFO)
    s.plan.log()
    assert "settings from command line: global_batch_size=8" in caplog.text
    assert "settings from config/cfg_pretrain_apple_silicon.yaml:" in caplog.text and "lr=7e-05" in caplog.text
    assert "torch.compile: " in caplog.text and "precision: " in caplog.text
    assert re.search(r"threads: \d+ threads? \(.+\)", caplog.text)  # how many, and why (utils/threads.py)


def test_plan_is_written_to_the_run_directory(sudoku_dir, tmp_path):
    run = tmp_path / "run"
    assert train(sudoku_dir, f"checkpoint_path={run}", "epochs=2", "eval_interval=2") == 0
    plan = (run / "plan.yaml").read_text()
    assert "decisions:" in plan and "torch.compile" in plan and "from: command line" in plan


# ---- metrics: W&B, optional -----------------------------------------------------------------------------------

def test_wandb_logger_logs_everything_and_is_optional(tmp_path, monkeypatch, caplog):
    calls = []
    fake = types.SimpleNamespace(Image=lambda a: ("image", a.shape))
    fake.init = lambda **kw: calls.append(("init", kw)) or types.SimpleNamespace(
        log=lambda values, step: calls.append(("log", values, step)), finish=lambda: calls.append(("finish",)))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with MetricsWriter(tmp_path, logger="wandb", run_id="abc", project="p", config={"lr": 1}) as out:
        out.log(3, {"train/loss": 1.5})
    assert calls[0][0] == "init" and calls[0][1]["id"] == "abc" and calls[0][1]["resume"] == "allow"
    assert calls[1] == ("log", {"train/loss": 1.5}, 3) and calls[-1] == ("finish",)

    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed: import fails
    caplog.set_level(logging.WARNING)
    with MetricsWriter(tmp_path / "b", logger="wandb") as out:
        out.log(1, {"x": 1.0})
    assert "the wandb package is not installed" in caplog.text
    assert steps_in(tmp_path / "b" / "metrics.jsonl") == [1]


def test_metrics_resume_drops_points_after_the_checkpoint(tmp_path):
    with MetricsWriter(tmp_path) as out:
        for step in (2, 4, 6, 8):
            out.log(step, {"x": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 10, "x"')  # a line cut off by a kill
    with MetricsWriter(tmp_path, resume_step=4) as out:
        out.log(6, {"x": 6.0})
    assert steps_in(tmp_path / "metrics.jsonl") == [2, 4, 6]


def test_a_full_disk_while_updating_run_json_exits_1_with_the_resume_command(sudoku_dir, tmp_path, monkeypatch,
                                                                             capsys):
    real_open, calls = open, {"n": 0}

    def flaky_open(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        if str(path).endswith(".tmp") and ".run.json." in str(path):
            calls["n"] += 1
            if calls["n"] == 3:  # the record before the second checkpoint (the first one is complete)
                f.close()
                raise OSError(28, "No space left on device")
        return f

    monkeypatch.setattr(run_dir_mod, "open", flaky_open, raising=False)
    run = tmp_path / "run"
    assert train(sudoku_dir, f"checkpoint_path={run}") == 1
    line = one_error_line(capsys)
    assert f"could not write {run / 'run.json'} (No space left on device" in line and "bytes" in line
    assert "resume with: python pretrain.py" in line
    assert not list(run.glob(".run.json.*"))
    monkeypatch.undo()
    assert train(sudoku_dir, f"checkpoint_path={run}", "resume=auto") == 0


def test_a_full_disk_while_writing_a_picture_exits_1_and_leaves_no_partial_file(sudoku_dir, tmp_path, monkeypatch,
                                                                               capsys):
    from PIL import Image

    # The pictures of the second evaluation fail (four a time; TensorBoard encodes its copy in memory).
    monkeypatch.setattr(Image.Image, "save", full_disk_after(Image.Image.save, 4, lambda f: not isinstance(f, io.BytesIO)))
    run = tmp_path / "run"
    assert train(sudoku_dir, f"checkpoint_path={run}") == 1
    line = one_error_line(capsys)
    assert f"could not write picture {run / 'pictures'}" in line and "No space left on device" in line
    assert "bytes" in line and "MiB free" in line and "resume with: python pretrain.py" in line
    assert all(p.stat().st_size > 100 for p in (run / "pictures").iterdir())  # whole pictures only
    assert safe_load(run / "step_8.pt")["step"] == 8


def test_a_run_whose_first_evaluation_would_come_after_its_end_says_so_before_training(sudoku_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    assert train(sudoku_dir, f"checkpoint_path={run}", "min_eval_interval=2") == 0  # 4 epochs, eval_interval 2
    assert "this run will not evaluate: its first evaluation would come after min_eval_interval=2 of its 2" in caplog.text
    assert caplog.text.index("will not evaluate") < caplog.text.index("estimated time to the end of the schedule")
    assert not any("eval/exact_accuracy" in line for line in (run / "metrics.jsonl").read_text().splitlines())
    caplog.clear()
    assert train(sudoku_dir, f"checkpoint_path={tmp_path / 'evaluated'}", "min_eval_interval=1") == 0
    assert "will not evaluate" not in caplog.text
    assert sum("eval/exact_accuracy" in line for line in (tmp_path / "evaluated" / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_failed_start_leaves_no_claim_and_the_corrected_command_runs(sudoku_dir, tmp_path, capsys):
    hrm = tmp_path / "hrm"
    assert train(sudoku_dir, f"checkpoint_path={hrm}", "epochs=2", "eval_interval=2") == 0
    run = tmp_path / "run"
    assert train(sudoku_dir, f"checkpoint_path={run}", "arch=trm", f"load_checkpoint={hrm / 'step_8.pt'}") == 2
    assert "does not fit this architecture" in one_error_line(capsys)
    assert not run.exists()  # as it found it
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    assert train(sudoku_dir, f"checkpoint_path={run}", "arch=trm", f"load_checkpoint={hrm / 'step_8.pt'}") == 2
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    assert train(sudoku_dir, f"checkpoint_path={run}", "arch=trm") == 0  # not refused: nothing was claimed


@pytest.mark.slow
def test_a_stop_during_the_first_step_acts_at_once_and_the_length_is_told(sudoku_dir, tmp_path, warm_pretrain):
    """A SIGTERM in step 1, which compiles (minutes on a CPU), stops the run at once: nothing to save, nothing
    left. (Stops whose raise Python drops inside the compiler: tests/test_graceful_stop.py.) The run is a fork of the
    warm interpreter (tests/warm_trainer.py): a process of its own, whose hook sends the signal to it alone."""
    run = tmp_path / "run"
    proc = warm_pretrain.run(["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", f"checkpoint_path={run}",
                              *[t for t in TINY if t != "compile=false"], "compile=true"],
                             TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), **signal_at("train", 1, "SIGTERM"))
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert "during the first step (compiling)" in proc.stderr
    assert "estimated time to the end of the schedule: " in proc.stderr
    assert "compiling the training step: the first step builds its kernels" in proc.stderr  # a line of its own
    assert not run.exists()  # a fresh run stopped before its first checkpoint leaves nothing
    # campaign 4, p22: the armed hook is the run's first line, and the stop it causes names it
    assert proc.stderr.splitlines()[0].startswith("RUN_SIGNAL_AT=train:1:SIGTERM is set: this run will send SIGTERM")
    assert "RUN_SIGNAL_AT=train:1:SIGTERM: sending SIGTERM to this process as optimizer step 1 begins" in proc.stderr


def test_the_length_is_told_again_from_timed_steps_and_the_first_step_apart(monkeypatch):
    """A launch-bound GPU run (the hard-Sudoku recipe on an H200: 13 ms steps where FLOPs allow 4 ms): the first
    step (compiling, 60 s) is told apart, and the rest at the median of the timed steps, which one slow step (an
    evaluation between them) does not move. The clock is scripted: nothing here depends on this machine's pace."""
    ticks = iter([0.0, 60.0] + [60.0 + 0.013 * i for i in range(1, 101)] + [100.0] + [100.0 + 0.013 * i for i in
                                                                                   range(1, 200)])
    monkeypatch.setattr(estimate_mod.time, "perf_counter", lambda: next(ticks))
    monkeypatch.setattr(estimate_mod, "load_note", lambda: "a quiet machine")  # whatever else runs here now
    lines = []
    pace = estimate_mod.StepPace(0, 4218, torch.device("cpu"), True, 16.0, lambda msg, *a: lines.append(msg % a))
    pace.begin()
    for step in range(1, 300):
        pace.step_done(step)
    assert lines[0].startswith("compiling the training step: the first step builds its kernels")
    assert lines[1] == "compiling the training step and running it took 60 s"
    assert lines[2] == ("measured: steps 2-102 took 13 ms each (median; 76.9 steps/s, on a quiet machine); the rest of the schedule (4116 "
                        "steps): about 54 s at this pace, evaluations not counted; the FLOP estimate said 16 s: these "
                        "steps are bound by more than their FLOPs (on a CPU: other processes on its cores, or steps "
                        "too small to keep its threads busy)")
    assert len(lines) == 3  # told once
    # The reason names the device's own cause: it blamed kernel launches on a CPU shared with other processes.
    assert estimate_mod.slower_than_flops(torch.device("cuda")) == ("for a small model on a GPU, kernel launches and "
                                                                      "host work")


@pytest.mark.parametrize("value,expected", [("train:12:SIGKILL", ("train", 12, signal.SIGKILL, None)),
                                            ("val:4:term:group", ("val", 4, signal.SIGTERM, "group")),
                                            ("train:5:usr1:leader", ("train", 5, signal.SIGUSR1, "leader"))])
def test_a_signal_point_names_where_which_step_which_signal_and_whom(value, expected):
    plan = signal_hook.parse(value)
    assert (plan.point, plan.step, plan.signum, plan.target) == expected


@pytest.mark.parametrize("value", ["train", "train:x:SIGTERM", "fit:3:SIGTERM", "train:3:SIGNOPE", "train:3:TERM:all"])
def test_a_malformed_signal_point_is_one_line_before_any_work(sudoku_dir, tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv("RUN_SIGNAL_AT", value)
    assert train(sudoku_dir, f"checkpoint_path={tmp_path / 'run'}") == 2
    assert f"RUN_SIGNAL_AT={value!r} is not POINT:STEP:SIGNAL[:group|:leader]" in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


# ---- campaign 4: the test hook reaches only a trainer started as a program, and says so --------------------------

def fake_train(calls: list):
    """A trainer loop as far as the hook sees it: step 1 begins, then the run stops if a signal asked it to."""
    def train(args, rank, stopper):
        points.reach("train", 1)  # where the real loop passes it
        calls.append(stopper.requested)
        return stopper.exit_code if stopper.requested else 0
    return train


@pytest.mark.parametrize("value", ["train:1:SIGTERM", "train:1:SIGINT", "train:x:SIGNOPE"])
def test_campaign4_p07_p19_an_in_process_arc_adaptation_never_arms_the_signal_hook(value, tmp_path, monkeypatch):
    """The ARC adaptation trains inside solve.py or the page (utils/train/arc_adapt.py): RUN_SIGNAL_AT in their
    environment neither signals their own process (p07: the page died on an ARC request; p19: solve.py --arc exited
    1 with a resume hint) nor refuses the task (p19: a malformed value, after the task's dataset was written)."""
    monkeypatch.setenv("RUN_SIGNAL_AT", value)
    calls = []
    monkeypatch.setattr(puzzle_trainer, "train", fake_train(calls))
    args = types.SimpleNamespace(adapt_steps=2, adapt_batch_size=2, adapt_all=False, device="cpu", forward_dtype="float32")
    task = types.SimpleNamespace(id="task", pairs={"train": [None, None]})
    arc_adapt.adapt(args, task, tmp_path / "data", tmp_path / "adapt", ROOT / "models/pretrained/sudoku_hard_trm.pt")
    assert calls == [False]


@pytest.mark.parametrize("name", ["SIGCHLD", "SIGCONT", "SIGHUP", "USR2", "9"])
def test_campaign4_p08_the_hook_accepts_only_the_stops_the_tests_use(name):
    with pytest.raises(UserError, match="SIGNAL one of SIGINT, SIGTERM, SIGKILL, SIGSTOP, SIGUSR1"):
        signal_hook.parse(f"train:1:{name}")


def test_campaign4_p08_a_run_the_hook_freezes_says_how_to_continue_it():
    assert f"it stays stopped until it gets SIGCONT (kill -CONT {os.getpid()})" in \
        signal_hook.parse("train:3:SIGSTOP").announcement()


def test_campaign4_p22_the_armed_hook_is_the_first_line_and_its_stop_names_it(monkeypatch, capsys):
    monkeypatch.setenv("RUN_SIGNAL_AT", "train:1:SIGTERM")
    calls = []
    monkeypatch.setattr(puzzle_trainer, "train", fake_train(calls))
    assert pretrain.main(["--config-name=cfg_pretrain_cpu"]) == 128 + signal.SIGTERM and calls == [True]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("RUN_SIGNAL_AT=train:1:SIGTERM is set: this run will send SIGTERM to this process as optimizer "
                      "step 1 begins (a test hook: unset RUN_SIGNAL_AT to run without it)")
    assert "RUN_SIGNAL_AT=train:1:SIGTERM: sending SIGTERM to this process as optimizer step 1 begins" in err
    assert signal_hook.planned() is None  # disarmed once the run is over


@pytest.mark.parametrize("total", [3, 4, 6])
def test_campaign4_p24_a_short_run_is_told_its_first_step_and_its_pace(monkeypatch, total):
    """A 40 ms first step is not "0 s", and a run shorter than the 1 + 5 steps the pace waits for is told too (after
    as many timed steps as are left). The clock is scripted."""
    ticks = iter([0.0, 0.04] + [0.04 + 0.01 * i for i in range(1, total)])
    monkeypatch.setattr(estimate_mod.time, "perf_counter", lambda: next(ticks))
    monkeypatch.setattr(estimate_mod, "load_note", lambda: "a quiet machine")  # whatever else runs here now
    lines = []
    pace = estimate_mod.StepPace(0, total, torch.device("cpu"), False, 1.0, lambda msg, *a: lines.append(msg % a))
    pace.begin()
    for step in range(1, total + 1):
        pace.step_done(step)
    assert lines[0] == "the first step took 40 ms"
    timed = total // 2  # as many timed as are left after them
    assert lines[1:] == [f"measured: {'step 2' if timed == 1 else f'steps 2-{1 + timed}'} took 10 ms "
                         f"{'(' if timed == 1 else 'each (median; '}100 steps/s, on a quiet machine); the rest of the "
                         "schedule "
                         f"({total - 1 - timed} step{'' if total - 1 - timed == 1 else 's'}): about "
                         f"{10 * (total - 1 - timed)} ms at this pace, evaluations not counted"]


def test_campaign4_p24_durations_under_ten_seconds_keep_their_digits():
    assert [estimate_mod.duration(s) for s in (0.004, 0.25, 2.54, 45, 720)] == ["4 ms", "250 ms", "2.5 s", "45 s",
                                                                                  "12 min"]


# ---- campaign 5, p09: the product holds no test hook ----------------------------------------------------------------

def test_campaign5_p09_no_product_code_reads_the_tests_signal_hook():
    product = [*ROOT.glob("*.py"), *(p for folder in ("utils", "models", "scripts") for p in (ROOT / folder).rglob("*.py"))]
    assert len(product) > 50 and not [p for p in product if "RUN_SIGNAL_AT" in p.read_text(encoding="utf-8")]


def test_campaign5_p09_run_signal_at_in_a_users_environment_does_not_reach_pretrain(sudoku_dir, tmp_path):
    """A user's shell (no tests/run_hook on PYTHONPATH) with the variable set: it was armed, and froze the run in
    step 1 until it was killed."""
    hook = str(ROOT / "tests" / "run_hook")
    path = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != hook)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "RUN_SIGNAL_AT": "train:1:SIGSTOP"}
    with open(tmp_path / "err.txt", "w") as err:
        run = subprocess.Popen([sys.executable, "pretrain.py", "--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}",
                                f"checkpoint_path={tmp_path / 'run'}", *TINY, "epochs=1", "eval_interval=1"], cwd=ROOT,
                               env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status = os.waitpid(run.pid, os.WUNTRACED)  # returns when it ends, or stops itself
        stopped = os.WIFSTOPPED(status)
        if stopped:
            os.kill(run.pid, signal.SIGKILL)
            _, status = os.waitpid(run.pid, 0)
        run.returncode = os.waitstatus_to_exitcode(status)  # reaped here: the Popen is told
    printed = (tmp_path / "err.txt").read_text()
    assert not stopped, f"the run stopped itself in step 1: {printed}"
    assert run.returncode == 0 and "RUN_SIGNAL_AT" not in printed, printed
