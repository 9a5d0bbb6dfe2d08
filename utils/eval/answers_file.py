"""A file of puzzles answered into ``OUT/answers.csv``: one row a puzzle, appended and flushed the moment it is
found, so that a stop keeps every answer found so far and the same command continues after the last one.

``OUT/answers.json`` beside it holds the settings the answers were made with (the input file, the task, the model,
the protocol, the precision, ...); a run with other settings refuses to add to it, naming the difference, since
one file would then mix answers of two kinds. A last row cut short by a kill (no line end, or too few fields) is
dropped and answered again. Nothing else in ``OUT`` is touched, and a ``answers.csv`` without its settings file
is not this command's: it is refused, never repaired.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
from pathlib import Path
from typing import Iterator

from utils.errors import UserError

COLUMNS = ("line", "puzzle", "answer", "verdict", "unique", "protocol", "precision", "passes", "seconds",
           "file_answer")  # file_answer: the answer the input file gives for the puzzle, where it gives one
ANSWERS, SETTINGS = "answers.csv", "answers.json"
BAD_LINE = "bad line"  # how the verdict of a line that is not a puzzle begins


class AnswersFileError(UserError):
    """``OUT/answers.csv`` cannot be continued: other settings, or a file this command did not write."""


class AnswersFile:
    """``out/answers.csv`` and its settings, opened to add rows (module docstring).

    Args:
        out: the output folder (made when missing).
        settings: what the answers are made with, JSON-able; compared key by key with an earlier run's.

    Raises:
        AnswersFileError: an earlier ``answers.csv`` made with other settings (the first difference named), or one
            with no settings file beside it, or one that another process is writing (it holds the file's lock,
            which goes with it however it ends).
    """

    def __init__(self, out: Path, settings: dict):
        self.path, self.settings_path = out / ANSWERS, out / SETTINGS
        out.mkdir(parents=True, exist_ok=True)
        existed = self.path.exists()
        self._handle = open(self.path, "a", newline="", encoding="utf-8")
        try:
            try:
                fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AnswersFileError(f"another solve.py is answering into {self.path}: wait for it to end (this "
                                       "command then continues the file), or give another --out") from None
            self._writer = csv.writer(self._handle)
            self.answered = self._continue(settings) if existed else self._start(settings)
        except BaseException:
            self._handle.close()
            raise

    def _start(self, settings: dict) -> set[int]:
        self.settings_path.write_text(json.dumps(settings, indent=1) + "\n")
        self.write(dict(zip(COLUMNS, COLUMNS)))  # the header row
        return set()

    def _continue(self, settings: dict) -> set[int]:
        """The lines already answered, after dropping a torn last row; refuses other settings."""
        if not self.settings_path.is_file():
            raise AnswersFileError(f"{self.path} exists but {self.settings_path.name} does not: it was not written by "
                                   "solve.py; give another --out")
        try:
            before = json.loads(self.settings_path.read_text())
        except (OSError, ValueError) as e:
            raise AnswersFileError(f"{self.settings_path} cannot be read ({e}); give another --out") from None
        for key in [*settings, *(k for k in before if k not in settings)]:  # this command's order, then the rest
            if before.get(key) != settings.get(key):
                raise AnswersFileError(f"{self.path} holds answers made with {key}={before.get(key)!r}, and this "
                                       f"command has {key}={settings.get(key)!r}: run it with the same settings to "
                                       "continue that file, or give another --out")
        self._drop_torn_row()
        return {int(row["line"]) for row in read_rows(self.path)}

    def _drop_torn_row(self) -> None:
        """Cut the file after its last complete row (a kill can stop a write mid-row)."""
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1
        last = data[data.rfind(b"\n", 0, keep - 1) + 1:keep]
        if keep and len(next(csv.reader(io.StringIO(last.decode("utf-8", "replace"))), [])) != len(COLUMNS):
            keep -= len(last)  # a complete line with too few fields: also a torn row
        if keep < len(data):
            with open(self.path, "r+b") as handle:
                handle.truncate(keep)

    def write(self, row: dict) -> None:
        """Append one row (keys :data:`COLUMNS`) and flush it to the operating system: a kill of this process
        loses no row written (a power cut may lose the last ones; the file is still read back whole)."""
        self._writer.writerow([row.get(column, "") for column in COLUMNS])
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def read_rows(path: Path) -> Iterator[dict]:
    """The complete rows of an ``answers.csv``, streamed."""
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if None not in row.values() and len(row) == len(COLUMNS):
                yield row


def summary(path: Path, bad_lines_kept: int = 0) -> tuple[dict[str, int], list[str]]:
    """Counts over every row of ``path``, in one pass: ``answered`` lines, ``consistent`` answers, ``not_unique``
    lines and ``bad`` lines, and among the answered lines whose input gave an answer, ``labelled`` and ``exact``
    (equal); and the line numbers of the first ``bad_lines_kept`` bad lines."""
    counts = dict.fromkeys(("answered", "consistent", "not_unique", "bad", "labelled", "exact"), 0)
    bad_lines = []
    for row in read_rows(path):
        if row["verdict"].startswith(BAD_LINE):
            counts["bad"] += 1
            if len(bad_lines) < bad_lines_kept:
                bad_lines.append(row["line"])
            continue
        counts["answered"] += 1
        counts["consistent"] += row["verdict"] == "consistent"
        counts["not_unique"] += row["unique"] == "no"
        if row["file_answer"]:
            counts["labelled"] += 1
            counts["exact"] += row["answer"] == row["file_answer"]
    return counts, bad_lines
