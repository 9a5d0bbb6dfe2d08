"""utils.run.stop.GracefulStop's at-once stop: a raise that Python drops is raised again."""

import os
import signal
import sys
import time
import weakref

import pytest

from utils.run.stop import REDELIVER_S, GracefulStop, StoppedAtOnce


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


def test_outside_the_block_a_signal_asks_for_a_stop_after_the_step_and_a_second_ctrl_c_interrupts():
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert stop.requested and stop.exit_code == 143
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
