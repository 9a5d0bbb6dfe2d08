"""Answers files that no link, edit or odd input can corrupt or crash (issue 74), on device=cpu with the bundled Sudoku
model and anytime solving replaced by an instant answer (tests/test_file_solving.py's ``fake_solver``):

- a linked ``answers.csv`` or ``answers.json`` (to a file, or dangling) is refused and nothing outside OUT is written;
- an input edited between runs (lines inserted, replaced, removed) is refused naming the line, never continued by
  line number; lines added at its end are answered;
- a header cut short or missing is written again, every row counted, the exit code right;
- a line of any length is a bounded bad row, and a CSV field past the reader's limit is a bad line, not a crash;
- hand-edited files (a renamed header, a line field ``x5``, settings that are not an object, folders where files go)
  are one line and exit 2;
- a file-size limit reached while writing rows is one line naming the file and the bytes, the rows before kept.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import solve
from tests.test_file_solving import CPU_FLAGS, TOP95, fake_solver, puzzle_file, rows
from utils.solve.answers_file import EXCERPT, HEADER

ROOT = Path(__file__).resolve().parents[1]


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def answered(tmp_path: Path, monkeypatch, puzzles: list[str]) -> tuple[list[str], Path]:
    """``puzzles`` answered into ``tmp_path/out`` by the fake solver: the command line and the input file."""
    source = puzzle_file(tmp_path / "p.txt", puzzles, {})
    args = ["--sudoku", str(source), "--out", str(tmp_path / "out"), *CPU_FLAGS]
    fake_solver(monkeypatch)
    assert solve.main(args) == 1
    return args, source


@pytest.mark.parametrize("name", ["answers.csv", "answers.json"])
@pytest.mark.parametrize("dangling", [False, True], ids=["to a file", "dangling"])
def test_a_linked_answers_file_is_refused_and_nothing_outside_out_is_written(tmp_path, monkeypatch, capsys, name,
                                                                           dangling):
    target = tmp_path / "elsewhere" / "mine.txt"
    target.parent.mkdir()
    if not dangling:
        target.write_text("my own lines\nkeep them\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(target)
    source = puzzle_file(tmp_path / "p.txt", TOP95[:2], {})
    calls = fake_solver(monkeypatch)
    assert solve.main(["--sudoku", str(source), "--out", str(out), *CPU_FLAGS]) == 2
    assert f"{out / name} is a link" in one_error(capsys) and calls == []
    assert target.exists() != dangling and (dangling or target.read_text() == "my own lines\nkeep them\n")
    assert [p.name for p in out.iterdir()] == [name]  # nothing written beside the link either


def test_an_edited_input_is_refused_naming_the_line_and_an_extended_one_continued(tmp_path, monkeypatch, capsys):
    args, source = answered(tmp_path, monkeypatch, TOP95[:4])
    before = (tmp_path / "out" / "answers.csv").read_bytes()
    for edited, line in [(TOP95[10:12] + TOP95[:4], 1), (TOP95[:2] + TOP95[20:21] + TOP95[3:4], 3),
                         (TOP95[:3], 4)]:  # two inserted on top, one replaced, the last removed
        puzzle_file(source, edited, {})
        calls = fake_solver(monkeypatch)
        assert solve.main(args) == 2 and calls == []
        err = one_error(capsys)
        assert "p.txt changed since" in err and f"line {line}" in err
        assert (tmp_path / "out" / "answers.csv").read_bytes() == before
    puzzle_file(source, TOP95[:6], {})  # two lines added at the end: those are answered
    calls = fake_solver(monkeypatch)
    assert solve.main(args) == 1 and calls == ["line 5", "line 6"]
    assert [r["puzzle"] for r in rows(tmp_path / "out")] == TOP95[:6]


@pytest.mark.parametrize("damage", ["no header", "cut header", "empty"])
def test_a_missing_or_cut_header_is_written_again_and_every_row_counted(tmp_path, monkeypatch, capsys, damage):
    args, _ = answered(tmp_path, monkeypatch, TOP95[:4])
    answers = tmp_path / "out" / "answers.csv"
    whole = answers.read_bytes()
    answers.write_bytes({"no header": whole[len(HEADER):], "cut header": HEADER[:17], "empty": b""}[damage])
    capsys.readouterr()
    calls = fake_solver(monkeypatch)
    assert solve.main(args) == 1  # the fake answers are not consistent: 1, never the 0 of an empty summary
    assert answers.read_bytes().startswith(HEADER)
    kept = rows(tmp_path / "out")
    assert [int(r["line"]) for r in kept] == [1, 2, 3, 4]
    assert calls == ([] if damage == "no header" else ["line 1", "line 2", "line 3", "line 4"])
    assert "4 line(s) answered, 0 consistent" in capsys.readouterr().out


def test_a_line_of_any_length_is_a_short_bad_row_and_continues(tmp_path, monkeypatch, capsys):
    long = "." * 200_000
    source = puzzle_file(tmp_path / "p.txt", TOP95[:2], {1: long})
    args = ["--sudoku", str(source), "--out", str(tmp_path / "out"), *CPU_FLAGS]
    fake_solver(monkeypatch)
    assert solve.main(args) == 1
    bad = rows(tmp_path / "out")[1]
    assert bad["verdict"].startswith("bad line") and len(bad["puzzle"]) < EXCERPT + 40
    assert "200,000 characters" in bad["puzzle"]
    calls = fake_solver(monkeypatch)
    assert solve.main(args) == 1 and calls == []  # continued without a crash: all three answered before
    assert "2 line(s) answered, 0 consistent, 0 not unique; 1 bad line(s)" in capsys.readouterr().out

    csv_input = tmp_path / "extreme.csv"  # a Sudoku-Extreme CSV whose second row holds a field past csv's limit
    csv_input.write_text(f"source,question,answer,rating\na,{TOP95[0]},,0\nb,{'1' * 140_000},,0\nc,{TOP95[1]},,0\n")
    calls = fake_solver(monkeypatch)
    assert solve.main(["--sudoku", str(csv_input), "--out", str(tmp_path / "csv"), *CPU_FLAGS]) == 1
    kept = rows(tmp_path / "csv")
    assert [r["line"] for r in kept] == ["2", "3", "4"] and "not a CSV row" in kept[1]["verdict"]
    assert calls == ["line 2", "line 4"]


@pytest.mark.parametrize("edit", ["renamed header", "line x5", "settings a list", "settings null", "csv a folder",
                                  "json a folder"])
def test_hand_edited_answers_files_are_one_line(tmp_path, monkeypatch, capsys, edit):
    args, _ = answered(tmp_path, monkeypatch, TOP95[:3])
    out = tmp_path / "out"
    answers, settings = out / "answers.csv", out / "answers.json"
    text = answers.read_text()
    if edit == "renamed header":
        answers.write_text(text.replace("line,puzzle", "number,puzzle", 1))
    elif edit == "line x5":
        answers.write_text(text.replace("\r\n2,", "\r\nx5,", 1))
    elif edit.startswith("settings"):
        settings.write_text("[1, 2]" if edit.endswith("list") else "null")
    else:
        target = answers if edit == "csv a folder" else settings
        target.unlink()
        target.mkdir()
    capsys.readouterr()
    calls = fake_solver(monkeypatch)
    assert solve.main(args) == 2 and calls == []
    one_error(capsys)


def test_a_file_size_limit_is_one_line_naming_the_file_and_the_bytes(tmp_path):
    """``ulimit -f 2`` (2 KiB) on a file of 60 bad lines, whose rows pass it: one line, exit 1, the rows before kept
    whole (the next run drops a row written in part)."""
    source = tmp_path / "bad.txt"
    source.write_text("".join(f"not a puzzle {i}\n" for i in range(60)))
    out = tmp_path / "out"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    done = subprocess.run([sys.executable, "solve.py", "--sudoku", str(source), "--out", str(out), *CPU_FLAGS,
                           "--quiet"], cwd=ROOT, capture_output=True, text=True, preexec_fn=limit, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 1 and "Traceback" not in err, err
    assert err.count("\n") == 0 and f"could not write answers to {out / 'answers.csv'} (File too large)" in err
    assert "2,048 bytes" in err or "bytes" in err
    kept = rows(out)
    assert 5 < len(kept) < 60 and [int(r["line"]) for r in kept] == list(range(1, len(kept) + 1))
    assert json.loads((out / "answers.json").read_text())["task"] == "sudoku"
    assert os.path.getsize(out / "answers.csv") <= 2048


def test_an_out_folder_name_past_the_limit_is_refused_before_any_solving(tmp_path, monkeypatch, capsys):
    source = puzzle_file(tmp_path / "p.txt", TOP95[:2], {})
    calls = fake_solver(monkeypatch)
    assert solve.main(["--sudoku", str(source), "--out", str(tmp_path / ("o" * 300)), *CPU_FLAGS]) == 2
    assert "more than the 255 a file name may have" in one_error(capsys) and calls == []


def test_a_budget_too_short_for_the_models_own_answer_advises_the_budget_that_holds_it(monkeypatch):
    """--budget 1e-9: the advice is the budget that holds the model's own answer (its round 0 took about 2 s here),
    not 4e-09."""
    from types import SimpleNamespace

    from utils.solve import anytime as anytime_module
    from utils.solve.anytime import AnytimeAnswer, Spent

    def cut_short(trained, task, name, tokens, budget, ttc, device, **_):
        return AnytimeAnswer(None, Spent(1, 0.4, 1, 1), "budget", own_seconds=2.0)

    monkeypatch.setattr(anytime_module, "solve_anytime", cut_short)
    *_, more = solve.anytime(1e-9, None, "sudoku", [("p", None)], None, None, quiet=True)
    assert more == 3  # ceil(2.0 x 1.25)
    trained = SimpleNamespace(cfg=SimpleNamespace(arch={"halt_max_steps": 4}))
    assert "--budget 3 spends up to 3 s a puzzle" in solve.what_would_help(1e-9, None, trained, 10.0, more)


def test_a_missing_best_checkpoint_names_the_newest_one_beside_it(tmp_path):
    """scripts/predict_pose.py --checkpoint RUN/best.pt after a run stopped before its first validation: the message
    names RUN's newest step checkpoint (issue 74)."""
    from utils.checkpoint import CheckpointError, check_checkpoint_file

    for step in (53, 106, 9):
        (tmp_path / f"step_{step}.pt").write_bytes(b"PK")
    with pytest.raises(CheckpointError, match=r"holds step_106\.pt, its newest checkpoint"):
        check_checkpoint_file(tmp_path / "best.pt")
    with pytest.raises(CheckpointError, match=r"does not exist$"):
        check_checkpoint_file(tmp_path / "nowhere" / "best.pt")


