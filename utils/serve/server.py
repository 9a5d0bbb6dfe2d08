"""The page to watch a model think (``python solve.py --serve``): a local web server, the standard library's.

    python solve.py --serve                                   # the bundled models, http://127.0.0.1:8000/
    python solve.py --serve --checkpoint RUN --checkpoint hf://owner/repo --port 0

It serves one page (page.html, next to this file: HTML, CSS and JavaScript of its own, nothing from a CDN, so it
works offline) and a JSON API that solving goes through (utils/eval/solving.py, utils/eval/arc_adapt.py):

    GET  /api/models   the models on offer: the bundled ones, then each --checkpoint, with the task each answers
                       and its own test-time compute (what solve.py uses without flags)
    POST /api/solve    {"model": ID, "puzzle": TEXT} or {"model": ID, "task": ARC_TASK_JSON}, and optionally
                       "compute": {"segments", "early_exit", "min_segments", "rollouts", "noise", "views",
                       "rollout_seed"}; the answer after every ACT segment, sigmoid(q_halt) per segment, the verdict,
                       the GIF (base64) and the answer as text; or {"error": ONE_LINE} with status 400, the same line
                       solve.py prints

Safety: it listens on 127.0.0.1 unless ``--host`` says otherwise, and answers only requests whose ``Host`` (and
``Origin``, when a browser sends one) is its own address, so another web page cannot drive it (DNS rebinding
included); a POST must be ``application/json`` of at most :data:`MAX_BODY` bytes. No request names a file: models
are picked by their id among those the command line gave, and an ARC task's dataset and submission go to the
command's own ``--out`` folder.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import math
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional
from urllib.parse import urlsplit

import numpy as np
import torch

from utils.data.arc import tokens_to_grid
from utils.data.user_puzzles import PuzzleInputError, format_maze, format_sudoku, parse_maze, parse_sudoku
from utils.errors import RunFailure, UserError
from utils.run.main import one_line
from utils.eval.arc_adapt import adapt_and_answer, task_from_json
from utils.eval.load import Trained, load_trained
from utils.eval.reasoning import TEST_TIME_FLAGS, TestTimeCompute, test_time_compute
from utils.eval.solving import BUNDLED, VOCAB, Answer, answer, check_fits, open_model
from utils.viz.puzzles import render_segments, segments_gif

log = logging.getLogger(__name__)
PAGE = Path(__file__).with_name("page.html")
MAX_BODY = 1 << 20  # a 30x30 ARC task with its demonstrations is a few tens of kB
TASK_OF_VOCAB = {vocab: task for task, (vocab, _) in VOCAB.items()}
COMPUTE_FIELDS = (*TEST_TIME_FLAGS, "rollout_seed")


@dataclass
class Offered:
    """A model the page offers: ``id`` (its index), a ``label``, the ``task`` it answers, the loaded model, and
    whether it is a ``bundled`` one."""

    id: int
    label: str
    task: str
    trained: Trained
    bundled: bool

    def describe(self) -> dict[str, Any]:
        """What the page shows of it, with its own test-time compute as the defaults."""
        ttc = test_time_compute(SimpleNamespace(**dict.fromkeys(COMPUTE_FIELDS)), self.trained.cfg)
        segments = ttc.segments or self.trained.cfg.arch["halt_max_steps"]
        return {"id": self.id, "label": self.label, "task": self.task, "side": math.isqrt(self.trained.seq_len),
                "compute": {"segments": segments, "early_exit": ttc.early_exit, "min_segments": ttc.min_segments,
                            "rollouts": ttc.rollouts, "noise": ttc.noise, "views": ttc.views,
                            "rollout_seed": ttc.seed}}


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
    return [Offered(i, label, task, trained, bundled)
            for i, (label, task, trained, bundled) in enumerate(loaded)]


def grid_rows(tokens: np.ndarray, task: str) -> np.ndarray:
    """Tokens [side * side] as int64 rows [side, side] of the task's own values: Sudoku digits (0 blank), maze tokens,
    ARC colours."""
    side = math.isqrt(tokens.size)
    rows = tokens.reshape(side, side).astype(np.int64)
    return (rows - 1).clip(0) if task == "sudoku" else rows


def answer_json(found: Answer) -> dict[str, Any]:
    """An answer as the page draws it: each segment's grid, the cells whose shown value it changed, sigmoid(q_halt),
    the verdict."""
    frames, before = [], grid_rows(found.puzzle, found.task)
    for grid, confidence in zip(found.segment_grids, found.confidence):
        shown = grid_rows(grid, found.task)
        frames.append({"grid": shown.tolist(), "confidence": float(confidence),
                       "changed": np.flatnonzero(shown != before).tolist()})
        before = shown
    gif = segments_gif(render_segments(found.task, found.puzzle, found.grid, found.segment_grids,
                                       found.segment_q_halt, title=f"{found.task} (cells wrong = cells that differ "
                                                                   "from the final answer)"))
    text = (format_sudoku if found.task == "sudoku" else format_maze)(found.grid)
    return {"puzzle": grid_rows(found.puzzle, found.task).tolist(), "frames": frames, "segments": found.segments,
            "halting": found.halting, "votes": found.votes, "consistent": found.consistent, "verdict": found.verdict,
            "text": text, "gif": base64.b64encode(gif).decode()}


class Solver:
    """What the API does, apart from HTTP: the models on offer, one solve at a time."""

    def __init__(self, models: list[Offered], args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                 out: Path):
        self.models, self.args, self.device, self.dtype, self.out = models, args, device, dtype, out
        self.lock = threading.Lock()

    def solve(self, request: Any) -> dict[str, Any]:
        """Answer one ``/api/solve`` request.

        Raises:
            UserError: a malformed request or puzzle, or compute out of range: the one line solve.py prints.
            RunFailure: an ARC adaptation that stopped.
        """
        if not isinstance(request, dict):
            raise PuzzleInputError("the request is not a JSON object")
        model = request.get("model")
        if not isinstance(model, int) or isinstance(model, bool) or not 0 <= model < len(self.models):
            raise PuzzleInputError(f"model {model!r} is not one of the ids 0..{len(self.models) - 1}")
        offered = self.models[model]
        flags = argparse.Namespace(**{**dict.fromkeys(COMPUTE_FIELDS), **_compute(request.get("compute"))})
        ttc = test_time_compute(flags, offered.trained.cfg, keep_segments=True)
        with self.lock:
            if offered.task == "arc":
                return self._arc(offered, request.get("task"), ttc)
            puzzle = request.get("puzzle")
            if not isinstance(puzzle, str) or not puzzle.strip():
                wanted = "81 characters" if offered.task == "sudoku" else "a maze"
                raise PuzzleInputError(f"the puzzle is empty: give {wanted}")
            tokens = (parse_sudoku(puzzle, "the puzzle") if offered.task == "sudoku"
                      else parse_maze(puzzle, "the maze")[0])
            check_fits(offered.trained, offered.task, tokens.size, offered.bundled)
            found = answer(offered.trained, offered.task, [("puzzle", tokens)], ttc, self.device)[0]
            return {"model": offered.label, **answer_json(found)}

    def _arc(self, offered: Offered, raw: Any, ttc: TestTimeCompute) -> dict[str, Any]:
        """Adapt to an ARC task sent as JSON and answer it: both attempts of each test input, with every segment's
        answer of its un-augmented copy."""
        if ttc.views != 1:
            raise PuzzleInputError(f"views={ttc.views} cannot be used with ARC: its augmented copies vote instead")
        task, known = task_from_json(raw, "task", "the task")
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


def _compute(raw: Any) -> dict[str, Any]:
    """The request's test-time compute, as solve.py's flags (unknown names refused)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or set(raw) - set(COMPUTE_FIELDS):
        raise PuzzleInputError(f"compute must be an object of {', '.join(COMPUTE_FIELDS)}")
    for name, value in raw.items():
        kind = bool if name == "early_exit" else (float if name == "noise" else int)
        if value is not None and (not isinstance(value, (int, float)) or (kind is not bool) == isinstance(value, bool)
                                  or (kind is int and not float(value).is_integer())):
            raise PuzzleInputError(f"--{name.replace('_', '-')}={value!r} is not a {kind.__name__}")
    return {name: (value or None) if name == "early_exit" else value for name, value in raw.items()}


