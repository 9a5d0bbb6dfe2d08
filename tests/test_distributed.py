"""pretrain.py under the real torchrun on CPU/gloo: equivalence with one process, rank-0-only outputs, crash handling."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import REAL_EXIT, child_env, make_sudoku, signal_at
from utils.checkpoint import safe_load

ROOT = Path(__file__).resolve().parent.parent
TINY = ["compile=false", "device=cpu", "arch.hidden_size=32", "arch.num_heads=2", "arch.H_layers=1",
        "arch.L_layers=1", "arch.halt_max_steps=3",
        "arch.expansion=2", "arch.halt_exploration_prob=0.0", "global_batch_size=32", "epochs=4", "eval_interval=2",
        "log_interval=2", "lr_warmup_steps=2", "forward_dtype=float32", "deterministic=true"]

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")


@pytest.fixture(scope="module")
def sudoku_dir(tmp_path_factory):
    return make_sudoku(tmp_path_factory, 128, 40)


def run(cmd, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HRM_DIST_TIMEOUT_MIN="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def torchrun(script, *argv):
    return run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "0",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", str(script), *argv])


def eval_points(run_dir):
    return [p for p in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "eval/accuracy" in p]


def common(sudoku_dir) -> list[str]:
    """The settings of every run here: 4 steps an epoch, evaluations and checkpoints at steps 8 and 16."""
    return ["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", *TINY]


@pytest.fixture(scope="module")
def two_processes(sudoku_dir, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A run of two gloo processes under torchrun, uninterrupted: its directory and its process."""
    where = tmp_path_factory.mktemp("two") / "run"
    done = torchrun("pretrain.py", *common(sudoku_dir), f"checkpoint_path={where}")
    assert done.returncode == 0, done.stdout + done.stderr
    return where, done


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_and_only_rank0_writes(sudoku_dir, two_processes, tmp_path, warm_pretrain):
    single = warm_pretrain.run([*common(sudoku_dir), f"checkpoint_path={tmp_path / 'one'}"], HRM_DIST_TIMEOUT_MIN="1")
    assert single.returncode == 0, single.stdout + single.stderr
    two_dir, double = two_processes
    assert "processes: 2" in double.stderr and double.stderr.count("run directory:") == 1  # rank 0 logs alone

    one, two = safe_load(tmp_path / "one" / "step_16.pt"), safe_load(two_dir / "step_16.pt")
    for key, value in one["model"].items():
        torch.testing.assert_close(two["model"][key], value, atol=2e-5, rtol=1e-4, msg=f"weights differ at {key}")
    assert len(two["ranks"]) == 2 and all(r["carry"] is not None for r in two["ranks"])  # every rank's ACT carry

    evals_one, evals_two = eval_points(tmp_path / "one"), eval_points(two_dir)
    assert [p["step"] for p in evals_two] == [p["step"] for p in evals_one]  # no duplicate lines from rank 1
    for a, b in zip(evals_one, evals_two):
        assert b["eval/count"] == a["eval/count"] == 40
        for key in ("eval/accuracy", "eval/exact_accuracy", "eval/blank_accuracy", "eval/steps"):
            assert b[key] == pytest.approx(a[key], abs=1e-6), key


