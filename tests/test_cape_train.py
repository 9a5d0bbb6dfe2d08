"""The episodic CAPE trainer (models/train_cape_episodic.py): precision policy, the step, settings layers, the run
lifecycle (stop, resume bitwise, torchrun), and --eval_only with the papers' protocol end to end."""

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import models.train_cape_episodic as trainer
from models.cape import build_model
from tests.conftest import child_env, signal_at
from tests.test_cape_protocol import recompute_from_file, reference_episodes, write_protocol_fixture
from utils.data.cape.mp100 import Augmentation, EpisodeDataset, EpisodeSampler, collate_episodes, load_mp100
from utils.distributed import Dist
from utils.checkpoint import safe_load
from utils.run import guard as guard_mod
from utils.run.guard import NonFiniteGuard
from utils.run.train_state import Clock

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(backbone="resnet18", backbone_stride=16, hidden_dim=32, num_heads=4, ffn_dim=64, similarity_proj_dim=32,
            dynamic_proj_dim=16, dropout=0.0, image_size=64)
TINY_FLAGS = ["--model", "capeformer_lite", "--hidden_dim", "32", "--num_heads", "4", "--image_size", "64",
              "--device", "cpu", "--shots", "1", "--queries", "2", "--eval_queries", "2",
              "--val_episodes_per_category", "1", "--test_episodes_per_category", "1", "--batch_size", "1",
              "--accumulation_steps", "1", "--num_workers", "0", "--log_interval", "1", "--lr_warmup_steps", "1"]


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny: one thread beats OpenMP's spin-up, above all on a busy shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def batches(cape_data):
    train = load_mp100(cape_data, 1)["train"]
    ds = EpisodeDataset(train, EpisodeSampler(train, 1, 2), 64, Augmentation(), seed=0, num_episodes=4)
    return [collate_episodes([ds[i], ds[i + 1]]) for i in (0, 2)]


def args_for(**overrides):
    return trainer.argparse.Namespace(**{**trainer.DEFAULTS, "heatmap_weight": 2.0, "clip_max_norm": 1.0, **overrides})


def state_for(model, loss_fn, opt, amp, scaler=None, lr=1e-3):
    return trainer.CapeTrainState(model, model, loss_fn, opt, scaler, trainer.LRSchedule(lr, 0, 1),
                                  NonFiniteGuard(10, "advice"), amp, Clock(), 20, Dist())


def test_amp_policy(monkeypatch):
    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    assert trainer.amp_policy(cpu, use_amp=False) == trainer.AmpPolicy(None, False, "off (--no-use_amp)")
    monkeypatch.setattr(trainer, "bf16_support", lambda d: (True, "native"))
    assert trainer.amp_policy(cuda, True).dtype == torch.bfloat16 and not trainer.amp_policy(cuda, True).use_scaler
    monkeypatch.setattr(trainer, "bf16_support", lambda d: (False, "compute capability 7.5 < 8.0"))
    pol = trainer.amp_policy(cuda, True)  # e.g. a T4 or RTX 20xx: fp16 needs loss scaling
    assert pol.dtype == torch.float16 and pol.use_scaler and "7.5" in pol.reason
    assert trainer.amp_policy(mps, True).use_scaler
    assert trainer.amp_policy(cpu, True).dtype is None  # no fp16 on CPUs
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda t: t != "mps")
    pol = trainer.amp_policy(mps, True)
    assert pol.dtype is None and "no autocast for mps" in pol.reason


