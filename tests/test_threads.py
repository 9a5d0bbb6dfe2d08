"""device=cpu: the thread policy of utils/threads.py reaches OpenMP's runtime from every command, keeps a user's own
setting, and chooses threads from the free cores (a busy machine simulated by the runnable count it reads)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from utils import threads
from utils import device as device_mod
from utils.device import select_device

ROOT = Path(__file__).resolve().parent.parent
LIBGOMP = any(p.name.startswith("libgomp") for p in (Path(torch.__file__).parent / "lib").iterdir())
needs_libgomp = pytest.mark.skipif(not LIBGOMP, reason="torch's OpenMP here is not libgomp (GOMP_SPINCOUNT is "
                                                       "libgomp's; macOS's libomp keeps its own wait)")
ENTRY_POINTS = ["solve", "evaluate", "pretrain", "models.train_cape_episodic", "utils.solve.api"]


def runtime_settings(code: str, **env: str) -> str:
    """What libgomp says it read (``OMP_DISPLAY_ENV=verbose``, printed as the runtime loads) in a fresh Python that
    runs ``code``, with only ``env``'s thread settings."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "HRM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**clean, "OMP_DISPLAY_ENV": "verbose", **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr + done.stdout


@needs_libgomp
@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_the_short_spin_reaches_the_openmp_runtime_from_every_entry_point(module):
    """Importing a command first, then torch (as the command does), the runtime itself reports the spin count: the
    setting was made before OpenMP loaded, not only written into os.environ."""
    shown = runtime_settings(f"import {module}, torch; torch.ones(64, 64) @ torch.ones(64, 64)")
    assert f"GOMP_SPINCOUNT = '{threads.SPIN_COUNT}'" in shown, shown[-1500:]


@needs_libgomp
def test_a_users_own_wait_reaches_the_runtime_unchanged():
    shown = runtime_settings("import solve, torch", OMP_WAIT_POLICY="ACTIVE")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in shown and f"GOMP_SPINCOUNT = '{threads.SPIN_COUNT}'" not in shown
    shown = runtime_settings("import solve, torch", GOMP_SPINCOUNT="12345")
    assert "GOMP_SPINCOUNT = '12345'" in shown
    shown = runtime_settings("import solve, torch", HRM_THREADS="keep")
    assert "GOMP_SPINCOUNT = '300000'" in shown  # libgomp's own default (about 3 ms)


@pytest.mark.parametrize("env, code, said", [
    ({"OMP_NUM_THREADS": "1"}, "", "1 thread: OMP_NUM_THREADS=1 from the environment (kept)"),
    ({}, "torch.set_num_threads(1); ", "1 thread: set by torch.set_num_threads before this command chose (kept)"),
    ({"HRM_THREADS": "keep"}, "", "torch's default (HRM_THREADS=keep); OpenMP's own wait"),
])
def test_a_users_own_threads_are_kept_and_the_solver_says_so(env, code, said):
    shown = runtime_settings(f"import torch; from solve import Solver; {code}print(Solver(device='cpu').threads)",
                             **env)
    assert said in shown.strip().splitlines()[-1]


@pytest.fixture
def fresh(monkeypatch):
    """utils.threads as a command finds it at its start (nothing chosen yet), torch's threads restored after."""
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_chosen", None)
    monkeypatch.setattr(threads, "_note", None)
    for name in ("OMP_NUM_THREADS", "HRM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(device_mod, "physical_cores", lambda: 2)
    torch.set_num_threads(2)
    yield monkeypatch
    torch.set_num_threads(before)


@pytest.mark.parametrize("others, chosen", [(0.0, 2), (1.0, 1), (2.7, 1)])
def test_threads_are_the_free_cores_at_start_and_the_device_line_says_why(fresh, others, chosen):
    fresh.setattr(threads, "runnable_others", lambda: others)
    choice = select_device("cpu")
    assert torch.get_num_threads() == chosen and choice.threads.startswith(f"{chosen} thread")
    assert ("the machine is busy, 1 other process(es)" in choice.threads) == (others == 1.0)
    fresh.setattr(threads, "runnable_others", lambda: 0.0)  # chosen once a process: a later load changes nothing
    assert select_device("cpu").threads == choice.threads and torch.get_num_threads() == chosen


def test_a_deterministic_run_keeps_torchs_default_whatever_the_load(fresh):
    fresh.setattr(threads, "runnable_others", lambda: 1.0)
    choice = select_device("cpu", deterministic=True)
    assert torch.get_num_threads() == 2 and "deterministic" in choice.threads


def test_the_runnable_count_leaves_this_process_out(monkeypatch, tmp_path):
    """/proc/loadavg's fourth field counts this process while it reads; where there is no /proc, nothing runs."""
    import builtins

    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(tmp_path / "loadavg", *a, **k)
                        if path == "/proc/loadavg" else real_open(path, *a, **k))
    (tmp_path / "loadavg").write_text("0.50 0.40 0.30 3/412 9999\n")
    assert threads.runnable_others(samples=2, pause_s=0) == 2.0
    (tmp_path / "loadavg").unlink()
    assert threads.runnable_others() == 0.0
