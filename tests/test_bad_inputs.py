"""Every setting and command-line flag, driven with bad values: 0, negative, the wrong type, absurdly large, a
missing path. Each must end with exit code 2 and one ``error:`` line, never a traceback."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import evaluate
import pretrain
from utils.data.sudoku.build import main as build_sudoku_main
from utils.run.main import cli_main

ROOT = Path(__file__).resolve().parent.parent

BASE = ["--config-name=cfg_pretrain_cpu", "compile=false", "device=cpu", "arch.hidden_size=32", "arch.num_heads=2",
        "arch.H_layers=1",
        "arch.L_layers=1", "arch.halt_max_steps=2", "arch.expansion=2", "global_batch_size=16", "epochs=2",
        "eval_interval=2", "forward_dtype=float32"]

# (override, a fragment of the one error line)
PRETRAIN_CASES = [
    ("arch=nosuchmodel", "arch=nosuchmodel: no config/arch/nosuchmodel.yaml; available: hrm_v1"),
    ("arch.name=nosuchmodel", "is not a known architecture: use one of hrm_v1, trm"),
    ("arch.hidden_size=0", "must be >= 1"),
    ("arch.hidden_size=-32", "must be >= 1"),
    ("arch.hidden_size=wide", "arch: bad value for 'hidden_size'"),
    ("arch.hidden_size=4194304", "GiB for its weights"),
    ("arch.num_heads=0", "must be >= 1"),
    ("arch.num_heads=3", "divisible by num_heads (3)"),
    ("arch.H_cycles=0", "must all be >= 1"),
    ("arch.L_layers=-1", "must all be >= 1"),
    ("arch.halt_max_steps=0", "halt_max_steps (0) must be >= 1"),
    ("arch.halt_exploration_prob=2", "must be in [0, 1]"),
    ("arch.expansion=0", "expansion (0.0) > 0"),
    ("arch.pos_encodings=bogus", "use 'rope' or 'learned'"),
    ("arch.puzzle_emb_ndim=-1", "puzzle_emb_ndim (-1) >= 0"),
    ("arch.rms_norm_eps=0", "must be > 0"),
    ("arch.rope_theta=-1", "must be > 0"),
    ("arch.loss.loss_type=bogus", "arch.loss.loss_type='bogus'"),
    ("arch.seq_len=5", "arch.seq_len is filled from the dataset"),
    ("arch.hidden=5", "arch.hidden is not a key of this architecture"),
    ("data_path=", "config key 'data_path'"),
    ("build_data=maybe", "config key 'build_data'"),
    ("global_batch_size=0", "global_batch_size=0 is out of range"),
    ("global_batch_size=-16", "global_batch_size=-16 is out of range"),
    ("global_batch_size=many", "config key 'global_batch_size'"),
    ("global_batch_size=1000000000", "cannot fill one global batch"),
    ("epochs=0", "epochs=0 is out of range"),
    ("epochs=-2", "epochs=-2 is out of range"),
    ("epochs=many", "config key 'epochs'"),
    ("eval_interval=0", "eval_interval=0 is out of range"),
    ("eval_interval=3", "must divide epochs"),
    ("eval_interval=x", "config key 'eval_interval'"),
    ("checkpoint_every_eval=sometimes", "config key 'checkpoint_every_eval'"),
    ("eval_max_examples=0", "eval_max_examples=0 is out of range"),
    ("lr=-1", "lr=-1.0 is out of range"),
    ("lr=fast", "config key 'lr'"),
    ("lr_min_ratio=2", "lr_min_ratio=2.0 is out of range"),
    ("lr_warmup_steps=-1", "lr_warmup_steps=-1 is out of range"),
    ("beta1=1", "beta1=1.0 is out of range"),
    ("beta2=-0.5", "beta2=-0.5 is out of range"),
    ("weight_decay=-0.1", "weight_decay=-0.1 is out of range"),
    ("puzzle_emb_weight_decay=-1", "puzzle_emb_weight_decay=-1.0 is out of range"),
    ("puzzle_emb_lr=-1", "puzzle_emb_lr=-1.0 is out of range"),
    ("optimizer_backend=bogus", "optimizer_backend='bogus' is out of range"),
    ("seed=-1", "seed=-1 is out of range"),
    ("seed=abc", "config key 'seed'"),
    ("project_name=a/b", "project_name='a/b' is out of range"),
    ("run_name=..", "run_name='..' is out of range"),
    ("logger=bogus", "logger='bogus' is out of range"),
    ("log_interval=0", "log_interval=0 is out of range"),
    ("keep_last_checkpoints=-1", "keep_last_checkpoints=-1 is out of range"),
    ("max_nonfinite_steps=0", "max_nonfinite_steps=0 is out of range"),
    ("deterministic=perhaps", "config key 'deterministic'"),
    ("device=gpu0", "device='gpu0' is not a device"),
    ("device=cuda:7", "device='cuda:7' but"),
    ("hardware=bogus", "hardware='bogus' is not a profile"),
    ("forward_dtype=float16", "forward_dtype=float16 is not supported"),
    ("forward_dtype=bogus", "forward_dtype='bogus' is not supported"),
    ("compile=maybe", "compile='maybe' is out of range"),
    ("unknown_key=1", "unknown config key 'unknown_key'"),
    ("novalue", "override 'novalue' is not key=value"),
    ("--config-name=nosuchconfig", "--config-name=nosuchconfig: no "),
    ("--no-such-flag", "unrecognized arguments: --no-such-flag"),
]


def exit_code(call) -> int:
    try:
        return call()
    except SystemExit as e:  # argparse rejects a flag's type before our code runs
        return e.code


def assert_one_line(capsys, code, fragment):
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(errors) == 1 and "Traceback" not in err, err
    assert fragment in errors[0], errors[0]


@pytest.mark.parametrize("override,fragment", PRETRAIN_CASES, ids=[c[0] for c in PRETRAIN_CASES])
def test_pretrain_setting(sudoku_dir, tmp_path, capsys, override, fragment):
    code = exit_code(lambda: pretrain.main([*BASE, f"data_path={sudoku_dir}", f"checkpoint_path={tmp_path / 'run'}", override]))
    assert_one_line(capsys, code, fragment)


@pytest.mark.parametrize("overrides,fragment", [
    (["data_path={missing}"], "holds no dataset"),
    (["data_path={missing}", "build_data=true", "dataset_builder={{bogus: 1}}"], "dataset_builder: sudoku builds take no bogus"),
    (["resume={missing}"], "no such file or directory"),
    (["resume={file}"], "is not a PyTorch checkpoint"),
    (["checkpoint_path={file}/run"], "cannot create run directory"),
])
def test_pretrain_paths(sudoku_dir, tmp_path, capsys, overrides, fragment):
    (tmp_path / "file").write_text("not a directory")
    values = [o.format(missing=tmp_path / "missing", file=tmp_path / "file") for o in overrides]
    run = [] if any("checkpoint_path" in v for v in values) else [f"checkpoint_path={tmp_path / 'run'}"]
    assert_one_line(capsys, pretrain.main([*BASE, f"data_path={sudoku_dir}", *run, *values]), fragment)


@pytest.fixture(scope="module")
def trained_run(sudoku_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("trained") / "run"
    assert pretrain.main([*BASE, f"data_path={sudoku_dir}", f"checkpoint_path={run}"]) == 0
    return run


@pytest.mark.parametrize("flags,fragment", [
    (["--batch-size", "many"], "argument --batch-size: invalid int value: 'many'"),
    (["--checkpoint", "{missing}"], "does not exist"),
    (["--checkpoint", "{empty}"], "is empty (0 bytes"),
    (["--checkpoint", "{text}"], "is not a PyTorch checkpoint"),
    (["--checkpoint", "{cut}"], "is truncated or corrupt"),
    (["--checkpoint", "{dir}"], "holds no valid checkpoint (no best.pt, no loadable step_<N>.pt)"),
    (["--checkpoint", "{ckpt}", "--batch-size", "0"], "--batch-size=0 must be at least 1"),
    (["--checkpoint", "{ckpt}", "--max-examples", "-1"], "--max-examples=-1 must be at least 1"),
    (["--checkpoint", "{ckpt}", "--device", "gpu"], "device='gpu' is not a device"),
    (["--checkpoint", "{ckpt}", "--forward-dtype", "float16"], "forward_dtype=float16 is not supported"),
    (["--checkpoint", "{ckpt}", "--data-path", "{missing}"], "not found"),
])
def test_evaluate_flag(trained_run, tmp_path, capsys, flags, fragment):
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "text.pt").write_text("hello")
    (tmp_path / "cut.pt").write_bytes((trained_run / "step_8.pt").read_bytes()[:5000])
    paths = dict(missing=tmp_path / "missing", empty=tmp_path / "empty.pt", text=tmp_path / "text.pt", dir=tmp_path,
                 ckpt=trained_run / "step_8.pt", cut=tmp_path / "cut.pt")
    capsys.readouterr()
    assert_one_line(capsys, exit_code(lambda: evaluate.main(["--device", "cpu",
                                                             *(f.format(**paths) for f in flags)])), fragment)


@pytest.mark.parametrize("name,content,fragment", [
    ("missing.pt", None, "does not exist"),
    ("empty.pt", b"", "is empty (0 bytes"),
    ("notes.pt", b"hello", "is not a PyTorch checkpoint"),
])
def test_evaluate_refuses_a_bad_checkpoint_file_before_choosing_the_device(tmp_path, capsys, monkeypatch, name,
                                                                            content, fragment):
    """A checkpoint file that cannot be one is refused by its path alone, before ``select_device`` calls into torch."""
    import utils.device

    def device_chosen(*args, **kwargs):
        raise AssertionError("select_device ran before the checkpoint file was checked")

    monkeypatch.setattr(utils.device, "select_device", device_chosen)
    if content is not None:
        (tmp_path / name).write_bytes(content)
    capsys.readouterr()
    assert_one_line(capsys, exit_code(lambda: evaluate.main(["--device", "cpu", "--checkpoint", str(tmp_path / name)])),
                    fragment)


def test_evaluate_skips_a_damaged_newest_checkpoint_once(trained_run, tmp_path, caplog):
    """A folder of step checkpoints whose newest was cut off: evaluate.py takes the one before, and says so once (it
    resolves the folder before choosing the device, and the model loads from that resolution)."""
    run = tmp_path / "steps"
    run.mkdir()
    shutil.copy(trained_run / "step_8.pt", run / "step_8.pt")
    (run / "step_16.pt").write_bytes(b"")  # a write cut short
    caplog.set_level(logging.INFO)
    assert evaluate.main(["--device", "cpu", "--checkpoint", str(run), "--max-examples", "2"]) == 0
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert len(skipped) == 1 and "step_16.pt is empty" in skipped[0], skipped
    assert "evaluating the run's newest checkpoint step_8.pt" in caplog.text


@pytest.mark.parametrize("flags,fragment", [
    (["--generate", "--train-size", "0"], "--train-size must be >= 1, got 0"),
    (["--generate", "--train-size", "lots"], "argument --train-size: invalid int value: 'lots'"),
    (["--generate", "--test-size", "-1"], "--test-size must be >= 1, got -1"),
    (["--generate", "--num-aug", "-1"], "--num-aug must be >= 0, got -1"),
    (["--generate", "--min-blanks", "99"], "--min-blanks must be in [0, 64]"),
    (["--generate", "--workers", "0"], "argument --workers: '0': give 1 to "),
    (["--source-dir", "{missing}"], "not found"),
    (["--generate", "--source-dir", "{missing}"], "choose exactly one source"),
    (["--generate", "--repo", "owner/data"], "--repo and --revision pick the Hugging Face Hub source"),
])
def test_sudoku_builder_flag(tmp_path, capsys, flags, fragment):
    argv = [f.format(missing=tmp_path / "missing") for f in flags] + ["--output-dir", str(tmp_path / "out")]
    assert_one_line(capsys, exit_code(lambda: cli_main(lambda: build_sudoku_main(argv) and 0)), fragment)


CAPE_CASES = [
    (["--data_root", "{missing}"], "not found"),
    (["--split", "6"], "--split 6 is out of range"),
    (["--split", "one"], "argument --split: invalid int value"),
    (["--image_size", "100"], "--image_size 100 is out of range"),
    (["--image_size", "65536"], "--image_size 65536 is out of range"),
    (["--shots", "0"], "--shots 0 is out of range"),
    (["--queries", "-1"], "--queries -1 is out of range"),
    (["--eval_queries", "0"], "--eval_queries 0 is out of range"),
    (["--val_episodes_per_category", "101"], "--val_episodes_per_category 101 is out of range"),
    (["--test_episodes_per_category", "0"], "--test_episodes_per_category 0 is out of range"),
    (["--num_workers", "-2"], "--num_workers -2 is out of range"),
    (["--model", "capeformer_xl"], "argument --model: invalid choice"),
    (["--backbone", "vgg16"], "argument --backbone: invalid choice"),
    (["--backbone_weights", "{missing}"], "does not exist"),
    (["--hidden_dim", "30"], "hidden_dim 30 must be divisible by 4"),
    (["--num_heads", "0"], "num_heads"),
    (["--dropout", "many"], "argument --dropout: invalid float value"),
    (["--epochs", "0"], "--epochs 0 is out of range"),
    (["--episodes_per_epoch", "-1"], "--episodes_per_epoch -1 is out of range"),
    (["--batch_size", "0"], "--batch_size 0 is out of range"),
    (["--batch_size", "3", "--accumulation_steps", "2"], "must be divisible by --accumulation_steps 2"),
    (["--optimizer", "sgd"], "argument --optimizer: invalid choice"),
    (["--lr", "-1"], "--lr -1.0 is out of range"),
    (["--lr", "inf"], "--lr inf is out of range: must be a finite number in [0, 1]"),
    (["--lr", "5"], "--lr 5.0 is out of range: must be a finite number in [0, 1]"),
    (["--weight_decay", "nan"], "--weight_decay nan is out of range"),
    (["--eval_only", "--resume", "{empty}", "--predictions_out", "/proc/x/p.jsonl"],
     "--predictions_out /proc/x/p.jsonl cannot be created"),
    (["--weight_decay", "-0.1"], "--weight_decay -0.1 is out of range"),
    (["--lr_schedule", "linear"], "argument --lr_schedule: invalid choice"),
    (["--lr_warmup_steps", "-5"], "--lr_warmup_steps -5 is out of range"),
    (["--lr_warmup_ratio", "2"], "--lr_warmup_ratio 2.0 is out of range"),
    (["--lr_min_ratio", "-1"], "--lr_min_ratio -1.0 is out of range"),
    (["--lr_steps", "-3"], "--lr_steps [-3] is out of range"),
    (["--lr_gamma", "5"], "--lr_gamma 5.0 is out of range"),
    (["--clip_max_norm", "-1"], "--clip_max_norm -1.0 is out of range"),
    (["--heatmap_weight", "1e9"], "--heatmap_weight 1000000000.0 is out of range"),
    (["--aug_scale", "1.5"], "--aug_scale 1.5 is out of range"),
    (["--aug_rotation_prob", "1.5"], "--aug_rotation_prob 1.5 is out of range"),
    (["--seed", "-1"], "--seed -1 is out of range"),
    (["--val_interval", "0"], "--val_interval 0 is out of range"),
    (["--device", "tpu"], "device='tpu' is not a device"),
    (["--hardware", "gpu_4090"], "argument --hardware: invalid choice"),
    (["--recipe", "hrnet"], "argument --recipe: invalid choice"),
    (["--resume", "{missing}"], "no such file or directory"),
    (["--logger", "mlflow"], "argument --logger: invalid choice"),
    (["--log_interval", "0"], "--log_interval 0 is out of range"),
    (["--keep_last_checkpoints", "-1"], "--keep_last_checkpoints -1 is out of range"),
    (["--max_nonfinite_steps", "0"], "--max_nonfinite_steps 0 is out of range"),
    (["--eval_only"], "--eval_only needs --resume CHECKPOINT"),
    (["--eval_only", "--resume", "{empty}"], "is empty (0 bytes"),
    (["--eval_set", "train"], "argument --eval_set: invalid choice"),
    (["--output_dir", "{file}/run"], "cannot create run directory"),
]


@pytest.mark.parametrize("flags,fragment", CAPE_CASES, ids=[" ".join(c[0]) for c in CAPE_CASES])
def test_cape_flag(cape_data, tmp_path, capsys, flags, fragment):
    from models import train_cape_episodic as cape
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "empty.pt").write_bytes(b"")
    paths = dict(missing=tmp_path / "missing", file=tmp_path / "file", empty=tmp_path / "empty.pt")
    base = ["--model", "capeformer_lite", "--hidden_dim", "32", "--num_heads", "4", "--image_size", "64",
            "--device", "cpu", "--queries", "2", "--eval_queries", "2", "--epochs", "1", "--episodes_per_epoch", "1",
            "--batch_size", "1", "--accumulation_steps", "1", "--num_workers", "0", "--data_root", str(cape_data)]
    if "--output_dir" not in flags:
        base += ["--output_dir", str(tmp_path / "run")]
    code = exit_code(lambda: cape.main(base + [f.format(**paths) for f in flags]))
    assert_one_line(capsys, code, fragment)


@pytest.mark.parametrize("script,flags,fragment", [
    ("build_maze_dataset.py", ["--generate", "--size", "1"], "--size"),
    ("build_maze_dataset.py", ["--generate", "--train-size", "-3"], "--train-size"),
    ("build_maze_dataset.py", ["--source-dir", "{missing}"], "not found"),
    ("build_arc_dataset.py", ["--dataset", "arc-agi-3"], "argument --dataset: invalid choice"),
    ("build_arc_dataset.py", ["--dataset", "arc-agi-1", "--num-aug", "-1"], "--num-aug and --seed must be >= 0"),
    ("build_arc_dataset.py", ["--dataset", "arc-agi-1", "--max-tasks", "0"], "--max-tasks must be >= 1"),
    ("build_arc_dataset.py", ["--dataset", "arc-agi-1", "--source-dir", "{missing}"], "is not a directory"),
    ("build_synthetic_cape_dataset.py", ["--num-categories", "3"], "num_categories=3"),
    ("visualize.py", ["--data-path", "{missing}", "--out", "{missing}"], "not found"),
])
def test_script_flag(tmp_path, capsys, script, flags, fragment):
    import runpy
    import sys as _sys
    argv = [f.format(missing=tmp_path / "missing") for f in flags]
    if script != "visualize.py" and "--output-dir" not in argv:
        argv += ["--output-dir", str(tmp_path / "out")]
    old = _sys.argv
    _sys.argv = [script, *argv]
    try:
        code = exit_code(lambda: runpy.run_path(str(ROOT / "scripts" / script), run_name="__main__"))
    finally:
        _sys.argv = old
    assert_one_line(capsys, code, fragment)


def _no_work(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{what} began before the command line was checked")
    return refuse


@pytest.mark.parametrize("flags,fragment", [
    (["--profile", "-1"], "argument --profile: '-1': give a whole number of 1 or more"),
    (["--profile", "0"], "argument --profile: '0'"),
    (["--gemm-size", "-5"], "argument --gemm-size: '-5': give a whole number of 1 or more"),
    (["--rounds", "-1"], "argument --rounds: '-1'"),
    (["--warmup", "0"], "argument --warmup: '0'"),
    (["--batch-size", "0"], "argument --batch-size: '0'"),
])
def test_benchmark_step_refuses_a_bad_number_before_the_warm_up(monkeypatch, capsys, flags, fragment):
    """Issue 63: --profile -1 and --gemm-size -5 ran the warm-up, then ended in a traceback."""
    from scripts import benchmark_step
    monkeypatch.setattr(benchmark_step, "device_and_dtype", _no_work("the benchmark"))
    assert_one_line(capsys, exit_code(lambda: benchmark_step.main(["--models", "trm_cpu", *flags])), fragment)


def test_recipe_lengths_refuses_an_unknown_recipe_and_names_the_known_ones(monkeypatch, capsys):
    """Issue 63: an unknown recipe was a row of the table with the error in a cell, exit code 1."""
    from scripts import recipe_lengths
    monkeypatch.setattr(recipe_lengths, "recipe_size", _no_work("counting"))
    code = exit_code(lambda: recipe_lengths.main(["cfg_pretrain_cpu", "UNKNOWN"]))
    assert_one_line(capsys, code, "unknown recipe UNKNOWN: config/ has no such cfg_*.yaml; known recipes: "
                                  "cfg_pretrain, ")


@pytest.mark.parametrize("workers", ["0", "100000"])
@pytest.mark.parametrize("command", ["build_sudoku_dataset", "build_maze_dataset", "check_gpu"])
def test_workers_above_the_bound_of_every_command_are_refused_before_a_worker_starts(
        monkeypatch, tmp_path, capsys, command, workers):
    """Issue 63: --workers 100000 forked about 4,300 processes. Every command with --workers takes at most
    utils.cli.WORKERS_PER_CORE per core, and says so."""
    import os

    from scripts import check_gpu
    from utils import cli
    from utils.data import common
    from utils.data.maze import main as build_maze_main
    monkeypatch.setattr(common, "worker_pool", _no_work("a worker pool"))
    monkeypatch.setattr(check_gpu, "build_data", _no_work("check_gpu"))
    out = ["--generate", "--output-dir", str(tmp_path / "out")]
    run = {"build_sudoku_dataset": lambda: cli_main(lambda: build_sudoku_main([*out, "--workers", workers]) and 0),
           "build_maze_dataset": lambda: cli_main(lambda: build_maze_main([*out, "--workers", workers]) and 0),
           "check_gpu": lambda: check_gpu.main(["--device", "cpu", "--workers", workers])}[command]
    code = exit_code(run)
    bound = cli.WORKERS_PER_CORE * (os.cpu_count() or 1)
    assert_one_line(capsys, code, f"argument --workers: '{workers}': give 1 to {bound} (at most "
                                  f"{cli.WORKERS_PER_CORE} per core; {os.cpu_count() or 1} cores here)")
    assert not (tmp_path / "out").exists()


def test_the_workers_bound_takes_its_own_value_and_refuses_the_next():
    import argparse

    from utils import cli
    bound = cli.max_workers()
    assert cli.worker_count(str(bound)) == bound and cli.worker_count("1") == 1
    for bad in (str(bound + 1), "0", "-1", "two", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"give 1 to {bound} "):
            cli.worker_count(bad)


def test_sudoku_builder_on_a_latin1_csv(tmp_path, capsys):
    source = tmp_path / "src"
    source.mkdir()
    for split in ("train", "test"):
        (source / f"{split}.csv").write_bytes(b"source,question,answer,rating\ncaf\xe9," + b"." * 81 + b"," + b"1" * 81 + b",0\n")
    argv = ["--source-dir", str(source), "--output-dir", str(tmp_path / "out")]
    assert_one_line(capsys, exit_code(lambda: cli_main(lambda: build_sudoku_main(argv) and 0)), "is not UTF-8 text")
    assert not (tmp_path / "out").exists()


def test_train_and_test_data_that_do_not_fit_one_model_fail_before_training(sudoku_dir, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(sudoku_dir, other)
    meta = json.loads((other / "test" / "dataset.json").read_text())
    (other / "test" / "dataset.json").write_text(json.dumps(meta | {"vocab_size": meta["vocab_size"] + 1}))
    run = tmp_path / "run"
    code = pretrain.main([*BASE, f"data_paths=[{sudoku_dir}]", f"data_paths_test=[{other}]", f"checkpoint_path={run}"])
    assert_one_line(capsys, code, "train and test disagree on vocab_size (11 vs 12)")
    assert not list(run.glob("step_*.pt"))  # found before the first step, not at the first evaluation


def test_an_unreadable_image_in_a_dataloader_worker_is_one_line(cape_data, tmp_path, capsys):
    """The worker's error reaches the main process wrapped in its traceback; the user sees the one line."""
    from models import train_cape_episodic as cape
    root = tmp_path / "data"
    shutil.copytree(cape_data, root)
    for image in (root / "images").rglob("*.png"):
        image.write_bytes(b"")  # e.g. a placeholder or an interrupted download
    code = exit_code(lambda: cape.main(["--model", "capeformer_lite", "--hidden_dim", "32", "--num_heads", "4",
                                        "--image_size", "64", "--device", "cpu", "--queries", "2", "--epochs", "1",
                                        "--episodes_per_epoch", "1", "--batch_size", "1", "--accumulation_steps", "1",
                                        "--num_workers", "1", "--data_root", str(root),
                                        "--output_dir", str(tmp_path / "run")]))
    assert_one_line(capsys, code, "cannot read image ")


