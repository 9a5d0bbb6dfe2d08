"""pretrain.py and evaluate.py end to end on a tiny generated Sudoku set, and how data_path is found or built."""

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import evaluate
import pretrain
from utils.distributed import Dist
from utils.train import puzzle_trainer
from utils.checkpoint import safe_load

TINY_ARCH = ["compile=false", "device=cpu", "arch.hidden_size=32", "arch.num_heads=2", "arch.H_layers=1",
             "arch.L_layers=1", "arch.halt_max_steps=2",
             "arch.expansion=2"]




def run_pretrain(sudoku_dir, run_dir, *extra):
    return pretrain.main(["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", f"checkpoint_path={run_dir}",
                          "global_batch_size=16", "epochs=4", "eval_interval=2", "log_interval=2", "lr_warmup_steps=2",
                          "forward_dtype=float32", *TINY_ARCH, *extra])


def test_end_to_end_run_writes_metrics_and_reference_format_checkpoints(sudoku_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_pretrain(sudoku_dir, run_dir) == 0
    points = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [p for p in points if "eval/exact_accuracy" in p]
    assert [p["step"] for p in evals] == [8, 16]  # 64 groups / 16 per batch = 4 steps per epoch
    assert all(0 <= p["eval/accuracy"] <= 1 and p["eval/count"] == 16 for p in evals)
    assert any("train/lm_loss" in p and "train/examples_per_s" in p for p in points)
    assert list((run_dir / "tensorboard").iterdir()), "no TensorBoard event file"

    ckpt = safe_load(run_dir / "step_16.pt")
    assert ckpt["step"] == 16
    assert all(k.startswith("_orig_mod.model.inner.") for k in ckpt["model"])
    assert "_orig_mod.model.inner.H_level.layers.0.self_attn.qkv_proj.weight" in ckpt["model"]
    adam_state, emb_state = ckpt["optimizers"]
    assert set(adam_state["param_groups"][0]) >= {"lr", "betas", "weight_decay"}
    assert any("exp_avg" in s for s in adam_state["state"].values())
    assert "param_groups" in emb_state

    # evaluate.py reproduces the last eval from the checkpoint alone.
    capsys.readouterr()
    assert evaluate.main(["--device", "cpu", "--checkpoint", str(run_dir / "step_16.pt"), "--forward-dtype",
                          "float32", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("accuracy", "exact_accuracy", "blank_accuracy"):
        assert metrics[key] == pytest.approx(evals[-1][f"eval/{key}"], abs=1e-6)


def test_evaluate_loads_a_reference_checkpoint_with_all_config_yaml(sudoku_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_pretrain(sudoku_dir, run_dir) == 0
    ref_dir = tmp_path / "released"
    ref_dir.mkdir()
    # The released layout: a raw state dict named `checkpoint` next to all_config.yaml.
    torch.save(safe_load(run_dir / "step_16.pt")["model"], ref_dir / "checkpoint")
    # The reference's all_config.yaml: its class-path architecture name, and keys this trainer does not use.
    config = OmegaConf.to_container(OmegaConf.load(run_dir / "all_config.yaml"))
    config["arch"]["name"] = "hrm.hrm_act_v1@HierarchicalReasoningModel_ACTV1"
    config["some_reference_only_key"] = 1
    OmegaConf.save(config, ref_dir / "all_config.yaml")
    capsys.readouterr()
    assert evaluate.main(["--device", "cpu", "--checkpoint", str(ref_dir / "checkpoint"), "--forward-dtype",
                          "float32", "--json"]) == 0
    assert "exact_accuracy" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_short_run_learns(sudoku_dir, tmp_path):
    run_dir = tmp_path / "run"
    assert run_pretrain(sudoku_dir, run_dir, "epochs=10", "eval_interval=10", "lr=3e-3", "lr_min_ratio=1.0") == 0
    losses = [p["train/lm_loss"] for p in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if "train/lm_loss" in p]
    assert losses[-1] < losses[0] - 0.1, losses
    assert math.isfinite(losses[-1])


def test_missing_dataset_without_builder_says_how_to_build_one(tmp_path, capsys):
    code = pretrain.main(["--config-name=cfg_pretrain", f"data_path={tmp_path / 'nope'}", "device=cpu"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "python scripts/build_sudoku_dataset.py --generate" in err[0]


def test_a_mistyped_data_path_is_an_error_not_a_new_dataset(tmp_path, capsys):
    typo = tmp_path / "sudoku-gen-easy-1k-aug-10O"
    assert pretrain.main(["--config-name=cfg_pretrain_cpu", "device=cpu", f"data_path={typo}",
                          f"checkpoint_path={tmp_path / 'run'}"]) == 2
    assert "add build_data=true" in capsys.readouterr().err
    assert not typo.exists() and not (tmp_path / "run").exists()


def test_build_data_builds_the_recipe_dataset_where_asked(tmp_path):
    data = tmp_path / "gen"
    run_dir = tmp_path / "run"
    code = pretrain.main(["--config-name=cfg_pretrain_cpu", f"data_path={data}", f"checkpoint_path={run_dir}", "build_data=true",
                          "dataset_builder={generate: true, train_size: 32, test_size: 8, min_blanks: 30, num_aug: 0}",
                          "global_batch_size=16", "epochs=2", "eval_interval=2", "forward_dtype=float32", *TINY_ARCH])
    assert code == 0
    assert (data / "train" / "dataset.json").is_file() and (run_dir / "step_4.pt").is_file()


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "config").glob("*.yaml")))
def test_every_recipe_resolves(name):
    setup = puzzle_trainer.resolve_setup(puzzle_trainer.parse_args([f"--config-name={name}", "device=cpu"]), Dist())
    assert setup.cfg.data_paths and setup.arch["name"] in ("hrm_v1", "trm") and setup.cfg.epochs % setup.cfg.eval_interval == 0
