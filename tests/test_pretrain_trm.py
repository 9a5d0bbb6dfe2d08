"""pretrain.py with TRM: both variants with EMA, kill-and-resume, fine-tuning from a TRM-repo checkpoint,
several datasets, and ARC runs scored by the voting evaluator with saved outputs and pictures."""

import json
import logging
import signal

import pytest
import torch
from PIL import Image

import evaluate
import pretrain
from models import build_model, validate_arch
from models.checkpoints import reference_state_dict, strip_reference_prefix
from tests.conftest import make_sudoku, signal_at
from utils.config import ConfigError
from utils.data.arc import build_arc_dataset
from utils.data.puzzle_dataset import PuzzleDataset
from utils.distributed import Dist
from utils.train import puzzle_trainer
from utils.checkpoint import safe_load

TINY_TRM = ["arch=trm", "compile=false", "device=cpu", "arch.hidden_size=32", "arch.num_heads=2", "arch.L_layers=1",
            "arch.H_cycles=2",
            "arch.L_cycles=2", "arch.halt_max_steps=2", "arch.expansion=2", "arch.puzzle_emb_len=1",
            "global_batch_size=16", "epochs=4", "eval_interval=2", "log_interval=2", "lr_warmup_steps=2",
            "forward_dtype=float32"]


def trm(sudoku_dir, run_dir, *extra):
    return ["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", f"checkpoint_path={run_dir}", *TINY_TRM, *extra]


def eval_points(run_dir):
    return [p for p in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "eval/accuracy" in p]


@pytest.mark.parametrize("variant", [["arch.mlp_t=false"], ["arch.mlp_t=true", "arch.pos_encodings=none"]],
                         ids=["attention", "mlp_t"])
