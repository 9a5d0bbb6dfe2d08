"""Graceful stop on SIGINT/SIGTERM, shared by both trainers, and the exit code that tells a job scheduler so.

DataLoader workers leave the stopping to the main process: a scheduler's signal goes to the whole process group
(``kill -- -PGID``, ``timeout``, Slurm), and a worker that died of it, or ran the trainer's handler it inherited,
turned a graceful stop into a crash. The workers start with SIGINT and SIGTERM held (:func:`start_workers`); then
(:func:`quiet_worker`, their ``worker_init_fn``) they ignore SIGINT, and a thread of theirs takes each SIGTERM with
its sender: one from the main process (the DataLoader shutting its workers down, as torch's own worker handler
allows) ends the worker, any other is left to the main process. Ignoring SIGTERM outright would leave a worker that
the DataLoader, or Python at exit, can no longer terminate.

A run stopped by a signal checkpoints, then exits with ``128 + the signal's number`` (130 for SIGINT, 143 for
SIGTERM), the shell's convention for "ended by a signal": a scheduler sees a non-zero code and can requeue the
job, which continues with ``resume=auto``. A run exits 0 only when it finished its schedule.

A scheduler's early warning (Slurm's ``--signal=USR1@90``: SIGUSR1 some seconds before the SIGTERM of a time
limit or a preemption) is a signal of its own (:meth:`GracefulStop.listen_for_warning`, the trainers'
``warning_signal``): after the current step the run writes a checkpoint and goes on, or stops as for SIGTERM
(``on_warning``), so the SIGTERM that follows finds the latest step saved.

The first step of a process can take minutes (``torch.compile`` builds its kernels then). Inside
:meth:`GracefulStop.at_once`, a signal stops the run at once (:class:`StoppedAtOnce`), without finishing the step
or writing a checkpoint: nothing was trained since the last one. The handler raises wherever the main thread is;
where that is a weakref callback or a ``__del__``, which the compiler's garbage collection runs, Python prints
the exception and drops it ("Exception ignored in ..."). So until the block is left, the handler runs again every
:data:`REDELIVER_S` seconds (``_thread.interrupt_main``), and raises again: without that, 6 of 100 SIGTERMs at
random points of a compiling first step waited for the whole step (23-31 s instead of 1.3-2.8 s, 2-core CPU).
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import threading
from typing import Iterable, Iterator, Optional

from tqdm import tqdm


REDELIVER_S = 0.5  # seconds between raises of an at-once stop that Python dropped
ON_WARNING = ("checkpoint", "stop")  # what an early warning does after the current step
FIRST_STEP = "the first step (compiling)"  # the at-once phase of every run


def signal_exit_code(signum: int) -> int:
    """The exit status of a run ended by signal ``signum``: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


class StoppedAtOnce(BaseException):
    """A signal arrived during :meth:`GracefulStop.at_once`; ``exit_code`` is 128 + its number. A BaseException, as
    KeyboardInterrupt is, so no ``except Exception`` on the way swallows it."""

    def __init__(self, signal_name: str, during: str = FIRST_STEP):
        super().__init__(f"stopped by {signal_name} during {during}, before anything was trained since the last "
                         "checkpoint; nothing needed saving")
        self.exit_code = signal_exit_code(signal.Signals[signal_name])


