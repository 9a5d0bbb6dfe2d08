"""The two kinds of error a run reports to its user as one line.

Every module raises a subclass of one of these; the shared main wrapper
(:func:`utils.run.main.run_main`) catches them once and prints ``error: <message>``.
The message says what was wrong, where, and how to fix it, so a traceback would only
bury it.

- :class:`UserError` (exit code 2): the input is wrong: a config value, a path, a file's
  content. Nothing was written before it was found.
- :class:`RunFailure` (exit code 1): a run that started could not go on: a checkpoint
  write failed, or training diverged. What was saved before stays intact.
"""


class UserError(Exception):
    """Bad input (a setting, a path, a file); reported as one line with exit code 2."""

    exit_code = 2


class RunFailure(Exception):
    """A started run cannot continue (storage fault, divergence); reported as one line with exit code 1."""

    exit_code = 1
