"""Settings checks of utils/config.py: finite numbers in published-recipe ranges (:func:`check_number`), evaluators
by name, and ``data_paths=[]`` refused on the command line. Each bad value is one ``error:`` line and exit code 2."""

import dataclasses
import math
import subprocess
import sys

import pytest

import pretrain
from tests.test_bad_inputs import BASE, ROOT, assert_one_line, exit_code
from utils.config import (FLOAT_RANGES, ConfigError, PretrainConfig, check_number, command_line_layer,
                          recipe_config)


NUMBER_CASES = [
    ("lr=inf", "lr=inf is out of range: must be a finite number in [0, 1]"),
    ("lr=1e30", "lr=1e+30 is out of range: must be a finite number in [0, 1]"),
    ("lr=nan", "lr=nan is out of range"),
    ("weight_decay=inf", "weight_decay=inf is out of range: must be a finite number in [0, 10]"),
    ("puzzle_emb_lr=inf", "puzzle_emb_lr=inf is out of range: must be a finite number in [0, 1]"),
    ("ema_rate=nan", "ema_rate=nan is out of range: must be a finite number in [0, 1]"),
]


@pytest.mark.parametrize("override,fragment", NUMBER_CASES, ids=[c[0] for c in NUMBER_CASES])
def test_pretrain_refuses_a_number_before_building_data(tmp_path, capsys, monkeypatch, override, fragment):
    """The recipe builds its dataset under the working directory on first use: the refusal must come first."""
    monkeypatch.chdir(tmp_path)
    assert_one_line(capsys, exit_code(lambda: pretrain.main(["--config-name=cfg_pretrain_trm_cpu", override])),
                    fragment)
    assert not list(tmp_path.iterdir())  # no dataset, no run directory


def test_the_script_refuses_a_number_in_one_line_with_exit_code_2(tmp_path, capsys):
    """The same refusal from ``python pretrain.py`` as a user types it (each value's check: above, in-process)."""
    override, fragment = NUMBER_CASES[2]
    done = subprocess.run([sys.executable, str(ROOT / "pretrain.py"), "--config-name=cfg_pretrain_trm_cpu", override],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    print(done.stderr, file=sys.stderr, end="")
    assert_one_line(capsys, done.returncode, fragment)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("override,fragment", [
    ("beta1=0.999999", None),
    ("beta2=-0.1", "beta2=-0.1 is out of range: must be a finite number in [0, 1)"),
    ("lr_min_ratio=inf", "lr_min_ratio=inf is out of range: must be a finite number in [0, 1]"),
    ("puzzle_emb_weight_decay=-inf", "puzzle_emb_weight_decay=-inf is out of range"),
    ("weight_decay=10", None),
    ("weight_decay=10.5", "weight_decay=10.5 is out of range: must be a finite number in [0, 10]"),
    ("lr=1", None),
])
def test_float_settings_in_range(override, fragment):
    overrides = [override, "weight_decay=0"] if override.startswith("lr=") else [override]
    if fragment is None:
        recipe_config("cfg_pretrain_trm", overrides)
    else:
        with pytest.raises(ConfigError) as e:
            recipe_config("cfg_pretrain_trm", overrides)
        assert fragment in str(e.value)


def test_every_float_setting_has_a_range():
    floats = {f.name for f in dataclasses.fields(PretrainConfig) if f.type == "float"}
    assert floats == set(FLOAT_RANGES)
    for low, high, _ in FLOAT_RANGES.values():
        assert math.isfinite(low) and math.isfinite(high) and low < high


@pytest.mark.parametrize("lr,decay,ok", [("0.1", "9.99", True), ("0.1", "10", False), ("0.5", "2", False)])
@pytest.mark.parametrize("prefix", ["", "puzzle_emb_"])
def test_decoupled_decay_must_not_flip_the_weights(prefix, lr, decay, ok):
    overrides = [f"{prefix}lr={lr}", f"{prefix}weight_decay={decay}"]
    if ok:
        recipe_config("cfg_pretrain_trm", overrides)
        return
    with pytest.raises(ConfigError) as e:
        recipe_config("cfg_pretrain_trm", overrides)
    assert str(e.value).startswith(f"{prefix}weight_decay={float(decay)!r} is out of range: {prefix}lr * "
                                   f"{prefix}weight_decay = {float(lr) * float(decay):g} must be below 1")
    assert "flip their sign" in str(e.value)


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 1, 1.0])
def test_check_number_accepts_the_closed_interval(value):
    check_number("ema_rate", value, 0, 1)