@pytest.mark.parametrize("flag, spec", [("--sudoku", "puzzles/missing.txt"), ("--sudoku", "."),
                                        ("--maze", "missing.txt"), ("--maze", ".")])
def test_a_missing_puzzle_file_is_refused_before_torch_loads(flag, spec, tmp_path):
    """Issue 73: a missing --sudoku/--maze file (or a folder) took 2-5 s to be refused, after torch's import and the
    device's choice; now one line and exit 2 with torch never imported (a fresh process)."""
    code = ("import sys, solve; code = solve.main([{!r}, {!r}, '--out', {!r}]); "
            "print('exit', code, 'torch' in sys.modules)").format(flag, spec, str(tmp_path / "out"))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip().splitlines()[-1] == "exit 2 False", done.stdout + done.stderr
    assert done.stderr.count("error:") == 1 and spec in done.stderr and not (tmp_path / "out").exists()


def test_a_reader_that_leaves_ends_the_command_quietly(tmp_path):
    """``solve.py ... | head -1``: the reader closes the pipe while the command still prints. The command ends as a
    shell's does (exit 141, 128 + SIGPIPE), with no traceback, through the exit the solving commands take."""
    code = ("from utils.run.main import cli_main, exit_skipping_teardown\n"
            "exit_skipping_teardown(cli_main(lambda: [print('answer line', i, flush=True) for i in range(10**6)]))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "answer line 0\n"
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == "", err


def test_the_skipped_teardown_delivers_every_line_printed_and_logged(tmp_path):
    """The solving commands end by ``os._exit`` (``exit_skipping_teardown``), skipping torch's teardown: what was
    printed without a flush, and a log line to a file, still arrive whole, with the command's exit code."""
    log_file = tmp_path / "run.log"
    code = ("import logging, sys\n"
            f"logging.basicConfig(filename={str(log_file)!r}, level=logging.INFO)\n"
            "from utils.run.main import exit_skipping_teardown\n"
            "logging.info('logged last'); print('printed, not flushed', end=''); sys.stderr.write('said')\n"
            "exit_skipping_teardown(3)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "printed, not flushed", "said")
    assert log_file.read_text().strip().endswith("logged last")
