"""scripts/check_gpu.py: one line where there is no GPU, and its checks rehearsed on the CPU (the CUDA run itself is
what the script is for; its output on a GPU is in the README)."""

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from tqdm import tqdm

from scripts import check_gpu as script
from utils.data.cape import synthetic as synthetic_cape
from utils.data.sudoku import build as sudoku_data

ROOT = Path(__file__).resolve().parent.parent


def check_gpu(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/check_gpu.py", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, **env})


def test_without_a_gpu_it_says_so_in_one_line_and_checks_nothing():
    done = check_gpu(CUDA_VISIBLE_DEVICES="")  # no GPU visible, whatever this machine has
    assert done.returncode == 1 and done.stdout.count("\n") == 1, done.stdout + done.stderr
    assert done.stdout.startswith("no NVIDIA GPU here (torch ") and "nothing was checked" in done.stdout


def test_a_check_it_does_not_have_is_one_error_line():
    done = check_gpu("--only", "cuda-magic")
    assert done.returncode == 2 and done.stderr.startswith("error: --only: no check named 'cuda-magic'; the checks: hrm")


@pytest.mark.slow
def test_rehearsed_on_the_cpu_each_check_is_one_line_ok_or_why_not():
    done = check_gpu("--device", "cpu", "--only", "installer,cape,adam", OMP_NUM_THREADS="1")
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[0].startswith("rehearsal on the CPU (") and "torch " in lines[0]
    assert sorted(line.split()[:2] for line in lines[1:-1]) == [["ok", "cape"], ["ok", "installer"]]  # adam: CUDA only
    assert lines[-1] == "2 of 2 checks ok"


# ---- campaign 4: a stop ends every command it started, and the rehearsal says what really ran ------------------

WAITING = '''
import os, subprocess, sys, time
below = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {below.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
'''

# check_gpu.py with one check: a command that waits, with a process below it in a session of its own (as torchrun
# starts its workers); no datasets (the stop is the point).
ONE_WAITING_CHECK = '''
import sys
from scripts import check_gpu
check_gpu.build_data = lambda work: (work / "sudoku", work / "cape")
check_gpu.CHECKS = [check_gpu.Check("wait", "a command that waits",
                                    lambda c: check_gpu.expect(c.run(["-c", sys.argv[1], sys.argv[2]])))]
sys.exit(check_gpu.main(["--device", "cpu"]))
'''


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie whose parent has not reaped it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_campaign4_p11_p21_a_stop_ends_the_commands_and_the_scratch_folder_in_one_line(tmp_path, signum):
    """p11: SIGTERM left the trainers running and /tmp/check_gpu-* behind; p21: Ctrl-C printed a traceback."""
    ready = tmp_path / "pids"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", ONE_WAITING_CHECK, WAITING, str(ready)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(scratch)})
    pids = []
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the command is up: then the stop comes while it runs, whatever the pace
        assert ready.exists(), proc.communicate()
        pids = [int(p) for p in ready.read_text().split()]
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signum, out + err
        assert err.startswith(f"stopped by {signal.Signals(signum).name}: ") and err.count("\n") == 1, err
        assert out.startswith("rehearsal on the CPU (")
        deadline = time.monotonic() + 30  # a SIGKILL is sent at once, carried out by the kernel soon after
        while any(map(alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(alive, pids))
        assert list(scratch.iterdir()) == []
    finally:  # what a failure left running
        proc.kill()
        for pid in filter(alive, pids):
            os.kill(pid, signal.SIGKILL)


def fake_run(stderr: str):
    return lambda argv: subprocess.CompletedProcess(argv, 0, "", stderr)


def test_campaign4_p25_a_trainer_check_says_the_precision_it_ran_in(tmp_path, capsys):
    ctx = types.SimpleNamespace(device="cpu", work=tmp_path, sudoku=tmp_path, commands=script.Commands({}),
                                run=fake_run("12:00:00 INFO precision: float32 (the recipe's forward_dtype)\n"
                                             "12:00:00 INFO torch.compile: off (no C++ compiler)\n"))
    script.run_checks([c for c in script.CHECKS if c.name == "hrm"], ctx, 1)
    line = capsys.readouterr().out
    assert line.startswith("ok      hrm        HRM training, compile=auto (") and "bf16" not in line
    assert line.endswith(": precision float32, torch.compile off\n")


def test_campaign4_p25_the_commands_show_no_bars_and_keep_their_temporary_files_in_the_scratch_folder(tmp_path):
    done = script.Commands(script.child_env(tmp_path)).run(
        [sys.executable, "-c", "import os, tempfile; print(os.environ['TQDM_DISABLE'], tempfile.mkdtemp())"])
    disable, temporary = done.stdout.split()
    assert disable == "1" and Path(temporary).parent == tmp_path / "tmp"  # torchrun's torchelastic_* among them


def test_campaign4_p25_the_datasets_are_built_without_progress_bars(tmp_path, monkeypatch, capfd):
    def noisy(*args, **kwargs):
        for _ in tqdm(range(3), desc="generate"):
            pass
        print("wrote it")
        return tmp_path
    monkeypatch.setattr(sudoku_data, "build_dataset", noisy)  # build_data imports them when it runs
    monkeypatch.setattr(synthetic_cape, "build", noisy)
    script.build_data(tmp_path)
    assert capfd.readouterr() == ("", "")
