"""CUDA's own behaviour, on an NVIDIA GPU (every test here is marked ``gpu`` and skipped, with the reason, where
there is none; the same code's CPU paths are tested everywhere else).

What is promised on CUDA (README, Resuming and failures): with ``deterministic=true compile=false`` a run stopped
and resumed equals the uninterrupted run bitwise, HRM and TRM, fp32 and bf16; AdamATan2 (eager, compiled, and the
native kernel where installed) matches the independent re-computation of the algorithm.
"""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import models.train_cape_episodic as cape_trainer
import pretrain
from test_optimizer_fallback import reference_step
from tests.conftest import child_env, signal_at
from tests.test_cape_train import TINY_FLAGS
from tests.test_optimizer import BETAS, TOL, WD, make_params, set_grads
from tests.test_pretrain_trm import TINY_TRM
from tests.test_resume import TINY
from utils.data.cape.synthetic import build
from utils.optimizer_utils import AdamATan2
from utils.checkpoint import safe_load

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
ON_CUDA = ["device=cuda" if t == "device=cpu" else t for t in TINY]
ARCHS = {"hrm": ON_CUDA, "trm": ["device=cuda" if t == "device=cpu" else t for t in TINY_TRM] + ["deterministic=true"]}


def _step_against_reference(opt, params, steps: int = 100) -> float:
    """Step CUDA ``params`` and the host re-computation side by side; the max abs difference seen."""
    gen = torch.Generator().manual_seed(1)
    ref = [(p.detach().cpu().clone(), torch.zeros(p.shape, dtype=p.dtype), torch.zeros(p.shape, dtype=p.dtype))
           for p in params]
    host = [torch.nn.Parameter(r[0].clone()) for r in ref]
    worst = 0.0
    for t in range(1, steps + 1):
        set_grads(host, gen)
        for p, h in zip(params, host):
            p.grad = h.grad.cuda()
        ref = [reference_step(r[0], h.grad, r[1], r[2], t, 1e-3, BETAS, WD) for r, h in zip(ref, host)]
        opt.step()
        for p, (rp, rm, rv) in zip(params, ref):
            state = opt.state[p]
            for ours, want in ((p.detach(), rp), (state["exp_avg"], rm), (state["exp_avg_sq"], rv)):
                worst = max(worst, (ours.double().cpu() - want.double()).abs().max().item())
    return worst


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_adam_atan2_on_cuda_matches_the_reference(dtype, compile):
    params = [torch.nn.Parameter(p.detach().cuda()) for p in make_params(dtype, torch.Generator().manual_seed(0))]
    opt = AdamATan2(params, lr=1e-3, betas=BETAS, weight_decay=WD, compile=compile)
    assert _step_against_reference(opt, params) <= TOL[dtype]
    assert opt.use_compile == compile


def test_native_adam_atan2_matches_the_reference():
    native = pytest.importorskip("adam_atan2", reason="the native adam-atan2 is not installed "
                                                      "(python install_dependencies.py builds it where it can)")
    params = [torch.nn.Parameter(p.detach().cuda()) for p in make_params(torch.float32, torch.Generator().manual_seed(0),
                                                                         transposed=False)]
    opt = native.AdamATan2(params, lr=1e-3, betas=BETAS, weight_decay=WD)
    assert _step_against_reference(opt, params) <= TOL[torch.float32]


def _pretrain(run: Path, argv: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "pretrain.py", *argv, f"checkpoint_path={run}"], cwd=ROOT,
                          env=child_env(**env), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_stopped_and_resumed_cuda_run_equals_the_uninterrupted_one_bitwise(sudoku_dir, tmp_path, arch, dtype):
    argv = ["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", *ARCHS[arch], f"forward_dtype={dtype}"]
    straight = _pretrain(tmp_path / "straight", argv)
    assert straight.returncode == 0, straight.stderr
    killed = _pretrain(tmp_path / "killed", argv, **signal_at("train", 11, "SIGKILL"))
    assert killed.returncode == -9, killed.stderr
    assert sorted(p.name for p in (tmp_path / "killed").glob("step_*.pt")) == ["step_8.pt"]
    resumed = _pretrain(tmp_path / "killed", [*argv, "resume=auto"])
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr
    a, b = safe_load(tmp_path / "straight" / "step_16.pt"), safe_load(tmp_path / "killed" / "step_16.pt")
    for key, value in a["live_model"].items():
        assert torch.equal(value, b["live_model"][key]), f"weights differ at {key}"
    for i, state in a["optimizers"][0]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizers"][0]["state"][i][key]), f"optimizer state {i}.{key} differs"


def test_hrm_trains_in_bf16_with_compile_auto_on_cuda(sudoku_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    argv = ["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", f"checkpoint_path={tmp_path / 'run'}",
            *[t for t in ON_CUDA if t not in ("compile=false", "forward_dtype=float32", "deterministic=true")]]
    assert pretrain.main(argv) == 0
    assert "precision: bfloat16" in caplog.text and "torch.compile: on" in caplog.text


def test_cape_trains_with_amp_and_workers_on_cuda(tmp_path):
    data = build(tmp_path / "data", num_categories=10, instances_per_category=20, image_size=64, seed=0)
    flags = ["cuda" if f == "cpu" else f for f in TINY_FLAGS]  # the value of --device
    assert cape_trainer.main([*flags, "--data_root", str(data), "--output_dir", str(tmp_path / "run"), "--epochs", "1",
                              "--episodes_per_epoch", "4", "--use_amp", "--num_workers", "2"]) == 0
    assert (tmp_path / "run" / "pck_report.json").is_file()
