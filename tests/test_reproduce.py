"""Issue 45: every published number of the Tasks table has one sequence (data, training, evaluation), and its dry run
checks every setting and flag without training (scripts/reproduce.py), so a renamed setting cannot break a recipe
silently. The dry runs here skip the timing (``--timed-steps 0``) but one, which times a tiny model's step on the CPU.
"""

import dataclasses
import signal
import sys
from pathlib import Path

import pytest

from scripts import reproduce
from tests.conftest import terminate_this_process

REPO = Path(__file__).resolve().parents[1]


def dry_run(capsys, *argv: str) -> tuple[int, str, str]:
    code = reproduce.main([*argv, "--dry-run"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", sorted(reproduce.RECIPES))
def test_issue45_every_published_recipe_passes_its_dry_run(capsys, name):
    recipe = reproduce.RECIPES[name]
    code, out, err = dry_run(capsys, name, "--timed-steps", "0")
    assert code == 0, err
    assert f"expected: {recipe.expected} ({recipe.source})" in out and f"GPU budget: {recipe.budget}" in out
    launcher = f"torchrun --nproc-per-node {recipe.gpus} pretrain.py" if recipe.gpus > 1 else "python pretrain.py"
    assert f"train: {launcher} --config-name={recipe.config}" in out
    assert "optimizer steps" in out and "parameters" in out and "not measured (--timed-steps 0)" in out


def test_issue45_the_reproducing_page_holds_every_command_of_every_row():
    page = (REPO / "docs" / "reproducing.md").read_text()
    for recipe in reproduce.RECIPES.values():
        for _, command in recipe.commands():
            assert command in page, (recipe.name, command)
    tasks = page.split("\n## Tasks\n")[1].split("\n## ")[0]
    assert "build_sudoku_dataset.py" in tasks and "--source-dir" not in tasks  # the one-command forms


def broken(monkeypatch, **changes) -> str:
    """Register a copy of the TRM-MLP Sudoku recipe with ``changes`` as the row ``broken``."""
    recipe = dataclasses.replace(reproduce.RECIPES["sudoku-extreme-trm-mlp"], name="broken", **changes)
    monkeypatch.setitem(reproduce.RECIPES, "broken", recipe)
    return "broken"


@pytest.mark.parametrize("changes, message", [
    ({"overrides": ("arch.L_cycle=6",)}, "broken: arch.L_cycle is not a key of this architecture"),
    ({"overrides": ("eval_intervall=5000",)}, "broken: unknown config key 'eval_intervall'"),
    ({"overrides": ("eval_interval=3000",)}, "broken: eval_interval=3000 is out of range: must divide epochs"),
    ({"config": "cfg_pretrain_trm_sudoku"}, "broken: --config-name=cfg_pretrain_trm_sudoku: no config/"),
    ({"gpus": 7}, "broken: global_batch_size 768 is not divisible by the 7 processes"),
    ({"data": (("scripts/build_sudoku_dataset.py", "--output-dir", "d", "--num-augs", "9"),)},
     "broken: the data command does not parse: unrecognized arguments: --num-augs 9"),
    ({"data": (("scripts/build_maze_dataset.py", "--output-dir", "d", "--size", "x"),)},
     "broken: the data command does not parse: argument --size: invalid int value: 'x'"),
    ({"data": (("scripts/build_arc_dataset.py", "--output-dir", "d", "--dataset", "arc-agi-3"),)},
     "broken: the data command does not parse: argument --dataset: invalid choice: 'arc-agi-3'"),
    ({"evaluate": ("--segmens", "8")}, "broken: the evaluate command does not parse: unrecognized arguments"),
])
def test_issue45_a_renamed_setting_or_flag_fails_the_dry_run_in_one_line(capsys, monkeypatch, changes, message):
    code, _, err = dry_run(capsys, broken(monkeypatch, **changes), "--timed-steps", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert message in err, err


def test_issue45_the_dry_run_times_steps_on_this_machine(capsys, monkeypatch):
    tiny = ("arch.hidden_size=16", "arch.num_heads=2", "arch.L_layers=1", "arch.H_cycles=1", "arch.L_cycles=1",
            "arch.halt_max_steps=2", "global_batch_size=8", "device=cpu", "forward_dtype=float32")
    code, out, err = dry_run(capsys, broken(monkeypatch, overrides=tiny), "--timed-steps", "1")
    assert code == 0, err
    assert "time on this machine (cpu" in out and "from 1 timed step(s) at batch" in out and "from FLOPs" in out


def test_issue45_list_print_and_bad_rows(capsys):
    assert reproduce.main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in reproduce.RECIPES) and "87.4%" in listing
    assert reproduce.main(["maze-hard-trm"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [command for _, command in reproduce.RECIPES["maze-hard-trm"].commands()]
    assert out[2].startswith("torchrun --nproc-per-node 4 pretrain.py") and "'data_paths=[" in out[2]
    assert reproduce.main(["sudoku-extreme"]) == 2
    assert "no row 'sudoku-extreme': use one of sudoku-extreme-hrm" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        reproduce.main([])
    assert info.value.code == 2


def test_the_script_runs_from_anywhere(tmp_path, monkeypatch, capsys):
    # Run as a file (its own sys.path set-up), as the docs show it.
    import runpy

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "--list"])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(REPO / "scripts" / "reproduce.py"), run_name="__main__")
    assert info.value.code == 0 and "arc-agi-2-trm" in capsys.readouterr().out


# ---- fault campaign 5 ---------------------------------------------------------------------------------------------

def test_campaign5_p14_timed_steps_past_the_bound_are_one_line(capsys):
    for steps in ("1000000000", str(reproduce.MAX_TIMED_STEPS + 1), "-1"):
        with pytest.raises(SystemExit) as info:
            reproduce.main(["sudoku-extreme-trm-mlp", "--dry-run", "--timed-steps", steps])
        err = capsys.readouterr().err
        assert info.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"--timed-steps must be 0 to {reproduce.MAX_TIMED_STEPS}" in err and f"got {steps}" in err


def test_campaign5_p22_sigterm_during_a_dry_run_is_one_line_143_and_leaves_no_temporary_folder(capsys, monkeypatch):
    stand_ins = []

    def check_training(recipe, folder):
        stand_ins.append(folder)
        (folder / "stand-in").mkdir()  # the dry run has written its stand-in data by now
        terminate_this_process()
    monkeypatch.setattr(reproduce, "check_training", check_training)
    code, _, err = dry_run(capsys, "sudoku-extreme-trm-mlp", "--timed-steps", "0")
    assert code == 128 + signal.SIGTERM and err == "stopped (SIGTERM)\n", err
    assert stand_ins and not stand_ins[0].exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # as it was before the command
