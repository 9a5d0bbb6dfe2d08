"""Pieces every puzzle-dataset builder shares: the source (a directory, generation, or the Hugging Face Hub), the
output-directory rules, the atomic build, the dihedral transforms, generating distinct puzzles (in parallel,
deterministically), subsampling the training set, and writing a split of one-example puzzles in the HRM on-disk
format (utils/data/puzzle_dataset.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import json
import multiprocessing
import multiprocessing.pool
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from tqdm import tqdm

from utils.data.puzzle_dataset import DatasetError
from utils.outputs import OutputPathError, check_writable_dir

# dihedral(dihedral(g, t), DIHEDRAL_INVERSE[t]) == g: rotations by 1 and 3 quarter turns undo each other,
# the flips and (anti-)transposes undo themselves.
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)


def dihedral(grid: np.ndarray, t: int) -> np.ndarray:
    """Dihedral transform ``t`` of the last two axes (TRM ``dataset/common.py`` ``dihedral_transform``; HRM's is the same).

    t0 identity, t1/t2/t3 ``np.rot90`` by 1/2/3 quarter turns (counter-clockwise), t4 left-right flip,
    t5 up-down flip, t6 transpose, t7 anti-transpose (t1 then a left-right flip).

    Args:
        grid: [..., H, W] array (a batch of grids is transformed grid by grid).
        t: 0..7.
    Returns:
        [..., H, W] or [..., W, H] (t1, t3, t6, t7) view or copy.
    Raises:
        ValueError: t is not in 0..7.
    """
    if t in (1, 2, 3):
        return np.rot90(grid, t, axes=(-2, -1))
    if t == 4:
        return np.flip(grid, -1)
    if t == 5:
        return np.flip(grid, -2)
    if t == 6:
        return np.swapaxes(grid, -1, -2)
    if t == 7:
        return np.flip(np.rot90(grid, 1, axes=(-2, -1)), -1)
    if t == 0:
        return grid
    raise ValueError(f"dihedral transform index must be in 0..7, got {t!r}")


def inverse_dihedral(grid: np.ndarray, t: int) -> np.ndarray:
    """Undo :func:`dihedral` ``t``: ``inverse_dihedral(dihedral(g, t), t) == g``."""
    if t not in range(8):
        raise ValueError(f"dihedral transform index must be in 0..7, got {t!r}")
    return dihedral(grid, DIHEDRAL_INVERSE[t])


def check_source_and_sizes(source_dir, generate: bool, source_hint: str, minimums: dict[str, tuple[int, int]],
                           subsample_size: int | None, repo: str | None = None, revision: str | None = None) -> None:
    """The argument checks every puzzle builder shares: at most one source (none: the Hub, see :func:`csv_source`),
    ``repo``/``revision`` only for the Hub, sizes at or above their minimum.

    Args:
        source_hint: what ``--source-dir`` holds and which Hub repo is the default, for the message (e.g.
            "Sudoku-Extreme train.csv/test.csv, Hub repo sapientinc/sudoku-extreme").
        minimums: flag name (underscores) -> (value, smallest allowed).

    Raises:
        DatasetError: naming the flag and the value.
    """
    if source_dir is not None and generate:
        raise DatasetError(f"choose exactly one source: --source-dir DIR, --generate, or neither to download the "
                           f"published CSVs ({source_hint}) from the Hugging Face Hub")
    if (repo is not None or revision is not None) and (source_dir is not None or generate):
        raise DatasetError("--repo and --revision pick the Hugging Face Hub source: drop them, or drop "
                           f"{'--source-dir' if source_dir is not None else '--generate'}")
    for name, (value, low) in minimums.items():
        if value < low:
            raise DatasetError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    if subsample_size is not None and subsample_size < 1:
        raise DatasetError(f"--subsample-size must be >= 1, got {subsample_size}")


@dataclass(frozen=True)
class CsvSource:
    """Where a builder reads its CSVs: ``directory`` (None when it generates), and for a Hub build the ``record``
    of what was fetched (repo, commit, each CSV's SHA-256 and rows), which each split's ``dataset.json`` keeps under
    ``source``."""

    directory: Path | None
    record: dict | None = None


def csv_source(source_dir, generate: bool, repo: str, revision: str | None) -> CsvSource:
    """The CSVs a build reads: ``source_dir``; none with ``generate``; else ``repo`` at ``revision`` fetched from the
    Hugging Face Hub into its cache (:func:`utils.data.hub_source.fetch_csvs`), printed as one ``source:`` line.
    The Hub's files are then read exactly as a ``--source-dir`` with the same CSVs. Call it after
    :func:`check_output_dir`, so a bad output path is refused before a download.

    Raises:
        DatasetError: the Hub's (see :func:`~utils.data.hub_source.fetch_csvs`).
    """
    if generate:
        return CsvSource(None)
    if source_dir is not None:
        return CsvSource(Path(source_dir))
    from utils.data.hub_source import fetch_csvs  # huggingface_hub is imported by Hub builds only

    fetched = fetch_csvs(repo, revision)
    print(fetched.summary(), flush=True)
    return CsvSource(fetched.directory, fetched.record)


def add_source_arguments(parser, csv_help: str, generate_help: str, repo: str) -> None:
    """The builder flags that pick the source: ``--source-dir``, ``--generate``, and ``--repo``/``--revision`` for the
    default, the Hugging Face Hub (``repo`` unless ``--repo`` names another)."""
    source = parser.add_argument_group("source (default: the published CSVs from the Hugging Face Hub)")
    source.add_argument("--source-dir", help=f"read the CSVs from this directory instead: {csv_help}")
    source.add_argument("--generate", action="store_true", help=generate_help)
    source.add_argument("--repo", help=f"the Hub dataset repo to download train.csv and test.csv from (default "
                                       f"{repo}); they stay in the Hugging Face cache (HF_HOME), so HF_HUB_OFFLINE=1 "
                                       "reruns need no network")
    source.add_argument("--revision", help="a branch, tag or commit of the Hub repo (default main); dataset.json "
                                           "records the commit it resolved to")


def add_output_arguments(parser, what: str = "dataset directory to create") -> None:
    """The builder flags that name where a dataset goes: ``--output-dir`` (required; ``what`` says what it becomes)
    and ``--overwrite`` (replace an existing dataset there, :func:`check_output_dir`)."""
    parser.add_argument("--output-dir", required=True, help=what)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --output-dir")


def add_to_metadata(directory: Path, key: str, value) -> None:
    """Add ``key: value`` to the split's ``dataset.json`` (the reference loaders ignore keys they do not know)."""
    path = directory / "dataset.json"
    metadata = json.loads(path.read_text())
    metadata[key] = value
    path.write_text(json.dumps(metadata))


def check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse to build over a file, a symbolic link, a non-empty non-dataset directory, or a dataset without
    ``overwrite``, or where the dataset cannot be written: ``output_dir`` (or its nearest existing ancestor) must take
    a new directory, and so must the parent of an existing one (the build is staged beside it and renamed over it).
    Call it before any work; :func:`staged_dataset` applies the same rule again when it publishes.

    Raises:
        DatasetError: naming the path and the way out.
    """
    refusal = _output_refusal(output_dir, overwrite)
    if refusal:
        raise DatasetError(refusal)
    try:
        check_writable_dir(output_dir, "--output-dir")
        if output_dir.exists():
            check_writable_dir(output_dir.parent, "--output-dir's parent")
    except OutputPathError as e:
        raise DatasetError(str(e)) from None


def _output_refusal(output_dir: Path, overwrite: bool) -> str | None:
    """Why a dataset may not be put at ``output_dir`` now, or None: what is there must be nothing, an empty
    directory, or (with ``overwrite``) a dataset. A symbolic link is refused: the build replaces the folder it names,
    which would be the link, not the folder it points to."""
    if output_dir.is_symlink():
        return (f"--output-dir {output_dir} is a symbolic link (to {os.readlink(output_dir)}); a build replaces the "
                "folder the path names: give the folder itself, or a new path")
    if not output_dir.exists():
        return None
    if not output_dir.is_dir():
        return f"--output-dir {output_dir} is a file; pick a directory path"
    if any(output_dir.iterdir()):
        if not overwrite:
            return f"--output-dir {output_dir} is not empty; pass --overwrite to replace it or pick another path"
        if not (output_dir / "identifiers.json").exists():
            return f"refusing to overwrite {output_dir}: it does not look like a puzzle dataset (no identifiers.json)"
    return None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
WAKE_S = 0.2  # seconds the main process waits for a worker's result before it wakes to run a signal's handler
_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): the signal a process gets when its parent ends


class Workers:
    """Where a build's work runs (:func:`worker_pool`): the pool's processes, or this process without one."""

    def __init__(self, pool: multiprocessing.pool.Pool | None):
        self._pool = pool

    def imap(self, work: Callable, items: Iterable, chunksize: int = 1) -> Iterator:
        """``work(item)`` for each of ``items``, in order (``pool.imap``; ``work`` picklable with a pool).

        The main process waits for each result in slices of :data:`WAKE_S` seconds: a signal that the kernel gave
        another of its threads (torch's, tqdm's) runs its handler only when the main thread runs Python again, and
        a worker's task can take minutes, so a stop would otherwise wait for the next result.
        """
        if self._pool is None:
            yield from map(work, items)
            return
        items = iter(items)
        # Lists of chunksize items, one task each: Pool.imap's own chunking hides the waiting iterator behind a
        # generator without next(timeout).
        chunks = iter(lambda: list(itertools.islice(items, chunksize)), [])
        results = self._pool.imap(functools.partial(_map_list, work), chunks)
        while True:
            try:
                yield from results.next(timeout=WAKE_S)
            except multiprocessing.TimeoutError:
                continue
            except StopIteration:
                return


def _map_list(work: Callable, items: list) -> list:
    """``[work(item) for item in items]``: one task of :meth:`Workers.imap` in a worker."""
    return [work(item) for item in items]


@contextlib.contextmanager
def worker_pool(workers: int) -> Iterator[Workers]:
    """``workers`` generation processes (none for one worker: the work runs in this process), ended when the block
    is left, however it is left; their results come from :meth:`Workers.imap`.

    A stop is the main process's to act on: the workers ignore SIGINT (Ctrl-C reaches the whole process group, and
    the main process stops the build) and die of the SIGTERM with which the pool ends them. A signal in the main
    process (raised there by its handler: a trainer's at-once stop, Ctrl-C, a command's SIGTERM) leaves the block
    with its exception, and the workers are ended before it goes on; they also end with the main process however it
    ends (on Linux; :func:`_worker_signals`), so none is left running at full CPU without it. Each worker forks with
    SIGINT and SIGTERM held (:class:`_HeldStartProcess`), so that it never runs the main process's handler; they are
    held for one fork at a time, not the whole start, so a stop while the pool starts is acted on after the fork in
    progress: the workers started so far are ended and no more are started.
    """
    if workers <= 1:
        yield Workers(None)
        return
    before = set(multiprocessing.active_children())
    try:
        pool = _Pool(workers, _worker_signals)
    except BaseException:
        # Pool() ends the workers it started only on an Exception; a stop (KeyboardInterrupt) passes through it.
        started = [p for p in multiprocessing.active_children() if isinstance(p, _HeldStartProcess) and p not in before]
        for process in started:
            process.terminate()
        for process in started:
            process.join()
        raise
    try:
        yield Workers(pool)
    finally:
        # The ending runs in a thread of its own, where no signal handler runs: a second stop (or a trainer's repeat
        # of the first, utils/run/stop.py) can cut short this thread's wait for it, not the ending itself.
        ender = threading.Thread(target=_end, args=(pool,), name="end generation workers")
        ender.start()
        ender.join()


class _HeldStartProcess(multiprocessing.context.Process):
    """A generation worker that forks with SIGINT and SIGTERM held: until :func:`_worker_signals` has run in it, a
    signal would run the main process's handler there (a trainer's graceful stop would swallow the SIGTERM that ends
    it). A stop that came during the fork is raised in the main process as the signals are let through again."""

    def start(self) -> None:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


class _Pool(multiprocessing.pool.Pool):
    """``multiprocessing.Pool`` whose workers are :class:`_HeldStartProcess` (the default start method's)."""

    @staticmethod
    def Process(ctx, *args, **kwargs):  # noqa: N802 (Pool's name)
        return _HeldStartProcess(*args, **kwargs)


def _end(pool: multiprocessing.pool.Pool) -> None:
    """End ``pool``'s workers (SIGTERM) and wait for them."""
    pool.terminate()
    pool.join()


def _worker_signals() -> None:
    """A generation worker's signals (see :func:`worker_pool`): SIGTERM ends it, SIGINT is the main process's, and
    on Linux it gets SIGKILL when its parent ends (a worker that is not busy ends anyway, at the end of its task
    queue). A trainer's graceful-stop handler, inherited through fork, would otherwise swallow the SIGTERM with which
    the pool ends its workers, and the pool would wait for them forever."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def generate_distinct(work: Callable[[int], tuple[np.ndarray, np.ndarray]], key: Callable[[np.ndarray, np.ndarray], bytes],
                      count: int, workers: int = 1, exclude: set[bytes] | None = None, desc: str = "generate",
                      unit: str = "puzzle", chunksize: int = 8) -> tuple[np.ndarray, np.ndarray, set[bytes]]:
    """``count`` (question, answer) pairs from ``work(0), work(1), ...``, keeping a pair only when its
    ``key`` is new (not in ``exclude`` and not kept before); a rejected index is replaced by the next one.

    Which indices are kept depends only on ``work`` and ``key``, so with ``work(k)`` seeded by ``k`` the
    result is the same for any number of ``workers`` (``work`` must be picklable when ``workers > 1``).

    Returns:
        questions and answers stacked ``[count, ...]``, and the keys seen (``exclude`` plus the new ones).
    """
    seen = set(exclude or ())
    questions, answers = [], []
    next_index = 0
    with worker_pool(workers) as pool, \
            tqdm(total=count, desc=desc, unit=unit) as bar:
        while len(questions) < count:
            indices = range(next_index, next_index + count - len(questions))
            next_index = indices.stop
            for q, a in pool.imap(work, indices, chunksize):
                k = key(q, a)
                if k not in seen:
                    seen.add(k)
                    questions.append(q)
                    answers.append(a)
                    bar.update(1)
    return np.stack(questions), np.stack(answers), seen


def generate_train_test(generate: Callable[..., tuple[np.ndarray, np.ndarray, set[bytes]]], train_size: int,
                        test_size: int, workers: int, noun: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate the training split (stream 0), then the test split (stream 1) excluding every training key,
    so no test puzzle is a training puzzle or equivalent to one; prints the rate.

    ``generate(count, stream, exclude, desc)`` returns (questions, answers, keys seen), as a builder's
    ``generate_distinct`` does. Returns train questions, train answers, test questions, test answers.
    """
    start = time.perf_counter()
    train_q, train_a, seen = generate(train_size, 0, None, "generate train")
    test_q, test_a, _ = generate(test_size, 1, seen, "generate test")
    seconds = time.perf_counter() - start
    print(f"generated {train_size + test_size} {noun} in {seconds:.1f} s "
          f"({(train_size + test_size) / seconds:.1f} {noun}/s, {workers} worker(s))")
    return train_q, train_a, test_q, test_a


def subsample_training(questions: np.ndarray, answers: np.ndarray, subsample_size: int | None,
                       rng: np.random.Generator, noun: str) -> tuple[np.ndarray, np.ndarray]:
    """Keep ``subsample_size`` training pairs drawn without replacement by ``rng`` (all of them, with a note,
    when there are no more than that; unchanged when ``subsample_size`` is None), as the reference builders'
    ``--subsample-size`` does."""
    if subsample_size is None:
        return questions, answers
    if subsample_size >= len(questions):
        print(f"--subsample-size {subsample_size} >= {len(questions)} training {noun}: keeping all")
        return questions, answers
    keep = rng.choice(len(questions), size=subsample_size, replace=False)
    return questions[keep], answers[keep]


@contextlib.contextmanager
def staged_dataset(output_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Build into a temporary sibling directory, then rename it to ``output_dir``, so an interrupted build never
    leaves a dataset that looks complete. Call :func:`check_output_dir` first.

    What ``output_dir`` holds by the time the build is done is judged again by :func:`check_output_dir`'s rule
    (another build, or a user, may have put something there meanwhile): only an existing dataset, and only with
    ``overwrite``, is replaced. The rename itself refuses a folder that is not empty, so of two builds racing into
    one folder without ``overwrite`` the later fails instead of replacing the earlier.

    Raises:
        DatasetError: ``output_dir`` may not take the dataset now (nothing was published; it is left as it is).
    """
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = _new_sibling(output_dir, "building")
    try:
        yield staging
        _publish(staging, output_dir, overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _new_sibling(output_dir: Path, role: str) -> Path:
    """A new empty hidden directory beside ``output_dir``, named for this process and ``role``, with the mode a new
    folder gets (the umask's), as the dataset it becomes should have."""
    for n in itertools.count():
        path = output_dir.parent / f".{output_dir.name}.{role}-{os.getpid()}-{n}"
        try:
            path.mkdir()
            return path
        except FileExistsError:  # another build of this process, or a leftover: take the next name
            continue


def _publish(staging: Path, output_dir: Path, overwrite: bool) -> None:
    """Rename ``staging`` to ``output_dir``, first moving aside the dataset it replaces (``overwrite``), which is
    deleted only once the new one is in place.

    Raises:
        DatasetError: see :func:`staged_dataset`.
    """
    refusal = _output_refusal(output_dir, overwrite)
    if refusal:
        raise DatasetError(f"{refusal} (it changed while this build ran, so the new dataset was not published)")
    old = None
    if output_dir.exists() and any(output_dir.iterdir()):  # a dataset, which overwrite replaces
        old = _new_sibling(output_dir, "replaced") / output_dir.name
        os.rename(output_dir, old)
    try:
        os.rename(staging, output_dir)  # refuses a folder that is not empty: something put there since the check
    except OSError as e:
        kept = ""
        if old is not None:
            try:
                os.rename(old, output_dir)
                old.parent.rmdir()
            except OSError:
                kept = f"; the dataset it was to replace is kept at {old}"
        raise DatasetError(f"--output-dir {output_dir} took other files while this build ran ({e.strerror}); the new "
                           f"dataset was not published{kept}: rerun when nothing else writes there, or pick another "
                           "path") from None
    if old is not None:
        shutil.rmtree(old.parent)


def write_one_example_split(directory: Path, inputs: np.ndarray, labels: np.ndarray, variants: int, vocab_size: int,
                            ignore_label_id: int | None = 0) -> None:
    """Write one split of one-example puzzles with one puzzle identifier (0), ``variants`` puzzles to a group.

    This is the layout of the reference Sudoku and maze builders: group g holds rows
    ``g * variants .. (g + 1) * variants - 1`` (an original and its augmentations). ``dataset.json``
    carries HRM's metadata fields plus TRM's ``total_puzzles`` (the number of groups, as TRM's builders
    write it), so both references' loaders read it.

    Args:
        inputs, labels: uint8 [N, seq_len] tokens (pad 0); N a multiple of ``variants``.
    """
    num_puzzles, seq_len = inputs.shape
    groups = num_puzzles // variants
    arrays = {
        "inputs": inputs.astype(np.uint8, copy=False),
        "labels": labels.astype(np.uint8, copy=False),
        "puzzle_identifiers": np.zeros(num_puzzles, np.int32),
        "puzzle_indices": np.arange(num_puzzles + 1, dtype=np.int32),
        "group_indices": np.arange(0, num_puzzles + 1, variants, dtype=np.int32),
    }
    # Keys in the order of TRM's PuzzleDatasetMetadata.
    metadata = {"pad_id": 0, "ignore_label_id": ignore_label_id, "blank_identifier_id": 0, "vocab_size": vocab_size,
                "seq_len": seq_len, "num_puzzle_identifiers": 1, "total_groups": groups, "mean_puzzle_examples": 1.0,
                "total_puzzles": groups, "sets": ["all"]}
    directory.mkdir(parents=True)
    with open(directory / "dataset.json", "w") as f:
        json.dump(metadata, f)
    for name, array in arrays.items():
        np.save(directory / f"all__{name}.npy", array)
