"""Accuracy against wall time: the TRM and HRM CPU quickstarts on the same held-out puzzles, one after the other.

Each recipe runs as a user runs it (python pretrain.py --config-name=<recipe>), on the same dataset
(the TRM recipe's, built first if it is missing; its build time is reported apart), with a fresh
torch.compile cache so compilation counts as it does on a first run. A run that is still going when
the budget is up is stopped there (SIGTERM: it finishes the step and checkpoints). The table gives, at
each wall-time checkpoint, the last evaluation that had finished by then (its blank-cell and exact
accuracy on the held-out puzzles, and its step), from the runs' metrics.jsonl (eval/elapsed_s counts
from the start of pretrain.py's train(); imports take a few seconds more and are reported).

Tasks:
  sudoku  cfg_pretrain_trm_cpu against cfg_pretrain_cpu on generated 40-blank Sudoku (256 held out), 10 min
  maze    cfg_pretrain_trm_maze_cpu against cfg_pretrain_cpu on generated 10x10 mazes (held out), 15 min

The machine's 1-minute load average is printed before each run: on a shared machine, numbers measured
under load are slower than the machine can do.

    python scripts/benchmark_quickstart.py                          # Sudoku, TRM then HRM, 10 min each
    python scripts/benchmark_quickstart.py --task maze --runs TRM   # maze, TRM only, 15 min
    python scripts/benchmark_quickstart.py --minutes 4 --checkpoints 1,2,3,4
    python scripts/benchmark_quickstart.py --report runs/benchmark_sudoku_<time>/results.json --checkpoints 1,3,5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402
from tqdm import tqdm  # noqa: E402

from utils.cli import ArgumentParser, number_in  # noqa: E402
from utils.config import recipe_config  # noqa: E402
from utils.data.builders import build_dataset  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.run.metrics import read_points  # noqa: E402
from utils.run.stop import signal_exit_code  # noqa: E402


@dataclass(frozen=True)
class Task:
    """The recipes compared on one task: ``runs`` maps a label to (recipe, extra key=value settings)."""

    data_recipe: str
    runs: dict[str, tuple[str, tuple[str, ...]]]
    minutes: float
    checkpoints: tuple[float, ...]
    notes: dict[str, str] = field(default_factory=dict)


# The HRM quickstart evaluates twice in its 80 epochs; every 8 epochs here, so each checkpoint has a
# recent evaluation (4 segments on 256 puzzles: a few seconds each). Its schedule is unchanged on Sudoku; on
# mazes its 80 epochs of 24,000 mazes would not reach a first evaluation in 15 minutes, so it takes TRM's, and
# TRM's 8 dihedral views at evaluation, so both are scored with the same test-time voting.
TASKS = {
    "sudoku": Task("cfg_pretrain_trm_cpu",
                   {"TRM": ("cfg_pretrain_trm_cpu", ()), "HRM": ("cfg_pretrain_cpu", ("eval_interval=8",))},
                   minutes=10, checkpoints=(2, 4, 6, 8, 10),
                   notes={"HRM": "eval_interval=8 (the recipe: 40) for a point near each checkpoint"}),
    "maze": Task("cfg_pretrain_trm_maze_cpu",
                 {"TRM": ("cfg_pretrain_trm_maze_cpu", ()),
                  "HRM": ("cfg_pretrain_cpu", ("epochs=5", "eval_interval=1", "eval_views=8"))},
                 minutes=15, checkpoints=(6, 9, 12, 14, 15),  # TRM's first evaluation is after epoch 3
                 notes={"HRM": "the Sudoku quickstart's HRM on the maze data with the TRM recipe's 5 epochs of its "
                               "24,000 mazes, evaluated after each with its 8 dihedral views"}),
}


class BenchmarkError(UserError):
    """A run failed or its output could not be read."""


def ensure_data(recipe: str) -> tuple[Path, float | None]:
    """The recipe's dataset, built with its ``dataset_builder`` when missing; returns (path, build seconds or None)."""
    cfg = recipe_config(recipe)
    path = ROOT / (cfg.data_paths[0] if cfg.data_paths else cfg.data_path)
    if (path / "train" / "dataset.json").is_file():
        return path, None
    if cfg.dataset_builder is None:
        raise BenchmarkError(f"{path} holds no dataset and {recipe} has no dataset_builder to build it")
    start = time.perf_counter()
    build_dataset(path, cfg.dataset_builder)
    return path, time.perf_counter() - start



