"""The command-line parser of every entry point and builder, with the project's error style.

It sits on the floor (it imports nothing of the project), so a dataset builder in ``utils/data/`` can use it without
reaching up into the run lifecycle.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the project's error style: a bad flag is one ``error:`` line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr, flush=True)
        raise SystemExit(2)
