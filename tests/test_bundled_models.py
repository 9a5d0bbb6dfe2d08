"""The models this repository ships in models/pretrained/: each loads through the same path as any checkpoint, its
card states what was measured on that file (SHA-256, size, parameters, held-out accuracy with its interval), and each
answers a held-out puzzle through solve.py without --checkpoint, as the README's first command does (the Sudoku
consistently, the maze with its one shortest path). How the code treats bundled models in general:
tests/test_bundling.py."""

import hashlib
import re
import shutil

import pytest
import torch

import evaluate
import solve
from tests.test_bad_inputs import assert_one_line
from utils.data.user_puzzles import parse_sudoku, sudoku_problems
from utils.eval import load
from utils.solve import solving
from utils.eval.load import load_trained, read_card
from utils.checkpoint import CheckpointError
from utils.solve.solving import BUNDLED, BUNDLED_DIR

# Puzzle 1 of the hard recipe's test split (minimal, 25 givens, rating 5: singles alone do not solve it), never
# trained on; the page's hard example.
HARD = "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5...."
# Maze 0 of the maze quickstart's test split (data/maze-gen-10x10-24k-aug, seed 0), never trained on by either maze
# model, the page's example, and its only shortest path as the split's label marks it.
MAZE = ["  #    ## ", "#     ##  ", "## ##     ", "     ## # ", " ### #  ##",
        " # #  #   ", "    #####G", " ##### ###", "   # ### S", " #       #"]
MAZE_PATH = ["  #    ## ", "# oooo##  ", "##o##ooo  ", "ooo  ##o# ", "o### # o##",
             "o# #  #ooo", "o   #####G", "o##### ###", "ooo# ###oS", " #ooooooo#"]


@pytest.mark.parametrize("task", sorted(BUNDLED))
def test_each_bundled_model_loads_and_its_card_describes_the_file(task):
    path = BUNDLED_DIR / BUNDLED[task].file
    card = path.with_suffix(".md").read_text()
    trained = load_trained(str(path), torch.device("cpu"), torch.float32, 1)  # the same path as any checkpoint
    assert hashlib.sha256(path.read_bytes()).hexdigest() in card and f"{path.stat().st_size:,} bytes" in card
    assert f"{sum(p.numel() for p in trained.head.model.parameters()):,} parameters" in card
    assert len(re.findall(r"\*\*\d+\.\d%\*\* exact \(95% CI \d+\.\d-\d+\.\d%, n=\d+\)", card)) == 2