def test_fp16_step_unscales_before_clipping(monkeypatch, batches):
    """The CUDA fp16 path, run on the CPU: GradScaler.unscale_ must come before the norm clip."""
    def step(amp, scaler):
        torch.manual_seed(0)
        model, loss_fn = build_model("capeformer", **TINY)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return trainer.train_step(state_for(model, loss_fn, opt, amp, scaler), batches[:1], torch.device("cpu"), args_for())

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4)
    calls = []
    real_unscale = scaler.unscale_
    monkeypatch.setattr(scaler, "unscale_", lambda o: (calls.append("unscale"), real_unscale(o))[1])
    real_clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda p, n: (calls.append("clip"), real_clip(p, n))[1])
    parts = step(trainer.AmpPolicy(torch.float16, True, "test"), scaler)
    assert calls == ["unscale", "clip"] and parts["applied"] == 1.0
    fp32 = step(trainer.AmpPolicy(None, False, "off"), None)
    assert parts["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.1)  # the true norm, not 16x it


def test_bf16_and_fp32_steps_update_weights(batches):
    for amp in (trainer.AmpPolicy(torch.bfloat16, False, "bf16"), trainer.AmpPolicy(None, False, "off")):
        torch.manual_seed(0)
        model, loss_fn = build_model("capeformer", **TINY)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        before = model.input_proj.weight.detach().clone()
        parts = trainer.train_step(state_for(model, loss_fn, opt, amp), batches, torch.device("cpu"), args_for())
        assert parts["applied"] == 1.0 and torch.isfinite(torch.tensor(parts["loss"]))
        assert not torch.equal(before, model.input_proj.weight)


def test_a_nonfinite_loss_is_named_and_the_step_is_undone(batches, caplog):
    model, loss_fn = build_model("capeformer", **TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}

    def nan_loss(out, batch, heatmap_weight):
        loss, parts = loss_fn(out, batch, heatmap_weight=heatmap_weight)
        return loss * float("nan"), parts

    state = state_for(model, nan_loss, opt, trainer.AmpPolicy(None, False, ""))
    parts = trainer.train_step(state, batches, torch.device("cpu"), args_for())
    assert parts["applied"] == 0.0 and state.guard.total == 1
    assert "non-finite loss, gradient of " in caplog.text
    assert all(torch.equal(v, before[k]) for k, v in model.named_parameters())  # the weights as they were
    assert not opt.state  # and no optimizer state from the undone first step


@pytest.mark.slow
def test_a_short_run_lowers_the_loss(batches):
    torch.manual_seed(0)
    model, loss_fn = build_model("capeformer", **TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
    state = state_for(model, loss_fn, opt, trainer.AmpPolicy(None, False, ""), lr=2e-4)
    losses = []
    for _ in range(30):
        losses.append(trainer.train_step(state, batches[:1], torch.device("cpu"), args_for())["loss"])
    assert losses[-1] < 0.7 * losses[0], losses


# ---- settings ---------------------------------------------------------------------------------------

def test_settings_layers_defaults_profile_recipe_command_line():
    args, plan, _ = trainer.resolve_settings(["--device", "cpu", "--hardware", "gpu_16gb"], Dist())
    assert (args.batch_size, args.accumulation_steps) == (16, 2)  # the profile fills what nothing else set
    assert plan.sources["accumulation_steps"] == "hardware profile gpu_16gb"
    assert re.fullmatch(r"\d+ threads?", plan.decisions["threads"].value) and plan.decisions["threads"].reason
    args, plan, _ = trainer.resolve_settings(["--device", "cpu", "--hardware", "gpu_16gb", "--recipe", "capeformer"],
                                             Dist())
    assert (args.optimizer, args.lr, args.lr_schedule, args.lr_steps, args.epochs) == ("adam", 1e-5, "step", [160, 180], 200)
    assert (args.batch_size, args.accumulation_steps, args.queries) == (16, 2, 1)  # recipe batch, profile's split
    assert plan.sources["lr"] == "recipe capeformer"
    args, plan, _ = trainer.resolve_settings(["--device", "cpu", "--recipe", "pose_anything", "--lr", "3e-5"], Dist())
    assert (args.model, args.backbone, args.lr, args.val_interval) == ("pose_anything", "swinv2_tiny_window16_256", 3e-5, 25)
    assert plan.sources["lr"] == "command line"


# ---- the run lifecycle ------------------------------------------------------------------------------

def read_metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_end_to_end_stop_resume_and_test(monkeypatch, cape_data, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    flags = TINY_FLAGS + ["--data_root", str(cape_data), "--output_dir", str(out), "--epochs", "2",
                          "--episodes_per_epoch", "3", "--no-use_amp"]
    # A SIGTERM during the first step: the trainer finishes it, checkpoints and exits 143 with a resume line.
    monkeypatch.setattr(trainer.GracefulStop, "__enter__", lambda self: (setattr(self, "signal_name", "SIGTERM"), self)[1])
    caplog.set_level("INFO")
    assert trainer.main(flags) == 128 + signal.SIGTERM
    assert "resume with: python -m models.train_cape_episodic" in caplog.text
    ckpt = safe_load(out / "step_1.pt")
    assert (ckpt["position"], ckpt["step"]) == ({"epoch": 0, "episode": 1}, 1)
    monkeypatch.undo()

    caplog.clear()
    assert trainer.main(flags + ["--resume", "auto"]) == 0
    assert "resumed from" in caplog.text and "copy-support baseline" in caplog.text
    metrics = read_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics if "train/loss" in m] == [1, 2, 3, 4, 5, 6]
    assert [m["step"] for m in metrics if "val/PCK@0.2_percent" in m] == [3, 6]
    final = metrics[-1]
    assert set(final) == {"step", "test/PCK@0.2_percent", "test/copy_support_PCK@0.2_percent"}
    assert 0 <= final["test/PCK@0.2_percent"] <= 100
    report = json.loads((out / "pck_report.json").read_text())
    assert report["PCK@0.2_percent"] == pytest.approx(final["test/PCK@0.2_percent"]) and report["subset"] == "test"
    assert safe_load(out / "best.pt")["architecture"]["model"] == "capeformer_lite"
    assert list((out / "pictures").glob("val_poses_step_*.png")) and any((out / "tensorboard").iterdir())
    assert json.loads((out / "run.json").read_text())["best"] == "best.pt"


def test_a_second_run_in_one_directory_is_refused(cape_data, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"run_id": "abc", "trainer": "cape", "checkpoints": []}))
    flags = TINY_FLAGS + ["--data_root", str(cape_data), "--output_dir", str(out), "--epochs", "1",
                          "--episodes_per_epoch", "1"]
    assert trainer.main(flags) == 2
    assert "already holds run abc" in capsys.readouterr().err


