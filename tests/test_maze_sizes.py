"""Mazes of other sizes than a model's, end to end on device=cpu: every dihedral view of a rectangle framed into a
square maps back exactly; a fixed-size model (one trained here on 10x10 mazes) gets a smaller maze framed with walls
and refuses a larger one in one line, as the bundled grid model refuses one past its largest side; a grid model
(token_mixer conv, trained here for a few steps) answers mazes of any side, files of mixed sides and datasets of
another side; a maze whose S and G do not connect ends at once.

A tiny model's answers are mostly wrong: what is checked is that each answer is judged by the rules of the user's own
maze and shown in its own shape, never which answer a model gives.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest

import evaluate
import pretrain
import solve
from utils.data.common import dihedral
from utils.data.maze import build_maze_dataset, mark_first_path
from utils.data.user_puzzles import format_maze, maze_problems, parse_maze, read_mazes
from utils.eval.reasoning import dihedral_order
from utils.solve.bundled import BUNDLED
from utils.solve.search import View

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = ROOT / "utils" / "data" / "maze_outside"
GRID_TRM = ["compile=false", "device=cpu", "forward_dtype=float32", "arch.hidden_size=16", "arch.num_heads=2",
            "arch.L_layers=1", "arch.H_cycles=1", "arch.L_cycles=1", "arch.halt_max_steps=2", "arch.expansion=2",
            "global_batch_size=8", "epochs=2", "eval_interval=1", "log_interval=2", "lr_warmup_steps=2",
            "eval_halt_max_steps=2"]
# 6 rows of 11, two shortest paths: along the top and down, or down and along the bottom.
RECTANGLE = ("###########\n"
             "#S        #\n"
             "# ####### #\n"
             "# ####### .\n"
             "#        G#\n"
             "###########\n")


def open_maze(side: int) -> str:
    """A ``side`` x ``side`` maze without walls as text: S top left, G bottom right."""
    return "\n".join(["S" + " " * (side - 1)] + [" " * side] * (side - 2) + [" " * (side - 1) + "G"])


def printed_mazes(printed: str, rows: int) -> list[str]:
    """Each maze answer solve.py printed: the ``rows`` lines after each verdict line."""
    lines = printed.splitlines()
    starts = [i for i, line in enumerate(lines) if re.search(r": (NOT )?consistent", line)]
    return ["\n".join(lines[i + 1:i + 1 + rows]) for i in starts]


def test_every_view_of_a_framed_rectangle_maps_back_exactly():
    """A 6x11 maze is framed into an 11x11 square; each of the 8 dihedral views, solved in its own orientation (its
    first shortest path) and mapped back, is a shortest path of the original, and crops back to its 6x11 rows."""
    tokens, shape = parse_maze(RECTANGLE, "rectangle")
    assert shape == (6, 11) and tokens.size == 121
    assert (tokens.reshape(11, 11)[6:] == 1).all()  # the frame: walls below
    answers = set()
    for t in range(8):
        view = View(dihedral_order(11, t), np.arange(6))
        seen = view.apply(tokens)
        assert np.array_equal(seen.reshape(11, 11), dihedral(tokens.reshape(11, 11), t))
        back = view.back(mark_first_path(seen.reshape(11, 11)).ravel())
        assert maze_problems(back, tokens) == []
        assert np.array_equal(view.back(seen), tokens)
        shown = format_maze(back, shape).splitlines()
        assert len(shown) == 6 and {len(row) for row in shown} == {11}
        answers.add(back.tobytes())
    assert len(answers) == 2  # the views' first paths go both ways round the block: both shortest, both kept


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory):
    """A tiny fixed-size TRM (the reference's attention, learned positions) trained 2 epochs on 32 10x10 mazes."""
    root = tmp_path_factory.mktemp("fixed")
    data = build_maze_dataset(root / "data", generate=True, size=10, train_size=32, test_size=8, seed=0)
    run = root / "run"
    assert pretrain.main(["--config-name=cfg_pretrain_trm_maze_cpu", f"data_paths=[{data}]", "dataset_builder=null",
                          f"checkpoint_path={run}", *GRID_TRM, "eval_views=1"]) == 0
    return run


def test_a_fixed_size_model_frames_a_smaller_maze_and_refuses_a_larger_one(fixed_run, tmp_path, capsys):
    """A 10x10 model answers a 9x9 lattice maze (mazelib's) framed with walls, its answer printed in 9 rows and
    judged by the 9x9 maze's rules; an 11x11 maze is one line and exit 2, naming the largest side and the recipe
    that trains a model of any side; a 9x9 maze whose S and G do not connect ends at once."""
    (_, nine, shape), *_ = read_mazes(str(OUTSIDE / "mazelib_perfect.txt"))
    assert shape == (9, 9)
    maze = tmp_path / "nine.txt"
    maze.write_text(format_maze(nine))
    out = tmp_path / "out"
    given = ["--device", "cpu", "--checkpoint", str(fixed_run)]
    code = solve.main([*given, "--maze", str(maze), "--out", str(out), "--budget", "0", "--quiet"])
    printed = capsys.readouterr().out
    (shown,) = printed_mazes(printed, 9)
    rows = shown.splitlines()
    assert len(rows) == 9 and {len(row) for row in rows} == {9}  # shown in the user's 9x9, not the model's 10x10
    marked = np.frombuffer(shown.replace("\n", "").encode(), np.uint8)
    grid = np.where(marked == ord("o"), 5, nine)
    consistent = not maze_problems(grid, nine)
    assert code == (0 if consistent else 1) and ("nine: consistent" in printed) == consistent

    large = tmp_path / "eleven.txt"
    large.write_text("\n".join(["S" + " " * 10] + [" " * 11] * 9 + [" " * 10 + "G"]))
    assert solve.main([*given, "--maze", str(large), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "11 cells wide or tall is larger than" in err and "at most 10x10" in err
    assert "cfg_pretrain_trm_maze_grid_cpu" in err

    walled = tmp_path / "walled.txt"
    walled.write_text("#########\n#S#     #\n###     #\n#      G#\n#########\n")
    assert solve.main([*given, "--maze", str(walled), "--out", str(out)]) == 1
    assert "S and G are not connected in this maze" in capsys.readouterr().out


def test_the_bundled_grid_model_refuses_a_maze_past_the_largest_side_it_takes(tmp_path, capsys):
    """The bundled maze model takes any side up to BUNDLED's; one past it is one line naming that side."""
    side = BUNDLED["maze"].side + 1
    large = tmp_path / "large.txt"
    large.write_text(open_maze(side))
    assert solve.main(["--device", "cpu", "--maze", str(large), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"larger than the bundled model {BUNDLED['maze'].file} takes" in err
    assert f"at most {side - 1}x{side - 1}" in err


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    """A tiny grid TRM (token_mixer conv) trained 2 epochs on 32 mixed mazes of sides 6..8 on an 8x8 canvas."""
    root = tmp_path_factory.mktemp("grid")
    data = build_maze_dataset(root / "data", generate=True, size=8, min_size=6, layout="mixed", ties="first",
                              train_size=32, test_size=8, seed=0)
    run = root / "run"
    assert pretrain.main(["--config-name=cfg_pretrain_trm_maze_grid_cpu", f"data_paths=[{data}]",
                          "dataset_builder=null", f"checkpoint_path={run}", *GRID_TRM]) == 0
    return run


def test_a_grid_model_answers_mazes_of_any_side_in_their_own_shape(grid_run, tmp_path, capsys):
    """A model trained on an 8x8 canvas answers a 6x11 rectangle and a 13x13 maze (its segments scaled by the side);
    a file of mazes of three sides is answered row by row, each row in its maze's own shape."""
    maze = tmp_path / "rectangle.txt"
    maze.write_text(RECTANGLE)
    out = tmp_path / "out"
    code = solve.main(["--device", "cpu", "--checkpoint", str(grid_run), "--maze", str(maze), "--out", str(out),
                       "--budget", "0", "--quiet"])
    (shown,) = printed_mazes(capsys.readouterr().out, 6)
    rows = shown.splitlines()
    assert code in (0, 1) and len(rows) == 6 and {len(r) for r in rows} == {11}

    mazes = [text for text in (OUTSIDE / "maze_dataset_cycles.txt").read_text().split("\n\n") if text.strip()]
    chosen = [mazes[0], mazes[8], RECTANGLE.rstrip("\n")]  # 9x9, 13x13 and the 6x11 rectangle
    many = tmp_path / "many.txt"
    many.write_text("\n\n".join(chosen) + "\n")
    code = solve.main(["--device", "cpu", "--checkpoint", str(grid_run), "--maze", str(many), "--out",
                       str(tmp_path / "file"), "--budget", "0.5", "--quiet"])
    with open(tmp_path / "file" / "answers.csv", newline="") as f:
        answered = list(csv.DictReader(f))
    assert [len(row["puzzle"].split("|")) for row in answered] == [9, 13, 6]
    for row, text in zip(answered, chosen):
        assert row["puzzle"] == format_maze(*parse_maze(text, "m")).replace("\n", "|")
        assert len(row["answer"].split("|")) == len(row["puzzle"].split("|"))
        assert row["verdict"] == "consistent" or row["verdict"].startswith("NOT consistent")
    assert code in (0, 1)


def test_evaluate_takes_a_grid_model_to_a_dataset_of_another_side(grid_run, tmp_path, capsys):
    data = build_maze_dataset(tmp_path / "twelve", generate=True, size=12, layout="lattice", train_size=2,
                              test_size=4, seed=3)
    assert evaluate.main(["--checkpoint", str(grid_run), "--data-path", str(data), "--device", "cpu", "--segments",
                          "3", "--budget", "0"]) == 0
    assert "exact_accuracy" in capsys.readouterr().out


def test_the_benchmark_draws_each_wrong_answer_and_keeps_a_file_of_the_same_name(grid_run, tmp_path):
    """scripts/benchmark_maze_sizes.py --wrong: one PNG for each maze whose model-only answer the rules reject, as
    many as its JSON's early-exit figure leaves wrong; a file already there under a picture's name is kept."""
    import json

    from PIL import Image

    from scripts.benchmark_maze_sizes import main as benchmark

    folder = tmp_path / "wrong"
    folder.mkdir()
    (folder / "random_8_0.png").write_bytes(b"the user's own file")
    assert benchmark(["--checkpoint", str(grid_run), "--sizes", "8", "--sets", "random", "--count", "4",
                      "--segments-x", "1", "--budget", "0", "--device", "cpu", "--forward-dtype", "float32",
                      "--wrong", str(folder), "--json", str(tmp_path / "rows.json")]) == 0
    row = json.loads((tmp_path / "rows.json").read_text())[1]
    drawn = sorted(p.name for p in folder.iterdir() if p.name != "random_8_0.png")
    assert len(drawn) == round(4 * (1 - row["early_exit"])) > 0
    assert (folder / "random_8_0.png").read_bytes() == b"the user's own file"
    for name in drawn:
        assert re.fullmatch(r"random_8_[0-3](-2)?\.png", name)
        with Image.open(folder / name) as image:
            assert image.format == "PNG" and image.width > 8 * 6


def test_the_outside_summary_pools_mazes_by_kind_and_band_of_sides():
    from scripts.benchmark_maze_sizes import outside_summary
    from utils.eval.stats import wilson_interval

    def row(name, side, count, scaled, early, anytime):
        return {"set": name, "side": side, "outside": True, "count": count, "scaled_segments": 16,
                "segments_16": scaled, "early_exit": early, "anytime": anytime}

    result = [{"checkpoint": "m.pt"}, {"set": "random", "side": 30, "outside": False, "count": 8},
              row("mazelib_perfect", 9, 2, 1.0, 1.0, 1.0), row("labmaze_perfect", 16, 2, 0.5, 0.5, 1.0),
              row("mazelib_cycles", 17, 1, 0.0, 1.0, 1.0), row("maze_dataset_cycles", 31, 4, 0.25, 0.5, 0.75),
              {"set": "mazelib_perfect", "side": 33, "outside": True, "count": 0}]  # past the model: not pooled
    lines = outside_summary(result, 6).splitlines()
    body = [line.split(" | ") for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert [(cells[0], cells[1], cells[2]) for cells in body] == [
        ("| cycles", "17-24", "1"), ("| cycles", "25-31", "4"), ("| perfect", "9-16", "4"), ("| all", "9-31", "9")]
    low, high = wilson_interval(3, 4)  # perfect 9-16: 2 + 1 right of 4 at the scaled segments
    assert body[2][3] == f"0.750 ({low:.2f}-{high:.2f})"
    assert body[3][5].rstrip(" |").startswith(f"{(2 + 2 + 1 + 3) / 9:.3f} (")  # every maze, anytime
    assert "checked, anytime <=6 s" in lines[2]
    assert outside_summary(result[:2], 6) == ""
