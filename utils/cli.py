"""The command-line parser of every entry point and builder, with the project's error style.

It sits on the floor (it imports nothing of the project), so a dataset builder in ``utils/data/`` can use it without
reaching up into the run lifecycle.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Callable, NoReturn

# --workers takes at most this many processes per core (os.cpu_count): a worker busy on a core of its own is the
# point, a few more absorb their waits, and beyond that each one only costs a fork (--workers 100000 forked about
# 4,300 processes before the machine refused more).
WORKERS_PER_CORE = 4


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the project's error style: a bad flag is one ``error:`` line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr, flush=True)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    """A flag's value as a whole number of 1 or more (a count, a size), for ``add_argument(type=positive_int)``:
    a bad value is refused by the parser, before the command loads anything.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse prints it after the flag's name, as one ``error:`` line).
    """
    if not text.strip().isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of 1 or more")
    return int(text)


def non_negative_int(text: str) -> int:
    """A flag's value as a whole number of 0 or more (warm-up steps, a count that may be none), for
    ``add_argument(type=non_negative_int)``.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    if not text.strip().isdecimal():
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of 0 or more")
    return int(text)


def number_in(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    """A type function for a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``), for
    ``add_argument(type=number_in(0, 1440, low_open=True))``: nan, inf and 1e300 are refused by the parser.

    Raises (the returned function):
        argparse.ArgumentTypeError: not a number, or out of the range (named in the message).
    """
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (low < value if low_open else low <= value) and value <= high):
            raise argparse.ArgumentTypeError(f"{text!r}: give a number in {interval}")
        return value

    number.__name__ = "number_in"
    return number


def max_workers() -> int:
    """The most worker processes ``--workers`` takes on this machine: :data:`WORKERS_PER_CORE` per core."""
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def worker_count(text: str) -> int:
    """A ``--workers`` value as a whole number from 1 to :func:`max_workers`, for ``add_argument(type=worker_count)``:
    every command with ``--workers`` takes it through this, so the bound is the same everywhere.

    Raises:
        argparse.ArgumentTypeError: anything else, naming the bound and where it comes from.
    """
    bound = max_workers()
    if not text.strip().isdecimal() or not 1 <= int(text) <= bound:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 to {bound} (at most {WORKERS_PER_CORE} per core; "
                                         f"{os.cpu_count() or 1} cores here)")
    return int(text)


def add_workers_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str,
                         default: int = 1) -> None:
    """Add ``--workers N`` to ``parser`` (or a group of it): ``what`` runs N at once, 1 to :func:`max_workers`."""
    parser.add_argument("--workers", type=worker_count, default=default,
                        help=f"{what}, 1 to {WORKERS_PER_CORE} per core (default {default})")
