"""Shared fixtures (tiny generated Sudoku datasets in the reference on-disk format) and helpers for tests that
drive a trainer in a subprocess.

Every test names the device it means. Those of CUDA's own behaviour are marked ``gpu`` and skipped, with the
reason, where there is none; any other test that starts using CUDA fails (on a GPU machine, a run that names no
device would go there). A test that stops a run stops it at a step it chooses with ``RUN_SIGNAL_AT``
(tests/signal_hook.py, :func:`signal_at`), never by racing the run's pace: a tiny model's step takes milliseconds on
a GPU. The hook is the tests' alone: armed here for the session's own process, and in the processes the tests start
by :func:`child_env`'s PYTHONPATH."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import signal_hook
from tests.warm_trainer import WarmTrainer
from utils.data.sudoku.build import build_dataset
from utils.run import main as run_main

signal_hook.install()  # for the trainers the tests run in this process
HOOK_PATH = Path(__file__).resolve().parent / "run_hook"  # its sitecustomize arms the hook in a started process


HAS_CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parent.parent
NUMBA_CACHE = pytest.StashKey[subprocess.Popen]()  # tests/numba_cache.py, started by the controller


def pytest_configure(config):
    """Under pytest-xdist each worker's torch takes its share of the cores, not all of them: two workers with two
    threads each on two cores spend their time switching. Ctrl-C keeps its meaning (below). Under pytest-xdist the
    controller fills numba's cache in the background while the workers collect (tests/numba_cache.py)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    # A suite started in the background by a shell without job control (`pytest &` in a script) ignores SIGINT, and
    # an ignored signal stays ignored across exec: the commands the tests start would then shrug off the Ctrl-C the
    # tests send them. Ctrl-C is the tests' to send, so it gets its usual meaning here and in every child.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):  # xdist's controller
        config.stash[NUMBA_CACHE] = subprocess.Popen([sys.executable, "-m", "tests.numba_cache"], cwd=ROOT,
                                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_unconfigure(config):
    """The numba cache filler (tests/numba_cache.py) does not outlive the session."""
    filler = config.stash.get(NUMBA_CACHE, None)
    if filler is not None:
        filler.kill()
        filler.wait()


def pytest_terminal_summary(terminalreporter):
    """The documented commands tests/test_docs_run.py ran, and those it could not run here, with the reasons (each
    test records its list as the user property ``documented commands``, which pytest-xdist carries back)."""
    lines = [(status, command, note) for reports in terminalreporter.stats.values() for report in reports
             if getattr(report, "when", None) == "call"
             for name, value in getattr(report, "user_properties", ()) if name == "documented commands"
             for status, command, note in value]
    if not lines:
        return
    terminalreporter.section("documented commands (tests/test_docs_run.py)")
    for status, command, note in sorted(dict.fromkeys(lines), key=lambda line: line[0] != "ran"):
        terminalreporter.write_line(f"{status:6} {command}\n         {note}")


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``gpu`` where there is no NVIDIA GPU, saying so; and run the files that hold a test
    marked ``slow`` first (:func:`slow_files_first`)."""
    slow_files_first(items)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False here); the same code's "
                                   "CPU path is tested without one")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def slow_files_first(items: list) -> None:
    """Reorder ``items`` in place: the files that hold a test marked ``slow`` first, each file's tests together and
    in their order. Under pytest-xdist the session ends when its last test does: a long test drawn last keeps one
    worker busy while the others idle, and a file's fixtures are built once on each worker that runs its tests."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)  # stable: the order within each group is kept


@pytest.fixture(autouse=True)
def _cuda_only_where_named(request):
    """A test not marked ``gpu`` must not be the one that starts CUDA in this process."""
    before = HAS_CUDA and torch.cuda.is_initialized()
    yield
    if HAS_CUDA and not before and request.node.get_closest_marker("gpu") is None:
        assert not torch.cuda.is_initialized(), (f"{request.node.nodeid} used CUDA without naming it: pass device=cpu "
                                                 "(or --device cpu), or mark it gpu")


REAL_EXIT = run_main.exit_skipping_teardown


@pytest.fixture(autouse=True)
def _commands_end_as_system_exit(monkeypatch):
    """A test that runs ``solve.py`` or ``evaluate.py`` as ``__main__`` in this process stands in for the command's
    own process, whose end (``exit_skipping_teardown``: ``os._exit``) would end the test worker here; it ends as
    ``sys.exit`` with the same code instead, which the runner catches. The real exit is tested in fresh processes
    (tests/test_bad_inputs.py), and in this one where a test puts back :data:`REAL_EXIT`."""
    monkeypatch.setattr(run_main, "exit_skipping_teardown", sys.exit)


def release_abandoned_progress_locks() -> int:
    """Release what the calling thread still holds of tqdm's write lock (a cross-process and a thread lock, taken
    together for every bar's draw), and return how many holds that was.

    An exception raised from a signal handler (tests/test_every_flag.py's clock raises ``Reached`` from SIGALRM; a
    trainer's at-once stop raises too) lands wherever the thread is. Inside tqdm, between taking the lock and giving
    it back (the lock's ``acquire`` takes its two locks one after the other, and ``refresh`` has no ``finally``), the
    hold is never given back. The thread that took it goes on drawing bars (both locks are re-entrant), but any other
    thread waits for ever at its next bar. tests/test_progress_locks.py shows it; tqdm/tqdm issues #627 and #1500
    report such hangs. In one CI run the page's ARC adaptation, which runs in a server thread, hung at its first bar
    for 300 s; this is the likely way, not a proven one."""
    from tqdm import tqdm

    released = 0
    for held in getattr(getattr(tqdm, "_lock", None), "locks", ()):
        mine = held._semlock._is_mine if hasattr(held, "_semlock") else held._is_owned
        while mine():
            held.release()
            released += 1
    return released


@pytest.fixture(autouse=True)
def _progress_locks_given_back():
    """Between tests no bar is being drawn in the main thread, so whatever it holds of tqdm's lock was abandoned by a
    stop (:func:`release_abandoned_progress_locks`): give it back, so later tests' threads can draw bars."""
    yield
    release_abandoned_progress_locks()


def make_sudoku(tmp_path_factory, train_size: int, test_size: int):
    """Build easy unique-solution Sudoku (1 augmentation per puzzle) into a fresh temp directory."""
    path = tmp_path_factory.mktemp("data") / "sudoku"
    build_dataset(path, generate=True, train_size=train_size, test_size=test_size, min_blanks=30, num_aug=1, seed=0)
    return path


@pytest.fixture(scope="session")
def sudoku_dir(tmp_path_factory):
    """64 training puzzles (x2 with augmentation) and 16 test puzzles."""
    return make_sudoku(tmp_path_factory, 64, 16)


@pytest.fixture(scope="session")
def cape_data(tmp_path_factory):
    """A small synthetic MP-100 (utils/data/cape/synthetic.py: 10 categories of 20 instances, 64 px, seed 0), built
    once a session (about 1.5 s of CPU). Read it only: a test that changes a dataset copies it first."""
    from utils.data.cape.synthetic import build

    return build(tmp_path_factory.mktemp("cape") / "synthetic_cape", num_categories=10, instances_per_category=20,
                 image_size=64, seed=0)


def signal_at(point: str, step: int, signal_name: str, group: bool = False, leader: bool = False) -> dict[str, str]:
    """Environment entries that make a run send itself ``signal_name`` at ``point`` of step ``step`` (to its whole
    process group with ``group``, to the group's leader alone with ``leader``: start such a run, or the script that
    starts it, with ``start_new_session=True``), in an environment of :func:`child_env`."""
    return {"RUN_SIGNAL_AT": f"{point}:{step}:{signal_name}" + (":group" if group else ":leader" if leader else "")}


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a trainer subprocess: unbuffered output, one thread per process, the tests' hook on
    PYTHONPATH (tests/run_hook: it arms ``RUN_SIGNAL_AT`` there, :func:`signal_at`), and ``extra``."""
    path = os.pathsep.join(p for p in (str(HOOK_PATH), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def terminate_this_process() -> None:
    """SIGTERM to this process, as ``kill`` or a scheduler sends it, where the command under test catches it (with
    SIGTERM's default action it would end the test session rather than fail the test)."""
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL, "SIGTERM is not handled: it would end the process"
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def scalar_cpu_kernels():
    """torch.compile's C++ kernels for the CPU without SIMD (inductor's ``cpp.simdlen=1``), for the tests of our code
    under torch.compile: its graph capture, decompositions, fusion and C++ code generation all run, only the vector
    width differs. With an empty cache, as on a fresh clone, the scalar kernels take a third less to build (about 30
    CPU-s less for the compiled training step); AVX2/AVX-512 code generation itself is PyTorch's to test."""
    import torch._inductor.config as inductor

    with inductor.patch({"cpp.simdlen": 1}):
        yield


@pytest.fixture(scope="session")
def warm_pretrain():
    """Runs of pretrain.py as forks of one warm interpreter (tests/warm_trainer.py), in :func:`child_env`: for the
    crash and resume tests, whose point is the files a run leaves, not how a process starts."""
    with WarmTrainer("pretrain", child_env()) as warm:
        yield warm


@pytest.fixture(scope="session")
def warm_cape():
    """As :func:`warm_pretrain`, for ``python -m models.train_cape_episodic``."""
    with WarmTrainer("models.train_cape_episodic", child_env()) as warm:
        yield warm
