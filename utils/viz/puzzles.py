"""Pictures of puzzles (Sudoku, mazes, ARC) from their token sequences, with a model's prediction when there is one.

Each ``render_*`` function takes one example's tokens (numpy or torch, ``[seq_len]`` integers, labels
may hold -100 where a position is ignored, as in the saved outputs) and returns a PIL RGB image; they
cost a few milliseconds, so the trainer can also send some to TensorBoard
(``add_image(tag, np.asarray(image), step, dataformats="HWC")``).

- Sudoku (vocab 11, seq_len 81; blank 1, digit d -> d + 1): given digits black on grey, filled-in
  digits blue on white; a wrong prediction is red on pink with the true digit small in the corner.
- Maze (vocab 6, seq_len size²; ``"# SGo"`` -> 1..5): walls dark, S green, G red, the path blue. With a
  prediction, blue is the predicted path where it is right, orange where it leaves the true path,
  yellow the true path it missed, magenta any other wrong cell.
- ARC (vocab 12, seq_len 900; pad 0, end marker 1, colour c -> c + 2): input, target and prediction
  side by side in the standard ARC palette (``fchollet/ARC`` apps/css/common.css); prediction cells
  that differ from the target are outlined in white. The prediction is cropped as the reference
  evaluator crops it (:func:`utils.data.arc.tokens_to_grid`).

:func:`write_gallery` renders a dataset split, or saved predictions, to PNG files and an ``index.html``.
The reference's own viewer (``sapientinc/HRM`` puzzle_visualizer.html) draws raw token grids only.
"""

from __future__ import annotations

import functools
import html
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from utils.data.arc import COLOUR_OFFSET, tokens_to_grid
from utils.data.maze import GOAL, OPEN, PATH, START, WALL
from utils.data.puzzle_dataset import IGNORE_LABEL_ID, DatasetError, PuzzleDatasetMetadata, load_arrays, load_metadata
from utils.errors import UserError
from utils.eval.outputs import OutputsError, load_outputs

# (vocab_size, seq_len) of each task; a maze's seq_len is any square.
SUDOKU_SHAPE, ARC_SHAPE, MAZE_VOCAB = (11, 81), (12, 900), 6

MARGIN = 10                        # pixels around the picture
TITLE_HEIGHT = 22                  # strip above the grid when there is a title
LEGEND_ROW, SWATCH = 20, 14        # legend line height, colour square side
WHITE, BLACK, TEXT = (255, 255, 255), (0, 0, 0), (30, 30, 30)

SUDOKU_CELL = 40
GIVEN_BG, GIVEN_FG = (222, 222, 222), BLACK
FILLED_FG = (0, 90, 200)
WRONG_BG, WRONG_FG, TRUE_FG = (255, 205, 205), (200, 0, 0), (0, 140, 0)

MAZE_COLOURS = {WALL: (50, 50, 50), OPEN: WHITE, START: (46, 204, 64), GOAL: (255, 65, 54), PATH: (0, 116, 217)}
MAZE_EXTRA, MAZE_MISSED, MAZE_OTHER = (255, 133, 27), (255, 220, 0), (240, 18, 190)

# fchollet/ARC apps/css/common.css .symbol_0 .. .symbol_9
ARC_PALETTE = np.array([(0x00, 0x00, 0x00), (0x00, 0x74, 0xD9), (0xFF, 0x41, 0x36), (0x2E, 0xCC, 0x40),
                        (0xFF, 0xDC, 0x00), (0xAA, 0xAA, 0xAA), (0xF0, 0x12, 0xBE), (0xFF, 0x85, 0x1B),
                        (0x7F, 0xDB, 0xFF), (0x87, 0x0C, 0x25)], np.uint8)
ARC_GRID_LINE = (85, 85, 85)
ARC_GAP = 16                       # pixels between the input, target and prediction panels


class VisualizationError(UserError):
    """A dataset or an outputs file that cannot be drawn (unknown task, tokens that do not fit it)."""


