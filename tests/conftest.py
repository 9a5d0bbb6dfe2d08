"""Shared fixtures: tiny generated Sudoku datasets in the reference on-disk format."""

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