@pytest.mark.parametrize("task", sorted(BUNDLED))
def test_campaign4_p12_each_shipped_model_is_checked_against_its_card_when_loaded(task, tmp_path):
    path = BUNDLED_DIR / BUNDLED[task].file
    card = read_card(path)  # the card the load path finds and reads
    assert (card.size, card.sha256) == (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    copy = tmp_path / path.name
    shutil.copyfile(card.path, copy.with_suffix(".md"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the weights
    copy.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"the card says {card.size:,} bytes with SHA-256 {card.sha256}"):
        load_trained(str(copy), torch.device("cpu"), torch.float32, 1)


def test_the_bundled_models_add_a_few_mb_at_most():
    # float32 weights, as the cards' accuracies were measured on them
    assert sum((BUNDLED_DIR / bundled.file).stat().st_size for bundled in BUNDLED.values()) < 5_000_000


def test_the_bundled_sudoku_model_solves_a_hard_held_out_puzzle(tmp_path, capsys):
    assert solve.main(["--device", "cpu", "--sudoku", HARD, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"model: the bundled model for hard 9x9 Sudoku, {BUNDLED_DIR / 'sudoku_hard_trm.pt'}" in printed
    answer = "".join(c for c in printed.split("puzzle 1: consistent", 1)[1] if c.isdigit())[:81]
    assert not sudoku_problems(parse_sudoku(answer, "answer"), parse_sudoku(HARD, "puzzle"))


def test_the_bundled_maze_model_finds_a_held_out_mazes_shortest_path(tmp_path, capsys):
    maze = tmp_path / "maze.txt"
    maze.write_text("\n".join(MAZE) + "\n")
    assert solve.main(["--device", "cpu", "--maze", str(maze), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert f"model: the bundled model for {BUNDLED['maze'].what}, {BUNDLED_DIR / BUNDLED['maze'].file}" in printed
    assert "\n".join(MAZE_PATH) in printed.split("consistent", 1)[1]


# ---- fault campaign 5: the card check cannot be switched off --------------------------------------------------------

@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """The shipped Sudoku model and its card, copied into a folder that the load check and solve.py take for
    models/pretrained/ (the real files are never touched)."""
    folder = tmp_path / "pretrained"
    folder.mkdir()
    model = folder / BUNDLED["sudoku"].file
    for source in (BUNDLED_DIR / model.name, (BUNDLED_DIR / model.name).with_suffix(".md")):
        shutil.copyfile(source, folder / source.name)
    monkeypatch.setattr(load, "BUNDLED_DIR", folder, raising=False)
    monkeypatch.setattr(solving, "BUNDLED_DIR", folder)
    return model


def zero_the_weights(model):
    payload = torch.load(model, weights_only=True)
    payload["model"] = {k: torch.zeros_like(v) if v.is_floating_point() else v for k, v in payload["model"].items()}
    torch.save(payload, model)


def refused_everywhere(capsys, model, tmp_path, fragment):
    """Every way of loading ``model`` refuses it in one line naming ``fragment``, before answering anything."""
    out = ["--out", str(tmp_path / "o")]
    for main, argv in ((solve.main, ["--sudoku", HARD, *out]),  # the bundled default
                       (solve.main, ["--checkpoint", str(model), "--sudoku", HARD, *out]),
                       (evaluate.main, ["--checkpoint", str(model)])):
        assert_one_line(capsys, main(["--device", "cpu", *argv]), fragment)
    assert not (tmp_path / "o").exists()


def test_campaign5_p04_a_shipped_model_whose_card_is_gone_is_refused_not_answered_with(shipped_copy, tmp_path,
                                                                                        capsys):
    card = shipped_copy.with_suffix(".md")
    solve.main(["--device", "cpu", "--sudoku", HARD, "--rollouts", "1", "--segments", "1", "--out",
                str(tmp_path / "answers")])  # one segment: whether its answer is consistent is not the point here
    assert f"(its card: {card})" in capsys.readouterr().out  # the card the load checked
    card.unlink()
    zero_the_weights(shipped_copy)  # was answered with, exit 0, naming "its card: ...md" that did not exist
    refused_everywhere(capsys, shipped_copy, tmp_path, f"{shipped_copy} has no card: {card.name} beside it is missing")
    card.mkdir()  # a card that cannot be read as one
    refused_everywhere(capsys, shipped_copy, tmp_path, f"{shipped_copy} has no card")


EDITS = [  # a card edited out of shape, and how the load refuses it
    (lambda text: text.replace("bundled with `scripts/bundle_model.py`", "bundled by hand"), "has no card"),
    (lambda text: text.replace("bundled with `scripts/bundle_model.py`", "").replace("SHA-256 `", "SHA-256 `0"),
     "has no card"),
    (lambda text: text.replace("SHA-256 `", "SHA-256 `0"), "records no size and SHA-256"),
    (lambda text: text.replace("| file |", "| weights |"), "records no size and SHA-256"),
    (lambda text: text.replace(" bytes, float32", " B, float32"), "records no size and SHA-256"),
]


def test_campaign5_p04_a_shipped_models_card_edited_out_of_shape_is_refused(shipped_copy, tmp_path, capsys):
    card = shipped_copy.with_suffix(".md")
    shipped = card.read_text()
    zero_the_weights(shipped_copy)
    for edit, fragment in EDITS:
        card.write_text(edit(shipped))
        refused_everywhere(capsys, shipped_copy, tmp_path, fragment)
