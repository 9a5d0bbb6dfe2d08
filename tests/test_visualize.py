"""Puzzle pictures: sizes, the colours of marked cells read back from the pixels, the gallery page and its CLI.

Expected colours are written out here (the ARC palette from fchollet/ARC apps/css/common.css), and cell
positions are computed from the documented layout, so a picture that draws the wrong thing fails.
"""

import json
import re
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from utils.data import maze
from utils.data.arc import grid_to_tokens
from utils.data.puzzle_dataset import IGNORE_LABEL_ID, PuzzleDatasetMetadata
from utils.data.sudoku.build import build_dataset as build_sudoku
from utils.viz import puzzles as viz

REPO = Path(__file__).resolve().parents[1]
ARC_HEX = ["#000000", "#0074D9", "#FF4136", "#2ECC40", "#FFDC00", "#AAAAAA", "#F012BE", "#FF851B", "#7FDBFF", "#870C25"]
M = viz.MARGIN


def rgb(hex_colour):
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def pixel(image, x, y):
    return image.getpixel((int(x), int(y)))


def cell_centres(image, rows, cols, cell, left, top):
    """[rows, cols] RGB tuples read at the centre of each cell of a grid drawn at (left, top)."""
    return [[pixel(image, left + c * cell + cell // 2, top + r * cell + cell // 2) for c in range(cols)]
            for r in range(rows)]


def metadata(vocab_size, seq_len):
    return PuzzleDatasetMetadata(pad_id=0, ignore_label_id=0, blank_identifier_id=0, vocab_size=vocab_size,
                                 seq_len=seq_len, num_puzzle_identifiers=1, total_groups=1, mean_puzzle_examples=1.0,
                                 sets=["all"])


def write_split(root, split, vocab_size, inputs, labels, names=("<blank>",)):
    """A one-example-per-puzzle split in the HRM layout (what every builder writes)."""
    d = Path(root) / split
    d.mkdir(parents=True)
    n, seq_len = inputs.shape
    meta = {"pad_id": 0, "ignore_label_id": 0, "blank_identifier_id": 0, "vocab_size": vocab_size,
            "seq_len": seq_len, "num_puzzle_identifiers": len(names), "total_groups": n, "mean_puzzle_examples": 1.0,
            "sets": ["all"]}
    (d / "dataset.json").write_text(json.dumps(meta))
    arrays = {"inputs": inputs.astype(np.uint8), "labels": labels.astype(np.uint8),
              "puzzle_identifiers": np.arange(n, dtype=np.int32) % len(names),
              "puzzle_indices": np.arange(n + 1, dtype=np.int32), "group_indices": np.arange(n + 1, dtype=np.int32)}
    for name, array in arrays.items():
        np.save(d / f"all__{name}.npy", array)
    (Path(root) / "identifiers.json").write_text(json.dumps(list(names)))


@pytest.fixture(scope="module")
def sudoku_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("viz") / "sudoku"
    build_sudoku(root, generate=True, train_size=2, test_size=3, min_blanks=30, seed=0)
    return root


@pytest.fixture(scope="module")
def maze_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("viz") / "maze"
    maze.build_maze_dataset(root, generate=True, size=10, train_size=3, test_size=5, min_path_length=20, aug=True)
    return root


def load(root, split, name):
    return np.load(Path(root) / split / f"all__{name}.npy")


def test_detect_task_from_metadata():
    assert viz.detect_task(metadata(11, 81)) == "sudoku"
    assert viz.detect_task(metadata(6, 900)) == "maze" and viz.detect_task(metadata(6, 144)) == "maze"
    assert viz.detect_task(metadata(12, 900)) == "arc"
    for vocab, seq_len in ((6, 50), (11, 900), (12, 81), (7, 49)):
        with pytest.raises(viz.VisualizationError, match=rf"cannot draw a dataset with vocab_size {vocab} and seq_len "
                                                         rf"{seq_len}: only Sudoku \(11/81\), maze"):
            viz.detect_task(metadata(vocab, seq_len))


def test_sudoku_marks_wrong_cells_and_tells_given_from_filled(sudoku_data):
    inputs, labels = load(sudoku_data, "test", "inputs")[0], load(sudoku_data, "test", "labels")[0]
    blanks = np.flatnonzero(inputs == 1)
    wrong_cell, right_cell = int(blanks[0]), int(blanks[-1])
    given_cell = int(np.flatnonzero(inputs > 1)[0])
    preds = labels.astype(np.int64)
    preds[wrong_cell] = 2 + (labels[wrong_cell] - 1) % 9  # another digit
    image = viz.render_sudoku(inputs, labels, torch.from_numpy(preds))
    cell = viz.SUDOKU_CELL
    assert image.width == 9 * cell + 1 + 2 * M and image.height > 9 * cell + 1 + 2 * M  # grid plus the legend

    def background(i):  # bottom-left corner of the cell, clear of the digits and the box lines
        r, c = divmod(i, 9)
        return pixel(image, M + c * cell + 5, M + r * cell + cell - 5)

    def colours_in(i, region):
        r, c = divmod(i, 9)
        x0, y0 = M + c * cell, M + r * cell
        box = (x0 + 2, y0 + 2, x0 + cell // 2, y0 + cell // 3) if region == "corner" else (x0 + 8, y0 + 8, x0 + cell - 8,
                                                                                            y0 + cell - 6)
        return np.asarray(image.crop(box)).reshape(-1, 3).astype(int)

    def has(pixels, colour):  # text is anti-aliased: a stroke pixel within 40 of the colour on each channel
        return bool((np.abs(pixels - colour).max(axis=1) <= 40).any())

    assert background(wrong_cell) == viz.WRONG_BG
    assert background(right_cell) == viz.WHITE and background(given_cell) == viz.GIVEN_BG
    assert has(colours_in(wrong_cell, "digit"), viz.WRONG_FG) and has(colours_in(wrong_cell, "corner"), viz.TRUE_FG)
    assert has(colours_in(right_cell, "digit"), viz.FILLED_FG) and not has(colours_in(right_cell, "corner"), viz.TRUE_FG)
    assert has(colours_in(given_cell, "digit"), viz.GIVEN_FG) and not has(colours_in(given_cell, "digit"), viz.FILLED_FG)
    # Without a prediction nothing is wrong: the solution is drawn.
    plain = viz.render_sudoku(inputs, labels)
    assert not (np.asarray(plain) == viz.WRONG_BG).all(axis=-1).any()


def test_sudoku_keeps_givens_as_givens_when_the_model_changes_them(sudoku_data):
    inputs, labels = load(sudoku_data, "test", "inputs")[0], load(sudoku_data, "test", "labels")[0]
    givens, blanks = np.flatnonzero(inputs > 1), np.flatnonzero(inputs == 1)
    changed, untouched, no_digit = int(givens[0]), int(givens[1]), int(blanks[0])
    preds = labels.astype(np.int64)
    preds[changed] = 2 + (labels[changed] - 1) % 9  # another digit over a clue
    preds[no_digit] = 0                              # the pad token: no digit
    image = viz.render_sudoku(inputs, labels, preds)
    plain = viz.render_sudoku(inputs, labels, labels)  # the same grid, all right
    cell = viz.SUDOKU_CELL

    def crop(picture, i, box):  # box relative to the cell's top-left grid line
        r, c = divmod(i, 9)
        x0, y0 = M + c * cell, M + r * cell
        return np.asarray(picture.crop((x0 + box[0], y0 + box[1], x0 + box[2], y0 + box[3]))).reshape(-1, 3)

    middle, top_right = (8, 8, cell - 8, cell - 6), (cell - cell // 4, 2, cell - 2, cell // 4)
    # The clue keeps its grey cell and its own black digit: the middle of the cell is drawn as in the right grid.
    assert np.array_equal(crop(image, changed, middle), crop(plain, changed, middle))
    assert (crop(image, changed, (2, cell - 6, 6, cell - 2)) == viz.GIVEN_BG).all()
    # ... and an orange triangle in its top-right corner, which an untouched clue does not have.
    assert (crop(image, changed, top_right) == viz.CHANGED_GIVEN).all(axis=1).any()
    assert not (crop(image, untouched, top_right) == viz.CHANGED_GIVEN).all(axis=1).any()
    # The blank predicted as pad is a wrong filled cell showing a dot (red), not a digit.
    assert (crop(image, no_digit, (2, cell - 6, 6, cell - 2)) == viz.WRONG_BG).all()
    assert not (np.asarray(plain) == viz.CHANGED_GIVEN).all(axis=-1).any()
    # The legend has the triangle too (below the grid).
    legend = np.asarray(image)[M + 9 * cell + 1:].reshape(-1, 3)
    assert (legend == viz.CHANGED_GIVEN).all(axis=1).any()


def test_maze_draws_the_path_and_its_errors():
    question, answer = maze.generate_maze(np.random.default_rng(1), 10, 20)
    cell = viz.maze_cell_size(10)
    expected = np.array([[viz.MAZE_COLOURS[t] for t in row] for row in answer])
    image = viz.render_maze(question.ravel(), answer.ravel())
    assert image.width == 10 * cell + 1 + 2 * M
    assert np.array_equal(cell_centres(image, 10, 10, cell, M, M), expected)
    assert (answer == maze.PATH).sum() >= 19  # the path is there to be drawn
    assert viz.maze_cell_size(30) == 16 and viz.render_maze(np.full(900, 2), np.full(900, 2)).width == 481 + 2 * M


def maze_mistakes():
    """A 10x10 maze and a prediction with every kind of mistake, S and G among them."""
    question, answer = maze.generate_maze(np.random.default_rng(1), 10, 20)
    flat = answer.ravel()
    path, opened = np.flatnonzero(flat == maze.PATH), np.flatnonzero(flat == maze.OPEN)
    start, goal = int(np.flatnonzero(flat == maze.START)[0]), int(np.flatnonzero(flat == maze.GOAL)[0])
    preds = flat.astype(np.int64)
    preds[path[:3]] = maze.OPEN       # missed
    preds[opened[:2]] = maze.PATH     # predicted off the path
    preds[opened[2]] = maze.WALL      # another wrong token
    preds[start], preds[goal] = maze.PATH, maze.OPEN  # the model paints over S and G
    cells = {"missed": path[:3], "extra": opened[:2], "other": opened[2:3], "right path": path[3:],
             "start": [start], "goal": [goal]}
    return question.ravel(), flat, preds, cells


def test_maze_keeps_s_and_g_and_the_true_path_under_a_wrong_prediction():
    question, answer, preds, cells = maze_mistakes()
    cell = viz.maze_cell_size(10)
    image = viz.render_maze(question, answer, preds, title=viz.example_title("maze", "puzzle 1", 7, answer, preds))
    top = M + viz.TITLE_HEIGHT

    def at(i, dx, dy):  # a pixel dx, dy from the top-left grid line of cell i
        r, c = divmod(int(i), 10)
        return pixel(image, M + c * cell + dx, top + r * cell + dy)

    middle, edge = cell // 2, 2  # the middle of a cell; a pixel on its ring (inside the grid line)
    assert at(cells["start"][0], middle, middle) == viz.MAZE_COLOURS[maze.START]
    assert at(cells["goal"][0], middle, middle) == viz.MAZE_COLOURS[maze.GOAL]
    assert at(cells["start"][0], edge, edge) == viz.MAZE_EXTRA      # S predicted as path: ringed
    assert at(cells["goal"][0], edge, edge) == viz.MAZE_OTHER       # G predicted open: ringed
    for i in cells["missed"]:  # the true path shows through the ring of a missed cell
        assert at(i, middle, middle) == viz.MAZE_COLOURS[maze.PATH] and at(i, edge, edge) == viz.MAZE_MISSED
    for i in cells["extra"]:   # predicted path on an open cell: the square in the middle, an orange ring
        assert at(i, middle, middle) == viz.MAZE_PREDICTED and at(i, edge, edge) == viz.MAZE_EXTRA
        assert at(i, cell // 4 - 2, middle) == viz.WHITE
    for i in cells["other"]:
        assert at(i, middle, middle) == viz.MAZE_COLOURS[maze.OPEN] and at(i, edge, edge) == viz.MAZE_OTHER
    for i in cells["right path"]:  # right: the square on the light-blue fill, no ring
        assert at(i, middle, middle) == viz.MAZE_PREDICTED and at(i, edge, edge) == viz.MAZE_COLOURS[maze.PATH]
    # The legend below the grid shows every colour and mark.
    legend = np.asarray(image)[top + 10 * cell + 1:].reshape(-1, 3)
    for colour in (*viz.MAZE_COLOURS.values(), viz.MAZE_PREDICTED, viz.MAZE_EXTRA, viz.MAZE_MISSED, viz.MAZE_OTHER):
        assert (legend == colour).all(axis=1).any(), colour


def test_titles_say_what_and_whether_right(sudoku_data):
    inputs, labels = load(sudoku_data, "test", "inputs")[0], load(sudoku_data, "test", "labels")[0]
    preds = torch.from_numpy(labels.astype(np.int64))
    assert viz.example_title("sudoku", "puzzle 17", 1200, labels, preds) == "sudoku · puzzle 17 · step 1200 · right"
    preds[:3] = 1
    assert viz.example_title("sudoku", "puzzle 17", 1200, labels, preds) == \
        "sudoku · puzzle 17 · step 1200 · wrong: 3 of 81 cells"
    assert viz.example_title("sudoku", "puzzle 17", None, labels, None) == "sudoku · puzzle 17"  # no step, no model
    ignored = np.where(np.arange(81) < 2, IGNORE_LABEL_ID, labels.astype(np.int64))  # ignored cells are not counted
    assert viz.verdict(ignored, preds) == "wrong: 1 of 79 cells"
    grid = grid_to_tokens(np.eye(3, dtype=int))
    examples = {"sudoku": (inputs, labels), "maze": maze.generate_maze(np.random.default_rng(0), 8, 10), "arc": (grid, grid)}
    for task, (inp, lab) in examples.items():
        inp, lab = np.ravel(inp), np.ravel(lab)
        title = viz.example_title(task, "puzzle 3", 10, lab, lab)
        untitled, titled = viz.render_example(task, inp, lab, lab), viz.render_example(task, inp, lab, lab, title)
        assert titled.height == untitled.height + viz.TITLE_HEIGHT, task
        title_strip = np.asarray(titled)[M:M + viz.TITLE_HEIGHT].reshape(-1, 3)
        assert (np.abs(title_strip.astype(int) - viz.TEXT).max(axis=1) <= 40).any(), task  # text in the strip
    long_title = viz.example_title("maze", "a rather long puzzle name " * 3, 123456, lab, lab)
    assert viz.render_example("maze", inp, lab, lab, long_title).width > viz.render_example("maze", inp, lab, lab).width


def test_eval_pictures_are_titled_with_the_step():
    question, answer = maze.generate_maze(np.random.default_rng(0), 6, 6)
    inputs = torch.from_numpy(np.stack([question.ravel(), question.ravel()]).astype(np.int64))
    labels = np.stack([np.full(36, IGNORE_LABEL_ID), answer.ravel()])  # row 0: padding
    labels = torch.from_numpy(labels.astype(np.int64))
    pictures = viz.EvalPictures("maze", count=1)
    pictures.update_batch({"inputs": inputs, "labels": labels}, {"preds": labels.clamp(min=0)})
    with_step, without = pictures.images(step=40)["eval/example_0"], pictures.images()["eval/example_0"]
    assert with_step.size == without.size and not np.array_equal(np.asarray(with_step), np.asarray(without))
    assert pictures.rows[0][0] == 1  # titled "maze · test row 1 · step 40 · right"


def test_segments_make_one_frame_each_a_gif_and_a_strip(tmp_path):
    question, flat, preds, _ = maze_mistakes()
    title = viz.example_title("maze", "puzzle 1", 7, flat, None)
    lengths = {}
    for steps in (1, 3, 6):
        answers = np.stack([preds if t < steps - 1 else flat for t in range(steps)])  # right at the last segment
        q_halt = torch.linspace(-3, 3, steps)
        frames = viz.render_segments("maze", question, flat, torch.from_numpy(answers), q_halt, title)
        assert len(frames) == steps and len({f.size for f in frames}) == 1
        gif, strip = viz.save_segments(frames, tmp_path / f"row_{steps}")
        assert (gif.name, strip.name) == (f"row_{steps}.gif", f"row_{steps}_strip.png")
        with Image.open(gif) as animation:
            assert animation.n_frames == steps and animation.info.get("loop") == 0
            durations = []
            for t in range(steps):
                animation.seek(t)
                durations.append(animation.info["duration"])
        assert durations[-1] == viz.LAST_FRAME_MS and set(durations[:-1]) <= {viz.FRAME_MS}
        with Image.open(strip) as picture:
            lengths[steps] = picture.width
            assert picture.height == frames[0].height
    assert lengths[1] < lengths[3] < lengths[6] == 6 * frames[0].width + 5 * viz.STRIP_GAP
    wide = viz.render_segments("maze", question, flat, np.stack([flat] * 20), np.zeros(20, np.float32))
    _, strip = viz.save_segments(wide, tmp_path / "wide")
    with Image.open(strip) as picture:
        assert picture.width == viz.STRIP_MAX_WIDTH and picture.height < wide[0].height  # scaled down
    with pytest.raises(viz.VisualizationError, match=r"segment predictions must be \[T >= 1, 100\] integer tokens"):
        viz.render_segments("maze", question, flat, np.zeros((0, 100), np.int64), np.zeros(0, np.float32))
    with pytest.raises(viz.VisualizationError, match=r"segment q_halt must be \[2\] floats"):
        viz.render_segments("maze", question, flat, np.stack([flat, flat]), np.zeros(3, np.float32))


def test_segment_titles():
    question, flat, preds, _ = maze_mistakes()
    frames = viz.render_segments("maze", question, flat, np.stack([preds, flat]), np.array([0.0, 2.5]),
                                 "maze · puzzle 1")
    # the titles differ (segment number, confidence, verdict): the title strips differ
    strips = [np.asarray(f)[:M + viz.TITLE_HEIGHT] for f in frames]
    assert not np.array_equal(*strips)
    assert viz.verdict(flat, preds) == "wrong: 8 of 100 cells" and viz.verdict(flat, flat) == "right"


def test_arc_panels_use_the_arc_palette():
    rng = np.random.default_rng(0)
    grid_in, grid_out = rng.integers(0, 10, (4, 6)), rng.integers(0, 10, (3, 3))
    grid_in[0, :] = np.arange(6)
    grid_in[1, :4] = np.arange(6, 10)  # every colour appears
    pred = grid_out.copy()
    pred[1, 1] = (pred[1, 1] + 1) % 10
    labels = grid_to_tokens(grid_out).astype(np.int64)
    labels[labels == 0] = IGNORE_LABEL_ID  # as in saved outputs
    image = viz.render_arc(grid_to_tokens(grid_in), labels, grid_to_tokens(pred))
    cell = viz.arc_cell_size([grid_in, grid_out, pred])
    top = M + viz.TITLE_HEIGHT
    palette = [rgb(h) for h in ARC_HEX]
    assert [list(map(tuple, row)) for row in cell_centres(image, 4, 6, cell, M, top)] == \
        [[palette[v] for v in row] for row in grid_in]
    # The target panel is the next slot to the right; its cells are the target's colours.
    target_left = M + max(6 * cell + 1, _caption_width("input 4x6")) + viz.ARC_GAP
    assert [list(map(tuple, row)) for row in cell_centres(image, 3, 3, cell, target_left, top)] == \
        [[palette[v] for v in row] for row in grid_out]
    # The wrong prediction cell is outlined in white, a right one is not.
    pred_left = target_left + max(3 * cell + 1, _caption_width("target 3x3")) + viz.ARC_GAP
    assert pixel(image, pred_left + cell + 3, top + cell + cell // 2) == viz.WHITE
    assert pixel(image, pred_left + 3, top + cell // 2) == palette[pred[0, 0]]


def _caption_width(text):
    return int(viz._font(13).getlength(text)) + 4


def test_arc_translated_grids_and_missing_predictions():
    grid = np.array([[1, 2], [3, 4]])
    shifted = np.zeros((30, 30), np.int64)
    shifted[5:7, 9:11] = grid + 2
    shifted[7, 9:11] = shifted[5:7, 11] = 1  # end markers below and right
    assert np.array_equal(viz._arc_grid(shifted.ravel()), grid)  # not at the top left: the box of colour cells
    assert np.array_equal(viz._arc_grid(grid_to_tokens(grid)), grid)
    image = viz.render_arc(shifted.ravel(), grid_to_tokens(grid), np.zeros(900, np.int64))  # no grid predicted
    assert image.width > 2 * (2 * viz.arc_cell_size([grid]) + 1)


def test_bad_token_sequences():
    with pytest.raises(viz.VisualizationError,
                       match=r"Sudoku inputs must be 81 integer tokens, got int64 of shape \[80\]"):
        viz.render_sudoku(np.ones(80, np.int64), np.ones(81, np.int64))
    with pytest.raises(viz.VisualizationError, match="maze inputs must be size² tokens"):
        viz.render_maze(np.ones(50, np.int64), np.ones(50, np.int64))
    with pytest.raises(viz.VisualizationError, match="ARC labels must be 900 integer tokens, got float32"):
        viz.render_arc(np.zeros(900, np.int64), np.zeros(900, np.float32))
    with pytest.raises(viz.VisualizationError, match="unknown task 'chess'"):
        viz.render_example("chess", [], [])


def listed_pngs(index):
    return set(re.findall(r'<img src="([^"]+)"', index.read_text()))


def test_gallery_of_a_dataset_lists_every_picture(maze_data, tmp_path):
    index = viz.write_gallery(maze_data, tmp_path / "pics", split="train", num=2)
    pngs = {p.name for p in (tmp_path / "pics").glob("*.png")}
    assert listed_pngs(index) == pngs == {"train_all_0000000.png", "train_all_0000008.png"}  # groups of 8 augmentations
    assert "train example 8: puzzle 8, group 1" in index.read_text()  # the blank name is not shown
    index = viz.write_gallery(maze_data, tmp_path / "all", num=100)  # more than there are: all 5 test mazes
    assert len(listed_pngs(index)) == 5 == len(list((tmp_path / "all").glob("*.png")))


def save_outputs(path, inputs, labels, preds, ids=None):
    """The reference's saved-outputs file: a torch.save dict of CPU tensors."""
    n = len(inputs)
    torch.save({"inputs": torch.as_tensor(inputs, dtype=torch.int32),
                "labels": torch.as_tensor(labels, dtype=torch.int32),
                "puzzle_identifiers": torch.as_tensor(np.zeros(n) if ids is None else ids, dtype=torch.int32),
                "preds": torch.as_tensor(preds, dtype=torch.int64), "q_halt_logits": torch.zeros(n)}, path)


def test_gallery_of_outputs_marks_right_and_wrong(sudoku_data, tmp_path):
    inputs, labels = load(sudoku_data, "test", "inputs"), load(sudoku_data, "test", "labels")
    preds = labels.astype(np.int64)
    blank = np.flatnonzero(inputs[1] == 1)[:2]
    preds[1, blank] = 2 + (labels[1, blank] - 1) % 9
    pad = np.zeros((1, 81))  # the last batch's padding row: pad inputs, ignored labels
    save_outputs(tmp_path / "step_5_all_preds.0", inputs[:2], labels[:2], preds[:2])
    save_outputs(tmp_path / "step_5_all_preds.1", np.concatenate([inputs[2:], pad]),
                 np.concatenate([labels[2:], pad + IGNORE_LABEL_ID]), np.concatenate([preds[2:], pad]))
    index = viz.write_gallery(sudoku_data, tmp_path / "pics",
                              outputs=[tmp_path / "step_5_all_preds.1", tmp_path / "step_5_all_preds.0"])
    page = index.read_text()
    assert listed_pngs(index) == {p.name for p in (tmp_path / "pics").glob("*.png")} == \
        {"output_0000000.png", "output_0000001.png", "output_0000002.png"}  # rank order; padding row 3 skipped
    assert "sudoku · puzzle 0 · step 5 · right" in page
    assert "sudoku · puzzle 1 · step 5 · wrong: 2 of 81 cells" in page
    assert "blank" not in page
    assert "exact accuracy 66.7% over 3 rows (2 correct)" in page


def test_gallery_of_arc_outputs(tmp_path):
    rng = np.random.default_rng(2)
    grids = [(rng.integers(0, 10, (3, 4)), rng.integers(0, 10, (2, 2))) for _ in range(2)]
    inputs = np.stack([grid_to_tokens(i) for i, _ in grids])
    labels = np.stack([grid_to_tokens(o) for _, o in grids])
    write_split(tmp_path / "arc", "test", 12, inputs, labels, names=("<blank>", "task_a"))
    labels_ignored = np.where(labels == 0, IGNORE_LABEL_ID, labels.astype(np.int64))
    save_outputs(tmp_path / "out.pt", inputs, labels_ignored, np.stack([labels[0], np.zeros(900)]), ids=[1, 1])
    index = viz.write_gallery(tmp_path / "arc", tmp_path / "pics", outputs=[tmp_path / "out.pt"])
    page = index.read_text()
    assert "arc:" in page and "arc · row 0 (task_a) · right" in page and "arc · row 1 (task_a) · wrong: " in page
    assert len(listed_pngs(index)) == 2


def run_cli(monkeypatch, capsys, *argv):
    monkeypatch.setattr(sys, "argv", ["visualize.py", *map(str, argv)])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(REPO / "scripts" / "visualize.py"), run_name="__main__")
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


def test_cli_draws_the_segments_of_saved_outputs(maze_data, tmp_path, monkeypatch, capsys):
    inputs, labels = load(maze_data, "test", "inputs")[:2], load(maze_data, "test", "labels")[:2]
    path = tmp_path / "step_40_all_preds.0"
    save_outputs(path, inputs, labels, labels)
    outputs = torch.load(path, weights_only=True)
    steps = 4
    wrong = np.where(labels == maze.PATH, maze.OPEN, labels)  # the path not found yet
    segment_preds = np.stack([np.stack([wrong[i]] * (steps - 1) + [labels[i]]) for i in range(2)])
    outputs["segment_preds"] = torch.as_tensor(segment_preds, dtype=torch.int64)      # [N, T, S]
    outputs["segment_q_halt"] = torch.linspace(-2, 2, steps).repeat(2, 1)             # [N, T]
    torch.save(outputs, path)
    code, out, _ = run_cli(monkeypatch, capsys, "--data-path", maze_data, "--outputs", path, "--out", tmp_path / "pics")
    assert code == 0, out
    pics = tmp_path / "pics"
    for row in (0, 1):
        with Image.open(pics / f"output_{row:07d}_segments.gif") as gif:
            assert gif.n_frames == steps
        assert (pics / f"output_{row:07d}_segments_strip.png").is_file()
    page = (pics / "index.html").read_text()
    assert 'src="output_0000001_segments.gif"' in page and 'href="output_0000001_segments_strip.png"' in page
    assert "maze · puzzle 1 · step 40 · right" in page

    del outputs["segment_q_halt"]
    torch.save(outputs, path)
    code, _, err = run_cli(monkeypatch, capsys, "--data-path", maze_data, "--outputs", path, "--out", tmp_path / "x")
    assert code == 2 and "error: the outputs hold 'segment_preds' but not 'segment_q_halt'" in err
    outputs["segment_q_halt"] = torch.zeros(2, steps + 1)
    torch.save(outputs, path)
    code, _, err = run_cli(monkeypatch, capsys, "--data-path", maze_data, "--outputs", path, "--out", tmp_path / "x")
    assert code == 2 and "error: outputs 'segment_preds' must be integer [N, T, 100] and 'segment_q_halt' float" in err


def test_cli_end_to_end_and_bad_input(maze_data, tmp_path, monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "--data-path", maze_data, "--out", tmp_path / "pics", "--num", "3")
    assert code == 0 and out.strip() == f"wrote {tmp_path / 'pics' / 'index.html'}"
    assert len(listed_pngs(tmp_path / "pics" / "index.html")) == 3

    write_split(tmp_path / "odd", "test", 7, np.ones((2, 49), np.uint8), np.full((2, 49), 6, np.uint8))  # vocab 7
    save_outputs(tmp_path / "short.pt", np.ones((1, 16)), np.ones((1, 16)), np.ones((1, 16)))
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    for argv, message in [
        (["--data-path", tmp_path / "none", "--out", tmp_path / "x"],
         f"error: data_path '{tmp_path / 'none'}' not found"),
        (["--data-path", tmp_path / "odd", "--out", tmp_path / "x"], "error: cannot draw a dataset with vocab_size 7"),
        (["--data-path", maze_data, "--out", tmp_path / "x", "--outputs", tmp_path / "short.pt"],
         "error: outputs 'inputs' is [1, 16] but the dataset has seq_len 100"),
        (["--data-path", maze_data, "--out", tmp_path / "x", "--outputs", tmp_path / "junk.pt"],
         f"error: {tmp_path / 'junk.pt'} is not a readable torch.save file"),
        (["--data-path", maze_data, "--out", tmp_path / "x", "--num", "0"], "error: --num must be >= 1, got 0"),
        (["--data-path", maze_data, "--out", tmp_path / "x", "--split", "val"],
         "error: argument --split: invalid choice"),
    ]:
        code, _, err = run_cli(monkeypatch, capsys, *argv)
        assert code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()