def test_ten_nonfinite_steps_in_a_row_stop_training(monkeypatch, cape_data, tmp_path, capsys):
    monkeypatch.setattr(guard_mod, "nonfinite_flags", lambda tensors: torch.ones(len(tensors), dtype=torch.int32))
    flags = TINY_FLAGS + ["--data_root", str(cape_data), "--output_dir", str(tmp_path / "run"), "--epochs", "1",
                          "--episodes_per_epoch", "12", "--no-use_amp"]
    assert trainer.main(flags) == 1
    assert "stopping at step 10: 10 non-finite steps in a row (last: loss, " in capsys.readouterr().err


def test_cudnn_deterministic_turns_benchmark_off(monkeypatch, cape_data, tmp_path):
    calls = []
    monkeypatch.setattr(trainer, "configure_backends", lambda device, benchmark, **kw: calls.append((benchmark, kw)))
    flags = TINY_FLAGS + ["--data_root", str(cape_data), "--output_dir", str(tmp_path / "run"), "--epochs", "1",
                          "--episodes_per_epoch", "1", "--cudnn_deterministic"]
    assert trainer.main(flags) == 0
    assert calls == [(False, {"deterministic": True, "warn_only": True, "compiling": False})]


def flags(cape_data, out, *extra, epochs=2) -> list[str]:
    return TINY_FLAGS + ["--data_root", str(cape_data), "--output_dir", str(out), "--epochs", str(epochs),
                         "--episodes_per_epoch", "4", "--no-use_amp", "--cudnn_deterministic",
                         "--keep_last_checkpoints", "0", *extra]


def assert_same_state(a: Path, b: Path) -> None:
    ca, cb = safe_load(a), safe_load(b)
    assert ca["step"] == cb["step"]
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), f"weights differ at {k}"
    for i, s in ca["optimizer"]["state"].items():
        for k, v in s.items():
            assert torch.equal(v, cb["optimizer"]["state"][i][k]), f"optimizer state {i}.{k} differs"