def run_recipe(label: str, recipe: str, extra: tuple[str, ...], data: Path, out: Path, budget_s: float) -> dict:
    """Run ``pretrain.py`` on ``recipe`` for at most ``budget_s`` seconds; return what the table needs.

    Raises:
        BenchmarkError: the run exited with an error (its last output lines are in the message).
    """
    run_dir = out / label
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(out / f"{label}_compile_cache"))
    command = [sys.executable, str(ROOT / "pretrain.py"), f"--config-name={recipe}", f"data_path={data}",
               f"checkpoint_path={run_dir}", *extra]
    log_path = out / f"{label}.log"
    print(f"\n{label}: {' '.join(command[1:])}\n  1-minute load before the run: {os.getloadavg()[0]:.2f}; log: {log_path}",
          flush=True)
    start = time.perf_counter()
    with open(log_path, "w") as log, tqdm(total=round(budget_s), desc=label, unit="s", dynamic_ncols=True) as bar:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        stopped = False
        try:
            while proc.poll() is None:
                if time.perf_counter() - start >= budget_s and not stopped:
                    proc.send_signal(signal.SIGTERM)  # the trainer finishes the step and checkpoints
                    stopped = True
                time.sleep(1)
                bar.n = min(round(time.perf_counter() - start), bar.total)
                bar.set_postfix_str(last_eval_text(run_dir), refresh=True)
        finally:  # left early (SIGTERM, an error): the run must not go on training, orphaned, for its whole recipe
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait()
        code = proc.returncode
    wall = time.perf_counter() - start
    if not finished_as_asked(code, stopped):
        tail = "; ".join(log_path.read_text(errors="replace").strip().splitlines()[-3:])
        raise BenchmarkError(f"{label} ({recipe}) exited with code {code}: {tail} (full log: {log_path})")
    points = read_points(run_dir / "metrics.jsonl")
    evals = [p for p in points if "eval/elapsed_s" in p]
    train = [p for p in points if "train/elapsed_s" in p]
    speeds = sorted(p["train/examples_per_s"] for p in train)
    decision = OmegaConf.load(run_dir / "plan.yaml")["decisions"]["torch.compile"]["value"]
    compiled = decision == "on" and "torch.compile failed" not in log_path.read_text(errors="replace")
    result = {"label": label, "recipe": recipe, "extra": list(extra), "wall_s": wall, "stopped_at_budget": stopped,
              "compiled": compiled, "evals": evals, "last_step": max((p["step"] for p in points), default=0),
              "median_examples_per_s": speeds[len(speeds) // 2] if speeds else None}
    return result


def finished_as_asked(code: int, stopped: bool) -> bool:
    """Whether a run's exit status is a success: 0, or SIGTERM's 143 when the budget stopped it (a stopped run
    checkpoints and exits with 128 + the signal's number, utils/run/stop.py)."""
    return code == 0 or (stopped and code == signal_exit_code(signal.SIGTERM))


def last_eval_text(run_dir: Path) -> str:
    """The newest evaluation in ``run_dir``'s metrics.jsonl, briefly (for the progress bar)."""
    path = run_dir / "metrics.jsonl"
    lines = [ln for ln in path.read_text().splitlines() if '"eval/elapsed_s"' in ln] if path.is_file() else []
    if not lines:
        return "no eval yet"
    try:
        p = json.loads(lines[-1])
    except json.JSONDecodeError:  # the trainer is writing the line right now
        return "evaluating"
    return f"step {p['step']}: blank {p['eval/blank_accuracy']:.3f}, exact {p['eval/exact_accuracy']:.3f}"


def at_checkpoint(evals: list[dict], seconds: float) -> dict | None:
    """The last evaluation finished by ``seconds`` of wall time, or None."""
    done = [p for p in evals if p["eval/elapsed_s"] <= seconds]
    return done[-1] if done else None


def format_table(results: list[dict], checkpoints: tuple[float, ...]) -> str:
    """A Markdown table: one row per checkpoint, blank-cell / exact accuracy (and step) per run."""
    head = ["wall time"] + [f"{r['label']} blank / exact (step)" for r in results]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for minutes in checkpoints:
        cells = [f"{minutes:g} min"]
        for r in results:
            p = at_checkpoint(r["evals"], minutes * 60)
            cells.append("no eval yet" if p is None else
                         f"{p['eval/blank_accuracy']:.3f} / {p['eval/exact_accuracy']:.3f} ({p['step']})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    summary, details = __doc__.split("\n\n", 1)
    parser = ArgumentParser(description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASKS), default="sudoku", help="what to compare on (default: sudoku)")
    parser.add_argument("--runs", default=None, help="comma list of run labels, e.g. TRM (default: all of the task's)")
    parser.add_argument("--minutes", type=number_in(0, 7 * 24 * 60, low_open=True), default=None, help="wall-time budget per run (default: the task's)")
    parser.add_argument("--checkpoints", default=None, help="comma list of minutes for the table (default: the task's)")
    parser.add_argument("--out", default=None, help="output folder, new or empty (default: runs/benchmark_<task>_<time>)")
    parser.add_argument("--report", type=Path, default=None,
                        help="print the tables of an earlier benchmark's results.json instead of running one")
    args = parser.parse_args(argv)
    task = TASKS[args.task]
    args.runs = args.runs.split(",") if args.runs else list(task.runs)
    unknown = [r for r in args.runs if r not in task.runs]
    if unknown:
        parser.error(f"--runs: unknown {', '.join(unknown)}; the {args.task} task has {', '.join(task.runs)}")
    try:
        args.checkpoints = tuple(float(m) for m in args.checkpoints.split(",")) if args.checkpoints else None
    except ValueError:
        parser.error(f"--checkpoints must be a comma list of minutes, got {args.checkpoints!r}")
    if (args.minutes is not None and args.minutes <= 0) or min(args.checkpoints or [1]) <= 0:
        parser.error("--minutes and --checkpoints must be > 0")
    args.out = Path(args.out or ROOT / "runs" / f"benchmark_{args.task}_{time.strftime('%Y%m%d-%H%M%S')}")
    if not args.report and args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        parser.error(f"--out {args.out} is not an empty folder: name a new folder")
    return args


def print_report(saved: dict, checkpoints: tuple[float, ...], minutes: float) -> None:
    """The tables of a benchmark (as ``results.json`` holds it)."""
    results, task = saved["results"], TASKS[saved["task"]]
    print(f"\n{saved['task']}: accuracy on the held-out puzzles at equal wall time ({minutes:g} min budget each; "
          "the last evaluation finished by each checkpoint)\n" + saved["machine"])
    print(format_table(results, checkpoints))
    for r in results:
        note = task.notes.get(r["label"])
        final = r["evals"][-1] if r["evals"] else None
        print(f"- {r['label']}: {r['recipe']}, compile {'on' if r['compiled'] else 'off'}, {r['last_step']} steps in "
              f"{r['wall_s']:.0f} s{' (stopped at the budget)' if r['stopped_at_budget'] else ''}, median "
              f"{r['median_examples_per_s'] or 0:.0f} examples/s"
              + (f"; final eval at {final['eval/elapsed_s']:.0f} s on {final['eval/count']:.0f} puzzles: blank "
                 f"{final['eval/blank_accuracy']:.3f}, exact {final['eval/exact_accuracy']:.3f}" if final else "")
              + (f"; {note}" if note else ""))


def read_results(path: Path) -> dict:
    """A ``results.json`` written by this script.

    Raises:
        BenchmarkError: the file is missing or not one.
    """
    try:
        saved = json.loads(path.read_text())
        if saved["task"] not in TASKS or not all({"label", "evals"} <= set(r) for r in saved["results"]):
            raise KeyError("task/results")
        return saved
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BenchmarkError(f"--report {path}: not a results.json of this script ({type(e).__name__}: {e})") from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from utils.run.main import cli_main

    def body() -> int:
        if args.report:  # tables from a file: no torch (--help, a bad flag and a bad file are answered without it)
            saved = read_results(args.report)
            task = TASKS[saved["task"]]
            print_report(saved, args.checkpoints or task.checkpoints, saved.get("minutes", task.minutes))
            return 0
        from utils.hardware_optimizer import machine_line

        task = TASKS[args.task]
        minutes, checkpoints = args.minutes or task.minutes, args.checkpoints or task.checkpoints
        args.out.mkdir(parents=True, exist_ok=True)
        data, build_s = ensure_data(task.data_recipe)
        print(machine_line())
        print(f"data: {data}" + (f" (built in {build_s:.1f} s, not counted in the runs)" if build_s is not None
                                 else " (already built)"))
        results = [run_recipe(label, *task.runs[label], data, args.out, minutes * 60) for label in args.runs]
        saved = {"task": args.task, "minutes": minutes, "data": str(data), "build_s": build_s, "machine": machine_line(),
                 "results": results}
        (args.out / "results.json").write_text(json.dumps(saved, indent=1))
        print_report(saved, checkpoints, minutes)
        print(f"results: {args.out / 'results.json'}")
        return 0

    return cli_main(body)


if __name__ == "__main__":
    sys.exit(main())
