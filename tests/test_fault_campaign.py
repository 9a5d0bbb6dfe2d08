"""The new surfaces under fault (solve.py, evaluate.py's outputs, hf:// URIs, scripts/predict_pose.py, test-time
compute, the CAPE trainer's DataLoader workers): each problem a fault campaign found has its test here, numbered as
the campaign listed them. Nothing the user wrote is overwritten; a stop from any sender, in any phase, is graceful;
every bad input is one line with exit code 2, before any work, in the user's own terms."""

import json
import signal
from pathlib import Path

import pytest
import torch
from PIL import Image

import evaluate
import pretrain
import solve
from models.cape.checkpoint import load_trained as load_cape
from tests.conftest import signal_at
from tests.test_bad_inputs import BASE, assert_one_line, exit_code
from tests.test_cape_train import TINY_FLAGS
from tests.test_predict_pose import args_for, setup  # noqa: F401  (setup: a fixture)
from tests.test_solve import SUDOKU, sudoku_run  # noqa: F401  (sudoku_run: a fixture)
from tests.test_solve import exit_code as solve_exit_code
from utils.data.arc import parse_grid
from utils.data.puzzle_dataset import DatasetError
from utils.data.saved_outputs import FILE_PATTERN, load_outputs
from utils.eval import puzzle as puzzle_mod
from utils.train import puzzle_trainer
from utils.checkpoint import CheckpointError, safe_load