class GracefulStop:
    """Within ``with``, the first SIGINT/SIGTERM asks the loop to stop after the current step.

    The loop checks :attr:`requested` (agreed across ranks), writes a checkpoint and exits
    cleanly; a second Ctrl-C interrupts at once. The previous handlers come back on exit.
    """

    def __init__(self):
        self.signal_name: Optional[str] = None
        self.warning_name: Optional[str] = None  # an early warning received since the last checkpoint
        self.warning_signal: Optional[str] = None  # the signal taken as one (listen_for_warning)
        self.on_warning = "checkpoint"
        self._previous: dict = {}
        self._at_once = False
        self._during = FIRST_STEP
        self._redelivered = False  # the handler's next call is a repeat from _raise_again_later
        self._repeats: list[threading.Timer] = []

    @contextlib.contextmanager
    def at_once(self, when: bool = True, during: str = FIRST_STEP) -> Iterator[None]:
        """Within the block (when ``when``), a signal raises :class:`StoppedAtOnce` instead of waiting for the step;
        ``during`` names the phase for its message (a run's data build, which has no step to finish, is another)."""
        self._at_once, self._during = when, during
        try:
            if when and self.requested:
                raise StoppedAtOnce(self.signal_name, during)
            yield
        finally:
            self._at_once = False

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    @property
    def exit_code(self) -> int:
        """``128 + signal number`` of the signal received (SIGTERM's, 143, when another torchrun rank got it)."""
        number = signal.Signals[self.signal_name] if self.signal_name else signal.SIGTERM
        return signal_exit_code(number)

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is not threading.main_thread():
            return self  # a run inside a thread (the page's ARC adaptation): the process's own handlers stay in charge
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def listen_for_warning(self, name: Optional[str], then: str = "checkpoint") -> None:
        """Take signal ``name`` (e.g. ``"SIGUSR1"``; None: none) as a scheduler's early warning from now on: the loop
        sees :attr:`warned`, writes a checkpoint, and goes on (``then="checkpoint"``) or stops (``"stop"``). Its
        previous handler comes back on exit. A run inside a thread leaves the process's handlers alone."""
        self.on_warning, self.warning_signal = then, name
        if name is None or threading.current_thread() is not threading.main_thread():
            return
        signum = signal.Signals[name]
        self._previous.setdefault(signum, signal.signal(signum, self._warn))

    @property
    def warned(self) -> bool:
        return self.warning_name is not None

    def _warn(self, signum, _frame) -> None:
        self.warning_name = signal.Signals(signum).name
        then = "going on" if self.on_warning == "checkpoint" else "stopping"
        tqdm.write(f"{self.warning_name} received (a scheduler's early warning): checkpointing after this step, then "
                   f"{then}")

    def __exit__(self, *exc) -> None:
        # A repeat must not outlive this handler: its interrupt would run the handler put back below (Python's own
        # for SIGINT: a KeyboardInterrupt in whatever runs next). One under way is waited for, and signal.signal
        # runs a pending handler (this one) before it replaces it.
        for repeat in self._repeats:
            repeat.cancel()
            repeat.join()
        self._repeats.clear()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, _frame):
        repeat, self._redelivered = self._redelivered, False
        if self._at_once:
            self.signal_name = signal.Signals(signum).name
            self._raise_again_later(signum)
            raise StoppedAtOnce(self.signal_name, self._during)
        if repeat:
            return  # the raise it repeats was not dropped: the at-once block is over
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        tqdm.write(f"{self.signal_name} received: finishing this step, then checkpointing (Ctrl-C again to abort)")

    def _raise_again_later(self, signum: int) -> None:
        """In :data:`REDELIVER_S` seconds, if the at-once block has not been left, run the handler again in the
        main thread (see the module docstring)."""
        def again():
            if self._at_once:
                self._redelivered = True
                _thread.interrupt_main(signum)

        timer = threading.Timer(REDELIVER_S, again)
        timer.daemon = True
        self._repeats = [repeat for repeat in self._repeats if repeat.is_alive()] + [timer]
        timer.start()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def quiet_worker(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: this worker leaves a stop to the main process, which stops the run and then
    shuts its workers down (see the module docstring). Where ``sigwaitinfo`` is missing (macOS), SIGTERM keeps its
    default action."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "sigwaitinfo"):  # SIGTERM stays held in every thread: the thread below takes it
        threading.Thread(target=_end_when_the_main_process_asks, args=(os.getppid(),), daemon=True).start()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    else:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _end_when_the_main_process_asks(main_pid: int) -> None:
    """Take this worker's SIGTERMs: one sent by the main process ends the worker at once (torch's rule for its
    workers); one from anyone else is the main process's to act on."""
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == main_pid:
            os._exit(0)


def start_workers(loader: Iterable) -> Iterator:
    """``iter(loader)``, with SIGINT and SIGTERM held while its worker processes start: a signal sent to the group
    meanwhile reaches the main process right after (its handler runs then), and no worker before
    :func:`quiet_worker`. A loader without workers is iterated as it is."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
