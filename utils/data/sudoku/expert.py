"""Expert Sudoku puzzles: a local search over clue moves that keeps the puzzles whose search trees are large.

Random minimal puzzles (utils/data/sudoku/build.py ``generate_puzzle``) are mostly easy: half of them rate <= 1 on
:func:`utils.data.sudoku.rating.rate`'s scale and about 1 in 700 rates 50 or more. Hard puzzles cluster, though:
a puzzle a clue move away from a hard one is often hard too, which is how the community's hardest lists were grown
and how tdoku's generator works (``t-dillon/tdoku`` src/generate.cc: drop clues, re-complete, minimize, keep the
hardest in a pool). Here each *chain* keeps one solution grid and climbs:

1. draw a random full grid and a random minimal puzzle of it;
2. take the chain's hardest puzzle so far, drop one clue, add clues of the grid until the solution is unique again
   (each added clue rules out a second solution that the search found), and remove clues in random order while
   the solution stays unique (a minimal puzzle again); ``ExpertSearch.moves`` such neighbours at a time;
3. score a neighbour by its *search tree*: the guesses :func:`~utils.data.sudoku.rating.search` makes to prove the
   solution unique (limit 2), ties broken by the blanks that naked and hidden singles leave. The tree does not
   depend on how the digits are labelled (the search visits every branch), so the chain never selects a lucky
   labelling; the rating (:func:`~utils.data.sudoku.rating.rate`, the guesses before the first solution, about
   half the tree on average) is measured only on the candidates;
4. a neighbour whose tree has at least ``max(tree_target, 2 * min_rating)`` guesses and whose rating is at least
   ``min_rating`` is kept; the chain stops after ``per_grid`` kept puzzles, or after ``patience`` neighbours
   without one (:class:`ExpertSearch`).

With ``ExpertSearch.rating_scale = "tdoku"`` (:data:`TDOKU_SEARCH`) the trees, the ratings and the floor are
tdoku's guesses (utils/data/sudoku/tdoku.py, Sudoku-Extreme's scale), ties are broken by the band configurations
tdoku's propagation leaves open, and moves drop up to two clues. tdoku's tree depends on the labelling (it
branches on the lowest digit among equals), so a chain may favour an unlucky one; tdoku's own generator averages
over random relabellings instead. The bias is small: held-out puzzles keep most of their rating under random
relabellings and shuffles (docs/data.md).

Each chain is a generator whose searches :func:`~utils.data.sudoku.rating.run_jobs` answers with the compiled
search (utils/data/sudoku/jit.py). Chain k of a stream draws only from the RNG seeded
``[seed, stream, k, 44]``, so the puzzles do not depend on the number of worker processes. The puzzles of one
chain share its solution grid, and :func:`generate_expert` keeps or skips a chain's puzzles together by that grid's
symmetry-invariant fingerprint (:func:`utils.data.sudoku.symmetry.grid_fingerprints`): training and test sets
generated with the fingerprints of one passed to the other never hold puzzles of the same or of equivalent grids, so
no test puzzle is equivalent to a training puzzle (equivalent puzzles have equivalent solutions).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
import zipfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Generator

import numpy as np
from tqdm import tqdm

from utils.data.sudoku import rating as sudoku_rating
from utils.data.common import worker_pool
from utils.data.puzzle_dataset import DatasetError
from utils.data.sudoku.symmetry import grid_fingerprints
from utils.data.sudoku.rating import Query, SearchResult

MIN_RATING = 20   # the default floor on utils/data/sudoku/rating.rate
MIN_RATINGS = {"singles": MIN_RATING, "tdoku": 10}  # the default floor on each rating scale
_REACH = {"singles": "20-300", "tdoku": "5-40"}  # what the chains reach on each scale, for messages
_STREAM_TAG = 44  # keeps these RNG streams apart from generate_puzzle's [seed, stream, index]


@dataclass(frozen=True)
class ExpertSearch:
    """How the chains search (see the module docstring); the defaults give ratings with a median near 60.

    Attributes:
        tree_target: search-tree guesses (of the uniqueness search) that make a neighbour a candidate; raised to
            twice ``min_rating`` when that is more, since a rating is about half the tree on average.
        per_grid: puzzles kept per chain, i.e. per solution grid.
        moves: neighbours a chain tries side by side before it takes its hardest puzzle again.
        patience: neighbours a chain tries without keeping a puzzle before it gives up.
        chains_per_task: chains a worker process runs in one task (the unit of work handed to a worker).
        give_up: chains in a row without a puzzle after which generation stops with an error.
        rating_scale: whose guesses the trees, the ratings and ``min_rating`` count
            (utils/data/sudoku/rating.RATING_SCALES): "singles" or "tdoku".
        max_drop: a move drops 1 to this many clues (drawn uniformly); more than 1 lets a chain leave a local
            maximum, which tdoku's scale needs.
    """

    tree_target: int = 60
    per_grid: int = 8
    moves: int = 8
    patience: int = 160
    chains_per_task: int = 32
    give_up: int = 512
    rating_scale: str = "singles"
    max_drop: int = 1


# The climb on tdoku's scale (Sudoku-Extreme's): its trees are far smaller than ours, and moves of one clue stall
# near trees of 10, so moves drop up to two clues and chains wait longer. With MIN_RATINGS["tdoku"] = 10, held-out
# ratings have a median near 17 (docs/data.md).
TDOKU_SEARCH = ExpertSearch(tree_target=20, patience=320, rating_scale="tdoku", max_drop=2)
SEARCHES = {"singles": ExpertSearch(), "tdoku": TDOKU_SEARCH}  # the default search for each rating scale


# A chain's steps: each yields a search or a list of searches and sub-steps, and is sent their results.
Job = Generator[Query | list, SearchResult | list, object]


def _minimize(puzzle: np.ndarray, rng: np.random.Generator) -> Job:
    """Remove clues in random order while the solution stays unique; returns the minimal puzzle (uint8 [81])."""
    for i in rng.permutation(81).tolist():
        digit = int(puzzle[i])
        if digit:
            puzzle[i] = 0
            if (yield Query(puzzle.copy(), 1, (i, digit))).count:  # another digit fits there: the clue is needed
                puzzle[i] = digit
    return puzzle


def _constrain(puzzle: np.ndarray, solution: np.ndarray, rng: np.random.Generator) -> Job:
    """Add clues of ``solution`` (a solution of ``puzzle``) until it is the only one; returns the puzzle."""
    while True:
        found = yield Query(puzzle.copy(), 2)
        if found.count == 1:
            return puzzle
        other = np.array(found.last if found.solution == solution.tolist() else found.solution, np.uint8)
        differ = np.flatnonzero(other != solution)
        cell = differ[rng.integers(len(differ))]
        puzzle[cell] = solution[cell]


def _score(puzzle: np.ndarray, scale: str) -> Job:
    """How a chain ranks a puzzle: (its search tree, what propagation leaves open), both on ``scale``. Among small
    trees, which are often equal, the second tells the puzzles on which propagation stalls, and those grow large
    trees sooner."""
    tree = (yield Query(puzzle.copy(), 2, scale=scale)).guesses
    return tree, sudoku_rating.left_open(puzzle, scale)


def _neighbour(parent: np.ndarray, solution: np.ndarray, seed: int, search: ExpertSearch) -> Job:
    """``parent`` with 1 to ``search.max_drop`` clues dropped, made unique again and minimized; returns it and its
    :func:`_score`."""
    rng = np.random.default_rng(seed)
    child = parent.copy()
    clues = np.flatnonzero(child)
    if search.max_drop == 1:  # one draw, as before there was a choice: the same puzzles for a seed
        child[rng.choice(clues)] = 0
    else:
        child[rng.choice(clues, size=rng.integers(1, search.max_drop + 1), replace=False)] = 0
    child = yield from _minimize((yield from _constrain(child, solution, rng)), rng)
    return child, (yield from _score(child, search.rating_scale))


def _chain(index: int, seed: int, stream: int, min_rating: int, search: ExpertSearch) -> Job:
    """One chain (see the module docstring). Returns (solution uint8 [81], [(puzzle uint8 [81], rating), ...])."""
    rng = np.random.default_rng([seed, stream, index, _STREAM_TAG])
    solution = np.array(sudoku_rating.search([0] * 81, rng=rng).solution, np.uint8)
    start = yield from _minimize(solution.copy(), rng)
    best = ((yield from _score(start, search.rating_scale)), start)
    seen = {start.tobytes()}
    target, kept, idle = max(search.tree_target, 2 * min_rating), [], 0
    while len(kept) < search.per_grid and idle < search.patience:
        seeds = rng.integers(2**63, size=search.moves).tolist()
        moved = yield [_neighbour(best[1], solution, s, search) for s in seeds]
        fresh = [(score, child) for child, score in moved if child.tobytes() not in seen]
        seen.update(child.tobytes() for _, child in fresh)
        best = max([best, *fresh], key=lambda entry: entry[0])
        hard = [child for (tree, _), child in fresh if tree >= target]
        rated = yield [Query(child.copy(), 1, scale=search.rating_scale) for child in hard]
        new = [(child, found.guesses) for child, found in zip(hard, rated) if found.guesses >= min_rating]
        kept += new
        idle = 0 if new else idle + search.moves
    return solution, kept[:search.per_grid]


def _run_task(chains: range, seed: int, stream: int, min_rating: int, search: ExpertSearch) -> tuple[list, float]:
    """The chains numbered ``chains``: their results in chain order, and the CPU seconds they took."""
    start = time.process_time()
    results = sudoku_rating.run_jobs([_chain(k, seed, stream, min_rating, search) for k in chains])
    return results, time.process_time() - start


def _tasks(first: int, missing: int, workers: int, search: ExpertSearch) -> list[range]:
    """The next chains to run, from chain ``first``, as tasks of consecutive chains: enough for ``missing`` puzzles
    if half the chains keep ``per_grid`` each, at least one task a worker, at most ``chains_per_task`` a task (so a
    small set runs a few chains, not a whole task's)."""
    chains = math.ceil(missing / (search.per_grid / 2))
    size = max(1, min(search.chains_per_task, math.ceil(chains / workers)))
    return [range(first + i * size, first + (i + 1) * size) for i in range(max(workers, math.ceil(chains / size)))]


class ChainStore:
    """The finished tasks of one stream's chains, kept on disk so that a stopped generation resumes where it stopped.

    A chain's result depends only on ``(seed, stream, min_rating, search)`` and its number (module docstring), so
    each task's results are saved under a folder named by a hash of those, one ``.npz`` per task (written to a
    temporary name and renamed: a stop never leaves half a file), and a later run with the same settings takes them
    instead of running the chains again. Other settings use another folder, so nothing stale is ever read.
    """

    def __init__(self, root: Path, seed: int, stream: int, min_rating: int, search: ExpertSearch):
        key = hashlib.sha256(repr((seed, stream, min_rating, search)).encode()).hexdigest()[:16]
        self.folder = Path(root) / f"stream{stream}-{key}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.results: dict[int, tuple] = {}
        self.cpu_seconds = 0.0  # of the chains saved by earlier runs
        for path in sorted(self.folder.glob("chains-*.npz")):
            try:
                with np.load(path) as saved:
                    found = list(zip(saved["chain"], saved["solution"], saved["puzzles"], saved["ratings"],
                                     saved["kept"]))
                    cpu_seconds = float(saved["cpu_seconds"])
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:  # written by another program, or damaged
                print(f"note: {path} is unreadable ({type(e).__name__}); its chains run again and replace it")
                continue
            self.cpu_seconds += cpu_seconds
            for k, solution, puzzles, ratings, kept in found:
                self.results[int(k)] = (solution, [(puzzles[i], int(ratings[i])) for i in range(kept)])
        if self.results:
            print(f"resuming: {len(self.results)} chains of stream {stream} were finished earlier ({self.folder})")

    def has(self, chains: range) -> bool:
        return all(k in self.results for k in chains)

    def get(self, chains: range) -> list:
        return [self.results[k] for k in chains]

    def put(self, chains: range, results: list, cpu_seconds: float) -> None:
        """Save one task's results and CPU time (what ``_run_task`` returns for ``chains``)."""
        width = max([1, *(len(kept) for _, kept in results)])
        puzzles = np.zeros((len(results), width, 81), np.uint8)
        ratings = np.zeros((len(results), width), np.int64)
        for row, (_, kept) in enumerate(results):
            for i, (puzzle, rating) in enumerate(kept):
                puzzles[row, i], ratings[row, i] = puzzle, rating
        path = self.folder / f"chains-{chains.start:08d}-{chains.stop:08d}.npz"
        partial_path = path.with_suffix(".partial")  # not a chains-*.npz: a stop while writing leaves nothing read
        with open(partial_path, "wb") as f:
            np.savez(f, chain=np.arange(chains.start, chains.stop), puzzles=puzzles, ratings=ratings,
                     solution=np.stack([solution for solution, _ in results]),
                     kept=np.array([len(kept) for _, kept in results]), cpu_seconds=cpu_seconds)
        os.replace(partial_path, path)
        self.results.update(zip(chains, results))


def _task_results(pool, work, batch: list[range], store: ChainStore | None):
    """``(results, CPU seconds spent now)`` for each task in ``batch``, in order: from ``store`` where it has them
    (0 s), else run on ``pool`` (and saved)."""
    todo = [task for task in batch if store is None or not store.has(task)]
    computed = pool.imap(work, todo)
    for task in batch:
        if store is not None and store.has(task):
            yield store.get(task), 0.0
            continue
        results, cpu_seconds = next(computed)
        if store is not None:
            store.put(task, results, cpu_seconds)
        yield results, cpu_seconds


def generate_expert(count: int, seed: int, stream: int = 0, min_rating: int = MIN_RATING, workers: int = 1,
                    exclude: set[bytes] | None = None, desc: str = "generate expert",
                    search: ExpertSearch = ExpertSearch(),
                    resume_dir: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray, set[bytes]]:
    """``count`` expert puzzles: unique solutions, rated at least ``min_rating`` (see the module docstring).

    Chains 0, 1, 2, ... of ``stream`` are run in tasks of at most ``search.chains_per_task`` on ``workers``
    processes, and their puzzles are taken in chain order until there are ``count`` (the last chain's cut short),
    skipping every chain whose solution grid's fingerprint is in ``exclude`` or was taken before; so the result
    depends on ``seed``, ``stream``, ``min_rating`` and ``search``, not on ``workers``, and a smaller ``count`` gives
    the first puzzles of a larger one. The signature and return value follow
    :func:`utils.data.sudoku.build.generate_distinct`, so :func:`utils.data.common.generate_train_test` can drive it.

    Args:
        count: puzzles to return, >= 1.
        min_rating: the floor on :func:`utils.data.sudoku.rating.rate` on ``search.rating_scale``, >= 0.
        workers: processes, >= 1.
        exclude: grid fingerprints whose puzzles are not wanted (e.g. the training set's, for a test set).
        search: how the chains search.
        resume_dir: where finished tasks are kept (:class:`ChainStore`), so that a stopped run resumes; None keeps
            nothing. The result is the same with or without it.
    Returns:
        questions uint8 [count, 81] (0 = blank), answers uint8 [count, 81], and the fingerprints seen
        (``exclude`` plus the grids taken).
    Raises:
        DatasetError: ``search.give_up`` chains in a row kept no puzzle (``min_rating`` out of reach).
    """
    seen = set(exclude or ())
    questions, answers = [], []
    work = partial(_run_task, seed=seed, stream=stream, min_rating=min_rating, search=search)
    next_chain, barren, spent = 0, 0, 0.0
    store = None if resume_dir is None else ChainStore(Path(resume_dir), seed, stream, min_rating, search)
    with worker_pool(workers) as pool, \
            tqdm(total=count, desc=desc, unit="puzzle") as bar:
        while len(questions) < count:
            batch = _tasks(next_chain, count - len(questions), workers, search)
            next_chain = batch[-1].stop
            for results, cpu_seconds in _task_results(pool, work, batch, store):
                spent += cpu_seconds
                for solution, kept in results:
                    if len(questions) == count:
                        break
                    barren = barren + 1 if not kept else 0
                    if barren >= search.give_up:
                        raise DatasetError(f"{search.give_up} chains in a row found no puzzle rated >= {min_rating} "
                                           f"(--min-rating) on the {search.rating_scale} scale; lower it (expert "
                                           f"puzzles rate {_REACH[search.rating_scale]})")
                    key = grid_fingerprints(solution[None])[0]
                    if not kept or key in seen:
                        continue
                    seen.add(key)
                    taken = kept[:count - len(questions)]
                    questions += [puzzle for puzzle, _ in taken]
                    answers += [solution] * len(taken)
                    bar.update(len(taken))
                if len(questions) == count:
                    break
    earlier = 0.0 if store is None else store.cpu_seconds
    print(f"{desc}: the chains took {spent + earlier:.1f} CPU-s"
          + (f" ({earlier:.1f} of them in earlier runs, resumed from {store.folder})" if earlier else ""))
    return np.stack(questions), np.stack(answers), seen
