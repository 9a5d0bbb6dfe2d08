"""A file of puzzles answered into ``OUT/answers.csv``: one row a puzzle, appended and flushed the moment it is
found, so that a stop keeps every answer found so far and the same command continues after the last one.

``OUT/answers.json`` beside it holds the settings the answers were made with (the input file, the task, the model,
the protocol, the precision, ...); a run with other settings refuses to add to it, naming the difference, since
one file would then mix answers of two kinds. Each row keeps its puzzle as the input gave it, and a continuation
reads the input again beside the rows (:class:`Answered`): a line whose puzzle is not the one answered (a line
inserted, replaced or removed since) is refused, naming it, and never answered by line number.

What a kill can leave is repaired: a last row cut short (no line end, or too few fields) is dropped and answered
again; a header row cut short, or never written, is written again. Nothing else is repaired, and nothing outside
``OUT`` is ever written: an ``answers.csv`` or ``answers.json`` that is a link, a folder, or a file this command did
not write (no settings beside it, a header or a line field changed by hand, settings that are not an object) is
refused in one line, and a full disk or a file-size limit ends the run in one line naming the file and the bytes,
every row written so far kept.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from utils.errors import UserError
from utils.outputs import FILE_MODE, write_atomically, write_failure

COLUMNS = ("line", "puzzle", "answer", "verdict", "unique", "protocol", "precision", "passes", "seconds",
           "file_answer")  # file_answer: the answer the input file gives for the puzzle, where it gives one
ANSWERS, SETTINGS = "answers.csv", "answers.json"
BAD_LINE = "bad line"  # how the verdict of a line that is not a puzzle begins
HEADER = ",".join(COLUMNS).encode() + b"\r\n"  # as csv.writer writes it
# A bad line's row keeps this many characters of it: a line of any length stays a short row.
EXCERPT = 200


class AnswersFileError(UserError):
    """``OUT/answers.csv`` cannot be continued: other settings, a changed input, a link, or a file this command did
    not write."""


def excerpt(text: str) -> str:
    """``text`` as a row keeps it: whole up to :data:`EXCERPT` characters, else its start and its length."""
    return text if len(text) <= EXCERPT else f"{text[:EXCERPT]}... ({len(text):,} characters)"


def _regular_or_absent(path: Path) -> None:
    """Refuse ``path`` unless it is a regular file or nothing: a link (even a dangling one) would have this command
    write or cut a file outside ``OUT``, a folder is no answers file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = "a link" if stat.S_ISLNK(mode) else "not a file"
        raise AnswersFileError(f"{path} is {kind}: solve.py writes its answers only into files of its own in --out; "
                               "remove it or give another --out")


