"""The page's solves: the models on offer, the queue of solves (one at a time, each its client's by id, with its
progress and its stop), and an answer as the page draws it (utils/serve/server.py)."""


from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from utils.data.arc import tokens_to_grid
from utils.data.user_puzzles import PuzzleInputError, parse_maze, parse_sudoku
from utils.train.arc_adapt import adapt_and_answer, task_from_json
from utils.solve.anytime import UNSOLVABLE, Spent, anytime_compute, default_search, protocol, solve_anytime
from utils.eval.load import Trained, load_trained
from utils.eval.reasoning import RULES, Cancelled, TestTimeCompute, test_time_compute
from utils.solve.search import Search
from utils.solve.precheck import VOCAB, Prepared, prepare
from utils.solve.solving import (BUNDLED, BundledModelMissing, answer, check_budget, compute_budget, flops_per_pass,
                                 gif_segments, open_model)
from utils.solve.verdict import Answer
from utils.viz.puzzles import render_segments, segments_gif

from utils.serve.fields import (COMPUTE_FIELDS, request_compute, named_as_fields, page_budget, checked_solve_id,
                                 compute_json)

log = logging.getLogger(__name__)
TASK_OF_VOCAB = {vocab: task for task, (vocab, _) in VOCAB.items()}
STOP_GRACE_S = 30  # Ctrl-C waits this long for the solve in progress to leave the model
TURN_POLL_S = 0.2  # how often a request waiting for its turn checks that its client is still there


@dataclass
class Offered:
    """A model the page offers: ``id`` (its index), a ``label``, the ``task`` it answers, the loaded model, whether it
    is a ``bundled`` one, and the ``flops`` of one of its segment passes (its compute budget's unit)."""

    id: int
    label: str
    task: str
    trained: Trained
    bundled: bool
    flops: int

    def defaults(self, flags: argparse.Namespace) -> TestTimeCompute:
        """The page's default test-time compute for it: what the command line's flags (``flags``, solve.py's) ask
        for, else its own, with checked selection where ``--checked`` was given and its task has rules to check.

        Raises:
            TestTimeComputeError: a flag out of this model's range.
        """
        given = {field: getattr(flags, field, None) for field in COMPUTE_FIELDS}
        given["checked"] = bool(given["checked"]) and self.task in RULES
        return test_time_compute(SimpleNamespace(**given), self.trained.cfg, task=self.task)

    def budget(self, flags: argparse.Namespace) -> float:
        """The page's default anytime budget for it, seconds a puzzle: the command line's (solve.py's default for
        Sudoku and mazes), 0 (fixed compute) for an ARC model, whose answers have no rules to check."""
        return float(getattr(flags, "budget", None) or 0) if self.task in RULES else 0.0

    def describe(self, device: torch.device, flags: argparse.Namespace) -> dict[str, Any]:
        """What the page shows of it: its :meth:`defaults` and its budget now."""
        budget = compute_budget(self.trained, device, flops=self.flops)
        return {"id": self.id, "label": self.label, "task": self.task, "side": math.isqrt(self.trained.seq_len),
                "compute": compute_json(self.defaults(flags), self.trained.cfg.arch["halt_max_steps"],
                                        self.budget(flags)),
                "budget": budget.describe()}


def offered_models(checkpoints: Optional[list[str]], device: torch.device, dtype: torch.dtype) -> list[Offered]:
    """The bundled models (those whose file is there), then each checkpoint the command line gave, loaded once.

    Raises:
        CheckpointError, ConfigError: a checkpoint (a bundled one too) that cannot be loaded, or whose data sizes it
            does not record.
        PuzzleInputError: a checkpoint of puzzles the page does not know, a bundled model that is there but does
            not take its side, or no model at all.
    """
    loaded = []
    for task, bundled in BUNDLED.items():
        # Only a missing file is passed over: a bundled model that is there but does not load or take its side is a
        # damaged checkout, and the page says so rather than calling it missing.
        try:
            trained = open_model(None, task, bundled.side ** 2, 1, device, dtype)
        except BundledModelMissing:
            log.warning("the bundled model for %s (%s) is not there: the page offers the others", bundled.what,
                        bundled.file)
            continue
        loaded.append((f"bundled: {bundled.what} ({bundled.file})", task, trained, True))
    for spec in checkpoints or []:
        trained = load_trained(spec, device, dtype, 1)
        task = TASK_OF_VOCAB.get(trained.vocab_size)
        if task is None:
            raise PuzzleInputError(f"--checkpoint {spec}: a model of {trained.vocab_size} tokens answers no puzzle the "
                                   "page knows (Sudoku 11, mazes 6, ARC 12)")
        loaded.append((f"{spec} ({task}, step {trained.step})", task, trained, False))
    if not loaded:
        raise PuzzleInputError("no model to offer: the bundled ones are missing; give --checkpoint")
    return [Offered(i, label, task, trained, bundled, flops_per_pass(trained))
            for i, (label, task, trained, bundled) in enumerate(loaded)]