@pytest.mark.parametrize("value", [-1e-9, 1.0000001, math.inf, -math.inf, math.nan, 1e30, True, "0.5", None])
def test_check_number_refuses(value):
    with pytest.raises(ConfigError) as e:
        check_number("ema_rate", value, 0, 1)
    assert str(e.value) == f"ema_rate={value!r} is out of range: must be a finite number in [0, 1]"


def test_check_number_open_high_and_flag_style():
    check_number("beta1", 0.999, 0, 1, high_open=True)
    with pytest.raises(ConfigError, match=r"^beta1=1 is out of range: must be a finite number in \[0, 1\)$"):
        check_number("beta1", 1, 0, 1, high_open=True)
    with pytest.raises(ConfigError) as e:
        check_number("lr", math.inf, 0, 1e6, flag_style=True)
    assert str(e.value) == "--lr inf is out of range: must be a finite number in [0, 1e+06]"


@pytest.mark.parametrize("override,expected", [
    ("evaluators=[ARC]", [{"name": "ARC"}]),
    ("evaluators=[arc@ARC,arc]", [{"name": "arc@ARC"}, {"name": "arc"}]),
    ("evaluators=[{name: arc@ARC}]", [{"name": "arc@ARC"}]),
    ("evaluators=[]", []),
    ("evaluators=null", None),
])
def test_evaluators_by_name(override, expected):
    assert recipe_config("cfg_pretrain_trm_arc1", [override]).evaluators == expected


@pytest.mark.parametrize("override,message", [
    ("evaluators=[nosuch]", "evaluators: unknown evaluator 'nosuch'; use one of arc@ARC, ARC, arc"),
    ("evaluators=[ARC,nosuch]", "evaluators: unknown evaluator 'nosuch'; use one of arc@ARC, ARC, arc"),
    ("evaluators=[{name: nosuch}]", "evaluators: unknown evaluator 'nosuch'; use one of arc@ARC, ARC, arc"),
    ("evaluators=[{nme: ARC}]", "evaluators: unknown evaluator {'nme': 'ARC'}; use one of arc@ARC, ARC, arc"),
    ("evaluators=ARC", "evaluators=ARC is not a list: write evaluators=[ARC]"),
])
def test_unknown_evaluator(override, message):
    with pytest.raises(ConfigError) as e:
        recipe_config("cfg_pretrain_trm_arc1", [override])
    assert str(e.value) == message


def test_empty_data_paths_on_the_command_line_is_refused(sudoku_dir, tmp_path, capsys):
    message = "data_paths=[] names no dataset: give data_paths=[DIR] (or data_path=DIR)"
    with pytest.raises(ConfigError) as e:
        command_line_layer(["data_paths=[]"])
    assert str(e.value) == message
    code = pretrain.main([*BASE, f"data_path={sudoku_dir}", "data_paths=[]", f"checkpoint_path={tmp_path / 'run'}"])
    assert_one_line(capsys, code, message)
    assert command_line_layer(["data_paths_test=[]"])[0].data_paths_test == []  # empty: the training data's tests


def test_a_value_the_recipe_leaves_missing_is_refused_not_taken_as_the_default(tmp_path):
    """A recipe's ``???`` (OmegaConf's missing value) must be given: a merge onto the schema would keep the default
    under it (``load_checkpoint: ???`` trained from scratch)."""
    from utils.config import CONFIG_DIR, build_config, merge_layers, recipe_layers, to_dict

    (tmp_path / "cfg_needs_weights.yaml").write_text("defaults:\n  - cfg_pretrain_trm_cpu\n  - _self_\n"
                                                     "load_checkpoint: ???\n")
    for source in CONFIG_DIR.iterdir():  # the recipe's parents, as they are
        (tmp_path / source.name).symlink_to(source, target_is_directory=source.is_dir())

    def merged(*overrides):
        cli = command_line_layer(list(overrides))[0]
        return merge_layers([("defaults", to_dict(PretrainConfig())),
                             *recipe_layers("cfg_needs_weights", config_dir=tmp_path), ("command line", cli)])[0]

    with pytest.raises(ConfigError, match=r"cfg_needs_weights.yaml leaves load_checkpoint to the command line "
                                          r"\(\?\?\?\): give load_checkpoint=VALUE"):
        merged()
    assert build_config(merged("load_checkpoint=w.pt")).load_checkpoint == "w.pt"
    with pytest.raises(ConfigError, match=r"^lr=\?\?\? on the command line is OmegaConf's 'missing', not a value: "
                                          r"give lr=VALUE$"):
        merged("load_checkpoint=w.pt", "lr=???")
