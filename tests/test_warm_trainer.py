"""tests/warm_trainer.py, the warm interpreter the crash and resume tests fork their runs from: each run is a process
of its own, and one that hangs is ended at its bound while the interpreter goes on serving."""

import os
import subprocess

import pytest


def test_a_run_is_a_process_of_its_own_and_a_hung_run_is_ended_at_its_bound(warm_pretrain):
    done = warm_pretrain.run(["--help"], prelude="import os; print('pid', os.getpid())")
    assert done.returncode == 0 and "usage: pretrain.py" in done.stdout
    assert int(done.stdout.split("pid ", 1)[1].split()[0]) != os.getpid()
    with pytest.raises(subprocess.TimeoutExpired):
        warm_pretrain.run(["--help"], prelude="import time; time.sleep(600)", timeout=1)
    died = warm_pretrain.run(["--help"], prelude="import os; os._exit(137)")
    assert died.returncode == 137  # the answer after a killed run is this run's own
