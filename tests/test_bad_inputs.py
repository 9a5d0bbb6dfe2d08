"""Every setting and command-line flag, driven with bad values: 0, negative, the wrong type, absurdly large, a
missing path. Each must end with exit code 2 and one ``error:`` line, never a traceback."""

import pytest

import evaluate
import pretrain
from utils.data.sudoku import main as build_sudoku_main
from utils.run.main import cli_main

BASE = ["--config-name=cfg_pretrain_cpu", "compile=false", "arch.hidden_size=32", "arch.num_heads=2", "arch.H_layers=1",
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
    (["--checkpoint", "{dir}"], "is a directory"),
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
    assert_one_line(capsys, exit_code(lambda: evaluate.main([f.format(**paths) for f in flags])), fragment)


@pytest.mark.parametrize("flags,fragment", [
    (["--generate", "--train-size", "0"], "--train-size must be >= 1, got 0"),
    (["--generate", "--train-size", "lots"], "argument --train-size: invalid int value: 'lots'"),
    (["--generate", "--test-size", "-1"], "--test-size must be >= 1, got -1"),
    (["--generate", "--num-aug", "-1"], "--num-aug must be >= 0, got -1"),
    (["--generate", "--min-blanks", "99"], "--min-blanks must be in [0, 64]"),
    (["--generate", "--workers", "0"], "--workers must be >= 1, got 0"),
    (["--source-dir", "{missing}"], "not found"),
    (["--generate", "--source-dir", "{missing}"], "choose exactly one source"),
    ([], "choose exactly one source"),
])
def test_sudoku_builder_flag(tmp_path, capsys, flags, fragment):
    argv = [f.format(missing=tmp_path / "missing") for f in flags] + ["--output-dir", str(tmp_path / "out")]
    assert_one_line(capsys, exit_code(lambda: cli_main(lambda: build_sudoku_main(argv) and 0)), fragment)