def one_line(capsys, code: int) -> str:
    """The one ``error:`` line of a command that exited 2 without a traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def solve_cpu(*argv: str) -> int:
    return exit_code(lambda: solve.main(["--device", "cpu", *argv]))


def evaluate_cpu(*argv: str) -> int:
    return exit_code(lambda: evaluate.main(["--device", "cpu", *argv]))


# ---- 1, 2: nothing the user wrote is overwritten ------------------------------------------------------------

def test_01_solve_keeps_the_users_pictures_and_writes_its_own_beside_them(sudoku_run, tmp_path, capsys, caplog):
    out = tmp_path / "mydir"
    out.mkdir()
    mine = {name: f"the user's {name}".encode() for name in ("sudoku_1.png", "sudoku_1.gif")}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    for _ in range(2):  # run twice into the same folder: both results are kept
        code = solve_cpu("--checkpoint", str(sudoku_run), "--sudoku", SUDOKU, "--out", str(out), "--segments", "2",
                         "--budget", "0")
        assert code == solve_exit_code(capsys.readouterr().out)  # 1: a tiny model's answer may break the rules
    assert all((out / name).read_bytes() == data for name, data in mine.items())
    assert sorted(p.name for p in out.glob("sudoku_1-*.png")) == ["sudoku_1-2.png", "sudoku_1-2_strip.png",
                                                                  "sudoku_1-3.png", "sudoku_1-3_strip.png"]
    assert Image.open(out / "sudoku_1-3.gif").n_frames == 2
    assert f"{out / 'sudoku_1.png'} exists and is kept: this result is {out / 'sudoku_1-2.png'}" in caplog.text


def test_02_evaluate_keeps_saved_outputs_it_did_not_write(sudoku_run, tmp_path, caplog):
    out = tmp_path / "mydir"
    out.mkdir()
    step = safe_load(sudoku_run / "best.pt")["step"]
    theirs = out / f"step_{step}_all_preds.0"
    theirs.write_bytes(b"the user's outputs")
    for _ in range(2):
        assert evaluate_cpu(str(sudoku_run), "--save-outputs", str(out), "--json") == 0
    assert theirs.read_bytes() == b"the user's outputs"
    for copy in (2, 3):  # both runs' outputs, each a saved outputs file whose step and rank are read as usual
        name = f"step_{step}_all_preds-{copy}.0"
        assert load_outputs(out / name)["preds"].shape[1] == 81 and FILE_PATTERN.fullmatch(name).groups() == (
            str(step), "0")


def test_02_an_explicitly_named_submission_is_replaced_and_the_command_says_so(tmp_path, caplog):
    from utils.outputs import announce_replacing

    named = tmp_path / "x.json"
    named.write_text("{}")
    announce_replacing(named, "--submission")
    assert f"--submission {named} exists: replacing it, as named" in caplog.text


# ---- 3-6: a stop from any sender, with DataLoader workers ---------------------------------------------------------

@pytest.mark.slow
# SIGTERM in every phase (its loaders start their own workers, which must leave a group's SIGTERM to the main process
# yet end on the DataLoader's own); SIGINT, which the workers simply ignore, once: Ctrl-C in training.
@pytest.mark.parametrize("phase,step,signal_name", [("train", 3, "SIGTERM"), ("val", 4, "SIGTERM"),
                                                    ("test", 8, "SIGTERM"), ("train", 3, "SIGINT")])
def test_03_to_06_a_signal_to_the_group_with_workers_stops_gracefully(cape_data, tmp_path, warm_cape, phase, step,
                                                                      signal_name):
    """The signal goes to the whole process group (as kill -- -PGID, timeout and schedulers send it), workers
    included: in training (during step 3), in the validation after epoch 1 (step 4) and in the test split (after
    step 8). Each run exits 128 + the signal with its checkpoint and the resume line, no traceback; resuming it
    finishes the run. Both runs are forks of the warm interpreter (tests/warm_trainer.py); the stopped one leads a
    session of its own, as a fresh process started with start_new_session=True would, so the group is the run's."""
    run = tmp_path / "run"
    flags = [*TINY_FLAGS, "--data_root", str(cape_data), "--output_dir", str(run), "--epochs", "2",
             "--episodes_per_epoch", "4", "--num_workers", "2", "--no-use_amp"]
    done = warm_cape.run(flags, new_session=True, **signal_at(phase, step, signal_name, group=True))
    assert done.returncode == 128 + signal.Signals[signal_name], done.stderr
    assert "Traceback" not in done.stderr and "resume with: python -m models.train_cape_episodic" in done.stderr
    assert (done.stdout + done.stderr).count(f"{signal_name} received") == 1  # the main process's: workers ignore it
    kept = sorted(p.name for p in run.glob("step_*.pt"))
    assert kept == {"train": ["step_3.pt"], "val": ["step_4.pt"], "test": ["step_4.pt", "step_8.pt"]}[phase]
    assert not (run / "pck_report.json").exists()  # the test split was not finished
    resumed = warm_cape.run([*flags, "--resume", "auto"])
    assert resumed.returncode == 0 and (run / "pck_report.json").is_file(), resumed.stderr


def test_03_a_run_that_crashed_after_logging_a_step_keeps_its_directory(sudoku_dir, tmp_path, monkeypatch):
    """A crash (a bug, a killed worker) before the first checkpoint: the directory of a run that had logged a step
    is kept, its metrics in it; one that had logged nothing is removed, so the corrected command can start there."""
    real, calls = puzzle_trainer.train_step, {"n": 0}

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Terminated.")
        return real(*args, **kwargs)

    monkeypatch.setattr(puzzle_trainer, "train_step", crashing)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        pretrain.main([*BASE, f"data_path={sudoku_dir}", f"checkpoint_path={run}", "log_interval=2"])
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [2]
    calls["n"] = 0
    with pytest.raises(RuntimeError):
        pretrain.main([*BASE, f"data_path={sudoku_dir}", f"checkpoint_path={tmp_path / 'early'}", "log_interval=4"])
    assert not (tmp_path / "early").exists()


# ---- 7-20: one line, exit code 2, before any work, in the user's terms ---------------------------------------------

