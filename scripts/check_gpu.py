"""Check every CUDA path of the project on this machine, each in a few steps, one line each.

    python scripts/check_gpu.py                      # every check, four at a time: a few minutes on one GPU
    python scripts/check_gpu.py --only adam,resume   # some of them (--list names them all)

Each check runs the project's own command, as a user types it, on a tiny problem (generated Sudoku, a synthetic
MP-100) and reads its outcome: ``ok`` with its time, or ``FAILED`` with the last line the command printed. The
first line names the GPU, its driver, and the torch, CUDA and cuDNN versions. The exit code is 0 when every check
is ok, 1 otherwise, and 1 with one line where there is no NVIDIA GPU (nothing is checked then).

``--device cpu`` rehearses the checks on the CPU (for testing this script; the CUDA-only checks are skipped).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from utils.data.sudoku import build_dataset  # noqa: E402
from utils.data.synthetic_cape import build as build_cape  # noqa: E402
from utils.device import cpu_name  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.run.main import ArgumentParser, cli_main  # noqa: E402

TIMEOUT_S = 300
SUDOKU = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
TINY = ["--config-name=cfg_pretrain_cpu", "arch.hidden_size=64", "arch.num_heads=2", "arch.H_layers=1",
        "arch.L_layers=1", "arch.halt_max_steps=2", "arch.expansion=2", "global_batch_size=32", "epochs=2",
        "eval_interval=1", "log_interval=4", "lr_warmup_steps=2"]
TRM = ["arch=trm", "arch.L_layers=1", "arch.H_cycles=2", "arch.L_cycles=2", "arch.puzzle_emb_len=1"]
CAPE = ["--model", "capeformer_lite", "--hidden_dim", "32", "--num_heads", "4", "--image_size", "64", "--shots", "1",
        "--queries", "2", "--eval_queries", "2", "--val_episodes_per_category", "1", "--test_episodes_per_category",
        "1", "--batch_size", "2", "--accumulation_steps", "1", "--epochs", "1", "--episodes_per_epoch", "8"]


@dataclass
class Context:
    """What the checks share: the device, the interpreter, a scratch folder with the tiny datasets."""

    device: str
    work: Path
    sudoku: Path
    cape: Path

    def run(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``python argv`` from the repository, the output captured."""
        return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


class Ok(str):
    """A check's result when all is well but worth a word (the result is None when there is nothing to add)."""


@dataclass(frozen=True)
class Check:
    """One line of the report: ``run(ctx)`` returns None (or an :class:`Ok` note) when all is well, else what went
    wrong; ``after`` names the checks whose output it uses; ``cuda_only`` checks are skipped on the CPU."""

    name: str
    what: str
    run: Callable[[Context], str | None]
    after: tuple[str, ...] = ()
    cuda_only: bool = False


def last_line(done: subprocess.CompletedProcess) -> str:
    """The last non-empty line a command printed (its error, for a failed one), with its exit code."""
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return f"exit {done.returncode}: {lines[-1].strip() if lines else '(no output)'}"


def expect(done: subprocess.CompletedProcess, *needles: str) -> str | None:
    """None when ``done`` exited 0 and printed every needle, else what is missing."""
    if done.returncode != 0:
        return last_line(done)
    missing = [n for n in needles if n not in done.stdout + done.stderr]
    return f"did not print {missing[0]!r}" if missing else None


def pretrain(ctx: Context, run: str, *extra: str, needles: tuple[str, ...] = ()) -> str | None:
    return expect(ctx.run(["pretrain.py", *TINY, f"data_path={ctx.sudoku}", f"device={ctx.device}",
                           f"checkpoint_path={ctx.work / run}", *extra]), *needles)


def precision_needles(ctx: Context) -> tuple[str, ...]:
    return ("precision: bfloat16", "torch.compile: on") if ctx.device == "cuda" else ()


def pytest_gpu(ctx: Context, *selection: str) -> str | None:
    """The suite's GPU-marked tests of ``selection`` (pytest arguments); None when they passed."""
    done = ctx.run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *selection])
    summary = next((line for line in reversed(done.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", line)),
                   last_line(done))
    return None if done.returncode == 0 and "skipped" not in summary else summary


def torchrun(ctx: Context) -> str | None:
    n = max(1, min(2, torch.cuda.device_count()))
    done = ctx.run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), "pretrain.py", *TINY,
                    f"data_path={ctx.sudoku}", f"device={ctx.device}", f"checkpoint_path={ctx.work / 'torchrun'}"])
    problem = expect(done, *(["processes: 2"] if n == 2 else []))
    return problem or (None if n == 2 else Ok("1 process: NCCL between processes needs 2 GPUs"))


