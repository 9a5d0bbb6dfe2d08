"""scripts/check_gpu.py: one line where there is no GPU, and its checks rehearsed on the CPU (the CUDA run itself is
what the script is for; its output on a GPU is in the README)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