def test_07_min_segments_above_the_segments_run_is_refused_in_each_command(sudoku_dir, sudoku_run, tmp_path, capsys):
    code = pretrain.main([*BASE, f"data_path={sudoku_dir}", f"checkpoint_path={tmp_path / 'run'}",
                          "arch.halt_max_steps=3", "eval_early_exit=true", "eval_min_segments=9"])
    assert_one_line(capsys, code, "eval_min_segments=9 is more than the 3 segments each puzzle runs (the model's "
                                  "halt_max_steps): lower it, or set eval_halt_max_steps higher")
    assert not (tmp_path / "run").exists()
    assert_one_line(capsys, evaluate_cpu(str(sudoku_run), "--min-segments", "9", "--early-exit"),
                    "--min-segments=9 is more than the 2 segments each puzzle runs")
    assert_one_line(capsys, solve_cpu("--checkpoint", str(sudoku_run), "--sudoku", SUDOKU, "--out", str(tmp_path / "o"),
                                      "--min-segments", "9", "--early-exit"), "--segments higher")
    assert not (tmp_path / "o").exists()


def test_08_a_json_true_is_not_a_colour():
    with pytest.raises(DatasetError, match=r"task.json: row 1, column 1: true is not a colour"):
        parse_grid([[True, 2], [3, 4]], "task.json")


@pytest.mark.parametrize("flag,fragment", [("--sudoku", "--sudoku is empty: give 81 characters"),
                                           ("--arc", "--arc is empty: give a task JSON file"),
                                           ("--maze", "--maze is empty: give a text file of mazes or a Maze-Hard CSV")])
def test_09_and_18_an_empty_puzzle_flag(sudoku_run, tmp_path, capsys, flag, fragment):
    assert_one_line(capsys, solve_cpu("--checkpoint", str(sudoku_run), flag, "", "--out", str(tmp_path)), fragment)


def test_10_a_rollout_seed_out_of_range(sudoku_run, tmp_path, capsys):
    code = solve_cpu("--checkpoint", str(sudoku_run), "--sudoku", SUDOKU, "--out", str(tmp_path), "--rollouts", "2",
                     "--rollout-seed", "99999999999999999999999")
    assert_one_line(capsys, code, "--rollout-seed=99999999999999999999999 is out of range: 0..")


@pytest.mark.parametrize("spec", ["hf://owner/repo/../../etc/passwd", "hf://owner/repo/sub/../checkpoint"])
def test_11_a_hub_path_with_dot_dot(tmp_path, capsys, monkeypatch, spec):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = solve_cpu("--checkpoint", spec, "--sudoku", SUDOKU, "--out", str(tmp_path))
    assert_one_line(capsys, code, "a path in a repo cannot hold '.' or '..' segments")


def test_12_and_17_a_checkpoint_of_the_other_trainer_is_named(sudoku_run, setup, tmp_path, capsys):  # noqa: F811
    cape_checkpoint = setup[3]
    cape = safe_load(cape_checkpoint) | {"trainer": "cape"}
    torch.save(cape, tmp_path / "cape.pt")
    with pytest.raises(CheckpointError, match="is an HRM/TRM checkpoint of pretrain.py, not a CAPE one"):
        load_cape(sudoku_run / "best.pt")
    assert_one_line(capsys, solve_cpu("--checkpoint", str(tmp_path / "cape.pt"), "--sudoku", SUDOKU, "--out",
                                      str(tmp_path / "o")), "is a CAPE checkpoint of models.train_cape_episodic")


def arc_task(path: Path) -> Path:
    path.write_text(json.dumps({"train": [{"input": [[1, 2], [3, 4]], "output": [[4, 3], [2, 1]]}],
                                "test": [{"input": [[5, 6], [7, 8]]}]}))
    return path


@pytest.mark.parametrize("flags,fragment", [
    (["--adapt-steps", "0"], "--adapt-steps: '0': give a whole number of 1 or more"),
    (["--adapt-steps", "-5"], "--adapt-steps: '-5': give a whole number"),
    (["--adapt-batch-size", "0"], "--adapt-batch-size: '0': give a whole number"),
    (["--views", "8"], "--views 8 cannot be used with --arc")])
