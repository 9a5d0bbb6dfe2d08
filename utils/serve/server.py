"""The page to watch a model think (``python solve.py --serve``): a local web server, the standard library's.

    python solve.py --serve                                   # the bundled models, http://127.0.0.1:8000/
    python solve.py --serve --checkpoint RUN --checkpoint hf://owner/repo --port 0

It serves one page (page.html, next to this file: HTML, CSS and JavaScript of its own, nothing from a CDN, so it
works offline) and a JSON API that solving goes through (utils/solve/solving.py, utils/train/arc_adapt.py):

    GET  /api/models   the models on offer: the bundled ones, then each --checkpoint, with the task each answers,
                       its own test-time compute (what solve.py uses without flags) and its budget (below)
    POST /api/solve    {"model": ID, "puzzle": TEXT} or {"model": ID, "task": ARC_TASK_JSON}, and optionally
                       "solve_id" (8 to 64 of A-Z a-z 0-9 _ -, a random one the client picks: the key to this
                       solve's progress and stop) and "compute": {"segments", "early_exit", "min_segments",
                       "rollouts", "noise", "views", "rollout_seed", "checked", "budget"}; the answer after every ACT
                       segment, sigmoid(q_halt) per segment, the verdict, the GIF (base64), the answer as text and
                       the compute used, and with a "budget" (seconds a puzzle: anytime solving with checked answers,
                       utils/solve/anytime.py) what it spent ("anytime"); or {"error": ONE_LINE} with status 400, the
                       line solve.py prints with the request's field names for its flags (budget, not --budget)
    GET  /api/progress ?solve=SOLVE_ID: {"solving": false} (no such solve under way), or {"solving": true,
                       "waiting"} (for its turn) and once an anytime solve runs "budget", "seconds", "rounds",
                       "passes", "consistent"
    POST /api/stop     {"solve": SOLVE_ID}: end that solve now: an anytime one with its best answer so far, a
                       fixed-compute one, or one waiting for its turn, with an error saying so (an ARC adaptation
                       under way runs to its end); {"stopping": false} when none is under way (or an ARC one)

Safety: it listens on 127.0.0.1 unless ``--host`` says otherwise, and answers only requests whose ``Host`` (and
``Origin``, when a browser sends one) is an address it listens on, never a bare 0.0.0.0, so another web page cannot
drive it (DNS rebinding included). Any other ``--host`` prints a warning naming who can reach the page, and every
request must then carry the token printed in its address (``?token=``; the page sends it on). A POST must be
``application/json`` of at most :data:`MAX_BODY` bytes, nested at most :data:`MAX_NESTING` deep. No request names a
file: models are picked by their id among those the command line gave, and an ARC task's dataset and submission go
to the command's own ``--out`` folder.

Bounds: a request over its model's compute budget (segments x rollouts x views, and the segment answers it keeps,
:func:`utils.solve.solving.compute_budget`) is refused before any work; one solve runs at a time, at most
:data:`PEER_SOLVES` of them running or waiting from one address, and a solve, or a request waiting for its turn, is
cancelled between two segments when its client goes away. A solve is its client's: only its id stops it or reads its
progress. A client silent for :data:`CONNECTION_TIMEOUT_S`, or whose request has not arrived within
:data:`REQUEST_DEADLINE_S`, is hung up on; at most :data:`MAX_CONNECTIONS` are served at once,
:data:`PEER_CONNECTIONS` of them from one address (the next gets a 503, before its request is read, so slow clients
at one address cannot keep the page from the others); a client that leaves is no error. Ctrl-C (or SIGTERM) cancels
the solve in progress and waits for it to leave the model, so the process never ends under a thread still inside
torch (which aborts: "terminate called without an active exception").
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import errno
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import secrets
import select
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional
from urllib.parse import parse_qs, urlsplit

import numpy as np
import torch

from utils.data.arc import tokens_to_grid
from utils.data.user_puzzles import PuzzleInputError, parse_maze, parse_sudoku
from utils.errors import RunFailure, UserError
from utils.run.main import Terminated, one_line, sigterm_as_ctrl_c
from utils.run.stop import signal_exit_code
from utils.train.arc_adapt import adapt_and_answer, task_from_json
from utils.config import ConfigError
from utils.solve.anytime import UNSOLVABLE, Spent, anytime_compute, default_search, protocol, solve_anytime
from utils.eval.load import Trained, load_trained
from utils.eval.reasoning import (RULES, TEST_TIME_FLAGS, Cancelled, TestTimeCompute, TestTimeComputeError,
                                  test_time_compute)
from utils.solve.search import Search
from utils.solve.solving import (BUNDLED, VOCAB, Answer, answer, check_budget, check_fits, compute_budget,
                                flops_per_pass, gif_segments, model_tokens, open_model)
from utils.viz.puzzles import render_segments, segments_gif

log = logging.getLogger(__name__)
PAGE = Path(__file__).with_name("page.html")
MAX_BODY = 1 << 20  # a 30x30 ARC task with its demonstrations is a few tens of kB
MAX_NESTING = 32  # an ARC task, the deepest request, nests 6 deep
TASK_OF_VOCAB = {vocab: task for task, (vocab, _) in VOCAB.items()}
COMPUTE_FIELDS = (*TEST_TIME_FLAGS, "rollout_seed", "checked", "budget")
FLOAT_FIELDS = ("noise", "budget")
MAX_PAGE_BUDGET_S = 300  # seconds a puzzle the page's anytime solving may spend (solve.py --budget: a day)
BOOL_FIELDS = ("early_exit", "checked")
TOKEN_HEADER = "X-Page-Token"
CONNECTION_TIMEOUT_S = 30  # a client silent this long (mid-request, or not reading its answer) is hung up on
REQUEST_DEADLINE_S = 60  # a request's headers and body arrive within this, however slowly they trickle
MAX_CONNECTIONS = 64  # connections served at once, each a thread
# Connections served at once from one address (an IPv6 /64), counted as they arrive, before any request is read: a
# page in a browser opens at most 6, and a client that holds more (slowly sending nothing) keeps the rest of the
# MAX_CONNECTIONS free for everyone else.
PEER_CONNECTIONS = 8
# Solves running or waiting for their turn from one address: fewer than PEER_CONNECTIONS, so that a client whose solves
# wait still has connections left to stop them and watch them (the next solve gets a 429).
PEER_SOLVES = PEER_CONNECTIONS - 2
SOLVE_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")  # a solve's id, picked at random by its client
# solve.py's test-time flags in a message, each named as the page's field instead: the request is what the user wrote
_FLAG = re.compile(r"--(" + "|".join(field.replace("_", "-") for field in COMPUTE_FIELDS) + r")(?![\w-])")
STOP_GRACE_S = 30  # Ctrl-C waits this long for the solve in progress to leave the model
TURN_POLL_S = 0.2  # how often a request waiting for its turn checks that its client is still there


def compute_json(ttc: TestTimeCompute, halt_max_steps: int, budget: float) -> dict[str, Any]:
    """``ttc`` and the anytime ``budget`` (seconds a puzzle; 0: fixed compute) as the page's compute fields
    (``segments`` counted: the model's ``halt_max_steps`` when unset)."""
    return {"segments": ttc.segments or halt_max_steps, "early_exit": ttc.early_exit,
            "min_segments": ttc.min_segments, "rollouts": ttc.rollouts, "noise": ttc.noise, "views": ttc.views,
            "rollout_seed": ttc.seed, "checked": ttc.checker is not None, "budget": budget}


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
        CheckpointError, ConfigError: a checkpoint that cannot be loaded, or whose data sizes it does not record.
        PuzzleInputError: a checkpoint of puzzles the page does not know, or no model at all.
    """
    loaded = []
    for task, bundled in BUNDLED.items():
        try:
            trained = open_model(None, task, bundled.side ** 2, 1, device, dtype)
            loaded.append((f"bundled: {bundled.what} ({bundled.file})", task, trained, True))
        except PuzzleInputError:  # its file is missing
            log.warning("the bundled model for %s (%s) is not there: the page offers the others", bundled.what,
                        bundled.file)
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
        flags = argparse.Namespace(**{**dict.fromkeys(COMPUTE_FIELDS), **_compute(request.get("compute"))})
        flags.budget = _page_budget(flags.budget, offered.task)
        with _named_as_fields():
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
        tokens, shape = self._puzzle(offered, request.get("puzzle"))
        with self._owned(solve_id) as mine, _Turn(self, mine, cancelled, f"{offered.label}, {used}"):
            if flags.budget:
                search = default_search(offered.trained, ttc, tokens.size)
                found, spent = self._anytime(offered, tokens, flags.budget, ttc, search, cancelled, mine)
                # What the rounds ran, not the one unchecked rollout that anytime_compute hands each of them.
                used |= {"rollouts": spent["trajectories"], "noise": search.latent_noise, "checked": True,
                         "search": search.describe()}
            else:
                found, spent = self._fixed(offered, tokens, ttc, cancelled, mine), None
            if cancelled():
                raise Cancelled("stopped before drawing the answer")
            shown = answer_json(dataclasses.replace(found, shape=shape))
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

    def _anytime(self, offered: Offered, tokens: np.ndarray, budget: float, ttc: TestTimeCompute, search: Search,
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

        solved = solve_anytime(offered.trained, offered.task, "puzzle", tokens, budget, ttc, self.device,
                               enough=mine.enough.is_set, cancel=cancelled, progress=progressed, search=search)
        if solved.ended == "unsolvable":
            raise PuzzleInputError(f"{UNSOLVABLE[offered.task]}; nothing was run")
        if solved.answer is None:
            raise PuzzleInputError("stopped before the model's own answer was in: nothing to show")
        return solved.answer, {**dataclasses.asdict(solved.spent), "ended": solved.ended,
                               "protocol": protocol(budget)}

    @staticmethod
    def _puzzle(offered: Offered, puzzle: Any) -> tuple[np.ndarray, Optional[tuple[int, int]]]:
        """The request's puzzle as the tokens [S] ``offered``'s model answers, and a maze's own shape (rows, cols).

        Raises:
            PuzzleInputError: empty, malformed, or of a size the model does not take.
        """
        if not isinstance(puzzle, str) or not puzzle.strip():
            wanted = "81 characters" if offered.task == "sudoku" else "a maze"
            raise PuzzleInputError(f"the puzzle is empty: give {wanted}")
        tokens, shape = (parse_sudoku(puzzle, "the puzzle"), None) if offered.task == "sudoku" else \
            parse_maze(puzzle, "the maze")
        check_fits(offered.trained, offered.task, tokens.size)
        return model_tokens(offered.trained, offered.task, tokens), shape

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


def _compute(raw: Any) -> dict[str, Any]:
    """The request's test-time compute, as solve.py's flags would hold it (unknown names refused).

    Raises:
        PuzzleInputError: not an object of :data:`COMPUTE_FIELDS`, or a value of the wrong kind.
    """
    if raw is None:
        return {}
    if not isinstance(raw, dict) or set(raw) - set(COMPUTE_FIELDS):
        raise PuzzleInputError(f"compute must be an object of {', '.join(COMPUTE_FIELDS)}")
    return {name: _setting(name, value) for name, value in raw.items()}


def _page_budget(budget: Optional[float], task: str) -> Optional[float]:
    """The request's anytime budget (seconds a puzzle), None for fixed compute (0, or not given).

    Raises:
        PuzzleInputError: out of 0..:data:`MAX_PAGE_BUDGET_S`, or a budget for ARC, whose answers have no rules.
    """
    if not budget:
        return None
    if not (math.isfinite(budget) and 0 < budget <= MAX_PAGE_BUDGET_S):
        raise PuzzleInputError(f"budget={as_given(budget)} is out of range: 0 (fixed compute) to {MAX_PAGE_BUDGET_S} "
                               "seconds a puzzle on this page")
    if task not in RULES:
        raise PuzzleInputError("a time budget checks answers against the puzzle's rules, which an ARC task does not "
                               "have: set it to 0")
    return budget


def _setting(name: str, value: Any) -> Any:
    """One compute setting: ``early_exit`` and ``checked`` true or false (false is false, not the run's setting),
    ``noise`` and ``budget`` numbers, the others whole numbers (JSON's 2.0 is 2); None: not given.

    Raises:
        PuzzleInputError: a value of another kind, named as the request's field.
    """
    if value is None:
        return None
    if name in BOOL_FIELDS:
        if isinstance(value, bool):
            return value
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    elif isinstance(value, float) and (name in FLOAT_FIELDS or value.is_integer()):
        return value if name in FLOAT_FIELDS else int(value)
    kind = "bool" if name in BOOL_FIELDS else ("float" if name in FLOAT_FIELDS else "int")
    raise PuzzleInputError(f"{name}={value!r} is not a {kind}")


def as_given(number: float) -> str:
    """``number`` as it was written (301, 300.0001, 500 for solve.py's float 500.0), never rounded as ``:g`` rounds
    (300.0001 as 300)."""
    return repr(number).removesuffix(".0")


def page_fields(message: str) -> str:
    """``message`` with each of solve.py's test-time flags named as the page's field (``--min-segments``:
    ``min_segments``)."""
    return _FLAG.sub(lambda flag: flag[1].replace("-", "_"), message)


@contextlib.contextmanager
def _named_as_fields() -> Iterator[None]:
    """``with``: a :class:`TestTimeComputeError` raised in the block (its message written for solve.py's flags)
    names the request's fields instead (:func:`page_fields`)."""
    try:
        yield
    except TestTimeComputeError as e:
        raise TestTimeComputeError(page_fields(str(e))) from None


def checked_solve_id(value: Any, name: str) -> str:
    """``value`` when it is a solve's id (:data:`SOLVE_ID`).

    Raises:
        PuzzleInputError: anything else, naming the request's ``name`` for it.
    """
    if isinstance(value, str) and SOLVE_ID.fullmatch(value):
        return value
    if value is None:
        raise PuzzleInputError(f"the request names no solve: give {name}, the random solve_id its /api/solve request "
                               "sent")
    raise PuzzleInputError(f"{name}={value!r} is not a solve's id: 8 to 64 of A-Z a-z 0-9 _ -, the random solve_id "
                           "its /api/solve request sent")


def parse_request(body: bytes) -> Any:
    """The JSON value of a request's ``body`` (empty: None).

    Raises:
        PuzzleInputError: not JSON, or nested more than :data:`MAX_NESTING` deep (however deep: the parser's own
            recursion limit included).
    """
    too_deep = f"the request nests arrays or objects more than {MAX_NESTING} deep; an ARC task needs 6"
    try:
        request = json.loads(body or b"null")
    except RecursionError:
        raise PuzzleInputError(too_deep) from None
    except ValueError as e:
        raise PuzzleInputError(f"the request is not JSON ({e})") from None
    if nesting(request) > MAX_NESTING:
        raise PuzzleInputError(too_deep)
    return request


def nesting(value: Any) -> int:
    """How deep JSON ``value`` nests arrays and objects (a number: 0), counted without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def netloc(name: str, port: int) -> str:
    """``name:port`` as a ``Host`` header writes it (an IPv6 address in brackets)."""
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


@dataclass(frozen=True)
class Access:
    """Who may use the page (:func:`access_for`): the ``Host`` values it answers (None: any but an unspecified address,
    the token guarding it), the ``token`` each request carries (None: on loopback), the page's ``url``, and the
    ``warning`` a non-loopback address gets."""

    hosts: Optional[frozenset[str]]
    token: Optional[str]
    url: str
    warning: Optional[str]

    def host_ok(self, host: str) -> bool:
        """Whether ``host`` (a ``Host`` header, ``name:port``) is one the page answers."""
        if self.hosts is not None:
            return host in self.hosts
        try:
            name = urlsplit(f"//{host}").hostname or ""
        except ValueError:  # an unbalanced [
            return False
        address = spelled_address(name)
        return bool(name) if address is None else not address.is_unspecified

    def origin_ok(self, origin: str, host: str) -> bool:
        """Whether a browser's ``Origin`` is the page itself (its address, as the ``Host`` it sent)."""
        try:
            where = urlsplit(origin).netloc
        except ValueError:  # an unbalanced [
            return False
        return where in self.hosts if self.hosts is not None else where == host


# One part of an IPv4 address as inet_aton reads it, and browsers (the WHATWG URL standard) and curl with it: hex after
# 0x (0x alone: 0), octal after a leading 0, else decimal.
_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


def spelled_address(name: str) -> Optional[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The IP address that ``name`` (a URL's host, IPv6 without its brackets) spells; None for a name.

    Besides the standard forms, the IPv4 forms that inet_aton takes, and browsers and curl with it: one to four
    parts, each decimal, octal (a leading 0) or hex (0x), the last filling the bytes the others leave (``0``,
    ``0x0``, ``0.0``, ``00.0.0.0``, ``127.1``), with one trailing dot allowed. An IPv4-mapped IPv6 address
    (``::ffff:0.0.0.0``) is the IPv4 address it maps: a connection to it goes there.
    """
    try:
        found = ipaddress.ip_address(name)
    except ValueError:
        found = _inet_aton(name)
    return getattr(found, "ipv4_mapped", None) or found


def _inet_aton(name: str) -> Optional[ipaddress.IPv4Address]:
    """The IPv4 address ``name`` spells in one of inet_aton's forms (:func:`spelled_address`); None when it does not."""
    parts = name.removesuffix(".").split(".")
    if not 1 <= len(parts) <= 4 or not all(_IPV4_PART.fullmatch(part) for part in parts):
        return None
    values = [int(part[2:] or "0", 16) if part[:2] in ("0x", "0X") else int(part, 8 if part[0] == "0" else 10)
              for part in parts]
    *leading, last = values
    if any(value > 255 for value in leading) or last >= 256 ** (5 - len(values)):
        return None
    return ipaddress.IPv4Address(sum(value << 8 * (3 - i) for i, value in enumerate(leading)) + last)


def access_for(host: str, bound: str, port: int) -> Access:
    """Who may use a page that ``--host host`` bound to the address ``bound``, port ``port``.

    On loopback, the Host names of this machine (``localhost``, the address, the name given). Elsewhere a token, and
    a warning that names who can reach the page: the address's network, or for 0.0.0.0 (or ``""``, ``::``) every
    network of the machine, whose ``Host`` can be any of its names.
    """
    ip = ipaddress.ip_address(bound.split("%")[0])  # an IPv6 link-local address may carry its %interface
    if ip.is_loopback:
        names = {host, bound, "localhost"} - {""}
        url = f"http://{netloc(bound, port)}/"
        return Access(frozenset(netloc(name, port) for name in names), None, url, None)
    token = secrets.token_urlsafe(16)
    if ip.is_unspecified:
        machine = socket.gethostname()
        addresses = machine_addresses(machine, ip.version)
        reach = f"every network interface of this machine ({', '.join([machine, *addresses])})"
        hosts, where = None, machine
    else:
        reach = bound if host in (bound, "") else f"{host} ({bound})"
        hosts, where = frozenset({netloc(host, port), netloc(bound, port)}), bound
    warning = (f"--host {host or repr(host)} listens on {reach}: anyone who can reach it on port {port} can use the "
               "page and its models, with the token in the address below; --host 127.0.0.1 keeps it to this machine")
    return Access(hosts, token, f"http://{netloc(where, port)}/?token={token}", warning)


def machine_addresses(name: str, version: int) -> list[str]:
    """The addresses (IPv4, or with ``version`` 6 both) that ``name``, this machine's, resolves to, loopback left
    out; empty where it resolves to none."""
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    kept = [info[4][0] for info in found if version == 6 or info[0] == socket.AF_INET]
    return sorted({a for a in kept if not ipaddress.ip_address(a.split("%")[0]).is_loopback})


def listen_address(host: str, port: int) -> tuple[int, tuple]:
    """The socket family and address that ``--host host --port port`` bind (``""``: 0.0.0.0, every interface;
    an IPv4 address first where a name has both).

    Raises:
        UserError: ``host`` names no address.
    """
    try:
        found = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        raise UserError(f"--host {host}: no such address ({getattr(e, 'strerror', None) or e}); give an address of "
                        "this machine, such as 127.0.0.1 (this machine only)") from None
    family, _, _, _, address = min(found, key=lambda info: info[0] != socket.AF_INET)
    return family, address


def bind_advice(host: str, port: int, error: OSError) -> str:
    """The one line for a failed bind: the address, why, and what to change (the port only when it is the port)."""
    if error.errno == errno.EADDRINUSE:
        fix = "another program listens there: choose another --port (0 picks a free one)"
    elif error.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        fix = (f"{host} is not an address of this machine{' (or its IPv6 is off)' if ':' in host else ''}: give "
               "one of its addresses, such as 127.0.0.1 (this machine only)")
    elif error.errno == errno.EACCES and 0 < port < 1024:
        fix = "ports below 1024 need administrator rights: choose --port 1024 or above (0 picks a free one)"
    else:
        fix = "choose another --host or --port"
    return f"cannot listen on {netloc(host, port)} ({error.strerror or error}); {fix}"


class Handler(BaseHTTPRequestHandler):
    """The page, ``/api/models`` and ``/api/solve`` of its :class:`PageServer`, each after the Host/Origin (and
    token) check; a connection is hung up on when silent for ``timeout`` seconds or when its request has not arrived
    within :data:`REQUEST_DEADLINE_S`."""

    server: "PageServer"
    server_version = "solve.py"
    timeout = CONNECTION_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self._deadline = threading.Timer(REQUEST_DEADLINE_S, self._hang_up)
        self._deadline.daemon = True
        self._deadline.start()

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def _hang_up(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)  # the blocked read returns: the handler ends
        except OSError:
            pass

    def _client_gone(self) -> bool:
        """Whether the client closed its end (what it may have sent after the request is left unread)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except (OSError, ValueError):
            return True

    def log_message(self, format: str, *args) -> None:  # noqa: A002  (the base class's name)
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: HTTPStatus, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _ours(self) -> bool:
        access, host, origin = self.server.access, self.headers.get("Host", ""), self.headers.get("Origin")
        if not access.host_ok(host) or (origin is not None and not access.origin_ok(origin, host)):
            self._json(HTTPStatus.FORBIDDEN, {"error": "this server answers only its own page (Host/Origin is not "
                                                       "its address)"})
            return False
        if access.token is None:
            return True
        given = self.headers.get(TOKEN_HEADER) or parse_qs(self.path.partition("?")[2]).get("token", [""])[0]
        if hmac.compare_digest(given.encode(), access.token.encode()):
            return True
        self._json(HTTPStatus.FORBIDDEN, {"error": "this page needs its token: open the address solve.py --serve "
                                                   "printed, with its ?token=..."})
        return False

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        self._deadline.cancel()
        with self.server.answering():
            self._get()

    def _get(self) -> None:
        if not self._ours():
            return
        path = self.path.partition("?")[0]
        if path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, PAGE.read_bytes(), "text/html; charset=utf-8")
        elif path == "/api/models":
            solver = self.server.solver
            self._json(HTTPStatus.OK, {"models": [m.describe(solver.device, solver.args) for m in solver.models]})
        elif path == "/api/progress":
            try:
                solve_id = checked_solve_id(parse_qs(self.path.partition("?")[2]).get("solve", [None])[0], "solve")
            except UserError as e:
                return self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(e)})
            self._json(HTTPStatus.OK, self.server.solver.progress(solve_id))
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}"})

    def do_POST(self) -> None:  # noqa: N802
        with self.server.answering():
            self._post()

    def _post(self) -> None:
        if not self._ours():
            return
        path = self.path.partition("?")[0]
        if path not in ("/api/solve", "/api/stop"):
            return self._json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path}"})
        if self.headers.get_content_type() != "application/json":
            return self._json(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "send the request as application/json"})
        if self.headers.get("Content-Length") is None:  # a chunked body, say: its size is not known before it is read
            return self._json(HTTPStatus.LENGTH_REQUIRED, {"error": "send the request with its Content-Length (at most "
                                                                    f"{MAX_BODY} bytes), not in chunks"})
        try:
            length = int(self.headers.get("Content-Length", "-1"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            return self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                              {"error": f"a request is at most {MAX_BODY} bytes"})
        body = self.rfile.read(length)
        self._deadline.cancel()
        if len(body) < length:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": f"the request ended after {len(body)} of the "
                                                                f"{length} bytes its Content-Length announced"})
        try:
            request = parse_request(body)
        except UserError as e:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(e)})
        if path == "/api/stop":
            return self._stop(request)
        with self.server.solving(peer(self.client_address)) as admitted:
            if not admitted:
                return self._json(HTTPStatus.TOO_MANY_REQUESTS,
                                  {"error": f"this address has {PEER_SOLVES} solves running or waiting for their "
                                            "turn: stop one, or wait for one to end"})
            self._solve(request)

    def _stop(self, request: Any) -> None:
        try:
            solve_id = checked_solve_id(request.get("solve") if isinstance(request, dict) else None, "solve")
        except UserError as e:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(e)})
        self._json(HTTPStatus.OK, {"stopping": self.server.solver.stop(solve_id)})

    def _solve(self, request: Any) -> None:
        solver = self.server.solver
        try:
            payload = solver.solve(request, self._client_gone)
        except Cancelled:
            if solver.stopping.is_set():
                self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the server is stopping: this solve was "
                                                                     "cancelled"})
            return  # else the client left: no one to answer
        except (UserError, RunFailure) as e:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(e)})
        except Exception as e:  # a bug: the page says so, the terminal keeps the traceback
            log.exception("solving failed")
            return self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error ({type(e).__name__}: "
                                                                          f"{one_line(e)}); the terminal has the "
                                                                          "details"})
        self._json(HTTPStatus.OK, payload)


class PageServer(ThreadingHTTPServer):
    """The bound server, its :class:`Solver` and :class:`Access`; ``url`` is the page's address. At most
    :data:`MAX_CONNECTIONS` connections are served at once (``open_connections``), at most :data:`PEER_CONNECTIONS`
    of them from one address (:func:`peer`), and at most :data:`PEER_SOLVES` solves from one address run or wait
    (:meth:`solving`); a client that leaves early is logged at debug level, not as an error."""

    daemon_threads = True  # a stuck client never keeps the process alive; serve() waits for the solve itself

    def __init__(self, solver: Solver, host: str, port: int):
        self.address_family, address = listen_address(host, port)
        self.solver = solver
        self.open_connections = 0
        self._peers: dict[str, int] = {}  # open connections by peer
        self._solving: dict[str, int] = {}  # solves running or waiting by peer
        self._count = threading.Lock()
        self._answering: set[threading.Thread] = set()  # handlers between a request and its answer
        self._answered = threading.Condition()
        self._interrupted: Optional[BaseException] = None  # see service_actions
        super().__init__(address, Handler)
        bound, port = self.server_address[:2]
        self.access = access_for(host, bound, port)
        self.url = self.access.url

    def process_request(self, request, client_address) -> None:
        who = peer(client_address)
        with self._count:
            busy = self._busy(who)
            if busy is None:
                self.open_connections += 1
                self._peers[who] = self._peers.get(who, 0) + 1
        if busy is not None:
            busy_reply(request, busy)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:  # its thread did not start
            self._leave(who)
            raise
        except BaseException as interrupt:  # Ctrl-C or SIGTERM while start() waits for the thread
            # The thread runs: it answers, closes its connection and counts it off itself. Raised from here, the
            # interrupt would make socketserver close the connection under it (the client got no answer, not even
            # the 503 of a cancelled solve), so serve_forever raises it next, from service_actions.
            self._interrupted = interrupt

    def service_actions(self) -> None:
        """Raise the interrupt that landed while a connection's thread started (:meth:`process_request`), so that
        it reaches serve() once socketserver is done with that connection."""
        interrupt, self._interrupted = self._interrupted, None
        if interrupt is not None:
            raise interrupt

    def _busy(self, who: str) -> Optional[str]:
        """Why a new connection from ``who`` is not served now (the caller holds the count's lock); None: it is."""
        if self._peers.get(who, 0) >= PEER_CONNECTIONS:
            return (f"this address has {PEER_CONNECTIONS} connections to the page open already: try again when one "
                    "ends")
        if self.open_connections >= MAX_CONNECTIONS:
            return f"the page serves {MAX_CONNECTIONS} connections already: try again when one ends"
        return None

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._leave(peer(client_address))

    def _leave(self, who: str) -> None:
        with self._count:
            self.open_connections -= 1
            self._peers[who] -= 1
            if not self._peers[who]:
                del self._peers[who]

    @contextlib.contextmanager
    def solving(self, who: str) -> Iterator[bool]:
        """``with``: a solve from ``who`` runs or waits until the block ends; yields whether it may (False: ``who``
        has :data:`PEER_SOLVES` already, and this one is not counted)."""
        with self._count:
            admitted = self._solving.get(who, 0) < PEER_SOLVES
            if admitted:
                self._solving[who] = self._solving.get(who, 0) + 1
        try:
            yield admitted
        finally:
            if admitted:
                with self._count:
                    self._solving[who] -= 1
                    if not self._solving[who]:
                        del self._solving[who]

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """``with``: the calling handler is answering a request (read whole or in part) until the block ends."""
        with self._answered:
            self._answering.add(threading.current_thread())
        try:
            yield
        finally:
            with self._answered:
                self._answering.discard(threading.current_thread())
                self._answered.notify_all()

    def wait_answered(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no handler is answering a request; whether none is. Connections
        still waiting for a request are not waited for: nothing has been asked of them."""
        with self._answered:
            return self._answered.wait_for(lambda: not self._answering, timeout)

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):  # the client left, or stopped reading
            log.debug("%s: %s", client_address, error)
        else:
            log.error("a request from %s failed", client_address, exc_info=True)


def peer(client_address: tuple) -> str:
    """Whose a connection from ``client_address`` is, for :data:`PEER_CONNECTIONS`: its IPv4 address (also when
    IPv4-mapped), or the /64 network of an IPv6 one, which one machine commonly holds whole."""
    address = ipaddress.ip_address(client_address[0].split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(getattr(address, "ipv4_mapped", None) or address)


def busy_reply(connection: socket.socket, why: str) -> None:
    """Tell a connection that is not served now (a peer's or the page's connections are all in use) so, ``why``, with
    a 503, without waiting on it."""
    body = json.dumps({"error": why}).encode()
    head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    try:
        connection.settimeout(1)
        connection.sendall(head + body)
    except OSError:
        pass


def make_server(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, out: Path) -> PageServer:
    """The server, bound (port 0: a free one) and ready to ``serve_forever``; its models loaded.

    Raises:
        UserError: a ``--budget`` over the page's :data:`MAX_PAGE_BUDGET_S`, a checkpoint that cannot be offered,
            test-time compute flags out of a model's range or over its budget (the page's defaults, refused as
            solve.py refuses them), or an address that cannot be bound.
    """
    budget = getattr(args, "budget", None)
    if budget and budget > MAX_PAGE_BUDGET_S:  # it fills the page's field: every Solve would be refused
        raise ConfigError(f"--budget {as_given(budget)} is more than the page's {MAX_PAGE_BUDGET_S} s a puzzle: give "
                          f"--budget {MAX_PAGE_BUDGET_S} or less with --serve")
    solver = Solver(offered_models(args.checkpoint, device, dtype), args, device, dtype, out)
    for offered in solver.models:  # the flags as each model's defaults: refused now, not on the page's first call
        try:
            check_budget(offered.trained, offered.defaults(args), args, device, flops=offered.flops)
        except TestTimeComputeError as e:
            raise TestTimeComputeError(f"the page's model {offered.label}: {e}") from None
    try:
        return PageServer(solver, args.host, args.port)
    except OSError as e:
        raise UserError(bind_advice(args.host, args.port, e)) from None


def serve(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, out: Path, note: str = "") -> int:
    """``solve.py --serve``: serve the page until Ctrl-C (or SIGTERM); ``note`` (the device and precision line) is
    printed after the page's address, which stays the first line.

    Returns:
        0 when no solve was running, else 128 + the signal's number (130, 143): the solve was cancelled.
    """
    server = make_server(args, device, dtype, out)
    if server.access.warning:
        print(f"warning: {server.access.warning}", file=sys.stderr, flush=True)
    count = len(server.solver.models)
    print(f"the page: {server.url} ({count} model{'s' * (count != 1)}; Ctrl-C stops it)", flush=True)
    if note:
        print(note, flush=True)
    signum = signal.SIGINT
    try:
        with sigterm_as_ctrl_c():
            server.serve_forever()
    except Terminated:  # a KeyboardInterrupt: caught first
        signum = signal.SIGTERM
    except KeyboardInterrupt:
        pass
    return stop_serving(server, signum)


def stop_serving(server: PageServer, signum: int) -> int:
    """Cancel the solve in progress (and those waiting for their turn), wait up to :data:`STOP_GRACE_S` for every
    request under way to be answered (a cancelled solve answers 503), then close the server.

    Python's exit ends the threads still running (they are daemons) where they stand: a client whose answer was not
    written yet would lose it, and a thread inside torch's C++ code aborts the process. So the process ends only
    after every handler answered; one that does not in time (an ARC adaptation, which has no segments to stop
    between), or a second Ctrl-C, ends the process at once (``os._exit``).

    Returns:
        The exit code: 0 when no solve was running, else 128 + ``signum``.
    """
    solver = server.solver
    cut_short = solver.busy
    solver.stopping.set()
    try:
        answered = server.wait_answered(STOP_GRACE_S)
    except KeyboardInterrupt:  # asked again (Ctrl-C, or SIGTERM as utils.run.main.Terminated): do not wait
        answered = False
    server.server_close()
    code = signal_exit_code(signum) if cut_short else 0
    print(f"stopped{' (the solve in progress was cancelled)' if cut_short else ''}", flush=True)
    if not answered:
        print("the solve in progress did not stop in time: ending without waiting for it", file=sys.stderr,
              flush=True)
        os._exit(code)
    return code
