"""The checkpointer is crash-consistent (utils/run/checkpointer.py): a run killed at any step of the checkpoint
sequence resumes bitwise, loses nothing and touches nothing it did not write; one process per run directory;
metrics after a resume equal the uninterrupted run's; the final evaluation survives a stop after the last step."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pretrain
from tests.conftest import child_env, signal_at
from tests.test_resume import TINY, assert_same_training_state
from utils.run import session
from utils.checkpoint import safe_load
from utils.run.run_dir import RunDirError, RunLock

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"train/examples_per_s", "train/elapsed_s", "eval/elapsed_s"}
# Three evaluations (steps 8, 16, 24) with a checkpoint after each; one kept, so the step-16 write prunes step_8.pt.
RUN = [*TINY, "epochs=6", "eval_interval=2", "keep_last_checkpoints=1", "log_interval=3"]

# Patches that make a run die like kill -9 (os._exit: no cleanup of any kind) at one point of the sequence that
# writes step_16.pt.
CRASH = r"""
import os, pathlib, torch
from utils.run import run_dir
point, target = {point!r}, "step_16.pt"
die = lambda: os._exit(137)
real_manifest, real_save, real_replace, real_unlink = (run_dir.RunDirectory.write_manifest, torch.save, os.replace,
                                                       pathlib.Path.unlink)

def write_manifest(self):
    pending = self.manifest.get("pending") or {{}}
    if point == "commit" and target in self.manifest["checkpoints"] and not pending:
        with open(self.path / f".run.json.{{self.run_id}}.tmp", "w") as f:
            f.write('{{"run_id": "half a rec')  # the update of run.json is cut off mid-write
        die()
    real_manifest(self)
    if point == "record" and pending.get("name") == target:
        die()

def save(obj, f, *a, **kw):
    if point == "write" and target in getattr(f, "name", ""):
        f.write(b"PK\x03\x04 half a checkpoint")
        f.flush()
        die()
    return real_save(obj, f, *a, **kw)

def replace(src, dst, *a, **kw):
    real_replace(src, dst, *a, **kw)
    if point == "rename" and str(dst).endswith(target):
        die()

def unlink(self, *a, **kw):
    if point == "prune" and self.name.startswith("step_"):
        die()
    return real_unlink(self, *a, **kw)

