"""The page's request fields and their checks: the compute fields as solve.py's flags (named as the page's fields in
its messages), budgets, solve ids, and the JSON body's shape (utils/serve/server.py)."""


from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from typing import Any, Iterator, Optional


from utils.data.user_puzzles import PuzzleInputError
from utils.eval.reasoning import RULES, TEST_TIME_FLAGS, TestTimeCompute, TestTimeComputeError


log = logging.getLogger(__name__)
MAX_NESTING = 32  # an ARC task, the deepest request, nests 6 deep
COMPUTE_FIELDS = (*TEST_TIME_FLAGS, "rollout_seed", "checked", "budget")
FLOAT_FIELDS = ("noise", "budget")
MAX_PAGE_BUDGET_S = 300  # seconds a puzzle the page's anytime solving may spend (solve.py --budget: a day)
BOOL_FIELDS = ("early_exit", "checked")
SOLVE_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")  # a solve's id, picked at random by its client
# solve.py's test-time flags in a message, each named as the page's field instead: the request is what the user wrote
_FLAG = re.compile(r"--(" + "|".join(field.replace("_", "-") for field in COMPUTE_FIELDS) + r")(?![\w-])")


def compute_json(ttc: TestTimeCompute, halt_max_steps: int, budget: float) -> dict[str, Any]:
    """``ttc`` and the anytime ``budget`` (seconds a puzzle; 0: fixed compute) as the page's compute fields
    (``segments`` counted: the model's ``halt_max_steps`` when unset)."""
    return {"segments": ttc.segments or halt_max_steps, "early_exit": ttc.early_exit,
            "min_segments": ttc.min_segments, "rollouts": ttc.rollouts, "noise": ttc.noise, "views": ttc.views,
            "rollout_seed": ttc.seed, "checked": ttc.checker is not None, "budget": budget}


def request_compute(raw: Any) -> dict[str, Any]:
    """The request's test-time compute, as solve.py's flags would hold it (unknown names refused).

    Raises:
        PuzzleInputError: not an object of :data:`COMPUTE_FIELDS`, or a value of the wrong kind.
    """
    if raw is None:
        return {}
    if not isinstance(raw, dict) or set(raw) - set(COMPUTE_FIELDS):
        raise PuzzleInputError(f"compute must be an object of {', '.join(COMPUTE_FIELDS)}")
    return {name: _setting(name, value) for name, value in raw.items()}


def page_budget(budget: Optional[float], task: str) -> Optional[float]:
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
def named_as_fields() -> Iterator[None]:
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