@pytest.mark.slow
def test_mid_epoch_sigint_and_kill_9_then_resume_are_bitwise(cape_data, tmp_path, warm_cape):
    """Each run a fork of one warm interpreter (tests/warm_trainer.py); the signals come from the tests' hook."""
    def run(out, *extra, **env):
        return warm_cape.run(flags(cape_data, tmp_path / out, *extra), **env)

    straight = run("straight")
    assert straight.returncode == 0, straight.stderr

    # SIGINT in the middle of epoch 2 (during step 6 of 8): a mid-epoch checkpoint, then a resume.
    stopped = run("stopped", **signal_at("train", 6, "SIGINT"))
    assert stopped.returncode == 128 + signal.SIGINT and "resume with:" in stopped.stderr, stopped.stderr
    assert sorted(p.name for p in (tmp_path / "stopped").glob("step_*.pt")) == ["step_4.pt", "step_6.pt"]
    assert safe_load(tmp_path / "stopped" / "step_6.pt")["position"]["episode"] > 0

    # kill -9 in epoch 2: the resume replays it from the checkpoint of epoch 1.
    killed = run("killed", **signal_at("train", 7, "SIGKILL"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [p.name for p in (tmp_path / "killed").glob("step_*.pt")] == ["step_4.pt"]

    for out in ("stopped", "killed"):
        resumed = run(out, "--resume", "auto")
        assert resumed.returncode == 0 and "resumed from" in resumed.stdout + resumed.stderr, resumed.stderr
        assert_same_state(tmp_path / "straight" / "step_8.pt", tmp_path / out / "step_8.pt")


def test_ranks_partition_the_single_process_episode_stream(cape_data):
    train = load_mp100(cape_data, 1)["train"]
    sampler = EpisodeSampler(train, 1, 2)
    single = EpisodeDataset(train, sampler, 64, Augmentation(), seed=3, num_episodes=6)
    ranks = [EpisodeDataset(train, sampler, 64, Augmentation(), seed=3, num_episodes=3, rank=r, world_size=2) for r in (0, 1)]
    for i in range(3):
        for r in (0, 1):
            a, b = single[2 * i + r], ranks[r][i]
            assert a["category_id"] == b["category_id"] and (a["query_image"] == b["query_image"]).all()


SCRIPTED_VALIDATION = """
import sys
sys.path.insert(0, {root!r})
import models.train_cape_episodic as trainer
real, scores = trainer.evaluate, iter([0.5, 0.4, 0.6])  # improves, does not, improves
def evaluate(*args, **kwargs):
    ours, baseline, first = real(*args, **kwargs)
    if "val" in args:
        score = next(scores)
        ours.pck = lambda: score
    return ours, baseline, first
trainer.evaluate = evaluate
sys.exit(trainer.main(sys.argv[1:]))
"""


def torchrun(script, cape_data, out, *extra, env=None):
    env = child_env(HRM_DIST_TIMEOUT_MIN="2", **(env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "localhost:0", *script, *TINY_FLAGS, "--data_root", str(cape_data),
           "--output_dir", str(out), "--episodes_per_epoch", "4", "--batch_size", "2", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.slow
def test_two_processes_agree_when_validation_improves_when_it_does_not_and_on_a_stop(cape_data, tmp_path):
    # Rank 0 alone validates; a scripted score makes epoch 2 not improve, so rank 1 must follow rank 0's verdict
    # (a rank deciding on its own would wait in the best.pt barrier while the other waits elsewhere).
    script = tmp_path / "scripted.py"
    script.write_text(SCRIPTED_VALIDATION.format(root=str(ROOT)))
    run = torchrun([str(script)], cape_data, tmp_path / "run", "--epochs", "3")
    out, _ = run.communicate(timeout=600)
    assert run.returncode == 0, out
    assert out.count("val PCK@0.2") == 3 and out.count("new best") == 2  # rank 0 alone reports
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [m["step"] for m in metrics if "train/loss" in m]
    assert steps == sorted(set(steps)) == list(range(1, 7))  # no duplicate lines from rank 1
    assert [m["val/PCK@0.2_percent"] for m in metrics if "val/PCK@0.2_percent" in m] == [50.0, 40.0, 60.0]
    assert safe_load(tmp_path / "run" / "best.pt")["step"] == 6 and "test/PCK@0.2_percent" in metrics[-1]

    # A scheduler's SIGTERM to the job's process group (torchrun and both workers) during step 3.
    stopped = torchrun(["-m", "models.train_cape_episodic"], cape_data, tmp_path / "stopped", "--epochs", "50",
                       env=signal_at("train", 3, "SIGTERM", group=True))
    out, _ = stopped.communicate(timeout=300)
    assert "resume with:" in out, out
    assert sorted(p.name for p in (tmp_path / "stopped").glob("step_*.pt")) == ["step_2.pt", "step_3.pt"], out


# ---- evaluation only --------------------------------------------------------------------------------------

def test_eval_only_writes_the_protocols_predictions_and_report(tmp_path):
    """Placeholder images and an annotation file with the official oddities; the predictions file is scored again
    from the JSON alone, and its (support, query) pairs are the reference's random.seed(1) draw."""
    _, coco = write_protocol_fixture(tmp_path, per_category=20, subset="test")
    torch.manual_seed(0)
    model, _ = build_model("capeformer_lite", hidden_dim=32, num_heads=4, image_size=64)
    checkpoint = tmp_path / "best.pt"
    torch.save({"model": model.state_dict(), "architecture": trainer.model_record("capeformer_lite", model)}, checkpoint)
    predictions = tmp_path / "eval" / "predictions.jsonl"
    code = trainer.main(["--eval_only", "--resume", str(checkpoint), "--data_root", str(tmp_path), "--split", "1",
                         "--eval_set", "test", "--shots", "1", "--test_episodes_per_category", "3",
                         "--predictions_out", str(predictions), "--device", "cpu", "--batch_size", "2",
                         "--accumulation_steps", "1", "--num_workers", "0"])
    assert code == 0
    records = [json.loads(line) for line in predictions.read_text().splitlines()]
    report = json.loads((predictions.parent / "pck_report.json").read_text())
    again = recompute_from_file(coco, records)
    assert report["PCK@0.2_percent"] == pytest.approx(100 * float(again.mean()), abs=1e-4)
    assert [r["PCK@0.2_percent"] for r in records] == list(100 * again)
    assert report["episodes"] == 9 and report["queries"] == 9 * 15 and report["shots"] == 1
    expected = reference_episodes(coco, shots=1, queries=15, num_episodes=200)  # category-major, the full draw
    firsts = [expected[200 * k:200 * k + 3] for k in range(len(coco["categories"]))]  # a shorter run keeps these
    wanted = [(c["id"], ids[:1], q) for c, episodes in zip(coco["categories"], firsts) for ids in episodes for q in ids[1:]]
    assert [(r["category_id"], r["support_ids"], r["query_id"]) for r in records] == wanted


def test_eval_only_needs_a_checkpoint(tmp_path, capsys):
    assert trainer.main(["--eval_only", "--device", "cpu"]) == 2
    assert "--eval_only needs --resume CHECKPOINT" in capsys.readouterr().err


def test_a_failed_start_claims_nothing_and_an_empty_checkpoint_restarts_the_log(cape_data, tmp_path, capsys):
    out = tmp_path / "run"
    flags = TINY_FLAGS + ["--data_root", str(cape_data), "--output_dir", str(out), "--epochs", "1",
                          "--episodes_per_epoch", "2", "--no-use_amp", "--val_interval", "1"]
    assert trainer.main(flags + ["--shots", "50"]) == 2
    assert "no category has" in capsys.readouterr().err and not out.exists()
    assert trainer.main(flags) == 0  # the corrected command is not refused
    assert (out / "best.pt").is_file()
    (out / "step_2.pt").write_bytes(b"")  # the only step checkpoint, cut off
    assert trainer.main(flags + ["--resume", "auto"]) == 0  # starts over: best.pt is never a resume source
    steps = [m["step"] for m in read_metrics(out / "metrics.jsonl") if "train/loss" in m]
    assert steps == [1, 2]  # the log restarted with the run, no step twice


def test_newcomer_the_length_estimate_comes_before_the_first_step(cape_data, tmp_path, caplog):
    """device=cpu: as the puzzle trainer does, the CAPE trainer tells the length of its schedule from FLOPs before
    its first step, then again from its timed steps."""
    caplog.set_level("INFO")
    flags = TINY_FLAGS + ["--data_root", str(cape_data), "--output_dir", str(tmp_path / "run"), "--epochs", "1",
                          "--episodes_per_epoch", "8", "--no-use_amp"]
    assert trainer.main(flags) == 0
    told = caplog.text
    assert "estimated time to the end of the schedule: " in told and " (8 steps of " in told
    assert told.index("estimated time to the end") < told.index("the first step took") < told.index("measured: ")


# ---- ./START_CAPE_TRAINING.sh ------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_the_start_script_without_torch_says_so_in_one_line(tmp_path, device):
    """An interpreter without torch (``python -S``: no site-packages) is one line and exit code 2, whether the script
    picks the device (``auto``: it imports torch) or is told ``--device cpu`` (it only looks for torch, as that
    import takes seconds); nothing is built."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    done = subprocess.run([str(ROOT / "START_CAPE_TRAINING.sh"), "--device", device], capture_output=True, text=True,
                          timeout=120, env={**child_env(), "PYTHON": str(python)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (f"START_CAPE_TRAINING: error: {python} cannot import torch: install the requirements "
                           "(pip install -r requirements.txt)\n") and done.stdout == ""