def test_trm_trains_with_ema_and_evaluate_reads_the_ema_weights(sudoku_dir, tmp_path, capsys, variant):
    run = tmp_path / "run"
    assert pretrain.main(trm(sudoku_dir, run, *variant, "ema=true", "ema_rate=0.9")) == 0
    ckpt = safe_load(run / "step_16.pt")
    assert set(ckpt["ema"]) == {"model." + k for k in strip_reference_prefix(ckpt["live_model"]) if k != "inner.puzzle_emb.weights"
                                and not k.endswith(("H_init", "L_init"))}
    name = "_orig_mod.model.inner.lm_head.weight"
    assert not torch.equal(ckpt["model"][name], ckpt["live_model"][name])  # the reference-format weights are the EMA
    assert torch.equal(ckpt["model"][name], ckpt["ema"]["model.inner.lm_head.weight"])
    capsys.readouterr()
    assert evaluate.main(["--device", "cpu", "--checkpoint", str(run / "step_16.pt"), "--forward-dtype", "float32",
                          "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("accuracy", "exact_accuracy", "lm_loss"):
        assert metrics[key] == pytest.approx(eval_points(run)[-1][f"eval/{key}"], abs=1e-6)


@pytest.mark.slow
def test_kill_9_then_resume_with_ema_is_bitwise(sudoku_dir, tmp_path, warm_pretrain):
    """Each run a fork of one warm interpreter (tests/warm_trainer.py), killed by the signal a kill -9 sends."""
    def run(path, *extra, **env):
        return warm_pretrain.run(trm(sudoku_dir, path, "ema=true", "ema_rate=0.9", "deterministic=true", *extra), **env)

    straight = run(tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    killed = run(tmp_path / "killed", **signal_at("train", 11, "SIGKILL"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sorted(p.name for p in (tmp_path / "killed").glob("step_*.pt")) == ["step_8.pt"]  # killed in step 11
    resumed = run(tmp_path / "killed", "resume=auto")
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr
    a, b = safe_load(tmp_path / "straight" / "step_16.pt"), safe_load(tmp_path / "killed" / "step_16.pt")
    for part in ("model", "live_model", "ema"):
        for key, value in a[part].items():
            assert torch.equal(value, b[part][key]), f"{part}: {key} differs"
    for i, state in a["optimizers"][0]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizers"][0]["state"][i][key]), f"optimizer state {i}.{key} differs"


def test_load_checkpoint_from_the_trm_repo_resizes_the_puzzle_embedding_and_freeze_trains_it_alone(
        sudoku_dir, tmp_path, caplog):
    # A checkpoint as the TRM repository writes it: the compiled loss head's bare state dict, in a file named
    # step_<N> with no extension, from a run with another number of puzzle identifiers.
    setup = puzzle_trainer.resolve_setup(puzzle_trainer.parse_args(trm(sudoku_dir, tmp_path / "x")), Dist())
    torch.manual_seed(7)
    donor = build_model(validate_arch(setup.cfg.arch), batch_size=16, seq_len=81, vocab_size=11, num_puzzle_identifiers=5,
                        dtype=torch.float32, device="cpu")
    with torch.no_grad():
        donor.model.inner.puzzle_emb.weights.normal_()
    saved = tmp_path / "step_1234"
    torch.save(reference_state_dict(donor), saved)

    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    assert pretrain.main(trm(sudoku_dir, run, f"load_checkpoint={saved}", "freeze_weights=true")) == 0
    assert "puzzle embedding of" in caplog.text and "has shape (5, 32)" in caplog.text
    trained = strip_reference_prefix(safe_load(run / "step_16.pt")["model"])
    for key, value in strip_reference_prefix(reference_state_dict(donor)).items():
        if key == "inner.puzzle_emb.weights":
            start = value.mean(0)
            assert not torch.equal(trained[key][0], start)  # trained by sign-SGD from the mean row
        else:
            assert torch.equal(trained[key], value), f"{key} changed although the weights were frozen"
    assert len(safe_load(run / "step_16.pt")["optimizers"]) == 1  # sign-SGD only


def test_several_datasets_keep_puzzle_identifiers_unique(tmp_path_factory, sudoku_dir, tmp_path):
    other = make_sudoku(tmp_path_factory, 32, 8)
    loader = PuzzleDataset([sudoku_dir, other], "train", 16)
    assert loader.metadata.num_puzzle_identifiers == 2 and loader.identifier_offsets == [0, 1]
    assert sorted(loader._data) == ["all", "all1"] and set(loader._data["all1"]["puzzle_identifiers"].tolist()) == {1}
    run = tmp_path / "run"
    args = [a for a in trm(sudoku_dir, run) if not a.startswith("data_path=")]
    assert pretrain.main([*args, f"data_paths=[{sudoku_dir},{other}]"]) == 0
    last = json.loads((run / "run.json").read_text())["checkpoints"][-1]
    assert safe_load(run / last)["model"]["_orig_mod.model.inner.puzzle_emb.weights"].shape[0] == 2


def test_data_path_and_data_paths_resolve_by_layer():
    args = ["--config-name=cfg_pretrain_trm_sudoku_mlp", "device=cpu"]
    setup = puzzle_trainer.resolve_setup(puzzle_trainer.parse_args(args), Dist())
    assert setup.cfg.data_paths == ["data/sudoku-extreme-1k-aug-1000"] == [setup.cfg.data_path]
    setup = puzzle_trainer.resolve_setup(puzzle_trainer.parse_args([*args, "data_path=data/mine"]), Dist())
    assert setup.cfg.data_paths == ["data/mine"]  # the command line's data_path beats the recipe's data_paths
    with pytest.raises(ConfigError, match="sets both data_path and data_paths"):
        puzzle_trainer.resolve_setup(puzzle_trainer.parse_args([*args, "data_path=a", "data_paths=[b]"]), Dist())


def test_evaluations_vote_over_dihedral_views_and_evaluate_scores_the_same(sudoku_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert pretrain.main(trm(sudoku_dir, run, "eval_views=8", "eval_early_exit=true", "eval_min_segments=1")) == 0
    assert "eval_views: 8" in (run / "plan.yaml").read_text()
    capsys.readouterr()
    assert evaluate.main(["--device", "cpu", str(run), "--forward-dtype", "float32",
                          "--json"]) == 0  # the run's own settings, views too
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["exact_accuracy"] == pytest.approx(eval_points(run)[-1]["eval/exact_accuracy"], abs=1e-6)
    assert metrics["accuracy"] == pytest.approx(eval_points(run)[-1]["eval/accuracy"], abs=1e-6)


@pytest.fixture(scope="module")
def arc_dir(tmp_path_factory):
    return build_arc_dataset(tmp_path_factory.mktemp("arc") / "arc", "arc-agi-1", num_aug=2, max_tasks=3)


def test_arc_run_scores_with_voting_saves_outputs_and_pictures(arc_dir, tmp_path, capsys):
    run = tmp_path / "run"
    code = pretrain.main(["--config-name=cfg_pretrain_arc_cpu", f"data_paths=[{arc_dir}]", f"checkpoint_path={run}",
                          *TINY_TRM[1:], "global_batch_size=8", "epochs=1", "eval_interval=1", "ema=false"])
    assert code == 0
    point = eval_points(run)[-1]
    step = point["step"]
    assert {f"eval/ARC/pass@{k}" for k in (1, 2, 5, 10, 100, 1000)} <= set(point)
    submission = json.loads((run / f"evaluator_ARC_step_{step}" / "submission.json").read_text())
    assert set(submission) == set(json.loads((arc_dir / "test_puzzles.json").read_text()))
    outputs = run / f"step_{step}_all_preds.0"
    capsys.readouterr()
    assert evaluate.main(["--device", "cpu", "--outputs", str(outputs), "--data-path", str(arc_dir), "--json"]) == 0
    rescored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert all(rescored[k] == point[f"eval/{k}"] for k in rescored)

    refused = pretrain.main(["--config-name=cfg_pretrain_arc_cpu", f"data_paths=[{arc_dir}]", f"checkpoint_path={tmp_path / 'r2'}",
                             *TINY_TRM[1:], "eval_views=2"])
    assert refused == 2 and "identifiers" in capsys.readouterr().err and not (tmp_path / "r2" / "step_1.pt").exists()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert "eval/example_0" in events.Tags()["images"]
    picture = Image.open(run / "pictures" / f"eval_example_0_step_{step}.png")
    assert picture.mode == "RGB" and min(picture.size) > 8


def test_newcomer_a_first_look_comes_early_and_moves_nothing_else(sudoku_dir, tmp_path, capsys):
    """device=cpu: first_eval_step=2 prints a held-out accuracy after step 2 with when the first full evaluation
    comes (after step 4, the end of the first evaluation interval of 2); that run's evaluations and weights are
    bitwise those of the same run without it."""
    short = ("ema=true", "ema_rate=0.9", "epochs=2", "eval_interval=1")
    assert pretrain.main(trm(sudoku_dir, tmp_path / "plain", *short)) == 0
    capsys.readouterr()
    assert pretrain.main(trm(sudoku_dir, tmp_path / "look", *short, "first_eval_step=2")) == 0
    printed = capsys.readouterr()
    look = next(line for line in (printed.out + printed.err).splitlines() if "first look" in line)
    assert look.startswith("step 2 first look (") and "16 of 16 test examples, live weights): exact_accuracy=" in look
    assert "; the first full evaluation comes after step 4, in about " in look
    points = [json.loads(line) for line in (tmp_path / "look" / "metrics.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points if "first_eval/blank_accuracy" in p] == [2]

    def scores(run):
        return [{k: v for k, v in p.items() if "elapsed" not in k} for p in eval_points(run)]
    assert scores(tmp_path / "look") == scores(tmp_path / "plain") and len(scores(tmp_path / "plain")) == 2
    a, b = safe_load(tmp_path / "plain" / "step_8.pt"), safe_load(tmp_path / "look" / "step_8.pt")
    for part in ("model", "live_model", "ema"):
        assert all(torch.equal(value, b[part][key]) for key, value in a[part].items()), part
