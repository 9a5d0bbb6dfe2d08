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
``application/json`` of at most ``web.MAX_BODY`` bytes, nested at most
``fields.MAX_NESTING`` deep. No request names a
file: models are picked by their id among those the command line gave, and an ARC task's dataset and submission go
to the command's own ``--out`` folder.

Bounds: a request over its model's compute budget (segments x rollouts x views, and the segment answers it keeps,
:func:`utils.solve.solving.compute_budget`) is refused before any work; one solve runs at a time, at most
``web.PEER_SOLVES`` of them running or waiting from one address, and a solve, or a request waiting for its turn, is
cancelled between two segments when its client goes away. A solve is its client's: only its id stops it or reads its
progress. A client silent for ``web.CONNECTION_TIMEOUT_S``, or whose request has not arrived within
``web.REQUEST_DEADLINE_S``, is hung up on; at most ``web.MAX_CONNECTIONS`` are served at once,
``web.PEER_CONNECTIONS`` of them from one address (the next gets a 503, before its request is read, so slow clients
at one address cannot keep the page from the others); a client that leaves is no error. Ctrl-C (or SIGTERM) cancels
the solve in progress and waits for it to leave the model, so the process never ends under a thread still inside
torch (which aborts: "terminate called without an active exception").

The rooms: this module starts and stops the page; utils/serve/web.py is the HTTP layer and its security checks,
utils/serve/fields.py the request fields and their checks, utils/serve/solves.py the models on offer and the queue of
solves.
"""


from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import torch

from utils.errors import UserError
from utils.run.main import Terminated, sigterm_as_ctrl_c
from utils.run.stop import signal_exit_code
from utils.config import ConfigError
from utils.eval.reasoning import TestTimeComputeError
from utils.solve.solving import check_budget

from utils.serve.fields import MAX_PAGE_BUDGET_S, as_given
from utils.serve.web import PageServer, bind_advice
from utils.serve.solves import STOP_GRACE_S, Solver, offered_models

log = logging.getLogger(__name__)


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
    if threading.current_thread() is threading.main_thread():  # closed: a later Ctrl-C would only interrupt the
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # exit (killed by SIGINT, or an atexit callback's traceback)
    server.server_close()
    code = signal_exit_code(signum) if cut_short else 0
    print(f"stopped{' (the solve in progress was cancelled)' if cut_short else ''}", flush=True)
    if not answered:
        print("the solve in progress did not stop in time: ending without waiting for it", file=sys.stderr,
              flush=True)
        os._exit(code)
    return code
