"""How the code treats the models bundled in models/pretrained/, on small ones bundled here by scripts/bundle_model.py
from tiny runs: the script keeps the weights only and writes a card measured on the file that describes the run
itself (its recipe, checked; its overrides; its data; an evaluate.py command that reproduces the accuracy from
anywhere); a bundle is published only once measured, replaces only a bundle and only with --replace, never into a run
directory; every load checks a bundled file against its card; solve.py without --checkpoint uses the bundled model
and names it; a puzzle it cannot take, or a missing file, is one line. The shipped models themselves are tested in
tests/test_bundled_models.py."""

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import evaluate
import solve
from scripts import bundle_model
from tests.test_bad_inputs import assert_one_line
from tests.test_maze_sizes import open_maze
from tests.conftest import terminate_this_process
from tests.test_solve import MAZE, SUDOKU, exit_code, sudoku_run, train  # noqa: F401  (sudoku_run: a fixture)
from utils.data.maze import build_maze_dataset
from utils.solve import solving
from utils.eval.load import check_against_card
from utils.solve.solving import BUNDLED
from utils.outputs import OutputPathError, OutputWriteError, check_writable_file, replace_together, write_atomically

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_bundled(sudoku_run, tmp_path_factory):  # noqa: F811
    """A models/pretrained/ of tiny models under the bundled names (a Sudoku model and a grid maze model trained on
    10x10 mazes), in use while the module's tests run."""
    out = tmp_path_factory.mktemp("pretrained")
    mazes = build_maze_dataset(tmp_path_factory.mktemp("maze") / "maze", generate=True, size=10, train_size=32,
                               test_size=8, min_path_length=1)
    maze_run = train(mazes, tmp_path_factory.mktemp("maze_run") / "run", "arch.puzzle_emb_len=0", "arch.mlp_t=false",
                     "arch.token_mixer=conv")  # a grid model, as the bundled one is
    # The Sudoku run's recipe is read from the run; the maze run's is given, and checked (both ran
    # cfg_pretrain_trm_cpu).
    for run, task, recipe in ((sudoku_run, "sudoku", []), (maze_run, "maze", ["--recipe", "cfg_pretrain_trm_cpu"])):
        assert bundle_model.main([str(run), "--name", Path(BUNDLED[task].file).stem, *recipe, "--out", str(out)]) == 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(solving, "BUNDLED_DIR", out)
        yield out


