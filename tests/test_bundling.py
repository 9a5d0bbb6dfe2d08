"""How the code treats the models bundled in models/pretrained/, on small ones bundled here by scripts/bundle_model.py
from tiny runs: the script keeps the weights only and writes a card measured on the file (evaluate.py reproduces its
accuracy); solve.py without --checkpoint uses the bundled model and names it; a puzzle it cannot take, or a missing
file, is one line. The shipped models themselves are tested in tests/test_bundled_models.py."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import solve
from scripts import bundle_model
from tests.test_bad_inputs import assert_one_line
from tests.test_solve import MAZE, SUDOKU, sudoku_run, train  # noqa: F401  (sudoku_run: a fixture)
from utils.data.maze import build_maze_dataset
from utils.eval import solving
from utils.eval.solving import BUNDLED

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_bundled(sudoku_run, tmp_path_factory):  # noqa: F811
    """A models/pretrained/ of tiny models under the bundled names (a Sudoku and a 10x10 maze model), in use while
    the module's tests run."""
    out = tmp_path_factory.mktemp("pretrained")
    mazes = build_maze_dataset(tmp_path_factory.mktemp("maze") / "maze", generate=True, size=10, train_size=32,
                               test_size=8, min_path_length=1)
    maze_run = train(mazes, tmp_path_factory.mktemp("maze_run") / "run", "arch.puzzle_emb_len=0")
    for run, task, recipe in ((sudoku_run, "sudoku", "cfg_pretrain_trm_cpu"),
                              (maze_run, "maze", "cfg_pretrain_trm_maze_cpu")):
        assert bundle_model.main([str(run), "--name", Path(BUNDLED[task].file).stem, "--recipe", recipe,
                                  "--out", str(out)]) == 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(solving, "BUNDLED_DIR", out)
        yield out


def test_the_bundle_is_the_weights_and_a_card_measured_on_them(tiny_bundled):
    bundled = tiny_bundled / BUNDLED["sudoku"].file
    card = bundled.with_suffix(".md").read_text()
    kept = torch.load(bundled, weights_only=True)
    assert sorted(kept) == ["config", "data", "model", "step", "trainer"]  # no optimizer, no carry, no RNG
    assert all(v.dtype == torch.float32 for v in kept["model"].values() if v.is_floating_point())
    assert hashlib.sha256(bundled.read_bytes()).hexdigest() in card and f"{bundled.stat().st_size:,} bytes" in card
    assert "`python pretrain.py --config-name=cfg_pretrain_trm_cpu`" in card
    evaluated = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(bundled), "--device", "cpu",
                                "--forward-dtype", "float32", "--json"], cwd=ROOT, capture_output=True, text=True,
                               timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr
    exact = json.loads(evaluated.stdout.strip().splitlines()[-1])["exact_accuracy"]
    assert f"**{100 * exact:.1f}%** exact" in card  # the card's first accuracy is evaluate.py's on the file


def test_solve_without_a_checkpoint_uses_the_bundled_model_and_names_it(tiny_bundled, tmp_path, capsys):
    assert solve.main(["--device", "cpu", "--sudoku", SUDOKU, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"model: the bundled model for hard 9x9 Sudoku, {tiny_bundled / 'sudoku_hard_trm.pt'}" in printed
    assert "puzzle 1: " in printed and (tmp_path / "sudoku_1.gif").is_file()


def test_a_puzzle_the_bundled_model_cannot_take_is_one_line(tiny_bundled, tmp_path, capsys):
    maze = tmp_path / "small.txt"
    maze.write_text(MAZE)  # 5x5: the bundled maze model knows 10x10
    assert_one_line(capsys, solve.main(["--device", "cpu", "--maze", str(maze), "--out", str(tmp_path / "o")]),
                    "the bundled model maze_10x10_trm.pt was trained on 10x10 mazes, not on mazes of 5x5: give "
                    "--checkpoint")
    task = tmp_path / "task.json"
    task.write_text('{"train": [{"input": [[1]], "output": [[2]]}], "test": [{"input": [[1]]}]}')
    assert_one_line(capsys, solve.main(["--device", "cpu", "--arc", str(task), "--out", str(tmp_path / "o")]),
                    "no model is bundled for ARC grids (only for hard 9x9 Sudoku and 10x10 mazes): give --checkpoint")


def test_a_missing_bundled_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(solving, "BUNDLED_DIR", tmp_path / "pretrained")
    assert_one_line(capsys, solve.main(["--device", "cpu", "--sudoku", SUDOKU, "--out", str(tmp_path / "o")]),
                    "the bundled model for hard 9x9 Sudoku is missing")
    assert_one_line(capsys, solve.main(["--device", "cpu", "--serve", "--port", "0", "--out", str(tmp_path / "o")]),
                    "no model to offer: the bundled ones are missing; give --checkpoint")
    assert not (tmp_path / "o").exists()


def test_bundling_refuses_a_run_of_another_trainer_and_a_bad_name(tmp_path, capsys):
    cape = tmp_path / "cape.pt"
    torch.save({"trainer": "cape", "model": {}}, cape)
    assert_one_line(capsys, bundle_model.main([str(cape), "--name", "x", "--recipe", "r", "--out", str(tmp_path)]),
                    "is not a checkpoint of pretrain.py")
    assert_one_line(capsys, bundle_model.main([str(cape), "--name", "../x", "--recipe", "r", "--out", str(tmp_path)]),
                    "--name '../x': use letters, digits, _ and -")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cape.pt"]
