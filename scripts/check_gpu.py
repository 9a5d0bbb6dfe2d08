"""Check every CUDA path of the project on this machine, each in a few steps, one line each.

    python scripts/check_gpu.py                      # every check, four at a time: a few minutes on one GPU
    python scripts/check_gpu.py --only adam,resume   # some of them (--list names them all)

Each check runs the project's own command, as a user types it, on a tiny problem (generated Sudoku, a synthetic
MP-100) and reads its outcome: ``ok`` with its time, or ``FAILED`` with the last line the command printed. The
first line names the GPU, its driver, and the torch, CUDA and cuDNN versions. The exit code is 0 when every check
is ok, 1 otherwise, and 1 with one line where there is no NVIDIA GPU (nothing is checked then).

``--device cpu`` rehearses the checks on the CPU (for testing this script; the CUDA-only checks are skipped).

Ctrl-C or SIGTERM ends the commands still running, each with its own processes (DataLoader workers, torchrun's),
removes the scratch folder, and exits 130 or 143 with one line.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from utils.cli import ArgumentParser, add_workers_argument  # noqa: E402
from utils.device import cpu_name  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.run.main import cli_main  # noqa: E402

TIMEOUT_S = 300
GRACE_S = 20  # a stopped command's time to end on its own (a trainer checkpoints; torchrun ends its workers)
SUDOKU = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
TINY = ["--config-name=cfg_pretrain_cpu", "arch.hidden_size=64", "arch.num_heads=2", "arch.H_layers=1",
        "arch.L_layers=1", "arch.halt_max_steps=2", "arch.expansion=2", "global_batch_size=32", "epochs=2",
        "eval_interval=1", "log_interval=4", "lr_warmup_steps=2"]
TRM = ["arch=trm", "arch.L_layers=1", "arch.H_cycles=2", "arch.L_cycles=2", "arch.puzzle_emb_len=1"]
CAPE = ["--model", "capeformer_lite", "--hidden_dim", "32", "--num_heads", "4", "--image_size", "64", "--shots", "1",
        "--queries", "2", "--eval_queries", "2", "--val_episodes_per_category", "1", "--test_episodes_per_category",
        "1", "--batch_size", "2", "--accumulation_steps", "1", "--epochs", "1", "--episodes_per_epoch", "8"]


class Stopped(BaseException):
    """SIGINT or SIGTERM reached this script (a BaseException, so no check's ``except Exception`` takes it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux: from /proc; elsewhere none), whatever their process group: torchrun
    starts each worker in a session of its own."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def end(procs: list[subprocess.Popen], signum: int) -> None:
    """Send ``signum`` to each command's process group and give them :data:`GRACE_S` seconds to end (a trainer
    checkpoints, torchrun ends its workers); then kill each one left, and every process that was below one and
    outlived it."""
    below = [pid for proc in procs for pid in descendants(proc.pid)]
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
    deadline = time.monotonic() + GRACE_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            below += descendants(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Commands:
    """The commands the checks run, each in a process group of its own, so that a timeout or a stop of this script
    ends each one whole, and a Ctrl-C at the terminal reaches them only through :meth:`ended_on_stop`."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._stopping = False

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        """Run ``argv`` from the repository, the output captured.

        Raises:
            subprocess.TimeoutExpired: it ran past :data:`TIMEOUT_S` (it was ended). RuntimeError: the script is
            stopping (nothing was started).
        """
        with self._lock:
            if self._stopping:
                raise RuntimeError("not started: the checks are stopping")
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=self.env, start_new_session=True)
            self._running.add(proc)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            end([proc], signal.SIGTERM)
            raise
        finally:
            with self._lock:
                self._running.discard(proc)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    @contextlib.contextmanager
    def ended_on_stop(self):
        """On :class:`Stopped` inside the block, pass the signal on to every command still running and wait for them
        to end (:func:`end`), then let it go on; no command starts after it."""
        try:
            yield
        except Stopped as e:
            with self._lock:
                self._stopping, running = True, list(self._running)
            end(running, e.signum)
            raise


@dataclass
class Context:
    """What the checks share: the device, a scratch folder with the tiny datasets, and the commands running."""

    device: str
    work: Path
    sudoku: Path
    cape: Path
    commands: Commands

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        """Run ``python argv`` from the repository, the output captured (:meth:`Commands.run`)."""
        return self.commands.run([sys.executable, *argv])


def child_env(work: Path) -> dict[str, str]:
    """The commands' environment: unbuffered, no progress bars (their output is read, not watched), and temporary
    files (torchrun's ``torchelastic_*`` among them) inside ``work``, which goes when the checks end."""
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", "TMPDIR": str(tmp)}


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


def decisions(done: subprocess.CompletedProcess) -> Ok:
    """What a trainer said it decided about precision and torch.compile (``precision float32, torch.compile off``):
    the note of its check, so the line says what ran, not what a GPU would run."""
    text = done.stdout + done.stderr
    found = [f"{name} {m.group(1)}" for name in ("precision", "torch.compile")
             if (m := re.search(rf"\b{re.escape(name)}: (\S+) \(", text))]
    return Ok(", ".join(found))


def trainer(done: subprocess.CompletedProcess, *needles: str) -> str | None:
    """:func:`expect`, and for a trainer that ran, what it decided (:func:`decisions`)."""
    return expect(done, *needles) or decisions(done)


def pretrain(ctx: Context, run: str, *extra: str) -> str | None:
    return trainer(ctx.run(["pretrain.py", *TINY, f"data_path={ctx.sudoku}", f"device={ctx.device}",
                            f"checkpoint_path={ctx.work / run}", *extra]), *precision_needles(ctx))


def precision_needles(ctx: Context) -> tuple[str, ...]:
    """On a GPU the trainers must run in bf16 and compiled; the CPU rehearsal runs what its recipe says."""
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
    Check("hrm", "HRM training, compile=auto", lambda c: pretrain(c, "hrm")),
    Check("trm", "TRM training with EMA, compile=auto", lambda c: pretrain(c, "trm", *TRM, "ema=true")),
    Check("evaluate", "evaluate.py on the TRM run",
          lambda c: expect(c.run(["evaluate.py", str(c.work / "trm"), "--device", c.device]), "exact_accuracy"),
          after=("trm",)),
    Check("solve", "solve.py on the TRM run",
          lambda c: expect(c.run(["solve.py", "--checkpoint", str(c.work / "trm"), "--sudoku", SUDOKU, "--device",
                                  c.device, "--out", str(c.work / "solutions")]), "puzzle 1: "), after=("trm",)),
    Check("cape", "CAPE training with --use_amp and 2 DataLoader workers",
          lambda c: trainer(c.run(["-m", "models.train_cape_episodic", *CAPE, "--data_root", str(c.cape), "--device",
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
    # ended_on_stop leaves the block first: the commands end before the pool waits for the threads that wait on them
    with concurrent.futures.ThreadPoolExecutor(workers) as pool, ctx.commands.ended_on_stop():
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


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop(signum: int, _frame) -> None:
    """The handler of :data:`STOP_SIGNALS`: the first one stops the checks; later ones are ignored while the commands
    end (at most :data:`GRACE_S` seconds)."""
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    raise Stopped(signum)


def build_data(work: Path) -> tuple[Path, Path]:
    """The tiny Sudoku and synthetic MP-100 datasets in ``work``; the builders' reports and progress bars are not
    shown (one line per check here)."""
    from utils.data.sudoku.build import build_dataset  # here, not at the top: numba and the generators, not for --help
    from utils.data.cape.synthetic import build as build_cape

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        build_dataset(work / "sudoku", generate=True, train_size=64, test_size=16, min_blanks=30, num_aug=1, seed=0)
        cape = build_cape(work / "cape-data", num_categories=10, instances_per_category=20, image_size=64, seed=0)
    return work / "sudoku", cape


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated check names (default: all; see --list)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    add_workers_argument(parser, "checks run at once", default=4)
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
            sudoku, cape = build_data(work)
            results = run_checks(checks, Context(args.device, work, sudoku, cape, Commands(child_env(work))),
                                 args.workers)
        failed = [name for name, result in results.items() if not passed(result)]
        print(f"{len(results) - len(failed)} of {len(results)} checks ok" + (f"; failed: {', '.join(failed)}"
                                                                             if failed else ""), flush=True)
        return 1 if failed else 0

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        return cli_main(body)
    except Stopped as e:
        print(f"stopped by {e}: the checks still running were ended and the scratch folder removed; the lines above "
              "are the checks that finished", file=sys.stderr, flush=True)
        return 128 + e.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