def test_the_bundle_is_the_weights_and_a_card_measured_on_them(tiny_bundled, sudoku_run, tmp_path):
    bundled = tiny_bundled / BUNDLED["sudoku"].file
    card = bundled.with_suffix(".md").read_text()
    kept = torch.load(bundled, weights_only=True)
    assert sorted(kept) == ["config", "data", "model", "step", "trainer"]  # no optimizer, no carry, no RNG
    assert all(v.dtype == torch.float32 for v in kept["model"].values() if v.is_floating_point())
    assert hashlib.sha256(bundled.read_bytes()).hexdigest() in card and f"{bundled.stat().st_size:,} bytes" in card
    assert "`python pretrain.py --config-name=cfg_pretrain_trm_cpu arch.halt_max_steps=2 " in card
    # The card's command, as written, from another folder: the card's first accuracy is evaluate.py's on the file.
    command = card.split("```bash\n", 1)[1].split("\n```", 1)[0]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    evaluated = subprocess.run(["bash", "-c", f"{command} --json"], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr
    exact = json.loads(evaluated.stdout.strip().splitlines()[-1])["exact_accuracy"]
    assert f"**{100 * exact:.1f}%** exact" in card


def test_solve_without_a_checkpoint_uses_the_bundled_model_and_names_it(tiny_bundled, tmp_path, capsys):
    code = solve.main(["--device", "cpu", "--sudoku", SUDOKU, "--out", str(tmp_path), "--budget", "0"])
    printed = capsys.readouterr().out
    assert code == exit_code(printed)  # a tiny model: its answer may not be consistent
    assert f"model: the bundled model for hard 9x9 Sudoku, {tiny_bundled / 'sudoku_hard_trm.pt'}" in printed
    assert "puzzle 1: " in printed and (tmp_path / "sudoku_1.gif").is_file()


def test_a_puzzle_the_bundled_model_cannot_take_is_one_line(tiny_bundled, tmp_path, capsys):
    maze = tmp_path / "large.txt"
    side = solving.BUNDLED["maze"].side
    maze.write_text(open_maze(side + 1))
    assert_one_line(capsys, solve.main(["--device", "cpu", "--maze", str(maze), "--out", str(tmp_path / "o")]),
                    f"a maze {side + 1} cells wide or tall is larger than the bundled model "
                    f"{solving.BUNDLED['maze'].file} takes: at most {side}x{side}")
    task = tmp_path / "task.json"
    task.write_text('{"train": [{"input": [[1]], "output": [[2]]}], "test": [{"input": [[1]]}]}')
    assert_one_line(capsys, solve.main(["--device", "cpu", "--arc", str(task), "--out", str(tmp_path / "o")]),
                    f"no model is bundled for ARC grids (only for {BUNDLED['sudoku'].what} and "
                    f"{BUNDLED['maze'].what}): give --checkpoint")


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


# ---- fault campaign 4: the bundled-model surface ------------------------------------------------------------------

SCORES = {"exact_accuracy": 0.5, "exact_accuracy_ci95_low": 0.25, "exact_accuracy_ci95_high": 0.75, "count": 16.0,
          "steps": 2.0}


def pair(folder: Path, name: str = "sudoku_hard_trm") -> tuple[Path, Path]:
    return folder / f"{name}.pt", folder / f"{name}.md"


def copied_bundle(tiny_bundled: Path, folder: Path) -> tuple[Path, Path]:
    """A copy of the tiny bundled Sudoku model and its card in ``folder``."""
    folder.mkdir(exist_ok=True)
    for source, target in zip(pair(tiny_bundled), pair(folder)):
        shutil.copyfile(source, target)
    return pair(folder)


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def run_whose_data_is_gone(run: Path, folder: Path) -> Path:
    """The best checkpoint of ``run``, with its plan.yaml, as a run trained on a dataset that is no longer there."""
    folder.mkdir()
    payload = torch.load(run / "best.pt", weights_only=True)
    trained_on, gone = payload["config"]["data_path"], str(folder / "deleted-dataset")
    payload["config"] = json.loads(json.dumps(payload["config"]).replace(trained_on, gone))
    torch.save(payload, folder / "best.pt")
    (folder / "plan.yaml").write_text((run / "plan.yaml").read_text().replace(trained_on, gone))
    return folder / "best.pt"


def test_campaign4_p01_a_bundle_that_cannot_be_measured_replaces_nothing(tiny_bundled, sudoku_run, tmp_path, capsys):
    out = tmp_path / "pretrained"
    copied_bundle(tiny_bundled, out)
    before = contents(out)
    run = run_whose_data_is_gone(sudoku_run, tmp_path / "run")
    assert_one_line(capsys, bundle_model.main([str(run), "--name", "sudoku_hard_trm", "--out", str(out),
                                               "--replace"]), "deleted-dataset")
    assert contents(out) == before  # the model and its card as they were, and no staging folder left
    # Without --replace an existing bundle is refused before any work.
    assert_one_line(capsys, bundle_model.main([str(sudoku_run), "--name", "sudoku_hard_trm", "--out", str(out)]),
                    "sudoku_hard_trm.pt exists (a model bundled earlier): pass --replace")
    assert contents(out) == before


def test_campaign4_p01_replace_publishes_the_model_and_its_card_together(tiny_bundled, sudoku_run, tmp_path,
                                                                         monkeypatch, caplog):
    out = tmp_path / "pretrained"
    model, card = copied_bundle(tiny_bundled, out)
    monkeypatch.setattr(bundle_model, "score", lambda *args: SCORES)  # measured elsewhere in this module
    first = min(sudoku_run.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))  # not the bundled best.pt
    assert bundle_model.main([str(first), "--name", "sudoku_hard_trm", "--out", str(out), "--replace"]) == 0
    assert "sudoku_hard_trm.pt will be replaced (--replace)" in caplog.text
    assert sorted(contents(out)) == [card.name, model.name]  # no staging folder left
    assert f"its `{first.name}` at step {first.stem.split('_')[1]}" in card.read_text()
    assert "**50.0%** exact" in card.read_text()
    check_against_card(model)  # the new pair matches
    # A move that fails half-way puts the first file back: the pair never ends half old, half new.
    staged = {target: tmp_path / "stage" / target.name for target in (model, card)}
    (tmp_path / "stage").mkdir()
    for target, source in staged.items():
        source.write_bytes(b"new " + target.name.encode())
    before, real = contents(out), os.replace
    moves = []

    def fail_second(source, target):
        moves.append(target)
        if len(moves) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(source, target)
    monkeypatch.setattr(os, "replace", fail_second)
    with pytest.raises(OutputWriteError, match="were not changed"):
        replace_together(staged, "bundled model and its card")
    monkeypatch.setattr(os, "replace", real)
    assert contents(out) == before


