"""utils.run.stop: GracefulStop's at-once stop (a raise that Python drops is raised again), and DataLoader workers
that leave a stop to the main process."""

import multiprocessing
import os
import signal
import sys
import threading
import time
import weakref

import pytest
import torch

from utils.run import stop as stop_module
from utils.run.stop import REDELIVER_S, GracefulStop, StoppedAtOnce, quiet_worker, start_workers


class _Collectable:
    pass


def _signal_inside_a_weakref_callback(signum: int) -> None:
    """Send ``signum`` to this process from inside a weakref callback, where the handler then runs and where
    Python drops an exception it raises (as the compiler's garbage collection does to a real stop)."""
    def callback(_ref):
        os.kill(os.getpid(), signum)
        for _ in range(10_000):  # the pending handler runs in this loop, still inside the callback
            pass

    obj = _Collectable()
    ref = weakref.ref(obj, callback)
    del obj  # the callback runs here, while ref is alive
    assert ref() is None


def test_an_at_once_stop_dropped_in_a_weakref_callback_is_raised_again(monkeypatch):
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_type))
    begin = time.monotonic()
    with GracefulStop() as stop, pytest.raises(StoppedAtOnce) as raised:
        with stop.at_once():
            _signal_inside_a_weakref_callback(signal.SIGTERM)
            while time.monotonic() - begin < 20:  # a step that would go on for 20 s
                time.sleep(0.01)
    assert dropped == [StoppedAtOnce]  # the first raise was dropped, so a repeat stopped the step inside the block
    assert raised.value.exit_code == 143 and stop.signal_name == "SIGTERM"


def test_a_stop_that_was_not_dropped_is_not_repeated_after_the_block():
    with GracefulStop() as stop:
        with pytest.raises(StoppedAtOnce):
            with stop.at_once():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
        time.sleep(3 * REDELIVER_S)  # a repeat would come here: as a second Ctrl-C, a KeyboardInterrupt
    assert stop.signal_name == "SIGINT" and stop.exit_code == 130


def test_leaving_the_stop_ends_its_pending_repeats(monkeypatch):
    """A repeat left running after ``with`` would run the handler put back there: Python's own for SIGINT, a
    KeyboardInterrupt in whatever runs next (a later test's xdist worker went down with one in CI)."""
    monkeypatch.setattr(stop_module, "REDELIVER_S", 3600)  # the repeat would come long after this test
    with GracefulStop() as stop:
        with pytest.raises(StoppedAtOnce):
            with stop.at_once():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
        repeats = [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.is_alive()]
        assert len(repeats) == 1
    assert not repeats[0].is_alive()  # cancelled and waited for before the handlers were put back


def test_outside_the_block_a_signal_asks_for_a_stop_after_the_step_and_a_second_ctrl_c_interrupts():
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert stop.requested and stop.exit_code == 143
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)


class _Pids(torch.utils.data.Dataset):
    """Each item is the pid of the worker process that produced it."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return os.getpid()


@pytest.mark.skipif(not hasattr(signal, "sigwaitinfo"), reason="sigwaitinfo is missing here (macOS): SIGTERM keeps its "
                                                              "default action in workers")
def test_a_worker_outlives_a_foreign_sigterm_and_ends_at_its_main_process_sigterm():
    """A scheduler's SIGTERM to the group must not kill a DataLoader worker (the main process stops the run), but
    the main process must still be able to terminate it (DataLoader shutdown, Python at exit)."""
    loader = torch.utils.data.DataLoader(_Pids(), batch_size=1, num_workers=1, prefetch_factor=1,
                                         worker_init_fn=quiet_worker)
    batches = start_workers(loader)
    pid = int(next(batches))
    sender = os.fork()  # another process: the scheduler
    if sender == 0:
        os.kill(pid, signal.SIGTERM)
        os._exit(0)
    os.waitpid(sender, 0)
    assert [int(b) for b in batches] == [pid] * 3  # the rest of the epoch, from the same worker after the signal
    batches = start_workers(loader)
    worker = next(p for p in multiprocessing.active_children() if p.pid == int(next(batches)))
    worker.terminate()  # from this process, as DataLoader._shutdown_workers and multiprocessing at exit do
    worker.join(timeout=60)
    assert worker.exitcode == 0