def test_fixed_compute_writes_bad_lines_at_once_and_batches_one_size(tmp_path, monkeypatch):
    """--budget 0: a bad line with no puzzle waiting is written at once (a 100,000-line file of them stays flat and
    fast: the batch once recounted every line it held, quadratic); a batch holds puzzles of one size."""
    from types import SimpleNamespace

    from utils.data.user_puzzles import FileEntry
    from utils.solve import file_solving
    from utils.solve.answers_file import AnswersFile

    answered = []

    def fake_answer(trained, task, puzzles, ttc, device):
        answered.append([tokens.size for _, tokens in puzzles])
        return [SimpleNamespace(grid=tokens, consistent=True, problems=[]) for _, tokens in puzzles]

    monkeypatch.setattr(file_solving, "answer", fake_answer)
    monkeypatch.setattr(file_solving, "_row", lambda task, entry, field, *args: {"line": entry.line, "puzzle": field,
                                                                               "verdict": "consistent"})
    answers = AnswersFile(tmp_path, {"task": "maze"})
    trained = SimpleNamespace(cfg=SimpleNamespace(arch={"halt_max_steps": 2}))
    batch = file_solving._FixedBatch(answers, trained, "maze", SimpleNamespace(passes=lambda h: 2), None, "fp32",
                                     "fixed", None)
    batch.size = 8
    line = iter(range(1, 10**6))
    puzzle = lambda side: FileEntry(next(line), "m", np.ones(side * side, np.uint8))  # noqa: E731
    bad = lambda: FileEntry(next(line), "x", None, "not a maze")  # noqa: E731
    for _ in range(5000):
        batch.add(bad(), "x", None)
    assert batch.pending == []  # written at once: nothing held
    for entry in (puzzle(5), puzzle(5), bad(), puzzle(7), puzzle(7)):
        batch.add(entry, "m", 1)
    batch.flush()
    answers.close()
    assert answered == [[25, 25], [49, 49]]
    lines = [int(row["line"]) for row in rows(tmp_path)]
    assert lines == list(range(1, 5006))  # the file's order