def test_campaign4_p02_a_run_directory_or_a_file_the_project_did_not_write_is_never_replaced(sudoku_run, tmp_path,
                                                                                           capsys):
    step = sorted(sudoku_run.glob("step_*.pt"))[-1]
    before = step.read_bytes()
    assert_one_line(capsys, bundle_model.main([str(sudoku_run), "--name", step.stem, "--out", str(sudoku_run),
                                               "--replace"]), f"--out {sudoku_run} is a run directory")
    assert step.read_bytes() == before
    # Outside the run, a copy of its checkpoint, or a user's notes, under the bundle's name stays, even with --replace.
    out = tmp_path / "out"
    out.mkdir()
    shutil.copyfile(step, out / "mine.pt")
    (out / "notes.md").write_text("# notes\n")
    for name, kind in (("mine", "a model"), ("notes", "a card")):
        assert_one_line(capsys, bundle_model.main([str(sudoku_run), "--name", name, "--out", str(out), "--replace"]),
                        f"{out / name}.{'pt' if kind == 'a model' else 'md'} exists and is not {kind} "
                        "scripts/bundle_model.py wrote")
    assert (out / "mine.pt").read_bytes() == before and (out / "notes.md").read_text() == "# notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["mine.pt", "notes.md"]


@pytest.fixture
def damaged(tiny_bundled, tmp_path, monkeypatch):
    """A bundled Sudoku model with 4 KB of its weights flipped after its card was written, in use as the bundled one."""
    model, card = copied_bundle(tiny_bundled, tmp_path / "pretrained")
    data = bytearray(model.read_bytes())
    data[-8192:-4096] = bytes(b ^ 0xFF for b in data[-8192:-4096])
    model.write_bytes(bytes(data))
    monkeypatch.setattr(solving, "BUNDLED_DIR", model.parent)
    return model, hashlib.sha256(data).hexdigest(), hashlib.sha256((tiny_bundled / model.name).read_bytes()).hexdigest()


def test_campaign4_p12_a_bundled_file_that_is_not_its_cards_is_refused_by_every_caller(damaged, tmp_path, capsys):
    model, now, carded = damaged
    expected = f"{model} is not the file its card {model.stem}.md describes: it is "
    out = ["--out", str(tmp_path / "o")]
    for main, argv in ((solve.main, ["--sudoku", SUDOKU, *out]),  # the bundled default
                       (solve.main, ["--checkpoint", str(model), "--sudoku", SUDOKU, *out]),
                       (evaluate.main, ["--checkpoint", str(model)]),
                       (solve.main, ["--serve", "--port", "0", *out])):  # the page's models
        code, err = main(["--device", "cpu", *argv]), capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
        assert expected in errors[0] and f"SHA-256 {now}" in errors[0] and f"SHA-256 {carded}" in errors[0], errors[0]
    # A file of another size is refused the same way.
    model.write_bytes(model.read_bytes() + b"\0")
    assert_one_line(capsys, solve.main(["--device", "cpu", "--checkpoint", str(model), "--sudoku", SUDOKU, *out]),
                    f"bytes with SHA-256 {carded}")


