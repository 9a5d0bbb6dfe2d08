"""The episodic CAPE trainer (models/train_cape_episodic.py): AMP policy, GradScaler path, skips, resume, end to end."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import models.train_cape_episodic as trainer
from models.cape import CapeConfig, CapeModel
from utils.data.synthetic_cape import build
from utils.run.checkpoint import safe_load
from utils.data.mp100 import Augmentation, EpisodeDataset, EpisodeSampler, collate_episodes, load_mp100

TINY = CapeConfig(backbone="resnet18", hidden_dim=32, num_heads=4, ffn_dim=64, dropout=0.0)
TINY_FLAGS = ["--backbone", "resnet18", "--hidden_dim", "32", "--num_heads", "4", "--image_size", "64", "--device", "cpu",
              "--shots", "1", "--queries", "2", "--eval_queries", "2", "--val_episodes_per_category", "1",
              "--test_episodes_per_category", "1", "--batch_size", "1", "--accumulation_steps", "1", "--num_workers", "0",
              "--log_interval", "1", "--lr_warmup_steps", "1"]


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny: one thread beats OpenMP's spin-up, above all on a busy shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return build(tmp_path_factory.mktemp("synthetic_cape"), num_categories=10, instances_per_category=4, image_size=64, seed=0)


@pytest.fixture(scope="module")
def batches(data_root):
    train = load_mp100(data_root, 1)["train"]
    ds = EpisodeDataset(train, EpisodeSampler(train, 1, 2), 64, Augmentation(), seed=0, num_episodes=4)
    return [collate_episodes([ds[i], ds[i + 1]]) for i in (0, 2)]


def test_amp_policy(monkeypatch):
    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    assert trainer.amp_policy(cpu, use_amp=False) == trainer.AmpPolicy(None, False, "off (--no-use_amp)")
    monkeypatch.setattr(trainer, "bf16_support", lambda d: (True, "native"))
    assert trainer.amp_policy(cuda, True).dtype == torch.bfloat16 and not trainer.amp_policy(cuda, True).use_scaler
    assert trainer.amp_policy(cpu, True).dtype == torch.bfloat16
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
    torch.manual_seed(0)
    model = CapeModel(TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4)
    calls = []
    real_unscale, real_clip = scaler.unscale_, torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(scaler, "unscale_", lambda o: (calls.append("unscale"), real_unscale(o))[1])

    def clip(params, max_norm):
        calls.append("clip")
        return real_clip(params, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    before = model.offset_heads[0][0].weight.detach().clone()
    amp = trainer.AmpPolicy(torch.float16, True, "test")
    parts = trainer.train_step(model, opt, scaler, batches[:1], amp, torch.device("cpu"), clip_max_norm=1.0, heatmap_weight=0.2)
    assert calls == ["unscale", "clip"]
    assert parts is not None and parts["grad_norm"] > 0  # the unscaled norm, not 16x it
    assert not torch.equal(before, model.offset_heads[0][0].weight)


def test_bf16_and_fp32_steps_update_weights(batches):
    for amp in (trainer.AmpPolicy(torch.bfloat16, False, "bf16"), trainer.AmpPolicy(None, False, "off")):
        torch.manual_seed(0)
        model = CapeModel(TINY)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        before = model.lateral[0].weight.detach().clone()
        parts = trainer.train_step(model, opt, None, batches, amp, torch.device("cpu"), 1.0, 0.2)
        assert parts is not None and torch.isfinite(torch.tensor(parts["loss"]))
        assert not torch.equal(before, model.lateral[0].weight)


def test_nonfinite_loss_skips_the_step(monkeypatch, batches):
    model = CapeModel(TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    monkeypatch.setattr(trainer, "cape_loss", lambda *a, **k: (torch.tensor(float("nan"), requires_grad=True), {}))
    assert trainer.train_step(model, opt, None, batches, trainer.AmpPolicy(None, False, ""), torch.device("cpu"), 1.0, 0.2) is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.slow
def test_short_training_run_lowers_the_loss(batches):
    torch.manual_seed(0)
    model = CapeModel(TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    amp = trainer.AmpPolicy(None, False, "off")
    parts = [trainer.train_step(model, opt, None, [batches[i % 2]], amp, torch.device("cpu"), 1.0, 0.2) for i in range(20)]

    def first_vs_last(key):
        values = [p[key] for p in parts]
        return sum(values[:4]) / 4, sum(values[-4:]) / 4

    loss_start, loss_end = first_vs_last("loss")
    l1_start, l1_end = first_vs_last("l1_refined")  # the keypoints themselves, not just the heatmap's bias
    assert loss_end < 0.5 * loss_start and l1_end < 0.75 * l1_start, parts


def test_hardware_profile_fills_only_unset_knobs():
    args = trainer.parse_args(["--batch_size", "3", "--hardware", "cpu"])
    note = trainer.apply_hardware_profile(args, torch.device("cpu"))
    assert args.batch_size == 3 and args.accumulation_steps >= 1 and args.num_workers >= 0 and "batch_size=3" in note
    args = trainer.parse_args([])
    trainer.apply_hardware_profile(args, torch.device("cpu"))
    assert (args.batch_size, args.accumulation_steps) == (2, 8)  # the cpu profile's values fill what was not given


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_end_to_end_stop_resume_and_test(monkeypatch, data_root, tmp_path, capsys):
    out = tmp_path / "run"
    flags = TINY_FLAGS + ["--data_root", str(data_root), "--output_dir", str(out), "--epochs", "2", "--episodes_per_epoch", "3",
                          "--no-use_amp"]
    # A SIGTERM during the first step: the trainer finishes it, checkpoints and exits 0 with a resume line.
    monkeypatch.setattr(trainer.GracefulStop, "__enter__", lambda self: (setattr(self, "signal_name", "SIGTERM"), self)[1])
    assert trainer.main(flags) == 0
    assert "resume with:" in capsys.readouterr().out
    ckpt = safe_load(out / "last.pt")
    assert (ckpt["epoch"], ckpt["episode"], ckpt["step"]) == (0, 1, 1)
    monkeypatch.undo()

    assert trainer.main(flags + ["--resume", str(out / "last.pt")]) == 0
    text = capsys.readouterr().out
    assert "resumed from" in text and "copy-support baseline" in text
    metrics = read_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics if "train/loss" in m] == [1, 2, 3, 4, 5, 6]
    assert [m["step"] for m in metrics if "val/PCK@0.2" in m] == [3, 6]
    final = metrics[-1]
    assert set(final) == {"step", "test/PCK@0.2", "test/copy_support_PCK@0.2"} and 0 <= final["test/PCK@0.2"] <= 100
    best = safe_load(out / "best.pt")
    assert best["model_config"]["backbone"] == "resnet18" and best["step"] in (3, 6)
    assert any((out / "tb").iterdir())


def test_bad_inputs_give_one_line_errors(data_root, tmp_path, capsys):
    flags = TINY_FLAGS + ["--output_dir", str(tmp_path / "run"), "--epochs", "1", "--episodes_per_epoch", "1"]
    assert trainer.main(flags + ["--data_root", str(tmp_path / "missing")]) == 2
    assert "build_synthetic_cape_dataset" in capsys.readouterr().err
    assert trainer.main(flags + ["--data_root", str(data_root), "--resume", str(tmp_path / "nope.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert trainer.main(flags + ["--data_root", str(data_root), "--device", "cuda:7"]) == 2
    assert "error: device='cuda:7'" in capsys.readouterr().err
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "last.pt").write_bytes(b"")  # a finished run is never overwritten silently
    assert trainer.main(flags + ["--data_root", str(data_root)]) == 2
    assert "already holds a run; continue it with --resume" in capsys.readouterr().err


def test_ten_nonfinite_steps_in_a_row_stop_training(monkeypatch, data_root, tmp_path, capsys):
    monkeypatch.setattr(trainer, "cape_loss", lambda *a, **k: (torch.tensor(float("inf"), requires_grad=True), {}))
    flags = TINY_FLAGS + ["--data_root", str(data_root), "--output_dir", str(tmp_path / "run"), "--epochs", "1",
                          "--episodes_per_epoch", "12", "--no-use_amp"]
    assert trainer.main(flags) == 1
    captured = capsys.readouterr()
    assert "10 non-finite steps in a row" in captured.err and "10 in a row" in captured.err + captured.out


def test_cudnn_deterministic_turns_benchmark_off(monkeypatch, data_root, tmp_path):
    calls = []
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", torch.backends.cudnn.deterministic)  # restored after
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda mode, warn_only=False: calls.append((mode, warn_only)))
    monkeypatch.setattr(trainer, "train_step", lambda *a, **k: None)  # stop at once: only the setup matters here
    monkeypatch.setattr(trainer, "MAX_NONFINITE_IN_A_ROW", 1)
    backends = []
    monkeypatch.setattr(trainer, "configure_backends", lambda device, cudnn_benchmark: backends.append(cudnn_benchmark))
    flags = TINY_FLAGS + ["--data_root", str(data_root), "--output_dir", str(tmp_path / "run"), "--epochs", "1",
                          "--episodes_per_epoch", "1", "--cudnn_deterministic"]
    assert trainer.main(flags) == 1
    assert calls == [(True, True)] and backends == [False]


@pytest.mark.slow
def test_kill_9_then_resume_is_bitwise_identical(data_root, tmp_path):
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def spawn(out, *extra):
        flags = TINY_FLAGS + ["--data_root", str(data_root), "--output_dir", str(out), "--epochs", "2",
                              "--episodes_per_epoch", "4", "--no-use_amp", "--cudnn_deterministic", *extra]
        return subprocess.Popen([sys.executable, "-m", "models.train_cape_episodic", *flags], cwd=root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    straight = spawn(tmp_path / "straight")
    killed = spawn(tmp_path / "killed")
    last = tmp_path / "killed" / "last.pt"
    deadline = time.time() + 240
    while not last.exists():  # the first checkpoint is written at the end of epoch 1
        assert killed.poll() is None, killed.stdout.read()
        assert time.time() < deadline, "no checkpoint within 240 s"
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert safe_load(last)["epoch"] == 1
    assert straight.wait(timeout=300) == 0, straight.stdout.read()
    resumed = spawn(tmp_path / "killed", "--resume", str(last))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out

    a, b = safe_load(tmp_path / "straight" / "last.pt"), safe_load(last)
    assert a["step"] == b["step"] == 8
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), f"weights differ at {k}"
    for i, s in a["optimizer"]["state"].items():
        for k, v in s.items():
            assert torch.equal(v, b["optimizer"]["state"][i][k]), f"optimizer state {i}.{k} differs"


def test_ranks_partition_the_single_process_episode_stream(data_root):
    train = load_mp100(data_root, 1)["train"]
    sampler = EpisodeSampler(train, 1, 2)
    single = EpisodeDataset(train, sampler, 64, Augmentation(), seed=3, num_episodes=6)
    ranks = [EpisodeDataset(train, sampler, 64, Augmentation(), seed=3, num_episodes=3, rank=r, world_size=2) for r in (0, 1)]
    for i in range(3):
        for r in (0, 1):
            a, b = single[2 * i + r], ranks[r][i]
            assert a["category_id"] == b["category_id"] and (a["query_image"] == b["query_image"]).all()


@pytest.mark.slow
def test_two_process_torchrun_smoke(data_root, tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HRM_DIST_TIMEOUT_MIN="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "localhost:0", "-m", "models.train_cape_episodic", *TINY_FLAGS, "--data_root", str(data_root),
           "--output_dir", str(out), "--epochs", "2", "--episodes_per_epoch", "4"]
    result = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("epoch 2: val PCK@0.2") == 1  # rank 0 alone reports
    metrics = read_metrics(out / "metrics.jsonl")
    train_steps = [m["step"] for m in metrics if "train/loss" in m]
    assert train_steps == sorted(set(train_steps)) == list(range(1, 9))  # no duplicate lines from rank 1
    assert metrics[-1]["test/PCK@0.2"] >= 0 and safe_load(out / "last.pt")["step"] == 8