class AnswersFile:
    """``out/answers.csv`` and its settings, opened to add rows (module docstring).

    Args:
        out: the output folder (made when missing).
        settings: what the answers are made with, JSON-able; compared key by key with an earlier run's.

    Attributes:
        answered: the rows an earlier run wrote, to continue after (:class:`Answered`).

    Raises:
        AnswersFileError: an earlier ``answers.csv`` made with other settings (the first difference named), one with
            no settings file beside it, a header or line changed by hand, a link or folder where a file goes, or one
            that another process is writing (it holds the file's lock, which goes with it however it ends).
    """

    def __init__(self, out: Path, settings: dict):
        self.path, self.settings_path = out / ANSWERS, out / SETTINGS
        for path in (self.path, self.settings_path):
            _regular_or_absent(path)
        out.mkdir(parents=True, exist_ok=True)
        existed = self.path.exists() and self.path.stat().st_size > 0  # an empty one: a kill before its header
        # O_NOFOLLOW: a link made between the check above and here is refused too (ELOOP), never written through.
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            raise AnswersFileError(f"{self.path} cannot be opened to add answers ({e.strerror}); give another "
                                   "--out") from None
        self._fd = fd  # written unbuffered (os.write): a failed write leaves nothing pending to fail again on close
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AnswersFileError(f"another solve.py is answering into {self.path}: wait for it to end (this "
                                       "command then continues the file), or give another --out") from None
            self.answered = self._continue(settings) if existed else self._start(settings)
        except BaseException:
            os.close(self._fd)
            raise

    def _start(self, settings: dict) -> "Answered":
        write_atomically(self.settings_path, lambda f: f.write(json.dumps(settings, indent=1).encode() + b"\n"),
                         "answers' settings")
        self._write_bytes(HEADER)
        return Answered(self.path, 0)

    def _continue(self, settings: dict) -> "Answered":
        """The rows answered before, after mending a torn header or last row; refuses other settings."""
        if not self.settings_path.is_file():
            raise AnswersFileError(f"{self.path} exists but {self.settings_path.name} does not: it was not written by "
                                   "solve.py; give another --out")
        try:
            before = json.loads(self.settings_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise AnswersFileError(f"{self.settings_path} cannot be read ({e}); give another --out") from None
        if not isinstance(before, dict):
            raise AnswersFileError(f"{self.settings_path} holds a {type(before).__name__}, not the settings solve.py "
                                   "writes (an object): it was changed by hand; give another --out")
        for key in [*settings, *(k for k in before if k not in settings)]:  # this command's order, then the rest
            if before.get(key) != settings.get(key):
                raise AnswersFileError(f"{self.path} holds answers made with {key}={before.get(key)!r}, and this "
                                       f"command has {key}={settings.get(key)!r}: run it with the same settings to "
                                       "continue that file, or give another --out")
        self._mend_header()
        self._drop_torn_row()
        return Answered(self.path, sum(1 for _ in _checked_rows(self.path)))

    def _mend_header(self) -> None:
        """Write the header row again where a kill cut it short or left none (module docstring)."""
        with open(self.path, "rb") as f:
            first = f.readline()
            rest = f.read(1)
        if first == HEADER:
            return
        if not rest and HEADER.startswith(first):  # empty, or a header cut short: nothing else in the file
            os.truncate(self.path, 0)
            self._write_bytes(HEADER)
            return
        if _is_row(first):  # rows without their header: the header goes back in front of them
            self._prepend_header()
            return
        raise AnswersFileError(f"{self.path} does not begin with its header row ({HEADER.decode().strip()}): it was "
                               "changed by hand; restore the header, or give another --out")

    def _prepend_header(self) -> None:
        """Rewrite the file as the header and its rows: a copy beside it, locked, synced and renamed over it, so the
        lock is never let go and a failure leaves the file as it was."""
        fd, tmp = tempfile.mkstemp(prefix=".answers.", suffix=".tmp", dir=self.path.parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with open(self.path, "rb") as old, open(fd, "wb", closefd=False) as new:
                new.write(HEADER)
                while chunk := old.read(1 << 20):
                    new.write(chunk)
            os.fsync(fd)
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise
        os.close(self._fd)
        self._fd = fd  # at the end of what it holds: the rows go on after it

    def _drop_torn_row(self) -> None:
        """Cut the file after its last complete row (a kill can stop a write mid-row)."""
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            f.seek(max(0, size - (1 << 16)))  # a row is short (a bad line's text is cut to an excerpt)
            tail = f.read()
        keep = tail.rfind(b"\n") + 1
        last = tail[tail.rfind(b"\n", 0, keep - 1) + 1:keep]
        start = size - len(tail)
        if keep and start + keep > len(HEADER) and not _is_row(last):
            keep -= len(last)  # a complete line with too few fields: also a torn row
        if start + keep < size:
            os.truncate(self.path, start + keep)

    def _write_bytes(self, data: bytes) -> None:
        """Append ``data`` and flush it, or end the run in one line naming the file and the bytes."""
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError as e:
            raise write_failure(self.path, e, "answers") from None

    def write(self, row: dict) -> None:
        """Append one row (keys :data:`COLUMNS`) and flush it to the operating system: a kill of this process
        loses no row written (a power cut may lose the last ones; the file is still read back whole).

        Raises:
            OutputWriteError: the disk is full or a file-size limit is reached (the rows before are kept; a row
                written in part is dropped by the next run).
        """
        line = io.StringIO()
        csv.writer(line).writerow([row.get(column, "") for column in COLUMNS])
        self._write_bytes(line.getvalue().encode("utf-8"))

    def close(self) -> None:
        os.close(self._fd)


def _is_row(line: bytes) -> bool:
    """Whether ``line`` (one line of an answers.csv, its end included) is a whole row: every column, a line number."""
    if not line.endswith(b"\n"):
        return False
    try:
        fields = next(csv.reader(io.StringIO(line.decode("utf-8"))), [])
    except (UnicodeDecodeError, csv.Error):
        return False
    return len(fields) == len(COLUMNS) and fields[0].isdigit()


class Answered:
    """The rows of an ``answers.csv`` that an earlier run wrote, read beside the input again as it is answered, in
    the file's order: ``count`` of them, and :meth:`check` for each line of the input (module docstring)."""

    def __init__(self, path: Path, count: int):
        self.path, self.count = path, count
        self._rows = _checked_rows(path) if count else iter(())
        self._next = next(self._rows, None)

    def check(self, line: int, puzzle: str, input_name: str) -> bool:
        """Whether the input's line ``line``, whose row would hold ``puzzle``, was answered before (True: skip it).

        Raises:
            AnswersFileError: the row answered for that line holds another puzzle, or a row answers a line the input
                no longer has before it: the input changed since; the line is named.
        """
        row = self._next
        if row is None or int(row["line"]) > line:
            return False
        if int(row["line"]) < line or row["puzzle"] != puzzle:
            number = int(row["line"])
            raise AnswersFileError(f"{input_name} changed since {self.path} was written: line {number} is not the "
                                   f"puzzle answered there ({excerpt(row['puzzle'])[:60]!r}); restore the file, or give "
                                   "another --out to answer it anew")
        self._next = next(self._rows, None)
        return True

    def finish(self, input_name: str) -> None:
        """Refuse rows left over once the input has ended: lines removed from it since they were answered.

        Raises:
            AnswersFileError: naming the first such line.
        """
        if self._next is not None:
            raise AnswersFileError(f"{input_name} changed since {self.path} was written: it ends before line "
                                   f"{self._next['line']}, which was answered there; restore the file, or give "
                                   "another --out to answer it anew")


def _checked_rows(path: Path) -> Iterator[dict]:
    """The rows of an answers.csv this command wrote, streamed, each with a line number above the one before.

    Raises:
        AnswersFileError: a row changed by hand (a line that is not a number, lines out of order, a field past the
            CSV reader's limit), named by its place in the file.
    """
    last = 0
    for number, row in enumerate(read_rows(path), 2):
        line = row["line"]
        if not line.isdigit() or int(line) <= last:
            raise AnswersFileError(f"{path}, row {number}: the line field {line[:20]!r} is not a line number after "
                                   f"{last}: the file was changed by hand; give another --out")
        last = int(line)
        yield row


def read_rows(path: Path) -> Iterator[dict]:
    """The complete rows of an ``answers.csv``, streamed.

    Raises:
        AnswersFileError: the file cannot be read as one (a field past the CSV reader's limit, bytes that are not
            UTF-8), naming it.
    """
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if None not in row.values() and len(row) == len(COLUMNS):
                    yield row
    except (csv.Error, UnicodeDecodeError) as e:
        raise AnswersFileError(f"{path} cannot be read as answers ({e}): it was changed by hand; give another "
                               "--out") from None


def summary(path: Path, bad_lines_kept: int = 0) -> tuple[dict[str, int], list[str]]:
    """Counts over every row of ``path``, in one pass: ``answered`` lines, ``consistent`` answers, ``not_unique``
    lines and ``bad`` lines, and among the answered lines whose input gave an answer, ``labelled`` and ``exact``
    (equal); and the line numbers of the first ``bad_lines_kept`` bad lines."""
    counts = dict.fromkeys(("answered", "consistent", "not_unique", "bad", "labelled", "exact"), 0)
    bad_lines: list[str] = []
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

