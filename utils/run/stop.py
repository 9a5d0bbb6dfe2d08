"""Graceful stop on SIGINT/SIGTERM, shared by both trainers, and the exit code that tells a job scheduler so.

A run stopped by a signal checkpoints, then exits with ``128 + the signal's number`` (130 for SIGINT, 143 for
SIGTERM), the shell's convention for "ended by a signal": a scheduler sees a non-zero code and can requeue the
job, which continues with ``resume=auto``. A run exits 0 only when it finished its schedule.

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
import signal
import threading
from typing import Iterator, Optional

from tqdm import tqdm


REDELIVER_S = 0.5  # seconds between raises of an at-once stop that Python dropped


def signal_exit_code(signum: int) -> int:
    """The exit status of a run ended by signal ``signum``: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


class StoppedAtOnce(BaseException):
    """A signal arrived during :meth:`GracefulStop.at_once`; ``exit_code`` is 128 + its number. A BaseException, as
    KeyboardInterrupt is, so no ``except Exception`` on the way swallows it."""

    def __init__(self, signal_name: str):
        super().__init__(f"stopped by {signal_name} during the first step (compiling), before anything was trained "
                         "since the last checkpoint; nothing needed saving")
        self.exit_code = signal_exit_code(signal.Signals[signal_name])


class GracefulStop:
    """Within ``with``, the first SIGINT/SIGTERM asks the loop to stop after the current step.

    The loop checks :attr:`requested` (agreed across ranks), writes a checkpoint and exits
    cleanly; a second Ctrl-C interrupts at once. The previous handlers come back on exit.
    """

    def __init__(self):
        self.signal_name: Optional[str] = None
        self._previous: dict = {}
        self._at_once = False
        self._redelivered = False  # the handler's next call is a repeat from _raise_again_later

    @contextlib.contextmanager
    def at_once(self, when: bool = True) -> Iterator[None]:
        """Within the block (when ``when``), a signal raises :class:`StoppedAtOnce` instead of waiting for the step."""
        self._at_once = when
        try:
            if when and self.requested:
                raise StoppedAtOnce(self.signal_name)
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
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, _frame):
        repeat, self._redelivered = self._redelivered, False
        if self._at_once:
            self.signal_name = signal.Signals(signum).name
            self._raise_again_later(signum)
            raise StoppedAtOnce(self.signal_name)
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
        timer.start()