def grid_rows(tokens: np.ndarray, task: str) -> np.ndarray:
    """Tokens [side * side] as int64 rows [side, side] of the task's own values: Sudoku digits (0 blank), maze tokens,
    ARC colours."""
    side = math.isqrt(tokens.size)
    rows = tokens.reshape(side, side).astype(np.int64)
    return (rows - 1).clip(0) if task == "sudoku" else rows


def answer_json(found: Answer) -> dict[str, Any]:
    """An answer as the page draws it: each segment's grid, the cells whose shown value it changed, sigmoid(q_halt),
    the verdict; its GIF shows at most :data:`utils.solve.solving.GIF_FRAMES` of the segments."""
    frames, before = [], grid_rows(found.puzzle, found.task)
    for grid, confidence in zip(found.segment_grids, found.confidence):
        shown = grid_rows(grid, found.task)
        frames.append({"grid": shown.tolist(), "confidence": float(confidence),
                       "changed": np.flatnonzero(shown != before).tolist()})
        before = shown
    gif = segments_gif(render_segments(found.task, found.puzzle, found.grid, found.segment_grids,
                                       found.segment_q_halt, title=f"{found.task} (cells wrong = cells that differ "
                                                                   "from the final answer)",
                                       shown=gif_segments(len(found.segment_grids))))
    return {"puzzle": grid_rows(found.puzzle, found.task).tolist(), "frames": frames, "segments": found.segments,
            "halting": found.halting, "votes": found.votes, "consistent": found.consistent, "verdict": found.verdict,
            "selection": found.selection,
            "text": found.text, "gif": base64.b64encode(gif).decode()}


@dataclass
class _Solve:
    """One solve in the hands of :class:`Solver`: ``enough`` is set when its client stops it, ``progress`` is what
    ``/api/progress`` says of it, ``stoppable`` whether a stop still ends it (an ARC adaptation under way is not)."""

    enough: threading.Event = dataclasses.field(default_factory=threading.Event)
    progress: dict[str, Any] = dataclasses.field(default_factory=lambda: {"solving": True, "waiting": True})
    stoppable: bool = True