run_dir.RunDirectory.write_manifest, torch.save, os.replace, pathlib.Path.unlink = write_manifest, save, replace, unlink
"""


def argv(sudoku_dir, run_dir, *extra):
    return ["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", f"checkpoint_path={run_dir}", *RUN, *extra]


def points(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


@pytest.fixture(scope="module")
def straight(sudoku_dir, tmp_path_factory, warm_pretrain):
    run = tmp_path_factory.mktemp("straight") / "run"
    done = warm_pretrain.run(argv(sudoku_dir, run))
    assert done.returncode == 0, done.stderr
    return run


@pytest.mark.slow
@pytest.mark.parametrize("point", ["record", "write", "rename", "commit", "prune"])
def test_a_kill_at_any_step_of_the_checkpoint_sequence_resumes_bitwise(sudoku_dir, tmp_path, warm_pretrain, straight,
                                                                       point):
    """Each run a fork of one warm interpreter (tests/warm_trainer.py): a process that may die as kill -9 does."""
    run = tmp_path / "run"
    run.mkdir()
    notes, stray = run / ".notes.backup1.tmp", run / "step_999.pt"
    notes.write_text("keep")  # a user's file named like a temporary file
    crashed = warm_pretrain.run(argv(sudoku_dir, run), prelude=CRASH.format(point=point))
    assert crashed.returncode == 137, crashed.stderr
    stray.write_bytes(b"someone else's")  # a file that looks like a checkpoint, written between the two runs

    resumed = warm_pretrain.run(argv(sudoku_dir, run, "resume=auto"))
    assert resumed.returncode == 0, resumed.stderr
    resumed_from = "step_16.pt" if point in ("rename", "commit", "prune") else "step_8.pt"
    assert f"resumed from {run / resumed_from}" in resumed.stderr
    assert_same_training_state(straight / "step_24.pt", run / "step_24.pt")
    assert points(run) == points(straight)  # train and eval, point by point
    assert notes.read_text() == "keep" and stray.read_bytes() == b"someone else's"
    assert sorted(p.name for p in run.iterdir() if p.name.startswith((".", "step_"))) == \
        [".notes.backup1.tmp", "step_24.pt", "step_999.pt"]  # no temporary file, the pruned checkpoints gone


@pytest.mark.slow
@pytest.mark.parametrize("stop_at_call", [4, 17])
def test_metrics_after_a_stop_and_resume_equal_the_uninterrupted_runs(sudoku_dir, tmp_path, straight, monkeypatch,
                                                                     request, stop_at_call):
    """A stop after step 4 (mid log window: points come every 3 steps), or right after the last step of the second
    iteration (call 17, before its evaluation): the resumed run logs what the uninterrupted one did, evaluation
    included."""
    calls = {"n": 0}

    def any_ranks(flags, rank):  # [a stop asked, an early warning], as every rank agrees after a step
        calls["n"] += 1
        return [calls["n"] == stop_at_call, False]

    run = tmp_path / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the uninterrupted run in its child process, for bitwise equal sums
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    with monkeypatch.context() as m:
        m.setattr(session, "any_ranks", any_ranks)
        assert pretrain.main(argv(sudoku_dir, run)) == 128 + signal.SIGTERM
    assert safe_load(sorted(run.glob("step_*.pt"))[-1])["step"] == (4 if stop_at_call == 4 else 16)
    assert pretrain.main(argv(sudoku_dir, run, "resume=auto")) == 0
    assert points(run) == points(straight)
    assert_same_training_state(straight / "step_24.pt", run / "step_24.pt")


def test_a_run_directory_is_used_by_one_process_and_a_killed_holder_does_not_block(sudoku_dir, tmp_path, capsys):
    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "pretrain.py", *argv(sudoku_dir, run, "epochs=400", "eval_interval=200")],
                             cwd=ROOT, env=child_env(**signal_at("train", 3, "SIGSTOP")), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    _, status = os.waitpid(first.pid, os.WUNTRACED)  # returns once it has stopped itself in step 3, holding the run
    assert os.WIFSTOPPED(status), status
    record = (run / "run.json").read_bytes() if (run / "run.json").exists() else None
    assert pretrain.main(argv(sudoku_dir, run, "epochs=400", "eval_interval=200", "resume=auto")) == 2
    err = capsys.readouterr().err
    assert f"is in use by process {first.pid}" in err and err.count("error:") == 1
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert ((run / "run.json").read_bytes() if (run / "run.json").exists() else None) == record  # the refusal wrote nothing
    assert pretrain.main(argv(sudoku_dir, run, "resume=auto")) == 0  # the dead holder's lock is gone with it


def test_the_lock_names_its_holder_and_is_free_once_released(tmp_path):
    held = RunLock(tmp_path)
    with pytest.raises(RunDirError, match=f"in use by process {os.getpid()}"):
        RunLock(tmp_path)
    held.release()
    RunLock(tmp_path).release(remove=True)
    assert not (tmp_path / "run.lock").exists()


def test_an_update_that_makes_weights_nonfinite_is_undone(caplog):
    from utils.distributed import Dist
    from utils.run.guard import NonFiniteGuard

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = NonFiniteGuard(3, "a lower lr")
    weights = dict(model.named_parameters())

    def step(poison: bool) -> bool:
        model(torch.randn(2, 4)).sum().backward()
        grads = {f"gradient of {n}": p.grad for n, p in weights.items()}

        def apply():
            opt.step()
            if poison:
                with torch.no_grad():
                    model.weight[0, 0] = float("inf")
        kept = guard.update(1, grads, [opt], apply, weights, Dist())
        opt.zero_grad()
        return kept

    assert not step(poison=True) and not opt.state  # undone at the first step: no optimizer state either
    assert step(poison=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {k: v.clone() for k, v in opt.state[model.weight].items()}
    assert not step(poison=True)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(torch.equal(v, opt.state[model.weight][k]) for k, v in moments.items())
    assert guard.total == 2 and "non-finite updated weight weight" in caplog.text
