"""Past one machine, on CPU/gloo (issue 76): two torchrun agents as two nodes, torchrun's elastic restarts continuing
the run by themselves, a scheduler's early warning, a Slurm job requeued through scripts/train.sbatch (Slurm replayed
by a stand-in: its commands are small scripts on PATH), and ranks that see different run directories refused.

Every run here is pretrain.py's HRM on 128 easy Sudoku, 16 steps of 2 processes (or 1 where said) with
``deterministic=true``: checkpoints at steps 8 and 16, and each interrupted run must end bitwise where the
uninterrupted one does. The same code runs on NCCL with GPUs: only the backend differs (utils/distributed.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import child_env, make_sudoku, signal_at
from utils.checkpoint import safe_load

ROOT = Path(__file__).resolve().parent.parent
TINY = ["compile=false", "device=cpu", "arch.hidden_size=32", "arch.num_heads=2", "arch.H_layers=1",
        "arch.L_layers=1", "arch.halt_max_steps=3", "arch.expansion=2", "arch.halt_exploration_prob=0.0",
        "global_batch_size=32", "epochs=4", "eval_interval=2", "log_interval=2", "lr_warmup_steps=2",
        "forward_dtype=float32", "deterministic=true"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def env(**extra: str) -> dict[str, str]:
    return child_env(HRM_DIST_TIMEOUT_MIN="1", **extra)


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def settings(data: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["pretrain.py", "--config-name=cfg_pretrain_cpu", f"data_path={data}", *TINY, f"checkpoint_path={run_dir}",
            *extra]


def same_weights(a: Path, b: Path) -> None:
    one, two = safe_load(a), safe_load(b)
    for key, value in one["model"].items():
        assert torch.equal(value, two["model"][key]), f"weights differ at {key}"


def steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_sudoku(tmp_path_factory, 128, 40)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    """The uninterrupted run of 2 gloo processes under one torchrun agent."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    done = subprocess.run(torchrun("--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
                                   *settings(data, run_dir)), cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir


