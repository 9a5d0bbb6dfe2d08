"""The benchmarks' table code (on tiny models, no timing asserted) and the wall-time fields they read from pretrain.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pretrain
from tests.test_pretrain_trm import trm
from utils.checkpoint import safe_load
from utils.device import select_dtype

ROOT = Path(__file__).resolve().parent.parent


# Runs a script as `python SCRIPT ARGS...` would, then prints whether torch was imported: a script answers a bad
# command line before it loads torch (seconds on a small machine).
TORCH_PROBE = """
import os, runpy, sys
sys.argv, sys.path[0] = sys.argv[1:], os.path.dirname(sys.argv[1])
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("torch loaded:", "torch" in sys.modules)
"""


def refused_in_a_fresh_interpreter(name, *argv):
    """scripts/``name`` run with ``argv`` under :data:`TORCH_PROBE` in a new process (exit code, stdout, stderr)."""
    return subprocess.run([sys.executable, "-c", TORCH_PROBE, str(ROOT / "scripts" / name), *argv],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def in_process(main, *argv, capsys):
    """A script's ``main(argv)`` called in this process, where torch is loaded already (a new interpreter would spend
    seconds importing it): its exit code and output, as a subprocess would give them."""
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code or 0, captured.out, captured.err)


def swiglu_width(hidden, expansion):
    return -(-round(expansion * hidden * 2 / 3) // 256) * 256  # rounded up to a multiple of 256


def test_step_benchmark_counts_the_matmul_flops_of_a_training_step_and_prints_its_table(capsys):
    from scripts import benchmark_step

    tiny = ["arch.hidden_size=32", "arch.expansion=2", "arch.H_cycles=2", "arch.L_cycles=1", "arch.puzzle_emb_ndim=32",
            "arch.puzzle_emb_len=1"]
    out = in_process(benchmark_step.main, "--device", "cpu", "--models", "trm_cpu", "--no-compile", "--rounds", "1",
                     "--warmup", "1", "--batch-size", "2", "--gemm-size", "64", "--json", "--dtype", "float32", *tiny,
                     capsys=capsys)
    assert out.returncode == 0, out.stderr
    rows = {r["model"]: r for r in map(json.loads, (ln for ln in out.stdout.splitlines() if ln.startswith("{")))}
    assert set(rows) == {"trm_cpu"} and rows["trm_cpu"]["batch"] == 2
    assert rows["trm_cpu"]["dtype"] == "float32" and "precision float32 (forced by forward_dtype)" in out.stdout

    # TRM-MLP by hand: 2 blocks (sequence-axis SwiGLU over T = 81 cells + 1 prefix, hidden-axis SwiGLU); one segment
    # runs H_cycles x (L_cycles + 1) = 4 forward calls, the last recursion's 2 calls are backpropagated (2 matmuls
    # per forward one: input and weight gradients); lm_head runs on all T positions, q_head on position 0.
    d, t, vocab, layers = 32, 82, 11, 2
    block = 6 * d * t * swiglu_width(t, 2) + 6 * t * d * swiglu_width(d, 2)  # SwiGLU: 3 matmuls of 2*m*n*k
    expected = (4 + 2 * 2) * layers * block + 3 * (2 * t * d * vocab) + 3 * (2 * d * 2)
    assert rows["trm_cpu"]["flops_per_step"] == 2 * expected
    table = out.stdout[out.stdout.index("| model |"):].splitlines()
    assert table[0].split(" | ")[-1] == "eager of peak |" and len(table) == 3  # no compiled columns with --no-compile
    assert table[2].startswith(f"| trm_cpu | cfg_pretrain_trm_cpu | 0.18M | 2 | {rows['trm_cpu']['dtype']} | 0.13 |")
    assert "CPU " in out.stdout and "bf16 features" in out.stdout


def test_step_benchmark_profiles_where_a_step_spends_its_time(capsys):
    from scripts import benchmark_step

    out = in_process(benchmark_step.main, "--device", "cpu", "--models", "trm_cpu", "--no-compile", "--profile", "1",
                     "--warmup", "1", "--batch-size", "2", "arch.hidden_size=32", "arch.H_cycles=2", "arch.L_cycles=1",
                     capsys=capsys)
    assert out.returncode == 0, out.stderr
    dtype = str(select_dtype(torch.device("cpu"))[0]).removeprefix("torch.")  # bf16 on AVX512-BF16/AMX, else fp32
    assert "1 profiled steps per model" in out.stdout and f"trm_cpu (eager, batch 2, {dtype}): " in out.stdout
    report = out.stdout[out.stdout.index("trm_cpu (eager"):].splitlines()
    assert report[1].startswith("  CPU busy ") and report[2].startswith("  GEMM ")  # utils/step_profile.py's findings
    # AdamATan2 reads each tensor's step count on the host: a CPU tensor's, so no GPU would wait for it
    assert report[3].startswith("  value reads per step: ") and "at utils/optimizer_utils.py:" in report[4]
    kernels = report[report.index("    share  ms/step  calls/step  name") + 1:]
    assert any(line.endswith(" aten::mm") for line in kernels) and "| model |" not in out.stdout


def test_step_benchmark_rejects_an_unknown_model():
    out = refused_in_a_fresh_interpreter("benchmark_step.py", "--models", "gpt")
    assert out.returncode == 2 and out.stderr.startswith("error: --models: unknown gpt")
    assert out.stdout == "torch loaded: False\n"


def test_attention_benchmark_times_each_kernel_and_checks_it_against_float64(capsys):
    from scripts import benchmark_attention

    out = in_process(benchmark_attention.main, "--shape", "2,2,9,8", "--rounds", "2", "--warmup", "1", capsys=capsys)
    assert out.returncode == 0, out.stderr
    rows = [ln.split(" | ") for ln in out.stdout.splitlines() if ln.startswith("| SDPA") or ln.startswith("| the")]
    assert [r[0] for r in rows] == ["| SDPA on bf16 (baseline)", "| SDPA on fp32 copies",
                                    "| the project's (models.layers.sdpa)"]
    assert rows[0][2] == rows[0][4] == "1.00x"
    assert all(float(r[5]) < 2e-2 and float(r[6].rstrip(" |")) < 5e-2 for r in rows)
    assert "[B, H, S, D] = [2, 2, 9, 8]" in out.stdout and "bf16 features" in out.stdout
    bad = in_process(benchmark_attention.main, "--shape", "2,2,9", capsys=capsys)
    assert bad.returncode == 2 and "give batch,heads,seq_len,head_dim" in bad.stderr


def test_a_step_worker_serves_timed_steps_of_its_own_process_and_counts_its_flops(monkeypatch):
    from scripts import benchmark_step
    from scripts.benchmark_step import Worker

    monkeypatch.setattr(benchmark_step, "ROUND_S", 1e-3)  # one step a timing, not 2 s of them
    worker = Worker("eager", [str(ROOT / "scripts" / "benchmark_step.py"), "--worker", "--models", "trm_cpu",
                              "--no-compile", "--batch-size", "2", "--warmup", "1", "arch.hidden_size=32",
                              "arch.H_cycles=2", "arch.L_cycles=1"])
    try:
        assert worker.info["params"] > 0 and worker.info["flops"] > 0 and worker.info["step_s"] > 0
        assert worker.steps >= 1 and worker.seconds_per_step() > 0
    finally:
        worker.close()
    assert worker.proc.returncode == 0


def test_side_by_side_table_gives_the_ceiling_a_step_at_the_gemm_rate_would_reach():
    from scripts.benchmark_step import format_side_by_side

    row = {"model": "trm_mlp", "params": 5, "reference_params": 5, "batch": 64, "dtype": "bfloat16",
           "eager_examples_s": 11.0, "compiled_examples_s": 12.0, "reference_examples_s": 10.0,
           "reference_compiled_examples_s": 10.5, "compiled_vs_reference": 1.2, "compiled_vs_reference_compiled": 1.14,
           "compiled_of_peak": 0.75, "reference_of_peak": 0.625}
    head, _, cells = (line.strip("| ").split(" | ") for line in format_side_by_side([row]).splitlines())
    table = dict(zip(head, cells))
    # the reference at 62.5% of the GEMM rate: a step with no elementwise work would be 1 / 0.625 = 1.6x it
    assert table["ceiling vs reference eager"] == "1.60x" and table["reference eager of peak"] == "62%"


def test_side_by_side_needs_a_reference_checkout_and_trm_models(tmp_path, capsys):
    from scripts import benchmark_step

    out = in_process(benchmark_step.main, "--reference-dir", str(tmp_path), capsys=capsys)
    assert out.returncode == 2 and "no models/recursive_reasoning/trm.py there" in out.stderr
    (tmp_path / "models" / "recursive_reasoning").mkdir(parents=True)
    (tmp_path / "models" / "recursive_reasoning" / "trm.py").write_text("")
    out = in_process(benchmark_step.main, "--reference-dir", str(tmp_path), "--models", "hrm_cpu", capsys=capsys)
    assert out.returncode == 2 and "hrm_cpu is not a TRM model" in out.stderr
    out = refused_in_a_fresh_interpreter("reference_trm.py", "--reference-dir", str(tmp_path / "nowhere"),
                                         "step-worker", "--arch", "{}")
    assert out.returncode == 2 and out.stderr.startswith("error: --reference-dir") and "Traceback" not in out.stderr
    assert out.stdout == "torch loaded: False\n"


def test_reference_settings_changes_are_checked_before_any_work(tmp_path, capsys):
    from scripts import reference_trm
    from scripts.reference_trm import REFERENCE_SETTINGS, with_changes

    settings = with_changes(["lr=2e-3", "arch.halt_max_steps=16", "arch.pos_encodings=rope"])
    assert (settings["lr"], settings["arch"]["halt_max_steps"], settings["arch"]["pos_encodings"]) == (2e-3, 16, "rope")
    assert REFERENCE_SETTINGS["lr"] == 1e-3  # the defaults stay as they were
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "dataset.json").write_text("{}")
    for bad in ("lr", "arch.hiden_size=64", "arch=1"):
        out = in_process(reference_trm.main, "--reference-dir", str(tmp_path), "train", "--data-path", str(data),
                         "--out", str(tmp_path / "curve.json"), "--set", bad, capsys=capsys)
        assert out.returncode == 2 and f"--set {bad}: give KEY=VALUE" in out.stderr and "Traceback" not in out.stderr
    for bad in ("{hidden_size: 64}", "[64]"):  # benchmark_step.py writes this JSON; a person may type it
        out = in_process(reference_trm.main, "--reference-dir", str(tmp_path), "step-worker", "--arch", bad,
                         capsys=capsys)
        assert out.returncode == 2 and out.stderr.startswith(f"error: --arch {bad!r}: give a JSON object")


def test_the_reference_gets_the_projects_architecture_in_its_own_keys():
    from scripts.benchmark_step import recipe_arch, reference_arch

    arch, _ = recipe_arch("cfg_pretrain_trm_sudoku_mlp", [])
    ref = reference_arch(arch, torch.bfloat16)
    assert "name" not in ref and "loss" not in ref and ref["forward_dtype"] == "bfloat16"
    assert {k: ref[k] for k in ("hidden_size", "H_cycles", "L_cycles", "mlp_t", "puzzle_emb_len")} == {
        "hidden_size": 512, "H_cycles": 3, "L_cycles": 6, "mlp_t": True, "puzzle_emb_len": 16}


def test_pretrain_logs_wall_time_and_a_resume_continues_it(sudoku_dir, tmp_path):
    run = tmp_path / "run"
    assert pretrain.main(trm(sudoku_dir, run, "epochs=2", "eval_interval=1")) == 0
    points = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [p["eval/elapsed_s"] for p in points if "eval/accuracy" in p]
    trains = [p["train/elapsed_s"] for p in points if "train/lm_loss" in p]
    assert len(evals) == 2 and 0 < evals[0] < evals[1] and trains == sorted(trains) and trains[0] > 0
    saved = safe_load(run / "step_8.pt")["clock"]["elapsed_s"]
    assert saved >= evals[-1]  # the checkpoint follows the evaluation

    assert pretrain.main(trm(sudoku_dir, run, "epochs=4", "eval_interval=1", "resume=auto")) == 0
    points = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    resumed = [p["eval/elapsed_s"] for p in points if "eval/accuracy" in p and p["step"] > 8]
    assert resumed and min(resumed) > saved  # counted on from the checkpoint, not from zero


def results_file(tmp_path):
    evals = [{"step": s, "eval/elapsed_s": t, "eval/blank_accuracy": b, "eval/exact_accuracy": e, "eval/count": 256}
             for s, t, b, e in [(100, 70.0, 0.5, 0.0), (200, 130.0, 0.9, 0.25), (300, 250.0, 0.975, 0.875)]]
    run = {"label": "TRM", "recipe": "cfg_pretrain_trm_cpu", "compiled": True, "last_step": 300, "wall_s": 255.0,
           "stopped_at_budget": False, "median_examples_per_s": 150.0, "evals": evals}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"task": "sudoku", "minutes": 5, "machine": "CPU test", "results": [run]}))
    return path


def test_quickstart_table_shows_the_last_evaluation_finished_by_each_checkpoint(tmp_path, capsys):
    from scripts import benchmark_quickstart

    out = in_process(benchmark_quickstart.main, "--report", str(results_file(tmp_path)), "--checkpoints", "1,2,3,4.5",
                     capsys=capsys)
    assert out.returncode == 0, out.stderr
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("| ") and "min |" in ln]
    assert rows == ["| 1 min | no eval yet |",            # the first evaluation ended at 70 s
                    "| 2 min | 0.500 / 0.000 (100) |",    # 130 s is past 2 min
                    "| 3 min | 0.900 / 0.250 (200) |",
                    "| 4.5 min | 0.975 / 0.875 (300) |"]
    assert "final eval at 250 s on 256 puzzles: blank 0.975, exact 0.875" in out.stdout


def test_quickstart_accepts_the_exit_status_of_a_run_it_stopped_at_the_budget():
    from scripts.benchmark_quickstart import finished_as_asked

    assert finished_as_asked(0, stopped=False) and finished_as_asked(0, stopped=True)
    assert finished_as_asked(143, stopped=True)  # SIGTERM at the budget: checkpoint, then 128 + 15
    assert not finished_as_asked(143, stopped=False)  # a SIGTERM the benchmark did not send
    assert not finished_as_asked(1, stopped=True) and not finished_as_asked(2, stopped=False)


def test_a_quickstart_benchmark_left_early_ends_the_training_it_started(tmp_path, monkeypatch):
    """A benchmark stopped while its run trains (here an error from its wait; in the flag tests, their clock) ends
    that run: before, the trainer went on, orphaned, for its whole recipe. A sleeping process stands in for it."""
    from scripts import benchmark_quickstart

    started, real_popen = [], subprocess.Popen

    def popen(command, **kwargs):
        started.append(real_popen([sys.executable, "-c", "import time; time.sleep(600)"], **kwargs))
        return started[-1]

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmark_quickstart.subprocess, "Popen", popen)
    monkeypatch.setattr(benchmark_quickstart.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        benchmark_quickstart.run_recipe("TRM", "cfg_pretrain_trm_cpu", (), tmp_path / "data", tmp_path, 60.0)
    assert len(started) == 1 and started[0].poll() is not None


def test_quickstart_bad_input_is_one_error_line(tmp_path, capsys):
    from scripts import benchmark_quickstart

    bad = tmp_path / "results.json"
    bad.write_text("{}")
    out = refused_in_a_fresh_interpreter("benchmark_quickstart.py", "--report", str(bad))
    assert out.returncode == 2 and out.stderr.startswith(f"error: --report {bad}: not a results.json")
    assert out.stdout == "torch loaded: False\n"  # a bad file is answered before torch loads (seconds)
    out = in_process(benchmark_quickstart.main, "--runs", "GPT", capsys=capsys)
    assert out.returncode == 2 and "unknown GPT" in out.stderr


def test_cape_learning_table_gives_the_ratio_to_the_copy_support_baseline_and_whether_pck_rose():
    from scripts.benchmark_cape_learning import report

    val = [{"epoch": e + 1, "val/elapsed_s": 60.0 * (e + 1), "val/PCK@0.2_percent": p,
            "val/copy_support_PCK@0.2_percent": 40.0}
           for e, p in enumerate([30.0, 50.0, 60.0])]
    test = {"test/PCK@0.2_percent": 58.0, "test/copy_support_PCK@0.2_percent": 29.0}
    lines = report([{"train/loss": 1.0}, *val, test]).splitlines()
    assert lines[1].split() == ["1", "1.0", "30.00", "40.00", "0.75"]
    assert lines[3].split() == ["3", "3.0", "60.00", "40.00", "1.50"]
    assert lines[4] == "val (unseen categories): first 30.00, best 60.00, last 60.00; rising"
    assert lines[5] == "test (unseen categories): PCK@0.2 58.00, copy-support 29.00, ratio 2.00"
    assert report(val[:1]).splitlines()[-1].endswith("NOT rising")


def test_cape_learning_refuses_a_used_output_folder(tmp_path):
    (tmp_path / "old.txt").write_text("keep me")
    out = refused_in_a_fresh_interpreter("benchmark_cape_learning.py", "--output-dir", str(tmp_path))
    assert out.returncode == 2 and f"--output-dir {tmp_path} is not an empty folder" in out.stderr
    assert out.stdout == "torch loaded: False\n"
    assert (tmp_path / "old.txt").read_text() == "keep me"


def test_paired_median_pairs_the_rounds_a_ratio_of_medians_would_not():
    from utils.bench import paired_median, paired_ratio

    # rounds 1 and 2 say 0.5x (round 2 on a slow spell); round 3 caught the baseline alone in a fast one. Paired:
    # 0.5x; the ratio of the medians would say 1.5x (3 against 2)
    ours, baseline = [1.0, 8.0, 3.0], [2.0, 16.0, 1.0]
    assert paired_median(ours, baseline) == 0.5 and paired_ratio(ours, baseline) == "0.50x"
    assert paired_median([1.0, 4.0, 2.0], [2.0, 2.0, 2.0]) == 1.0  # ratios 0.5, 2, 1: the middle one


# ---- fault campaign 5 ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag,value", [("--segments", ""), ("--segments", ","), ("--rollouts", "2,0"),
                                        ("--segments", "1,x"), ("--max-examples", "-5"), ("--max-examples", "0")])
def test_campaign5_p23_test_time_counts_that_are_not_counts_are_one_line(tmp_path, capsys, flag, value):
    from scripts import benchmark_test_time

    with pytest.raises(SystemExit) as info:  # the arguments are read before the checkpoint is looked for
        benchmark_test_time.main(["--checkpoint", str(tmp_path / "none"), "--device", "cpu", flag, value])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert f"argument {flag}: " in err and ("give a whole number of 1 or more" in err or
                                            "give whole numbers of 1 or more" in err), err


@pytest.mark.parametrize("flags,fragment", [(["--min-seconds", "0"], "--min-seconds 0.0 is out of range"),
                                            (["--repeats", "0"], "--repeats 0 is out of range"),
                                            (["--rollouts", "0"], "give rollout counts from 1 to 1024")])
def test_passes_benchmark_refuses_a_bad_setting_in_one_line(capsys, flags, fragment):
    from scripts import benchmark_passes

    out = in_process(benchmark_passes.main, *flags, capsys=capsys)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and fragment in out.stderr, out.stderr


@pytest.mark.parametrize("module, argv", [("scripts.benchmark_attention", ["--rounds", "x"]),
                                          ("scripts.benchmark_optimizers", ["--bogus"]),
                                          ("utils.hardware_optimizer", ["--bogus"]),
                                          ("utils.optimizer_utils", ["--bogus"])])
def test_the_report_and_benchmark_commands_refuse_a_bad_flag_in_one_line(module, argv, capsys):
    import importlib

    out = in_process(importlib.import_module(module).main, *argv, capsys=capsys)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: ") and "--help)" in out.stderr
