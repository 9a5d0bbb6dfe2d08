"""A warm interpreter for tests that run a trainer many times in a row.

Every ``python pretrain.py`` (or ``python -m models.train_cape_episodic``) first spends about 5 s of CPU importing
torch, torch._dynamo (the optimizer's first call loads it) and TensorBoard before its first step; a test module that
starts a dozen tiny runs spends most of its time there. Here one interpreter imports all that once, and each run is a
fork of it: a process of its own, with its own stdout, stderr and exit status, which may die in any way
(``os._exit(137)``, SIGKILL) without touching the others.

Use it only where a run's files and output are the point, as in the crash and resume tests: a fork starts from an
interpreter that has imported the trainer and run nothing, so what a run reads as it starts (its argv, the files, its
environment) is what a fresh process would read.

Signals: a run stops itself with the tests' hook (``RUN_SIGNAL_AT``, tests/signal_hook.py), as a fresh process would.
Its ``:group`` form signals the whole process group, so such a run is started with ``new_session=True``: the fork
then leads a session and process group of its own (as ``start_new_session=True`` gives a fresh process), which the
signal reaches with every process the run starts (its DataLoader workers), and never the warm interpreter or the test
session. What still needs a real process: start-up itself (imports, ``python -m`` and tests/run_hook's
sitecustomize), the command as a user types it, and a signal a test sends from outside while the run goes on
(``run`` returns only when the run has ended, so there is no moment to send it), such as SIGCONT to a frozen run or
torchrun's agent forwarding a stop to its ranks.

    with WarmTrainer("pretrain", child_env()) as warm:
        done = warm.run([...argv...], prelude="...", RUN_SIGNAL_AT="train:12:SIGKILL")
        done.returncode, done.stdout, done.stderr
        warm.run([...argv...], new_session=True, RUN_SIGNAL_AT="train:3:SIGTERM:group")  # kill -- -PGID
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a run imports before its first step besides its own module, which loads its trainer lazily (so that --help
# is quick): the trainers' modules, torch._dynamo and TensorBoard's writer.
PRELOAD = ("utils.train.puzzle_trainer", "torch._dynamo", "torch.utils.tensorboard", "tests.signal_hook")


def serve(module: str) -> None:
    """The warm side: import ``module`` and :data:`PRELOAD`, then for each request line (JSON: argv, prelude, env,
    out, err, new_session) fork a run and answer two lines: its process id, then its exit status (``-N``: signal N
    ended it)."""
    for name in (module, *PRELOAD):
        importlib.import_module(name)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run(module, request)
        print(pid, flush=True)  # first the run's process id (the client ends a run that outlasts its bound) ...
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)  # ... then how it ended


def _run(module: str, request: dict) -> None:
    """In the fork: a session of its own where the request asks for one (first, so that nothing it runs can signal
    the warm interpreter's group), stdin from /dev/null, stdout and stderr to the request's files, its environment
    entries (the tests' hook armed where they name ``RUN_SIGNAL_AT``, as tests/run_hook does in a fresh process), the
    prelude (which may patch anything, as a ``python -c`` wrapper would), then ``module.main(argv)``; never returns."""
    if request["new_session"]:
        os.setsid()
    import logging
    import traceback

    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.environ.update(request["env"])
    code = 1
    try:
        if os.environ.get("RUN_SIGNAL_AT"):
            importlib.import_module("tests.signal_hook").install()
        exec(request["prelude"], {"__name__": "__prelude__"})
        code = importlib.import_module(module).main(request["argv"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # as an uncaught exception would: a traceback and exit status 1
        traceback.print_exc()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class WarmTrainer:
    """A warm interpreter (:func:`serve`) for ``module`` (``pretrain`` or ``models.train_cape_episodic``), started
    with ``env`` in the repository root; its runs are its forks, one at a time. Close it (or use it as a context
    manager) to end it."""

    def __init__(self, module: str, env: dict[str, str]):
        self._files = tempfile.TemporaryDirectory(prefix="warm_trainer_")
        serving = f"from tests.warm_trainer import serve; serve({module!r})"
        self._proc = subprocess.Popen([sys.executable, "-c", serving], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, bufsize=0)  # unbuffered: select() sees every answer
        self.module = module

    def run(self, argv: list[str], prelude: str = "", timeout: float = 300, new_session: bool = False,
            **env: str) -> subprocess.CompletedProcess:
        """``module.main(argv)`` in a fork, with ``env`` added to its environment and ``exec(prelude)`` first;
        waits for it to end, at most ``timeout`` seconds (a bound for a hung run, as ``subprocess.run`` has).
        With ``new_session`` the fork calls ``os.setsid()`` before anything else, as ``start_new_session=True`` does
        for a fresh process: it leads a session and process group of its own, so a signal to its group
        (``RUN_SIGNAL_AT=...:group``, ``kill -- -PGID``) reaches it and the processes it starts, never the warm
        interpreter or the test session. Without it the fork shares their group: never signal that group.

        Returns:
            its exit status as ``returncode`` (``-N`` for signal N), and its stdout and stderr as text.
        Raises:
            subprocess.TimeoutExpired: the run outlasted ``timeout`` (it is killed, the warm interpreter goes on).
            RuntimeError: the warm interpreter itself has ended.
        """
        out, err = (Path(self._files.name) / name for name in ("out", "err"))
        request = {"argv": argv, "prelude": prelude, "env": env, "out": str(out), "err": str(err),
                   "new_session": new_session}
        self._proc.stdin.write(json.dumps(request).encode() + b"\n")
        pid = int(self._answer())
        if not select.select([self._proc.stdout], [], [], timeout)[0]:
            os.kill(pid, signal.SIGKILL)
            self._answer()  # the killed run's status: the next run's answer comes clean
            raise subprocess.TimeoutExpired([self.module, *argv], timeout, out.read_text(), err.read_text())
        code = int(self._answer())
        return subprocess.CompletedProcess([self.module, *argv], code, out.read_text(), err.read_text())

    def _answer(self) -> str:
        """The warm interpreter's next line (read from the unbuffered pipe byte by byte, never past its end)."""
        answer = self._proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the warm interpreter ended with exit status {self._proc.wait()}")
        return answer.decode()

    def close(self) -> None:
        """End the warm interpreter (its stdin closes, so its loop ends) and remove its files."""
        self._proc.stdin.close()
        self._proc.wait(timeout=60)
        self._files.cleanup()

    def __enter__(self) -> WarmTrainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
