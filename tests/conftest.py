"""Shared fixtures (tiny generated Sudoku datasets in the reference on-disk format) and helpers for tests that
drive a trainer in a subprocess."""

import subprocess
import time
from pathlib import Path

import pytest

from utils.data.sudoku import build_dataset


def make_sudoku(tmp_path_factory, train_size: int, test_size: int):
    """Build easy unique-solution Sudoku (1 augmentation per puzzle) into a fresh temp directory."""
    path = tmp_path_factory.mktemp("data") / "sudoku"
    build_dataset(path, generate=True, train_size=train_size, test_size=test_size, min_blanks=30, num_aug=1, seed=0)
    return path


@pytest.fixture(scope="session")
def sudoku_dir(tmp_path_factory):
    """64 training puzzles (x2 with augmentation) and 16 test puzzles."""
    return make_sudoku(tmp_path_factory, 64, 16)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until ``path`` exists, failing with the process's output if it ends first or time runs out."""
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before writing {path}:\n{proc.stdout.read()}")
        if time.time() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.02)


def wait_for_training(metrics: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until ``metrics`` (a run's metrics.jsonl) holds a point: the run is past its first step, where a signal
    stops it at once with nothing to save (utils/run/stop.py), and a stop now finishes a step and checkpoints."""
    deadline = time.time() + timeout
    while not (metrics.exists() and metrics.read_text()):
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before logging to {metrics}:\n{proc.stdout.read() if proc.stdout else ''}")
        assert time.time() < deadline, f"timed out waiting for a point in {metrics}"
        time.sleep(0.05)
