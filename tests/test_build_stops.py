"""A stop while a dataset is built with worker processes (utils/data/common.py ``worker_pool``), on cpu: inside a
training run (issue 51: it used to print "finishing this step" and wait on its pool for minutes, deaf to a second
signal), and in the builder's own command (issue 53, problem 11: SIGTERM used to end it without a word and leave
its workers running at full CPU). Each stop comes at a chosen point, once the pool's workers exist: in-process, as the
pool is handed its first work; for a command of its own, after the progress bar it draws once its pool is up.
"""

import multiprocessing.pool
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import pretrain
from utils.data import common

REPO = Path(__file__).resolve().parents[1]
# A recipe per builder that uses workers, its data build made long enough that it cannot end before the stop.
RECIPES = {
    "sudoku": ["--config-name=cfg_pretrain_trm_cpu", "dataset_builder.workers=2", "dataset_builder.train_size=100000"],
    "sudoku-expert": ["--config-name=cfg_pretrain_trm_cpu_expert"],
    "maze": ["--config-name=cfg_pretrain_trm_maze_cpu", "dataset_builder.workers=2",
             "dataset_builder.train_size=100000"],
}


def stop_once_workers_run(monkeypatch, signals: list[int], workers: list[int]) -> None:
    """A build's worker pool sends ``signals`` to this process as it is handed its first work, and records its
    workers' pids in ``workers``."""
    real = multiprocessing.pool.Pool.imap

    def imap(self, *args, **kwargs):
        if not workers:
            workers.extend(p.pid for p in self._pool)  # Pool keeps its worker processes there
            for signum in signals:
                os.kill(os.getpid(), signum)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(multiprocessing.pool.Pool, "imap", imap)


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (it may linger as a zombie until its parent reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] in "ZX"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("builder, signals", [
    ("sudoku", [signal.SIGINT]),
    ("sudoku-expert", [signal.SIGTERM]),
    ("maze", [signal.SIGTERM, signal.SIGTERM]),
    ("sudoku-expert", [signal.SIGINT, signal.SIGINT]),
])
def test_issue51_a_stop_during_a_runs_data_build_ends_it_at_once_with_its_workers_and_publishes_nothing(
        tmp_path, monkeypatch, capsys, builder, signals):
    workers = []
    data = tmp_path / "data"
    stop_once_workers_run(monkeypatch, signals, workers)
    code = pretrain.main([*RECIPES[builder], f"data_paths=[{data}]", "build_data=true",
                          f"checkpoint_path={tmp_path / 'run'}"])
    assert code == 128 + signals[0]
    assert capsys.readouterr().err.rstrip().splitlines()[-1] == (
        f"stopped by {signal.Signals(signals[0]).name} during the data preparation (a dataset is published only once "
        "built whole), before anything was trained since the last checkpoint; nothing needed saving")
    assert len(workers) == 2 and all(map(gone, workers))
    # no dataset, no staging folder, no run; an expert build keeps the chains it finished, to resume (docs/data.md)
    assert [p.name for p in tmp_path.iterdir()] == ([".data.chains"] if builder == "sudoku-expert" else [])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers in /proc")
def test_campaign5_p11_sigterm_to_the_expert_generator_ends_its_workers_with_one_line_and_143(tmp_path):
    command = [sys.executable, "scripts/build_sudoku_dataset.py", "--generate", "--expert", "--workers", "2",
               "--output-dir", str(tmp_path / "expert")]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        err = b""
        while b"generate train:" not in err:  # tqdm draws the bar once the pool is up (a wait bounded by the build)
            piece = os.read(process.stderr.fileno(), 4096)
            assert piece, err.decode()
            err += piece
        workers = [int(p) for p in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()]
        assert len(workers) == 2, err.decode()
        process.send_signal(signal.SIGTERM)  # to the main process alone, as `kill PID` sends it
        err += process.stderr.read()
        assert process.wait(60) == 143
    finally:
        process.kill()
    assert err.decode().rstrip().endswith("stopped (SIGTERM)") and b"Traceback" not in err  # after the bar's last draw
    deadline = time.monotonic() + 30  # a bounded wait for the kernel to end workers that outlived their parent
    while not all(map(gone, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(map(gone, workers))
    assert [p.name for p in tmp_path.iterdir()] == [".expert.chains"]  # no dataset or staging folder; what resumes


@pytest.mark.skipif(not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread(),
                    reason="forks its workers and finds them in /proc; a signal's handler runs in the main thread")
def test_issue63_a_stop_while_the_pool_starts_ends_it_after_the_fork_in_progress_with_no_worker_left(monkeypatch):
    """Issue 63: the stop signals were held while all the workers forked (--workers 100000: about 4,300 of them), so a
    stop waited for the whole start. Ctrl-C comes here as the second worker forks; the start goes no further, and the
    two workers are ended before the stop leaves the pool."""
    forked, fork = [], os.fork

    def fork_then_stop():
        pid = fork()
        if pid:  # the main process
            forked.append(pid)
            if len(forked) == 2:  # to the main thread, as the kernel may hand a terminal's Ctrl-C
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return pid

    monkeypatch.setattr(os, "fork", fork_then_stop)
    with pytest.raises(KeyboardInterrupt):
        with common.worker_pool(6):
            pass
    assert len(forked) == 2
    assert all(map(gone, forked))