def test_13_and_15_arc_adaptation_settings_are_refused_before_any_work(sudoku_run, tmp_path, capsys, flags, fragment):
    out = tmp_path / "out"
    code = solve_cpu("--checkpoint", str(sudoku_run), "--arc", str(arc_task(tmp_path / "task.json")), "--out",
                     str(out), *flags)
    assert_one_line(capsys, code, fragment)
    assert not out.exists()  # no dataset built, no run written


def test_14_a_sudoku_model_cannot_adapt_to_an_arc_task(sudoku_run, tmp_path, capsys):
    out = tmp_path / "out"
    code = solve_cpu("--checkpoint", str(sudoku_run), "--arc", str(arc_task(tmp_path / "task.json")), "--out", str(out))
    assert_one_line(capsys, code, "was trained on puzzles of 81 cells (9x9) and a vocabulary of 11, not ARC grids of "
                                  "900 cells")
    assert not out.exists()


def test_15_a_submission_on_data_that_is_not_arc_is_refused_before_the_evaluation(sudoku_run, tmp_path, capsys,
                                                                                  monkeypatch):
    monkeypatch.setattr(puzzle_mod, "reason", lambda *a, **k: pytest.fail("the evaluation ran"))
    code = evaluate_cpu(str(sudoku_run), "--submission", str(tmp_path / "x.json"))
    assert_one_line(capsys, code, "is not an ARC dataset (no test_puzzles.json)")


def test_16_a_dataset_of_other_puzzles_is_named_as_the_mistake(sudoku_run, tmp_path, capsys):
    from utils.data.maze import build_maze_dataset

    maze = build_maze_dataset(tmp_path / "maze", generate=True, size=5, train_size=8, test_size=4, min_path_length=1)
    line = one_line(capsys, evaluate_cpu(str(sudoku_run), "--data-path", str(maze)))
    assert f"the dataset {maze} holds puzzles of 25 cells and a vocabulary of 6, but" in line
    assert "was trained on 81 cells and a vocabulary of 11" in line and "give the dataset it was trained on" in line


@pytest.mark.parametrize("text,fragment", [("S", "a maze is a grid of at least 2x2"),
                                           ("#S\n#S\n##\n", "a maze has exactly one S and one goal (G or E)")])
def test_18_maze_messages_state_the_rule(sudoku_run, tmp_path, capsys, text, fragment):
    grid = tmp_path / "maze.txt"
    grid.write_text(text)
    assert_one_line(capsys, solve_cpu("--checkpoint", str(sudoku_run), "--maze", str(grid), "--out", str(tmp_path)),
                    fragment)


def test_19_a_directory_or_a_missing_file_is_not_taken_for_a_puzzle(sudoku_run, tmp_path, capsys):
    assert_one_line(capsys, solve_cpu("--checkpoint", str(sudoku_run), "--sudoku", str(tmp_path), "--out",
                                      str(tmp_path / "o")), f"{tmp_path} is a directory; give a Sudoku")
    assert_one_line(capsys, solve_cpu("--checkpoint", str(sudoku_run), "--sudoku", "my_puzzles.csv", "--out",
                                      str(tmp_path / "o")), "my_puzzles.csv: no such file")


def test_20_a_query_image_too_small_for_a_box(setup, tmp_path, capsys):  # noqa: F811
    from scripts.predict_pose import main as predict_pose

    split, cid, _, checkpoint, _, spec_path, _ = setup
    tiny = tmp_path / "tiny.png"
    Image.new("RGB", (1, 1)).save(tiny)
    code = exit_code(lambda: predict_pose(args_for(checkpoint, [split.instances[cid][0].image_path], spec_path, [tiny],
                                                   tmp_path / "out")))
    assert_one_line(capsys, code, "--query image 1: the image is 1 x 1 pixels; an image needs at least 2 x 2")