class Solver:
    """What the API does, apart from HTTP: the models on offer, one solve at a time, each cancelled between two
    segments when its client leaves or the server stops (``stopping``); ``busy`` while one runs. A solve sent with an
    id (``solves``) reports its :meth:`progress` as it goes and ends when asked (:meth:`stop`): an anytime one (a
    budget) with its best answer so far."""

    def __init__(self, models: list[Offered], args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                 out: Path):
        self.models, self.args, self.device, self.dtype, self.out = models, args, device, dtype, out
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.busy = False
        self.solves: dict[str, _Solve] = {}  # by id: those running or waiting for their turn
        self._solves_lock = threading.Lock()

    def solve(self, request: Any, client_gone: Optional[Callable[[], bool]] = None) -> dict[str, Any]:
        """Answer one ``/api/solve`` request: checked whole, budget included, before it waits for its turn.

        Args:
            client_gone: whether the client has left (asked between segments); None: never.

        Raises:
            UserError: a malformed request or puzzle, compute out of range or over budget (the line solve.py
                prints, naming the request's fields), a ``solve_id`` already under way, or a stop (:meth:`stop`)
                before there was an answer to give.
            RunFailure: an ARC adaptation that stopped.
            Cancelled: the client left, or the server stops.
        """
        if not isinstance(request, dict):
            raise PuzzleInputError("the request is not a JSON object")
        model = request.get("model")
        if not isinstance(model, int) or isinstance(model, bool) or not 0 <= model < len(self.models):
            raise PuzzleInputError(f"model {model!r} is not one of the ids 0..{len(self.models) - 1}")
        offered = self.models[model]
        solve_id = None if request.get("solve_id") is None else checked_solve_id(request["solve_id"], "solve_id")
        flags = argparse.Namespace(**{**dict.fromkeys(COMPUTE_FIELDS), **request_compute(request.get("compute"))})
        flags.budget = page_budget(flags.budget, offered.task)
        with named_as_fields():
            ttc = anytime_compute(flags, test_time_compute(flags, offered.trained.cfg, keep_segments=True,
                                                           task=offered.task))
            if offered.task == "arc" and ttc.views != 1:
                raise PuzzleInputError(f"views={ttc.views} cannot be used with ARC: its augmented copies vote instead")
            check_budget(offered.trained, ttc, flags, self.device, flops=offered.flops)
        used = compute_json(ttc, offered.trained.cfg.arch["halt_max_steps"], flags.budget or 0.0)

        def cancelled() -> bool:
            return self.stopping.is_set() or (client_gone is not None and client_gone())

        if offered.task == "arc":
            task, known = task_from_json(request.get("task"), "task", "the task")
            with self._owned(solve_id) as mine, _Turn(self, mine, cancelled, f"{offered.label}, {used}",
                                                      stoppable=False):
                return self._arc(offered, task, known, ttc)
        ready = self._puzzle(offered, request.get("puzzle"))
        with self._owned(solve_id) as mine, _Turn(self, mine, cancelled, f"{offered.label}, {used}"):
            if flags.budget:
                search = default_search(offered.trained, ttc, ready.tokens.size)
                found, spent = self._anytime(offered, ready, flags.budget, ttc, search, cancelled, mine)
                # What the rounds ran, not the one unchecked rollout that anytime_compute hands each of them.
                used |= {"rollouts": spent["trajectories"], "noise": search.latent_noise, "checked": True,
                         "search": search.describe()}
            else:
                found, spent = self._fixed(offered, ready.tokens, ttc, cancelled, mine), None
            if cancelled():
                raise Cancelled("stopped before drawing the answer")
            shown = answer_json(dataclasses.replace(found, shape=ready.shape))
            return {"model": offered.label, **shown, "compute": used} | ({"anytime": spent} if spent else {})

    @contextlib.contextmanager
    def _owned(self, solve_id: Optional[str]) -> Iterator[_Solve]:
        """``with``: a solve that :meth:`progress` and :meth:`stop` reach by ``solve_id`` until the block ends (None:
        one no other request reaches).

        Raises:
            PuzzleInputError: ``solve_id`` names a solve already under way.
        """
        mine = _Solve()
        if solve_id is None:
            yield mine
            return
        with self._solves_lock:
            if solve_id in self.solves:
                raise PuzzleInputError(f"solve_id {solve_id!r} names a solve under way: pick a new random id for each "
                                       "solve")
            self.solves[solve_id] = mine
        try:
            yield mine
        finally:
            with self._solves_lock:
                del self.solves[solve_id]

    def progress(self, solve_id: str) -> dict[str, Any]:
        """What the solve ``solve_id`` has done so far (``/api/progress``); ``{"solving": False}`` when there is no
        such solve under way."""
        with self._solves_lock:
            mine = self.solves.get(solve_id)
            return dict(mine.progress) if mine is not None else {"solving": False}

    def stop(self, solve_id: str) -> bool:
        """Ask the solve ``solve_id`` to end now (``/api/stop``); whether one will: False when there is no such solve
        under way, or it cannot be stopped (an ARC adaptation under way)."""
        with self._solves_lock:
            mine = self.solves.get(solve_id)
            if mine is None or not mine.stoppable:
                return False
            mine.enough.set()
            return True

    def _begin(self, mine: _Solve, stoppable: bool) -> None:
        """``mine`` has its turn: it runs, and a stop still ends it where ``stoppable``.

        Raises:
            PuzzleInputError: it was stopped while it waited.
        """
        with self._solves_lock:  # a stop comes before this, and is refused, or after, and is kept
            if mine.enough.is_set():
                raise PuzzleInputError(STOPPED_WAITING)
            mine.progress, mine.stoppable = {"solving": True, "waiting": False}, stoppable

    def _fixed(self, offered: Offered, tokens: np.ndarray, ttc: TestTimeCompute, cancelled: Callable[[], bool],
               mine: _Solve) -> Answer:
        """The answer under the fixed compute ``ttc``.

        Raises:
            PuzzleInputError: stopped (``/api/stop``) before the answer was complete.
            Cancelled: the client left, or the server stops.
        """
        try:
            return answer(offered.trained, offered.task, [("puzzle", tokens)], ttc, self.device,
                          lambda: cancelled() or mine.enough.is_set())[0]
        except Cancelled:
            if cancelled():
                raise
            raise PuzzleInputError("stopped before the answer was complete: fixed compute keeps no answer so far (a "
                                   "time budget keeps its best one)") from None

    def _anytime(self, offered: Offered, ready: Prepared, budget: float, ttc: TestTimeCompute, search: Search,
                 cancelled: Callable[[], bool], mine: _Solve) -> tuple[Answer, dict[str, Any]]:
        """Solve under ``budget`` seconds (utils/solve/anytime.py) with ``search``, reporting ``mine``'s progress
        after every round; the answer kept and what was spent.

        Raises:
            PuzzleInputError: stopped (``/api/stop``) before the model's own answer was in.
            Cancelled: the client left, or the server stops.
        """
        mine.progress = {"solving": True, "waiting": False, "budget": budget, "seconds": 0.0, "rounds": 0,
                         "passes": 0, "consistent": False}

        def progressed(spent: Spent, best: Answer) -> None:
            mine.progress = {**mine.progress, **dataclasses.asdict(spent), "consistent": best.consistent}

        solved = solve_anytime(offered.trained, offered.task, "puzzle", ready.tokens, budget, ttc, self.device,
                               enough=mine.enough.is_set, cancel=cancelled, progress=progressed, search=search,
                               solutions=ready.solutions)
        if solved.ended == "unsolvable":
            raise PuzzleInputError(f"{UNSOLVABLE[offered.task]}; nothing was run")
        if solved.answer is None:
            raise PuzzleInputError("stopped before the model's own answer was in: nothing to show")
        return solved.answer, {**dataclasses.asdict(solved.spent), "ended": solved.ended,
                               "protocol": protocol(budget)}

    @staticmethod
    def _puzzle(offered: Offered, puzzle: Any) -> Prepared:
        """The request's puzzle, prepared for ``offered``'s model (utils/solve/precheck.py).

        Raises:
            PuzzleInputError: empty, malformed, or of a size the model does not take.
        """
        if not isinstance(puzzle, str) or not puzzle.strip():
            wanted = "81 characters" if offered.task == "sudoku" else "a maze"
            raise PuzzleInputError(f"the puzzle is empty: give {wanted}")
        tokens, shape = (parse_sudoku(puzzle, "the puzzle"), None) if offered.task == "sudoku" else \
            parse_maze(puzzle, "the maze")
        return prepare(offered.trained, offered.task, tokens, shape)

    def _arc(self, offered: Offered, task, known: bool, ttc: TestTimeCompute) -> dict[str, Any]:
        """Adapt to an ARC task sent as JSON and answer it: both attempts of each test input, with every segment's
        answer of its un-augmented copy."""
        args = argparse.Namespace(**{**vars(self.args), "checkpoint": str(offered.trained.path)})
        result = adapt_and_answer(task, known, "the page", args, ttc, self.device, self.dtype, self.out)
        tests = []
        for i, attempts in enumerate(result.submission[task.id]):
            frames = []
            if i < len(result.original.rows):
                _, grids, q_halt = result.original.rows[i]
                confidence = torch.sigmoid(q_halt.float()).tolist()
                decoded = [tokens_to_grid(g.numpy()) for g in grids]  # None: no grid (top-left not a colour)
                frames = [{"grid": [] if g is None else g.tolist(), "confidence": c}
                          for g, c in zip(decoded, confidence)]
            tests.append({"attempts": attempts, "frames": frames})
        return {"model": offered.label, "arc": tests, "submission": str(result.submission_path),
                "segments": result.segments}