CHECKS = [
    Check("hrm", "HRM training, bf16, compile=auto", lambda c: pretrain(c, "hrm", needles=precision_needles(c))),
    Check("trm", "TRM training with EMA, bf16, compile=auto",
          lambda c: pretrain(c, "trm", *TRM, "ema=true", needles=precision_needles(c))),
    Check("evaluate", "evaluate.py on the TRM run",
          lambda c: expect(c.run(["evaluate.py", str(c.work / "trm"), "--device", c.device]), "exact_accuracy"),
          after=("trm",)),
    Check("solve", "solve.py on the TRM run",
          lambda c: expect(c.run(["solve.py", "--checkpoint", str(c.work / "trm"), "--sudoku", SUDOKU, "--device",
                                  c.device, "--out", str(c.work / "solutions")]), "puzzle 1: "), after=("trm",)),
    Check("cape", "CAPE training with --use_amp and 2 DataLoader workers",
          lambda c: expect(c.run(["-m", "models.train_cape_episodic", *CAPE, "--data_root", str(c.cape), "--device",
                                  c.device, "--use_amp", "--num_workers", "2", "--output_dir", str(c.work / "cape")]),
                           "PCK@0.2")),
    Check("torchrun", "torchrun (NCCL with 2 GPUs)", torchrun),
    Check("resume", "deterministic resume compared bitwise (HRM, TRM; fp32, bf16)",
          lambda c: pytest_gpu(c, "tests/test_cuda.py", "-k", "stopped_and_resumed"), cuda_only=True),
    Check("adam", "AdamATan2 against its float64 re-computation (eager, compiled, native when installed)",
          lambda c: pytest_gpu(c, "tests/test_cuda.py", "-k", "adam_atan2"), cuda_only=True),
    Check("installer", "python install_dependencies.py --dry-run",
          lambda c: expect(c.run(["install_dependencies.py", "--dry-run", "--report", str(c.work / "report.json")]),
                           "Plan (dry run")),
    Check("gpu-tests", "the suite's other GPU-marked tests",
          lambda c: pytest_gpu(c, "-k", "not stopped_and_resumed and not adam_atan2"), cuda_only=True),
]


def machine_line(device: str) -> str:
    """The GPU, its driver, torch, CUDA and cuDNN (or the CPU of a rehearsal)."""
    versions = f"torch {torch.__version__}, Python {platform.python_version()}"
    if device != "cuda":
        return f"rehearsal on the CPU ({cpu_name()}), {versions}"
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = "unknown"
    return (f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} GiB, compute capability "
            f"{props.major}.{props.minor}), driver {driver}, {versions}, CUDA {torch.version.cuda}, "
            f"cuDNN {torch.backends.cudnn.version()}")


def passed(result: str | None) -> bool:
    return result is None or isinstance(result, Ok)


def run_checks(checks: list[Check], ctx: Context, workers: int) -> dict[str, str | None]:
    """Run ``checks`` (each once its ``after`` are done), ``workers`` at a time; print a line as each ends."""
    results: dict[str, str | None] = {}
    pending = list(checks)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        running: dict[concurrent.futures.Future, tuple[Check, float]] = {}
        while pending or running:
            for check in [c for c in pending if all(a in results for a in c.after)]:
                pending.remove(check)
                if any(not passed(results[a]) for a in check.after):
                    results[check.name] = f"not run: {', '.join(check.after)} failed"
                    print(f"FAILED  {check.name:<10} {check.what}: {results[check.name]}", flush=True)
                else:
                    running[pool.submit(check.run, ctx)] = (check, time.perf_counter())
            if not running:
                continue
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                check, started = running.pop(future)
                try:
                    results[check.name] = future.result()
                except Exception as e:  # a check's own bug or a timeout is that check's failure, not the report's
                    results[check.name] = f"{type(e).__name__}: {e}"
                result, took = results[check.name], time.perf_counter() - started
                note = f": {result}" if result else ""
                status = "ok     " if passed(result) else "FAILED "
                print(f"{status} {check.name:<10} {check.what} ({took:.0f} s){note}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated check names (default: all; see --list)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--workers", type=int, default=4, help="checks run at once (default: 4)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default), or cpu to rehearse this script without a GPU")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(f"{c.name:<10} {c.what}" + (" (CUDA only)" if c.cuda_only else "") for c in CHECKS))
        return 0

    def body() -> int:
        names = [n for n in args.only.split(",") if n]
        unknown = [n for n in names if n not in {c.name for c in CHECKS}]
        if unknown:
            raise UserError(f"--only: no check named {unknown[0]!r}; the checks: {', '.join(c.name for c in CHECKS)}")
        if args.workers < 1:
            raise UserError(f"--workers {args.workers}: give 1 or more")
        if args.device == "cuda" and not torch.cuda.is_available():
            print(f"no NVIDIA GPU here (torch {torch.__version__} sees no CUDA device): nothing was checked; run this "
                  "on a machine with one", flush=True)
            return 1
        chosen = {c.name for c in CHECKS if not names or c.name in names}
        chosen |= {a for c in CHECKS if c.name in chosen for a in c.after}  # what a chosen check needs runs too
        checks = [c for c in CHECKS if c.name in chosen and not (c.cuda_only and args.device != "cuda")]
        print(machine_line(args.device), flush=True)
        with tempfile.TemporaryDirectory(prefix="check_gpu-") as tmp:
            work = Path(tmp)
            sudoku = work / "sudoku"
            with contextlib.redirect_stdout(io.StringIO()):  # the builders' reports: one line per check here
                build_dataset(sudoku, generate=True, train_size=64, test_size=16, min_blanks=30, num_aug=1, seed=0)
                cape = build_cape(work / "cape-data", num_categories=10, instances_per_category=20, image_size=64,
                                  seed=0)
            results = run_checks(checks, Context(args.device, work, sudoku, cape), args.workers)
        failed = [name for name, result in results.items() if not passed(result)]
        print(f"{len(results) - len(failed)} of {len(results)} checks ok" + (f"; failed: {', '.join(failed)}"
                                                                             if failed else ""), flush=True)
        return 1 if failed else 0

    return cli_main(body)


if __name__ == "__main__":
    sys.exit(main())
