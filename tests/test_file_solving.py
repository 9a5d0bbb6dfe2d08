"""Files of puzzles answered into OUT/answers.csv (utils/solve/file_solving.py, utils/solve/answers_file.py; solve.py
--sudoku FILE / --maze FILE): streamed, resumable, bad lines skipped; on the CPU with the bundled models."""

import csv
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import solve
from utils.data.sudoku.rating import search
from utils.data.user_puzzles import PuzzleInputError, iter_puzzle_file, parse_maze
from utils.solve import file_solving
from utils.solve.anytime import AnytimeAnswer, Spent
from utils.solve.answers_file import COLUMNS, read_rows
from utils.solve.verdict import Answer

ROOT = Path(__file__).resolve().parents[1]
TOP95 = [line.split()[0] for line in (ROOT / "utils/data/sudoku/outside_puzzles/norvig_top95.txt").read_text().splitlines()
         if line.strip() and not line.startswith("#")]
CPU_FLAGS = ["--device", "cpu", "--forward-dtype", "float32"]


def puzzle_file(path: Path, puzzles: list[str], bad: dict[int, str]) -> Path:
    """``puzzles`` one a line with CRLF ends and a byte-order mark, and ``bad`` lines (0-based index: text) put
    in among them."""
    lines = list(puzzles)
    for index in sorted(bad):
        lines.insert(index, bad[index])
    path.write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode("utf-8"))
    return path


def fake_solver(monkeypatch, stop_at: int = 0, record: bool = True):
    """Anytime solving replaced by an instant answer (the puzzle itself, not consistent); with ``stop_at``, a
    Ctrl-C at that call. The calls made are returned (with ``record``)."""
    calls = []

    def solve_anytime(trained, task, name, tokens, budget, ttc, device, **_):
        if record:
            calls.append(name)
        if record and len(calls) == stop_at:
            raise KeyboardInterrupt
        found = Answer(name, task, tokens, tokens, tokens[None], np.zeros(1, np.float32), 0.5, 1, None,
                       ["a fake answer"], "checked", unique=True)
        return AnytimeAnswer(found, Spent(4, 0.01, 1, 1), "budget")

    monkeypatch.setattr(file_solving, "solve_anytime", solve_anytime)
    return calls


def rows(out: Path) -> list[dict]:
    return list(read_rows(out / "answers.csv"))


def test_a_file_with_bad_lines_is_answered_line_by_line_and_continued_after_a_stop(tmp_path, monkeypatch, capsys):
    source = puzzle_file(tmp_path / "p.txt", TOP95[:8], {0: "not a puzzle", 4: "1234", 9: "11" + "." * 79})
    out, args = tmp_path / "out", ["--sudoku", str(tmp_path / "p.txt"), "--out", str(tmp_path / "out"), *CPU_FLAGS]
    calls = fake_solver(monkeypatch, stop_at=4)
    assert solve.main(args) == 130  # a Ctrl-C at the 4th puzzle: the rows before it are on disk
    kept = rows(out)
    assert [int(r["line"]) for r in kept] == [1, 2, 3, 4, 5]  # 3 answers and 2 bad lines, flushed one by one
    assert kept[0]["verdict"].startswith("bad line: p.txt line 1: 10 cells") and kept[2]["puzzle"] == TOP95[1]
    calls = fake_solver(monkeypatch)
    assert solve.main(args) == 1  # continued: no line answered twice, the bad ones listed
    out_text = capsys.readouterr().out
    assert "continuing" in out_text and "5 line(s) answered before" in out_text
    assert calls == [f"line {n}" for n in (6, 7, 8, 9, 11)]
    assert [int(r["line"]) for r in rows(out)] == list(range(1, 12))
    assert "8 line(s) answered, 0 consistent, 0 not unique; 3 bad line(s)" in out_text
    assert "bad lines: 1, 5, 10 (their reasons are in answers.csv)" in out_text
    assert solve.main(args) == 1 and calls == [f"line {n}" for n in (6, 7, 8, 9, 11)]  # all done: nothing runs


def three_answered(tmp_path: Path, monkeypatch) -> tuple[list[str], Path, bytes]:
    """A file of 3 puzzles answered into ``tmp_path/out`` by the fake solver: (its command line, answers.csv, its
    bytes)."""
    source = puzzle_file(tmp_path / "p.txt", TOP95[:3], {})
    args = ["--sudoku", str(source), "--out", str(tmp_path / "out"), *CPU_FLAGS]
    fake_solver(monkeypatch)
    assert solve.main(args) == 1
    answers = tmp_path / "out" / "answers.csv"
    return args, answers, answers.read_bytes()


