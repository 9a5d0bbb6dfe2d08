"""tests/warm_trainer.py, the warm interpreter the crash and resume tests fork their runs from: each run is a process
of its own, and one that hangs is ended at its bound while the interpreter goes on serving."""

import os
import signal
import subprocess
import time

import pytest

from tests.conftest import signal_at

# A run that starts a child (which writes the signal it gets to a file), then signals its whole process group as the
# fault campaign's runs do (tests/signal_hook.py: SIGTERM from a process of its own, as kill -- -PGID), and dies of it.
# It refuses to send unless it leads a session of its own: else the signal would reach the warm interpreter and pytest.
GROUP_SIGNAL = """
import os, signal, time
from tests.signal_hook import HOOK
assert os.getsid(0) == os.getpgrp() == os.getpid(), "the run does not lead a session of its own"
ready, told = os.pipe()
if os.fork() == 0:
    def record(signum, frame):
        with open({got!r} + ".part", "w") as file:
            file.write(signal.Signals(signum).name)
        os.rename({got!r} + ".part", {got!r})
        os._exit(0)
    signal.signal(signal.SIGTERM, record)
    os.write(told, b"ready")
    time.sleep(60)
    os._exit(1)
os.read(ready, 5)
HOOK.begin()
HOOK.reach("train", 1)
time.sleep(60)
"""


def test_a_run_is_a_process_of_its_own_and_a_hung_run_is_ended_at_its_bound(warm_pretrain):
    done = warm_pretrain.run(["--help"], prelude="import os; print('pid', os.getpid())")
    assert done.returncode == 0 and "usage: pretrain.py" in done.stdout
    assert int(done.stdout.split("pid ", 1)[1].split()[0]) != os.getpid()
    with pytest.raises(subprocess.TimeoutExpired):
        warm_pretrain.run(["--help"], prelude="import time; time.sleep(600)", timeout=1)
    died = warm_pretrain.run(["--help"], prelude="import os; os._exit(137)")
    assert died.returncode == 137  # the answer after a killed run is this run's own


def test_a_run_in_a_session_of_its_own_signals_its_group_and_never_the_warm_interpreter(warm_pretrain, tmp_path):
    """new_session=True: a group signal (RUN_SIGNAL_AT=...:group) reaches the run and the child it started; the warm
    interpreter (which SIGTERM would end) and this test session are outside the group, and the next run is served."""
    got = tmp_path / "the child got"
    done = warm_pretrain.run(["--help"], prelude=GROUP_SIGNAL.format(got=str(got)), new_session=True,
                             **signal_at("train", 1, "SIGTERM", group=True))
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "sending SIGTERM to its whole process group" in done.stderr
    deadline = time.monotonic() + 60
    while not got.exists() and time.monotonic() < deadline:  # the child is no longer the run's to wait for
        time.sleep(0.05)
    assert got.read_text() == "SIGTERM"
    after = warm_pretrain.run(["--help"])
    assert after.returncode == 0 and "usage: pretrain.py" in after.stdout
