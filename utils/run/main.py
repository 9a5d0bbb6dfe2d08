"""The one main wrapper: logging set-up, torchrun membership, graceful stop, and the one error path.

Every entry point (``pretrain.py``, the CAPE trainer, ``evaluate.py``, the dataset builders) runs
through :func:`cli_main` or :func:`run_main`. A :class:`~utils.errors.UserError` (bad input) is
printed as ``error: <message>`` with exit code 2, a :class:`~utils.errors.RunFailure` (a run that
could not go on) the same way with exit code 1. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn

from utils.errors import RunFailure, UserError
from utils.run.stop import GracefulStop, StoppedAtOnce, signal_exit_code

if TYPE_CHECKING:
    from utils.distributed import Dist

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports it (signal.SIGPIPE is not defined on Windows)


def setup_logging(rank: Dist | None = None) -> None:
    """One logging set-up for every entry point: INFO on rank 0 (or with no ``rank``: a single process), warnings
    only on the other ranks.

    The handler is added only when the root logger has none (a test harness may have its own).
    """
    logging.basicConfig(format=LOG_FORMAT, datefmt="%H:%M:%S")
    logging.getLogger().setLevel(logging.INFO if rank is None or rank.is_main else logging.WARNING)


def one_line(error: Exception) -> str:
    """``error``'s message as one line.

    A DataLoader worker's exception reaches the main process re-raised as the same type, but with the
    worker's whole traceback as its message ("Caught X in DataLoader worker process 0. Original Traceback
    ..."); the original message is the last line, after ``module.X: ``.
    """
    message = str(error)
    if message.startswith("Caught ") and "Original Traceback" in message:
        last = message.rstrip().splitlines()[-1]
        message = last.split(": ", 1)[1] if last.startswith(f"{type(error).__module__}.{type(error).__name__}: ") else last
    return " ".join(message.split("\n"))


def report_error(error: Exception, rank: Dist | None = None) -> int:
    """Print ``error`` as one line on stderr (prefixed with the rank under torchrun); return its exit code."""
    where = f"[rank {rank.rank}] " if rank is not None and rank.world_size > 1 else ""
    print(f"{where}error: {one_line(error)}", file=sys.stderr, flush=True)
    return error.exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM reached a single-process command (:func:`cli_main`). A KeyboardInterrupt, so that it unwinds as Ctrl-C
    does: every ``finally`` and ``with`` on the way cleans up (a staging folder, a temporary directory)."""


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in this process, unless the command handles SIGTERM
    itself (scripts/check_gpu.py) or this is not the main thread (where no handler can be set). A process forked
    within (a pool worker) inherits the handler, and ends of the signal as it would without it."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    owner = os.getpid()

    def terminate(signum, _frame):
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def cli_main(body: Callable[[], int | None]) -> int:
    """Run a single-process command (``evaluate.py``, a builder) with the shared logging and error path; Ctrl-C
    ends it with one line and exit status 130, SIGTERM the same way with 143, a closed stdout (its reader left)
    quietly with 141, no traceback, after every cleanup on
    the way (utils/outputs.py writes each file whole or not at all, so an interruption leaves nothing half-written
    under a file's name; a staging folder or temporary directory is removed as the stop unwinds)."""
    setup_logging()
    try:
        with sigterm_as_ctrl_c():
            return body() or 0
    except (UserError, RunFailure) as e:
        return report_error(e)
    except Terminated:
        print("stopped (SIGTERM)", file=sys.stderr, flush=True)
        return signal_exit_code(signal.SIGTERM)
    except KeyboardInterrupt:
        print("stopped (Ctrl-C)", file=sys.stderr, flush=True)
        return signal_exit_code(signal.SIGINT)
    except BrokenPipeError:  # the reader of stdout left (``solve.py ... | head``): as a shell's command ends on it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush has somewhere to go
        return EXIT_BROKEN_PIPE


def run_main(body: Callable[[Dist, GracefulStop], int]) -> int:
    """Run a trainer: join the torchrun job if any, catch SIGINT/SIGTERM for a graceful stop, report errors.

    ``body(rank, stopper)`` returns the exit code. Under torchrun the ranks leave together (a rank that
    exits while rank 0 still writes aborts in gloo's teardown).
    """
    # Imported here, not with the module: cli_main's commands (the builders, --help) need no torch (about 2 s).
    import torch.distributed as dist

    from utils.distributed import init_distributed

    rank = init_distributed()
    setup_logging(rank)
    try:
        with GracefulStop() as stopper:
            code = body(rank, stopper)
        if rank.world_size > 1:
            dist.barrier()
    except (UserError, RunFailure) as e:
        code = report_error(e, rank)
    except StoppedAtOnce as e:
        print(f"{e}", file=sys.stderr, flush=True)
        code = e.exit_code
    except KeyboardInterrupt:  # a second Ctrl-C: abort at once, without a checkpoint
        print("aborted (second Ctrl-C): no checkpoint was written for the last steps", file=sys.stderr, flush=True)
        code = signal_exit_code(signal.SIGINT)
    finally:
        if rank.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()
    if rank.world_size > 1:
        exit_skipping_teardown(code)
    return code


def exit_skipping_teardown(code: int) -> NoReturn:
    """End the process with ``code`` once what it printed and logged is flushed, by ``os._exit``: the interpreter's
    teardown is skipped. Call it only when every file the command writes is closed. Two commands need it:

    - a torchrun worker whose run is over and whose process group is destroyed: in that teardown gloo's worker
      threads can abort a worker whose run succeeded (SIGABRT, "terminate called without an active exception";
      seen in this project's CI after "done", and reported upstream: pytorch/pytorch#179291);
    - the solving commands (``solve.py``, ``evaluate.py``), where torch's teardown is a fifth to a quarter of a
      short solve: ``solve.py`` on the README's Sudoku ran in 0.73x the wall time without it (farm-bench, paired
      runs on the 2-core AVX512-BF16 EPYC, one core busy; docs/results.md, "Start-up")."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            stream.flush()
    os._exit(code)