def two_nodes(data: Path, run_dir: str, cwd: list[Path]) -> list[subprocess.CompletedProcess]:
    """Two torchrun agents of one process each (``--nnodes 2``), a c10d rendezvous on this machine, each started in
    its own working directory: two nodes."""
    port = free_port()
    agents = [subprocess.Popen(torchrun("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                        "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "two-nodes",
                                        *settings(data, run_dir)),
                               cwd=where, env=env(PYTHONPATH=f"{ROOT}{os.pathsep}{child_env()['PYTHONPATH']}"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for where in cwd]
    return [subprocess.CompletedProcess(a.args, a.wait(timeout=300), a.stdout.read(), "") for a in agents]


def test_two_agents_as_two_nodes_train_bitwise_as_one_agent_of_two_and_only_global_rank_0_writes(data, reference,
                                                                                                 tmp_path):
    run_dir = tmp_path / "run"
    nodes = two_nodes(data, str(run_dir), [ROOT, ROOT])
    assert [n.returncode for n in nodes] == [0, 0], nodes[0].stdout[-3000:] + nodes[1].stdout[-3000:]
    same_weights(reference / "step_16.pt", run_dir / "step_16.pt")
    assert sum("checkpoint:" in n.stdout for n in nodes) == 1  # global rank 0 alone writes
    assert steps_logged(run_dir) == steps_logged(reference)


def test_ranks_that_see_different_run_directories_are_refused_at_start(data, tmp_path):
    """The same relative checkpoint_path on two nodes with other working directories: two folders, refused."""
    node_dirs = [tmp_path / "node0", tmp_path / "node1"]
    for where in node_dirs:
        where.mkdir()
        (where / "pretrain.py").symlink_to(ROOT / "pretrain.py")
        (where / "config").symlink_to(ROOT / "config")
    nodes = two_nodes(data, "runs/x", node_dirs)
    out = nodes[0].stdout + nodes[1].stdout
    assert all(n.returncode != 0 for n in nodes)
    assert "rank 1 does not see the run directory runs/x that rank 0 writes" in out, out[-3000:]
    assert "[rank 1] error: rank 1 does not see the run directory" in out  # one line, by the rank that found it
    assert not list(node_dirs[0].glob("runs/x/step_*.pt"))


@pytest.mark.parametrize("killed_at", [5, 11], ids=["before the first checkpoint", "after it"])
def test_a_worker_killed_mid_run_is_restarted_by_torchrun_and_the_run_continues_bitwise(data, reference, tmp_path,
                                                                                         killed_at):
    """``--max-restarts 2``: rank 0 is SIGKILLed as step ``killed_at`` begins; torchrun restarts both workers, which
    continue from the newest complete checkpoint with no resume= from the user, and end where the uninterrupted run
    does; no checkpoint or metrics line twice, none lost."""
    run_dir = tmp_path / "run"
    done = subprocess.run(torchrun("--nproc-per-node", "2", "--max-restarts", "2", "--rdzv-backend", "c10d",
                                   "--rdzv-endpoint", "localhost:0", *settings(data, run_dir)), cwd=ROOT,
                          env=env(**signal_at("train", killed_at, "SIGKILL")), capture_output=True, text=True,
                          timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "sending SIGKILL" in out and "restart 1, TORCHELASTIC_RESTART_COUNT" in out
    same_weights(reference / "step_16.pt", run_dir / "step_16.pt")
    assert steps_logged(run_dir) == steps_logged(reference)
    record = json.loads((run_dir / "run.json").read_text())
    assert sorted(p.name for p in run_dir.glob("step_*.pt")) == ["step_16.pt", "step_8.pt"]
    assert [Path(c).name for c in record["checkpoints"]] == ["step_8.pt", "step_16.pt"]


@pytest.fixture(scope="module")
def single(data, tmp_path_factory) -> Path:
    """The uninterrupted run of one process."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    subprocess.run([sys.executable, *settings(data, run_dir)], cwd=ROOT, env=env(), check=True, capture_output=True,
                   timeout=300)
    return run_dir


@pytest.mark.parametrize("then", ["checkpoint", "stop"])
def test_an_early_warning_checkpoints_then_goes_on_or_stops(data, single, tmp_path, then):
    """SIGUSR1 (the default warning_signal) as step 5 begins, through the real signal path: a checkpoint of step 5,
    then the run goes on to its end (on_warning=checkpoint), or stops with 128 + SIGUSR1 and continues bitwise with
    resume=auto (on_warning=stop). One process: the warning is agreed across ranks as the stops are."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, *settings(data, run_dir, f"on_warning={then}")]
    done = subprocess.run(cmd, cwd=ROOT, env=env(**signal_at("train", 5, "SIGUSR1")), capture_output=True, text=True,
                          timeout=300)
    out = done.stdout + done.stderr
    assert "SIGUSR1 received (a scheduler's early warning)" in out
    if then == "checkpoint":
        assert done.returncode == 0, out[-3000:]
        assert "early warning (SIGUSR1): checkpoint" in out
        assert json.loads((run_dir / "run.json").read_text())["checkpoints"][-1].endswith("step_16.pt")
    else:
        assert done.returncode == 128 + 10, out[-3000:]  # SIGUSR1 is 10: the requeue code of its signal
        assert [p.name for p in run_dir.glob("step_*.pt")] == ["step_5.pt"]
        again = subprocess.run([*cmd, "resume=auto"], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
    same_weights(single / "step_16.pt", run_dir / "step_16.pt")
    assert steps_logged(run_dir) == steps_logged(single)


STAND_IN = {  # Slurm's commands as the job script uses them, on one node
    "srun": '#!/bin/bash\nexec "$@"\n',
    "scontrol": '#!/bin/bash\n'
                'case "$1" in\n'
                '  show) echo localhost ;;\n'
                '  requeue) echo "requeue $2" >> "$STAND_IN_LOG"; kill -TERM 0 ;;  # every process of the job\n'
                'esac\n',
}


def test_the_sbatch_script_is_requeued_at_its_warning_and_the_second_start_continues_bitwise(data, reference,
                                                                                                tmp_path):
    """scripts/train.sbatch under a stand-in of Slurm: the warning (SIGUSR1 to the batch script, --signal=B:USR1)
    comes as step 5 begins; the script asks for a requeue, which sends SIGTERM to every process of the job; the
    workers checkpoint and exit 143. The stand-in then starts the job again, as Slurm does: it continues from the
    first start's checkpoint and ends bitwise where an uninterrupted run does."""
    stand_in = tmp_path / "slurm"
    stand_in.mkdir()
    for name, text in STAND_IN.items():
        (stand_in / name).write_text(text)
        (stand_in / name).chmod(0o755)
    run_dir, log = tmp_path / "run", tmp_path / "slurm.log"
    job = env(PATH=f"{stand_in}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
              SLURM_JOB_ID="4242", SLURM_NNODES="1", SLURM_JOB_NODELIST="localhost", RUN_DIR=str(run_dir),
              CONFIG="cfg_pretrain_cpu", NPROC="2", PORT=str(free_port()), STAND_IN_LOG=str(log))
    args = ["bash", str(ROOT / "scripts" / "train.sbatch"), f"data_path={data}", *TINY]
    # run() reads the job's output to its end: until every process of the job (the workers too) has ended.
    first = subprocess.run(args, cwd=ROOT, env={**job, **signal_at("train", 5, "SIGUSR1", leader=True)},
                           capture_output=True, text=True, timeout=300, start_new_session=True)
    assert log.read_text() == "requeue 4242\n", first.stdout[-3000:] + first.stderr[-3000:]
    assert [p.name for p in run_dir.glob("step_*.pt")] == ["step_5.pt"], first.stderr[-3000:]
    assert "stopped by SIGTERM after step 5" in first.stderr
    second = subprocess.run(args, cwd=ROOT, env=job, capture_output=True, text=True, timeout=300,
                            start_new_session=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "step_5.pt" in second.stderr
    same_weights(reference / "step_16.pt", run_dir / "step_16.pt")
    assert steps_logged(run_dir) == steps_logged(reference)