def test_campaign4_p13_the_card_describes_the_run_itself(tiny_bundled, sudoku_run):
    card = (tiny_bundled / BUNDLED["maze"].file).with_suffix(".md").read_text()
    # The recipe the run was trained with (given as --recipe, checked), with its overrides, not the maze recipe.
    assert "recipe `cfg_pretrain_trm_cpu`" in card and "`arch.puzzle_emb_len=0`" in card and "`epochs=2`" in card
    # The data as this run's dataset records it: not the recipe's builder (1,000 Sudoku puzzles) it never used.
    assert "32 training puzzles" in card and "8 held-out" in card
    assert "not the sizes of the run's `dataset_builder`" in card and "build_sudoku_dataset.py" not in card
    # The commands name the file where it really is, from anywhere.
    command = card.split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert command.startswith(f"cd {bundle_model.ROOT} && python evaluate.py --checkpoint "
                              f"{tiny_bundled / BUNDLED['maze'].file} ")
    assert "models/pretrained/" not in card


def test_campaign4_p13_a_recipe_that_does_not_exist_or_disagrees_with_the_run_is_refused(sudoku_run, tmp_path,
                                                                                         capsys):
    argv = [str(sudoku_run), "--name", "x", "--out", str(tmp_path / "out")]
    assert_one_line(capsys, bundle_model.main([*argv, "--recipe", "x"]),
                    "--recipe x: no config/x.yaml; the recipes: cfg_pretrain,")
    assert_one_line(capsys, bundle_model.main([*argv, "--recipe", "cfg_pretrain_trm_cpu_hard"]),
                    "--recipe cfg_pretrain_trm_cpu_hard disagrees with the run")
    assert_one_line(capsys, bundle_model.main([*argv, "--recipe", "cfg_pretrain_trm_maze_cpu"]),
                    "it was trained with cfg_pretrain_trm_cpu")
    assert not (tmp_path / "out").exists()


def test_campaign4_p26_a_name_too_long_is_refused_up_front_not_blamed_on_space(sudoku_run, tmp_path, capsys):
    long = "a" * 300
    assert_one_line(capsys, bundle_model.main([str(sudoku_run), "--name", long, "--out", str(tmp_path / "out")]),
                    "(300 characters): use letters, digits, _ and -")
    # The cause, for every command: a name the file system cannot take is named as such, before or during a write.
    with pytest.raises(OutputPathError, match="the file name is 303 bytes, more than the 255 "):
        check_writable_file(tmp_path / f"{long}.pt", "--out")
    with pytest.raises(OutputPathError, match="longer than the file system takes; choose a shorter name"):
        write_atomically(tmp_path / f"{long}.pt", lambda f: f.write(b"x"), "bundled model")
    fits = tmp_path / f"{'b' * 250}.pt"  # its temporary file's longer name used to fail as a full disk
    write_atomically(fits, lambda f: f.write(b"x"), "bundled model")
    assert [p.name for p in tmp_path.iterdir()] == [fits.name]


# ---- fault campaign 5 ---------------------------------------------------------------------------------------------

def test_campaign5_p22_sigterm_while_measuring_is_one_line_143_and_leaves_no_staging_folder(sudoku_run, tmp_path,
                                                                                            capsys, monkeypatch):
    out = tmp_path / "out"

    def measuring(staged, *args):
        assert staged.is_file() and staged.parent.parent == out  # the staged model, in its staging folder
        terminate_this_process()
    monkeypatch.setattr(bundle_model, "score", measuring)
    assert bundle_model.main([str(sudoku_run), "--name", "x", "--out", str(out)]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.splitlines()[-1] == "stopped (SIGTERM)"
    assert list(out.iterdir()) == []  # neither a bundle nor the staging folder