STOPPED_WAITING = "stopped while it waited for its turn (another solve was under way): nothing was run"


class _Turn:
    """``with``: wait for the solver's one turn, giving up when ``cancelled()`` or when the solve ``mine`` is stopped;
    hold it (``busy``) until the end. ``stoppable``: whether a stop still ends ``mine`` once it runs."""

    def __init__(self, solver: Solver, mine: _Solve, cancelled: Callable[[], bool], what: str, stoppable: bool = True):
        self.solver, self.mine, self.cancelled, self.what, self.stoppable = solver, mine, cancelled, what, stoppable

    def __enter__(self) -> None:
        while not self.solver.lock.acquire(timeout=TURN_POLL_S):
            self._leave_if_asked()
        try:
            self._leave_if_asked()
            self.solver._begin(self.mine, self.stoppable)
        except BaseException:
            self.solver.lock.release()
            raise
        self.solver.busy = True
        log.info("solving with %s", self.what)

    def _leave_if_asked(self) -> None:
        if self.cancelled():
            raise Cancelled("cancelled while waiting for the solve before it")
        if self.mine.enough.is_set():
            raise PuzzleInputError(STOPPED_WAITING)

    def __exit__(self, *exc) -> None:
        self.solver.busy = False
        self.solver.lock.release()
