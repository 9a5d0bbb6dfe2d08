"""Solving a file of puzzles (``solve.py --sudoku FILE`` / ``--maze FILE`` with more than one puzzle in it): each
puzzle read as it is needed, answered, and its row written to ``OUT/answers.csv`` at once (utils/solve/answers_file.py),
so memory and the time to the first answer do not grow with the file, a stop keeps every answer found, and the same
command continues where it stopped. A line that is not a puzzle gets a row saying why, and the rest are answered.

Under a budget each puzzle is solved by anytime solving (utils/solve/anytime.py); with fixed compute (``--budget 0``)
puzzles are answered in batches of one size, as many as take about :data:`FIXED_BATCH_S` seconds.

Exit codes: 0 every puzzle answered and every answer consistent; 1 some answer is not consistent (or the puzzle has
no solution); 3 every answer consistent, but some lines were not puzzles (listed in the summary).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from tqdm import tqdm

from utils.data.user_puzzles import FileEntry, PuzzleInputError, iter_puzzle_file, puzzle_text
from utils.solve.answers_file import BAD_LINE, AnswersFile, excerpt, summary
from utils.solve.anytime import UNSOLVABLE, protocol, solve_anytime
from utils.solve.precheck import prepare
from utils.solve.solving import answer
from utils.solve.verdict import Answer
from utils.eval.stats import wilson_interval

FIXED_BATCH = 64  # puzzles answered together under fixed compute at most: bounded memory, whatever the file's length
FIXED_BATCH_S = 2.0  # ... and about as many as take this long, so a stop loses seconds (a loaded CPU: minutes at 64)
BAD_LINES_SHOWN = 10  # bad lines the summary names


def grid_text(task: str, tokens: np.ndarray, shape: Optional[tuple[int, int]] = None) -> str:
    """A puzzle or answer as one CSV field: a Sudoku as 81 characters (``.`` blank), a maze's rows (of its own
    ``shape`` where given) joined by ``|``."""
    return puzzle_text(task, tokens, shape).replace("\n", "|")


def solve_file(trained, task: str, path: Path, out: Path, settings: dict, budget: Optional[float], ttc, device,
               quiet: bool = False, shown: Callable[[Answer, FileEntry], None] = None) -> int:
    """Answer every puzzle of ``path`` into ``out/answers.csv`` (module docstring) and print one line a puzzle and
    a summary; the exit code.

    Args:
        settings: what the answers are made with (model, protocol, precision, ...), kept beside them.
        budget: seconds a puzzle (anytime solving), or None for fixed compute ``ttc``.
        quiet: no progress bar (one is drawn only on a terminal anyway).
        shown: called with each answer and its entry (solve.py's pictures, on request).

    Raises:
        AnswersFileError: ``out`` holds answers made with other settings, or of an input that changed since (a line
            named), or files this command did not write.
        OutputWriteError: a row could not be written (a full disk); the rows before it are kept.
        PuzzleInputError: ``path`` cannot be opened.
    """
    answers = AnswersFile(out, settings)
    if answers.answered.count:
        print(f"continuing {answers.path}: {answers.answered.count} line(s) answered before", flush=True)
    precision = settings["precision"]
    how = protocol(budget) if budget is not None else ttc.describe(trained.cfg.arch["halt_max_steps"])
    bar = tqdm(desc=path.name, unit="puzzle", disable=quiet or not sys.stderr.isatty(), leave=False)
    batch = _FixedBatch(answers, trained, task, ttc, device, precision, how, shown)
    try:
        for entry in iter_puzzle_file(task, path):
            field = puzzle_field(task, entry)
            if answers.answered.check(entry.line, field, path.name):
                continue
            entry, solutions = _prepared(trained, task, entry)
            if budget is None:  # rows keep the file's order: a bad line waits for the puzzles before it
                batch.add(entry, field, solutions)
            elif entry.error is not None:
                _write(answers, _bad_row(entry, field))
            else:
                solved = solve_anytime(trained, task, f"line {entry.line}", entry.tokens, budget, ttc, device,
                                       solutions=solutions)
                _write(answers, _row(task, entry, field, solutions, solved.answer, solved.ended, how, precision,
                                     solved.spent.passes, solved.spent.seconds), shown, solved.answer, entry)
            bar.update(1)
        batch.flush()
        answers.answered.finish(path.name)
    finally:
        bar.close()
        answers.close()
    return _summarise(answers.path, how)


def puzzle_field(task: str, entry: FileEntry) -> str:
    """The puzzle as its row in answers.csv holds it: the puzzle (a maze in its own shape, rows joined by ``|``), or
    for a line that is not one, an excerpt of the line as written (:func:`utils.solve.answers_file.excerpt`)."""
    if entry.tokens is None:
        return excerpt(entry.text.replace("\n", "|"))
    return grid_text(task, entry.tokens, entry.shape)


def _prepared(trained, task: str, entry: FileEntry) -> tuple[FileEntry, Optional[int]]:
    """``entry`` with the tokens the model answers and its solutions counted (:func:`utils.solve.precheck.prepare`),
    or as a bad entry where the model does not take its puzzle (another size, one larger than it takes)."""
    if entry.tokens is None:
        return entry, None
    try:
        ready = prepare(trained, task, entry.tokens, entry.shape)
    except PuzzleInputError as e:
        return replace(entry, tokens=None, error=str(e)), None
    return replace(entry, tokens=ready.tokens), ready.solutions


class _FixedBatch:
    """Puzzles answered together under fixed compute, their rows written in the file's order (a bad line waits for
    the puzzles before it). A batch holds puzzles of one size, and as many as take about :data:`FIXED_BATCH_S`
    seconds at the pace of the batches before (at most :data:`FIXED_BATCH`), so a stop loses seconds of work."""

    def __init__(self, answers: AnswersFile, trained, task: str, ttc, device, precision: str, how: str, shown):
        self.answers, self.trained, self.task, self.ttc, self.device = answers, trained, task, ttc, device
        self.precision, self.how, self.shown = precision, how, shown
        self.pending: list[tuple[FileEntry, str, Optional[int]]] = []  # the first a puzzle, where any is pending
        self.puzzles, self.size = 0, 1  # puzzles pending; the batch's size

    def add(self, entry: FileEntry, field: str, solutions: Optional[int]) -> None:
        if entry.error is not None and not self.puzzles:  # nothing before it waits: its row goes out now
            _write(self.answers, _bad_row(entry, field))
            return
        if entry.error is None and self.puzzles and self.pending[0][0].tokens.size != entry.tokens.size:
            self.flush()  # one size a batch
        self.pending.append((entry, field, solutions))
        self.puzzles += entry.error is None
        if self.puzzles >= self.size:
            self.flush()

    def flush(self) -> None:
        """Answer the pending puzzles together, write their rows, and size the next batch by their pace."""
        good = [e for e, _, _ in self.pending if e.error is None]
        start = time.monotonic()
        found = iter(answer(self.trained, self.task, [(f"line {e.line}", e.tokens) for e in good], self.ttc,
                            self.device) if good else [])
        seconds = (time.monotonic() - start) / max(len(good), 1)
        passes = self.ttc.passes(self.trained.cfg.arch["halt_max_steps"]) if good else 0
        for entry, field, solutions in self.pending:
            if entry.error is not None:
                _write(self.answers, _bad_row(entry, field))
            else:
                one = next(found)
                _write(self.answers, _row(self.task, entry, field, solutions, one, "", self.how, self.precision,
                                          passes, seconds), self.shown, one, entry)
        self.pending.clear()
        self.puzzles = 0
        if good:
            self.size = max(1, min(FIXED_BATCH, int(FIXED_BATCH_S / max(seconds, 1e-6))))


def _bad_row(entry: FileEntry, field: str) -> dict:
    return {"line": entry.line, "puzzle": field, "verdict": f"{BAD_LINE}: {entry.error}"}


def _row(task: str, entry: FileEntry, field: str, solutions: int, found: Optional[Answer], ended: str, how: str,
         precision: str, passes: int, seconds: float) -> dict:
    """One row of answers.csv for ``entry`` (its puzzle's ``solutions`` counted before its search) answered by
    ``found`` (None: the puzzle has no solution)."""
    if ended == "unsolvable":
        verdict = f"no solution: {UNSOLVABLE[task]}"
    else:
        verdict = "consistent" if found.consistent else "NOT consistent: " + "; ".join(found.problems)
    return {"line": entry.line, "puzzle": field,
            "answer": "" if found is None else grid_text(task, found.grid, entry.shape), "verdict": verdict,
            "unique": "yes" if solutions == 1 else "no", "protocol": how, "precision": precision, "passes": passes,
            "seconds": f"{seconds:.3f}",
            "file_answer": "" if entry.label is None else grid_text(task, entry.label, entry.shape)}


def _write(answers: AnswersFile, row: dict, shown=None, found: Optional[Answer] = None,
           entry: Optional[FileEntry] = None) -> None:
    answers.write(row)
    seconds = f" in {float(row['seconds']):.1f} s" if row.get("seconds") else ""
    unique = " (not unique)" if row.get("unique") == "no" and row["verdict"] == "consistent" else ""
    print(f"line {row['line']}: {row['verdict']}{unique}{seconds}", flush=True)
    if shown is not None and found is not None:
        shown(found, entry)


def _summarise(path: Path, how: str) -> int:
    """Print the closing summary of ``path`` (every row, earlier runs' included), its accuracy line naming the
    protocol ``how`` as the rows do; the exit code."""
    counts, bad = summary(path, BAD_LINES_SHOWN)
    print(f"\n{counts['answered']} line(s) answered, {counts['consistent']} consistent, {counts['not_unique']} not "
          f"unique; {counts['bad']} bad line(s); answers in {path}")
    if counts["bad"]:
        print(f"bad lines: {', '.join(bad)}{', …' if counts['bad'] > BAD_LINES_SHOWN else ''} (their reasons are in "
              f"{path.name})")
    if counts["labelled"]:
        low, high = wilson_interval(counts["exact"], counts["labelled"])
        print(f"exact accuracy against the file's answers ({how}): {counts['exact'] / counts['labelled']:.4f} (95% CI "
              f"{low:.2f}-{high:.2f}, n={counts['labelled']})")
    if counts["consistent"] < counts["answered"]:
        return 1
    return 3 if counts["bad"] else 0