def detect_task(metadata: PuzzleDatasetMetadata) -> str:
    """"sudoku", "maze" or "arc" from a split's ``vocab_size`` and ``seq_len`` (11/81, 6/size², 12/900).

    Raises:
        VisualizationError: any other combination.
    """
    shape = (metadata.vocab_size, metadata.seq_len)
    if shape == SUDOKU_SHAPE:
        return "sudoku"
    if shape == ARC_SHAPE:
        return "arc"
    if metadata.vocab_size == MAZE_VOCAB and math.isqrt(metadata.seq_len) ** 2 == metadata.seq_len:
        return "maze"
    raise VisualizationError(f"cannot draw a dataset with vocab_size {metadata.vocab_size} and seq_len "
                             f"{metadata.seq_len}: only Sudoku (11/81), maze (6/size²) and ARC (12/900) datasets are supported")


# ----------------------------------------------------------------------------------------
# Drawing helpers


@functools.lru_cache(maxsize=None)
def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has only the small bitmap font
        return ImageFont.load_default()


def _array(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _tokens(x, seq_len: int, what: str) -> np.ndarray:
    """int64 [seq_len] from a numpy array or tensor, or a VisualizationError naming ``what``."""
    array = _array(x)
    if array.size != seq_len or not np.issubdtype(array.dtype, np.integer):
        raise VisualizationError(f"{what} must be {seq_len} integer tokens, "
                                 f"got {array.dtype} of shape {list(array.shape)}")
    return array.reshape(seq_len).astype(np.int64)


def _cells_image(colours: np.ndarray, cell: int, line: tuple[int, int, int]) -> Image.Image:
    """[h, w, 3] uint8 cell colours -> an image of ``cell``-pixel squares with 1-pixel grid lines (h*cell+1 high)."""
    h, w, _ = colours.shape
    canvas = np.empty((h * cell + 1, w * cell + 1, 3), np.uint8)
    canvas[1:, 1:] = np.repeat(np.repeat(colours, cell, axis=0), cell, axis=1)
    canvas[::cell, :] = line
    canvas[:, ::cell] = line
    return Image.fromarray(canvas)


def _compose(body: Image.Image, title: str | None, legend: list[tuple[tuple[int, int, int], str]]) -> Image.Image:
    """White picture: ``title`` above, ``body`` at (MARGIN, MARGIN [+ TITLE_HEIGHT]), legend swatches below, wrapped."""
    font = _font(13)
    width = max(body.width, 240)
    rows, x = [[]], 0
    for colour, label in legend:
        item = SWATCH + 6 + int(font.getlength(label)) + 14
        if x and x + item > width:
            rows.append([])
            x = 0
        rows[-1].append((x, colour, label))
        x += item
    top = MARGIN + (TITLE_HEIGHT if title else 0)
    height = top + body.height + (LEGEND_ROW * len(rows) + 4 if legend else 0) + MARGIN
    image = Image.new("RGB", (width + 2 * MARGIN, height), WHITE)
    image.paste(body, (MARGIN, top))
    draw = ImageDraw.Draw(image)
    if title:
        draw.text((MARGIN, MARGIN), title, fill=TEXT, font=_font(14))
    y = top + body.height + 6
    for row in rows if legend else []:
        for x, colour, label in row:
            draw.rectangle([MARGIN + x, y, MARGIN + x + SWATCH, y + SWATCH], fill=colour, outline=(120, 120, 120))
            draw.text((MARGIN + x + SWATCH + 6, y), label, fill=TEXT, font=font)
        y += LEGEND_ROW
    return image


# ----------------------------------------------------------------------------------------
# Sudoku


def render_sudoku(inputs, labels, preds=None, title: str | None = None) -> Image.Image:
    """A Sudoku grid: the clues, and the solution (``preds`` None) or the prediction with its wrong cells marked.

    Args:
        inputs, labels, preds: [81] tokens (blank 1, digit d -> d + 1), row-major.
        title: optional line above the grid.
    Returns:
        RGB image; the grid's top-left corner is at (MARGIN, MARGIN [+ TITLE_HEIGHT]), cells SUDOKU_CELL pixels.
    Raises:
        VisualizationError: a sequence that is not 81 integer tokens.
    """
    inputs, labels = _tokens(inputs, 81, "Sudoku inputs"), _tokens(labels, 81, "Sudoku labels")
    shown = labels if preds is None else _tokens(preds, 81, "Sudoku predictions")
    given = inputs >= 2
    wrong = (labels >= 0) & (shown != labels)  # ignored label positions (-100) cannot be wrong
    colours = np.where(wrong[:, None], WRONG_BG, np.where(given[:, None], GIVEN_BG, WHITE)).astype(np.uint8)
    grid = _cells_image(colours.reshape(9, 9, 3), SUDOKU_CELL, (170, 170, 170))
    draw = ImageDraw.Draw(grid)
    for k in range(0, 10, 3):  # box borders
        at = k * SUDOKU_CELL
        draw.rectangle([at - 1, 0, at + 1, grid.height], fill=BLACK)
        draw.rectangle([0, at - 1, grid.width, at + 1], fill=BLACK)
    big, small = _font(24), _font(12)
    for i in range(81):
        r, c = divmod(i, 9)
        x, y = c * SUDOKU_CELL, r * SUDOKU_CELL
        digit = str(shown[i] - 1) if 2 <= shown[i] <= 10 else "·"  # blank/pad/out of range as a dot
        colour = WRONG_FG if wrong[i] else GIVEN_FG if given[i] else FILLED_FG
        draw.text((x + SUDOKU_CELL / 2, y + SUDOKU_CELL / 2 + 1), digit, fill=colour, font=big, anchor="mm")
        if wrong[i] and 2 <= labels[i] <= 10:
            draw.text((x + 4, y + 2), str(labels[i] - 1), fill=TRUE_FG, font=small)
    legend = [(GIVEN_BG, "given"), (FILLED_FG, "solution" if preds is None else "predicted, right")]
    if preds is not None:
        legend.append((WRONG_BG, f"wrong: {int(wrong.sum())} cell(s), true digit in the corner"))
    return _compose(grid, title, legend)


# ----------------------------------------------------------------------------------------
# Maze


def maze_cell_size(size: int) -> int:
    """Pixels per cell for a size x size maze: about 480 pixels across, 6 to 24 per cell."""
    return max(6, min(24, 480 // size))


def render_maze(inputs, labels, preds=None, title: str | None = None) -> Image.Image:
    """A maze with its true path (``preds`` None) or with the predicted path compared to the true one.

    Args:
        inputs, labels, preds: [size²] tokens (1 wall, 2 open, 3 S, 4 G, 5 path), row-major; size >= 2.
        title: optional line above the grid.
    Returns:
        RGB image; the grid's top-left corner is at (MARGIN, MARGIN [+ TITLE_HEIGHT]), cells
        ``maze_cell_size(size)`` pixels. Colours: MAZE_COLOURS, MAZE_EXTRA, MAZE_MISSED, MAZE_OTHER.
    Raises:
        VisualizationError: sequences whose length is not a square, or that disagree in length.
    """
    seq_len = _array(inputs).size
    size = math.isqrt(seq_len)
    if size < 2 or size * size != seq_len:
        raise VisualizationError(f"maze inputs must be size² tokens (size >= 2), got {seq_len}")
    _tokens(inputs, seq_len, "maze inputs")
    labels = _tokens(labels, seq_len, "maze labels")
    colours = np.full((seq_len, 3), 255, np.uint8)
    for token, colour in MAZE_COLOURS.items():
        colours[labels == token] = colour
    legend = [(MAZE_COLOURS[WALL], "wall"), (MAZE_COLOURS[START], "start S"), (MAZE_COLOURS[GOAL], "goal G")]
    if preds is None:
        legend.append((MAZE_COLOURS[PATH], "shortest path"))
    else:
        preds = _tokens(preds, seq_len, "maze predictions")
        on_pred, on_true = preds == PATH, labels == PATH
        colours[on_pred & ~on_true] = MAZE_EXTRA
        colours[~on_pred & on_true] = MAZE_MISSED
        colours[~on_pred & ~on_true & (preds != labels) & (labels >= 0)] = MAZE_OTHER
        legend += [(MAZE_COLOURS[PATH], "predicted path, right"), (MAZE_EXTRA, "predicted, not on the path"),
                   (MAZE_MISSED, "path cell missed"), (MAZE_OTHER, "other wrong cell")]
    grid = _cells_image(colours.reshape(size, size, 3), maze_cell_size(size), (150, 150, 150))
    return _compose(grid, title, legend)


# ----------------------------------------------------------------------------------------
# ARC


def _arc_grid(tokens: np.ndarray) -> np.ndarray | None:
    """Colours [h, w] of a 30x30 token canvas: the reference crop, else (a translated grid) the box of colour cells."""
    grid = tokens_to_grid(tokens)
    if grid is not None:
        return grid
    rows, cols = np.nonzero(tokens.reshape(30, 30) >= COLOUR_OFFSET)
    if not len(rows):
        return None
    return (tokens.reshape(30, 30)[rows.min():rows.max() + 1, cols.min():cols.max() + 1] - COLOUR_OFFSET).astype(np.uint8)


def arc_cell_size(grids: list[np.ndarray | None]) -> int:
    """Pixels per cell, shared by the panels: about 300 pixels for the largest side, 6 to 24 per cell."""
    largest = max([max(g.shape) for g in grids if g is not None] or [1])
    return max(6, min(24, 300 // largest))


def render_arc(inputs, labels, preds=None, title: str | None = None) -> Image.Image:
    """An ARC example: input, target and (when given) prediction side by side in the ARC palette.

    Args:
        inputs, labels, preds: [900] tokens (pad 0, end marker 1, colour c -> c + 2) of a 30x30 canvas;
            labels may hold -100 where ignored.
        title: optional line above the panels.
    Returns:
        RGB image: panels of ``arc_cell_size`` pixel cells under a caption line each, the first at
        (MARGIN, MARGIN [+ TITLE_HEIGHT] + TITLE_HEIGHT), ARC_GAP apart (a caption wider than its grid widens its slot).
    Raises:
        VisualizationError: a sequence that is not 900 integer tokens.
    """
    inputs = _tokens(inputs, 900, "ARC inputs")
    labels = _tokens(labels, 900, "ARC labels")
    grids = [_arc_grid(inputs), _arc_grid(np.where(labels < 0, 0, labels))]
    captions = ["input", "target"]
    if preds is not None:
        grids.append(tokens_to_grid(_tokens(preds, 900, "ARC predictions")))
        captions.append("prediction")
    cell = arc_cell_size(grids)
    panels = []
    for grid, caption in zip(grids, captions):
        if grid is None:
            panels.append((None, f"{caption}: no grid"))
            continue
        panel = _cells_image(ARC_PALETTE[grid], cell, ARC_GRID_LINE)
        panels.append((panel, f"{caption} {grid.shape[0]}x{grid.shape[1]}"))
    target, wrong = grids[1], None
    if preds is not None and grids[2] is not None and target is not None:
        if grids[2].shape == target.shape:
            wrong = grids[2] != target
            draw = ImageDraw.Draw(panels[2][0])
            for r, c in zip(*np.nonzero(wrong)):
                draw.rectangle([c * cell + 1, r * cell + 1, (c + 1) * cell - 1, (r + 1) * cell - 1], outline=WHITE,
                               width=max(1, cell // 8))
            panels[2] = (panels[2][0], panels[2][1] + (f", {int(wrong.sum())} wrong" if wrong.any() else ", right"))
        else:
            panels[2] = (panels[2][0], panels[2][1] + f", target is {target.shape[0]}x{target.shape[1]}")
    font, empty = _font(13), 4 * cell + 1
    slots = [max(p.width if p else empty, int(font.getlength(caption)) + 4) for p, caption in panels]
    height = TITLE_HEIGHT + max((p.height if p else empty) for p, _ in panels)
    body = Image.new("RGB", (sum(slots) + ARC_GAP * (len(slots) - 1), height), WHITE)
    draw = ImageDraw.Draw(body)
    x = 0
    for (panel, caption), slot in zip(panels, slots):
        draw.text((x, 2), caption, fill=TEXT, font=font)
        if panel is None:
            draw.rectangle([x, TITLE_HEIGHT, x + empty - 1, TITLE_HEIGHT + empty - 1], outline=ARC_GRID_LINE)
        else:
            body.paste(panel, (x, TITLE_HEIGHT))
        x += slot + ARC_GAP
    legend = [(WHITE, "outlined: differs from the target")] if wrong is not None and wrong.any() else []
    return _compose(body, title, legend)


RENDERERS = {"sudoku": render_sudoku, "maze": render_maze, "arc": render_arc}


def render_example(task: str, inputs, labels, preds=None, title: str | None = None) -> Image.Image:
    """Draw one example with :func:`render_sudoku`, :func:`render_maze` or :func:`render_arc`, by ``task``.

    ``task`` is what :func:`detect_task` returns; the other arguments are those of the renderers.
    """
    if task not in RENDERERS:
        raise VisualizationError(f"unknown task {task!r}; expected one of {', '.join(RENDERERS)}")
    return RENDERERS[task](inputs, labels, preds, title)


# ----------------------------------------------------------------------------------------
# A gallery: PNG files and index.html


def _identifiers(data_path: Path) -> list[str]:
    path = data_path / "identifiers.json"
    try:
        names = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DatasetError(f"{path} not found; the dataset is incomplete, rebuild it") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path} is not valid JSON ({e}); rebuild the dataset") from None
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise DatasetError(f"{path} must hold a JSON list of puzzle names; rebuild the dataset")
    return names


def _name(names: list[str], identifier: int) -> str:
    return names[identifier] if 0 <= identifier < len(names) else f"<id {identifier}>"


def _dataset_items(data_path: Path, split: str, metadata: PuzzleDatasetMetadata, names: list[str], num: int):
    """(file stem, caption, inputs, labels, None) for the first example of each of the first ``num`` groups."""
    items = []
    for set_name, arrays in load_arrays(data_path, split, metadata).items():
        groups, puzzles = arrays["group_indices"], arrays["puzzle_indices"]
        for g in range(min(num - len(items), len(groups) - 1)):
            puzzle = int(groups[g])
            example = int(puzzles[puzzle])
            name = _name(names, int(arrays["puzzle_identifiers"][puzzle]))
            caption = f"{split} example {example}: puzzle {puzzle} ({name}), group {g}"
            if len(metadata.sets) > 1:
                caption += f", set {set_name}"
            items.append((f"{split}_{set_name}_{example:07d}", caption, arrays["inputs"][example],
                          arrays["labels"][example], None))
    return items


def _outputs_items(files: list, metadata: PuzzleDatasetMetadata, names: list[str], num: int):
    """(file stem, caption, inputs, labels, preds) for the first ``num`` real rows of saved outputs; and a summary."""
    outputs = load_outputs(files)
    missing = [k for k in ("inputs", "labels", "preds") if k not in outputs]
    if missing:
        raise OutputsError(f"the outputs lack {', '.join(missing)}; evaluate with "
                           "eval_save_outputs=[inputs,labels,puzzle_identifiers,preds,q_halt_logits]")
    for key in ("inputs", "labels", "preds"):
        if tuple(outputs[key].shape[1:]) != (metadata.seq_len,):
            raise OutputsError(f"outputs '{key}' is {list(outputs[key].shape)} but the dataset has seq_len "
                               f"{metadata.seq_len}; pass the dataset the outputs were evaluated on")
    inputs, labels, preds = (outputs[k].numpy() for k in ("inputs", "labels", "preds"))
    ids = outputs["puzzle_identifiers"].numpy() if "puzzle_identifiers" in outputs else np.zeros(len(inputs), np.int64)
    real = np.flatnonzero((inputs != metadata.pad_id).any(axis=1))  # the last batch's padding rows are all pad
    valid = labels != IGNORE_LABEL_ID
    correct = ((preds == labels) | ~valid).all(axis=1)
    items = []
    for row in real[:num]:
        verdict = "correct" if correct[row] else f"wrong ({int(((preds[row] != labels[row]) & valid[row]).sum())} cells)"
        caption = f"row {row} ({_name(names, int(ids[row]))}): {verdict}"
        items.append((f"output_{row:07d}", caption, inputs[row], labels[row], preds[row]))
    summary = (f"exact accuracy {correct[real].mean():.1%} over {len(real)} rows "
               f"({int(correct[real].sum())} correct)" if len(real) else "no rows")
    return items, summary


def write_gallery(data_path: str | os.PathLike, out_dir: str | os.PathLike, split: str = "test",
                  outputs: list | None = None, num: int = 16) -> Path:
    """Render dataset examples, or saved predictions, to ``out_dir`` as PNG files and an ``index.html`` listing them.

    Without ``outputs``: the first example of each of the first ``num`` groups of ``split`` (so augmented
    copies do not crowd the page). With ``outputs`` (the reference's ``step_<N>_all_preds.<rank>`` files,
    read with :func:`utils.eval.outputs.load_outputs`): the first ``num`` rows that are not batch padding,
    each marked correct (every supervised token right, the reference's exact accuracy) or wrong. The
    task is read from ``split``'s metadata. Files of earlier runs with other names are left alone.

    Returns:
        the path of ``index.html``.
    Raises:
        DatasetError, OutputsError, VisualizationError: a missing or malformed dataset or outputs file, an
            unsupported task, outputs that do not fit the dataset, or ``num`` < 1.
    """
    if num < 1:
        raise VisualizationError(f"--num must be >= 1, got {num}")
    data_path, out_dir = Path(data_path), Path(out_dir)
    metadata = load_metadata(data_path, split)
    task = detect_task(metadata)
    names = _identifiers(data_path)
    if outputs:
        items, summary = _outputs_items(outputs, metadata, names, num)
        source = ", ".join(str(f) for f in outputs)
    else:
        items, summary = _dataset_items(data_path, split, metadata, names, num), None
        source = f"{data_path} ({split} split)"
    if out_dir.exists() and not out_dir.is_dir():
        raise VisualizationError(f"--out {out_dir} is a file; pick a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = []
    for stem, caption, inputs, labels, preds in tqdm(items, desc="render", unit="picture"):
        render_example(task, inputs, labels, preds, title=caption).save(out_dir / f"{stem}.png")
        figures.append(f'<figure><img src="{html.escape(stem)}.png" alt="{html.escape(caption)}">'
                       f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    heading = f"{task}: {html.escape(source)}"
    page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + heading + "</title>\n<style>"
            "body{font-family:sans-serif;margin:16px} "
            "figure{display:inline-block;vertical-align:top;margin:0 16px 16px 0}"
            "figcaption{font-size:13px;max-width:520px}</style></head><body>\n"
            f"<h1>{heading}</h1>\n" + (f"<p>{html.escape(summary)}</p>\n" if summary else "")
            + "\n".join(figures) + "\n</body></html>\n")
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


class EvalPictures:
    """A few test examples with the model's answers, drawn at each evaluation (the trainer sends them to
    TensorBoard). Padding rows (every label ignored) are skipped.

    Use as an evaluation consumer: ``update_batch(batch, preds)`` per test batch, then :meth:`images`.
    """

    def __init__(self, task: str, count: int = 4):
        self.task, self.count = task, count
        self.rows: list[tuple] = []

    def update_batch(self, batch: dict, preds: dict) -> None:
        """Keep the first ``count`` real rows: ``batch`` ``inputs``/``labels`` [B, S], ``preds["preds"]`` [B, S]."""
        for inputs, labels, pred in zip(batch["inputs"], batch["labels"], preds["preds"]):
            if len(self.rows) >= self.count:
                return
            if (_array(labels) != IGNORE_LABEL_ID).any():
                self.rows.append((inputs, labels, pred))

    def images(self) -> dict[str, Image.Image]:
        """``{"eval/example_<i>": picture}`` of the kept rows."""
        return {f"eval/example_{i}": render_example(self.task, *row) for i, row in enumerate(self.rows)}