@pytest.mark.slow
def test_a_crashing_rank_brings_the_job_down_with_its_error(sudoku_dir, tmp_path):
    wrapper = tmp_path / "crash_rank1.py"
    wrapper.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        import pretrain
        from models.losses import ACTLossHead
        real = ACTLossHead.forward
        calls = [0]
        def forward(self, carry, batch):
            calls[0] += 1
            if os.environ["RANK"] == "1" and calls[0] == 3:
                raise RuntimeError("injected failure on rank 1")
            return real(self, carry, batch)
        ACTLossHead.forward = forward
        sys.exit(pretrain.main(sys.argv[1:]))
    """))
    result = torchrun(wrapper, "--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", *TINY,
                      f"checkpoint_path={tmp_path / 'run'}")
    assert result.returncode != 0
    assert "injected failure on rank 1" in result.stdout + result.stderr


def test_global_batch_must_divide_by_world_size(sudoku_dir, tmp_path, monkeypatch, capsys):
    """The check, in this process as rank 0 of two: a one-process gloo group stands in for the job's (rank 0's
    settings broadcast to itself). How a torchrun job ends on one rank's error is the crashing-rank test's."""
    import pretrain
    from utils import distributed

    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    monkeypatch.setattr(distributed, "init_distributed", lambda: distributed.Dist(rank=0, world_size=2, local_rank=0))
    monkeypatch.setattr("utils.run.main.exit_skipping_teardown", lambda code: None)  # a torchrun worker's exit would end pytest
    try:
        code = pretrain.main([*common(sudoku_dir), "global_batch_size=31", f"checkpoint_path={tmp_path / 'run'}"])
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert code == 2 and not (tmp_path / "run").exists()
    assert "global_batch_size 31 is not divisible by the 2 processes" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_under_torchrun_restores_every_ranks_carry(sudoku_dir, two_processes, tmp_path):
    # A scheduler's SIGTERM to the job's process group (torchrun and both workers) during step 5.
    env = child_env(HRM_DIST_TIMEOUT_MIN="1", **signal_at("train", 5, "SIGTERM", group=True))
    stopped_dir = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend",
                             "c10d", "--rdzv-endpoint", "localhost:0", "pretrain.py", *common(sudoku_dir),
                             f"checkpoint_path={stopped_dir}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out, _ = proc.communicate(timeout=300)
    assert [p.name for p in stopped_dir.glob("step_*.pt")] == ["step_5.pt"], out
    saved = safe_load(stopped_dir / "step_5.pt")
    assert len(saved["ranks"]) == 2
    assert not torch.equal(saved["ranks"][0]["carry"]["current_data"]["inputs"],
                           saved["ranks"][1]["carry"]["current_data"]["inputs"])  # each rank's own rows

    resumed = torchrun("pretrain.py", *common(sudoku_dir), f"checkpoint_path={stopped_dir}", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr
    a, b = safe_load(two_processes[0] / "step_16.pt"), safe_load(stopped_dir / "step_16.pt")
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), f"weights differ at {key}"


def test_with_gpus_the_group_sends_cuda_tensors_through_nccl_and_host_tensors_through_gloo(monkeypatch):
    """A GPU machine simulated on the CPU: a plain "nccl" group would fail on the host tensors the trainers agree on
    (the stop flag of any_rank, metric sums), so CUDA tensors take NCCL and host tensors gloo."""
    from utils import distributed

    joined = {}
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(distributed.torch.cuda, "set_device", lambda index: joined.setdefault("device", index))
    monkeypatch.setattr(distributed.dist, "rendezvous", lambda url, timeout: iter([(torch.distributed.HashStore(), 1, 2)]))
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **_: joined.update(backend=backend))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: joined["backend"])
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank = distributed.init_distributed()
    assert joined == {"device": 1, "backend": "cpu:gloo,cuda:nccl"} and rank.uses_nccl and rank.rank == 1
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 1)  # this rank has no GPU of its own
    joined.clear()
    assert not distributed.init_distributed().uses_nccl and joined == {"backend": "gloo"}


@pytest.mark.parametrize("outcome, code", [("done", 0), ("bad input", 2)])
def test_a_torchrun_worker_leaves_with_its_code_past_the_interpreters_teardown(monkeypatch, capsys, outcome, code):
    """device=cpu, a world of 2 simulated: after its group is destroyed, a worker ends by ``os._exit`` with the run's
    exit code, its output flushed (gloo's threads can abort a worker in the interpreter's teardown)."""
    from utils.distributed import Dist
    from utils.errors import UserError
    from utils.run import main

    events = []

    def body(rank, stopper):
        if outcome == "bad input":
            raise UserError("a bad setting")
        return 0

    def exit_now(status):
        events.append(("exit", status))
        raise SystemExit(status)

    monkeypatch.setattr("utils.distributed.init_distributed", lambda: Dist(1, 2, 1))
    monkeypatch.setattr(main, "setup_logging", lambda rank=None: None)  # keep this process's logging as it is
    monkeypatch.setattr(torch.distributed, "barrier", lambda: events.append("barrier"))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: events.append("destroyed"))
    monkeypatch.setattr(main.os, "_exit", exit_now)
    monkeypatch.setattr(main, "exit_skipping_teardown", REAL_EXIT)  # the real exit, down to os._exit
    with pytest.raises(SystemExit):
        main.run_main(body)
    assert events == (["barrier"] if outcome == "done" else []) + ["destroyed", ("exit", code)]
    if outcome == "bad input":
        assert capsys.readouterr().err == "[rank 1] error: a bad setting\n"