def test_a_torn_last_row_is_redone_and_other_settings_are_refused(tmp_path, monkeypatch, capsys):
    args, answers, whole = three_answered(tmp_path, monkeypatch)
    for torn in (whole[:-30], whole[:whole.rindex(b",")] + b"\r\n"):  # cut mid-row; a full line with a field short
        answers.write_bytes(torn)
        calls = fake_solver(monkeypatch)
        assert solve.main(args) == 1 and calls == ["line 3"]
        assert answers.read_bytes() == whole  # the torn row gone, redone once
    capsys.readouterr()
    assert solve.main([*args, "--budget", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "holds answers made with protocol='checked, anytime, <=6 s a puzzle" in err
    assert "this command has protocol='checked, anytime, <=3 s a puzzle" in err and len(err.splitlines()) == 1
    (tmp_path / "out" / "answers.json").unlink()  # an answers.csv this command did not write is never touched
    assert solve.main(args) == 2 and answers.read_bytes() == whole
    assert "was not written by solve.py" in capsys.readouterr().err


def test_memory_stays_flat_however_long_the_file(tmp_path, monkeypatch, capfd):
    fake_solver(monkeypatch, record=False)  # the lines printed go to a file (capfd), not to memory
    peaks = []
    for lines in (300, 3000):
        source = puzzle_file(tmp_path / f"p{lines}.txt", [TOP95[i % 95] for i in range(lines)], {})
        tracemalloc.start()
        try:
            model = SimpleNamespace(seq_len=81, vocab_size=11, grid=False, bundled=False)
            file_solving.solve_file(model, "sudoku", source, tmp_path / f"out{lines}", {"precision": "float32"}, 6.0,
                                    None, None, quiet=True)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        capfd.readouterr()
    # Ten times the lines: the same peak, within what one row's objects and the CSV machinery take.
    assert peaks[1] < peaks[0] + 200_000 and peaks[1] < 2_000_000, peaks


def test_bom_crlf_and_open_rows_are_read_as_written(tmp_path):
    maze = ["S  #", "    ", " # G", "    "]  # its last row is all open: a row, not the end of the text
    assert parse_maze("\ufeff" + "\r\n".join(maze) + "\r\n", "m")[0].size == 16
    two = tmp_path / "mazes.txt"
    two.write_bytes(("\ufeff" + "\r\n".join(maze) + "\r\n\r\n" + "\r\n".join(maze[::-1]) + "\r\n").encode())
    entries = list(iter_puzzle_file("maze", two))
    assert [(e.line, e.error) for e in entries] == [(1, None), (6, None)]
    with pytest.raises(PuzzleInputError, match=r"3 row\(s\) of up to 4 characters \(row 2 has 0"):
        parse_maze("S  #\n\n # G\n", "m")  # an editor emptied the open row: said so
    solution = "".join(map(str, search([0 if c in ".0" else int(c) for c in TOP95[0]]).solution))
    csv_file = tmp_path / "extreme.csv"
    csv_file.write_bytes(f"\ufeffsource,question,answer,rating\r\nx,{TOP95[0]},{solution},3\r\n"
                         f"y,{TOP95[1]},{'1' * 81},3\r\n".encode())
    good, bad = iter_puzzle_file("sudoku", csv_file)
    assert good.error is None and "".join(str(t - 1) for t in good.label) == solution and good.line == 2
    assert bad.tokens is None and "line 3, its answer: row 1 already holds 1 twice" in bad.error


def test_a_real_file_streams_its_answers_with_no_bar_in_redirected_output(tmp_path):
    source = puzzle_file(tmp_path / "p.txt", TOP95[:3], {1: "bad"})
    done = subprocess.run([sys.executable, str(ROOT / "solve.py"), "--sudoku", str(source), "--out",
                           str(tmp_path / "out"), *CPU_FLAGS, "--budget", "0", "--rollouts", "2"],
                          capture_output=True, text=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)},
                          timeout=300)
    assert done.returncode in (0, 1, 3), done.stderr
    assert "█" not in done.stdout + done.stderr and "\r" not in done.stdout + done.stderr
    kept = rows(tmp_path / "out")
    assert [r["line"] for r in kept] == ["1", "2", "3", "4"] and kept[1]["verdict"].startswith("bad line")
    fixed = " x 1 views = 8 segment passes a puzzle, model-only selection"
    assert all(r["precision"] == "float32" and r["protocol"].endswith(fixed) and r["passes"] == "8"
               for r in kept if r is not kept[1]), kept
    assert list(csv.reader((tmp_path / "out" / "answers.csv").open()))[0] == list(COLUMNS)
    assert "3 line(s) answered" in done.stdout


@pytest.mark.parametrize("task", ["sudoku", "maze"])
def test_a_file_that_is_not_text_is_refused_before_any_line_is_answered(tmp_path, task):
    program = tmp_path / "picture.png"
    program.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)))
    with pytest.raises(PuzzleInputError, match=r"picture.png is not a text file \(it holds NUL bytes\)"):
        next(iter_puzzle_file(task, program))


def test_a_second_solve_into_the_same_out_is_refused_while_the_first_writes(tmp_path, monkeypatch, capsys):
    import fcntl

    args, answers, whole = three_answered(tmp_path, monkeypatch)
    with open(answers, "a") as first:  # what a solve.py still answering into it holds
        fcntl.flock(first, fcntl.LOCK_EX)
        capsys.readouterr()
        assert solve.main(args) == 2
        err = capsys.readouterr().err.strip()
    assert err == f"error: another solve.py is answering into {answers}: wait for it to end (this command then " \
                  "continues the file), or give another --out"
    assert answers.read_bytes() == whole


def test_a_labelled_file_names_its_fixed_compute_protocol_in_the_accuracy_line(tmp_path, capsys):
    solutions = ["".join(map(str, search([0 if c in ".0" else int(c) for c in p]).solution)) for p in TOP95[:2]]
    csv_file = tmp_path / "extreme.csv"
    csv_file.write_text("source,question,answer\n" + "".join(f"x,{p},{s}\n" for p, s in zip(TOP95, solutions)))
    assert solve.main(["--sudoku", str(csv_file), "--out", str(tmp_path / "out"), *CPU_FLAGS, "--budget", "0",
                       "--rollouts", "1", "--segments", "1"]) in (0, 1)
    kept = rows(tmp_path / "out")
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("exact accuracy against"))
    assert {r["protocol"] for r in kept} == {"fixed: 1 segments x 1 rollouts (noise 0) x 1 views = 1 segment passes "
                                             "a puzzle, model-only selection"}
    assert f"({kept[0]['protocol']}): " in line and line.endswith("n=2)")