def handler_for(solver: Solver, allowed_hosts: set[str]) -> type[BaseHTTPRequestHandler]:
    """The request handler class: the page, ``/api/models``, ``/api/solve``, and the Host/Origin check."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "solve.py"

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
            origin = self.headers.get("Origin")
            own_origin = origin is None or urlsplit(origin).netloc in allowed_hosts
            if self.headers.get("Host") in allowed_hosts and own_origin:
                return True
            self._json(HTTPStatus.FORBIDDEN, {"error": "this server answers only its own page (Host/Origin is not "
                                                       "its address)"})
            return False

        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            if not self._ours():
                return
            if self.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, PAGE.read_bytes(), "text/html; charset=utf-8")
            elif self.path == "/api/models":
                self._json(HTTPStatus.OK, {"models": [m.describe() for m in solver.models]})
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._ours():
                return
            if self.path != "/api/solve":
                return self._json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {self.path}"})
            if self.headers.get_content_type() != "application/json":
                return self._json(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "send the request as application/json"})
            try:
                length = int(self.headers.get("Content-Length", "-1"))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                return self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                  {"error": f"a request is at most {MAX_BODY} bytes"})
            try:
                request = json.loads(self.rfile.read(length) or b"null")
            except ValueError as e:
                return self._json(HTTPStatus.BAD_REQUEST, {"error": f"the request is not JSON ({e})"})
            try:
                self._json(HTTPStatus.OK, solver.solve(request))
            except (UserError, RunFailure) as e:
                self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(e)})
            except Exception as e:  # a bug: the page says so, the terminal keeps the traceback
                log.exception("solving failed")
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error ({type(e).__name__}: "
                                                                       f"{one_line(e)}); the terminal has the details"})

    return Handler


class PageServer(ThreadingHTTPServer):
    """The bound server and its :class:`Solver`; ``url`` is the page's address."""

    daemon_threads = True

    def __init__(self, solver: Solver, host: str, port: int):
        super().__init__((host, port), handler_for(solver, set()))
        self.solver = solver
        bound, port = self.server_address[:2]
        local = bound in ("127.0.0.1", "::1")
        names = {host, bound} | ({"localhost", "127.0.0.1", "[::1]"} if local else set())
        self.RequestHandlerClass = handler_for(solver, {f"{name}:{port}" for name in names})
        self.url = f"http://{'localhost' if local else host}:{port}/"


def make_server(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, out: Path) -> PageServer:
    """The server, bound (port 0: a free one) and ready to ``serve_forever``; its models loaded.

    Raises:
        UserError: a checkpoint that cannot be offered, or an address that cannot be bound.
    """
    solver = Solver(offered_models(args.checkpoint, device, dtype), args, device, dtype, out)
    try:
        return PageServer(solver, args.host, args.port)
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); choose another --port") \
            from None


def serve(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, out: Path) -> int:
    """``solve.py --serve``: serve the page until Ctrl-C."""
    server = make_server(args, device, dtype, out)
    count = len(server.solver.models)
    print(f"the page: {server.url} ({count} model{'s' * (count != 1)}; Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        server.server_close()
    return 0
