"""The two kinds of error a run reports to its user as one line, and how to find an exception behind another.

Every module raises a subclass of one of these; the shared main wrapper
(:func:`utils.run.main.run_main`) catches them once and prints ``error: <message>``.
The message says what was wrong, where, and how to fix it, so a traceback would only
bury it.

- :class:`UserError` (exit code 2): the input is wrong: a config value, a path, a file's
  content. Nothing was written before it was found.
- :class:`RunFailure` (exit code 1): a run that started could not go on: a checkpoint
  write failed, or training diverged. What was saved before stays intact.
"""

from __future__ import annotations

from typing import Callable


def first_in_chain(error: BaseException | None, match: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception in ``error``'s chain (itself, then the exception each was raised from or while
    handling: ``__cause__``, else ``__context__``) for which ``match`` is true; None when there is none."""
    seen = set()
    while error is not None and id(error) not in seen:
        if match(error):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class UserError(Exception):
    """Bad input (a setting, a path, a file); reported as one line with exit code 2."""

    exit_code = 2


class RunFailure(Exception):
    """A started run cannot continue (storage fault, divergence); reported as one line with exit code 1."""

    exit_code = 1
