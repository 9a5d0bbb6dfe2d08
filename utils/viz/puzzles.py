"""Pictures of puzzles (Sudoku, mazes, ARC) from their token sequences, with a model's prediction when there is one.

Each ``render_*`` function takes one example's tokens (numpy or torch, ``[seq_len]`` integers, labels
may hold -100 where a position is ignored, as in the saved outputs) and returns a PIL RGB image; they
cost a few milliseconds, so the trainer can also send some to TensorBoard
(``add_image(tag, np.asarray(image), step, dataformats="HWC")``). A picture has an optional one-line
title (:func:`example_title`: task, puzzle, step, right or how many cells wrong) and a legend of every
colour and mark it uses.

- Sudoku (vocab 11, seq_len 81; blank 1, digit d -> d + 1): the clues (givens) black on grey, always
  the puzzle's own digit; filled-in digits blue on white; a wrong filled-in cell is red on pink with the
  true digit small in the corner; a given the model changed gets an orange corner triangle; ``·`` is a
  cell where no digit was predicted.
- Maze (vocab 6, seq_len size²; ``"# SGo"`` -> 1..5): walls dark, open cells white, the true path a
  light-blue fill, S green and G red (never painted over). With a prediction, the predicted path is a
  dark-blue square in the middle of its cells, and mistakes are rings on the cell's edge: orange where
  the prediction leaves the true path, magenta on a path cell it missed, teal on any other wrong cell.
- ARC (vocab 12, seq_len 900; pad 0, end marker 1, colour c -> c + 2): input, target and prediction
  side by side in the standard ARC palette (``fchollet/ARC`` apps/css/common.css); prediction cells
  that differ from the target are outlined in white. The prediction is cropped as the reference
  evaluator crops it (:func:`utils.data.arc.tokens_to_grid`).

:func:`render_segments` draws the answer after each ACT segment (one frame per segment) and
:func:`save_segments` writes them as an animated GIF and a strip. :func:`write_gallery` renders a dataset
split, or saved predictions (with their per-segment answers when saved), to files and an ``index.html``.
The reference's own viewer (``sapientinc/HRM`` puzzle_visualizer.html) draws raw token grids only.
"""
from __future__ import annotations

import functools
import html
import io
import json
import math
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from utils.data.arc import COLOUR_OFFSET, tokens_to_grid
from utils.data.maze import GOAL, OPEN, PATH, START, WALL
from utils.data.puzzle_dataset import IGNORE_LABEL_ID, DatasetError, PuzzleDatasetMetadata, load_arrays, load_metadata
from utils.data.saved_outputs import FILE_PATTERN, OutputsError, load_outputs
from utils.errors import UserError
from utils.outputs import write_atomically

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
CHANGED_GIVEN = (255, 120, 0)      # corner triangle on a given the model changed

# Cell fills from the labels; MAZE_COLOURS[PATH] is the true path.
MAZE_COLOURS = {WALL: (50, 50, 50), OPEN: WHITE, START: (46, 204, 64), GOAL: (255, 65, 54), PATH: (160, 210, 255)}
MAZE_PREDICTED = (0, 40, 140)      # the predicted path: a square in the middle of the cell
MAZE_EXTRA, MAZE_MISSED, MAZE_OTHER = (255, 133, 27), (240, 18, 190), (0, 170, 170)  # rings on wrong cells

# fchollet/ARC apps/css/common.css .symbol_0 .. .symbol_9
ARC_PALETTE = np.array([(0x00, 0x00, 0x00), (0x00, 0x74, 0xD9), (0xFF, 0x41, 0x36), (0x2E, 0xCC, 0x40),
                        (0xFF, 0xDC, 0x00), (0xAA, 0xAA, 0xAA), (0xF0, 0x12, 0xBE), (0xFF, 0x85, 0x1B),
                        (0x7F, 0xDB, 0xFF), (0x87, 0x0C, 0x25)], np.uint8)
ARC_GRID_LINE = (85, 85, 85)
ARC_GAP = 16                       # pixels between the input, target and prediction panels

SEGMENT_KEYS = ("segment_preds", "segment_q_halt")  # per-segment answers in a saved outputs file
FRAME_MS, LAST_FRAME_MS = 700, 2500  # how long a GIF shows each segment, and the last one
STRIP_GAP, STRIP_MAX_WIDTH = 8, 4000  # pixels between frames of a strip; wider strips are scaled down


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


def known_task(metadata: PuzzleDatasetMetadata) -> str | None:
    """:func:`detect_task`, or None for a dataset of another shape (the trainer then draws no pictures, and
    ``--checked`` says it has no rules to check the answers by)."""
    try:
        return detect_task(metadata)
    except VisualizationError:
        return None


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


def _mark(draw: ImageDraw.ImageDraw, x: int, y: int, cell: int, colour: tuple[int, int, int], kind: str) -> None:
    """Draw a mark on the ``cell``-pixel square whose top-left grid line is at (x, y).

    ``kind``: "square" (filled, the middle half of the cell), "ring" (an outline just inside the grid
    lines, max(2, cell // 8) pixels wide, leaving the middle of the cell as it was) or "corner" (a
    filled triangle in the top-right quarter).
    """
    if kind == "square":
        inset = cell // 4
        draw.rectangle([x + inset, y + inset, x + cell - inset, y + cell - inset], fill=colour)
    elif kind == "ring":
        draw.rectangle([x + 1, y + 1, x + cell - 1, y + cell - 1], outline=colour, width=max(2, cell // 8))
    else:
        side = cell // 3
        draw.polygon([(x + cell - side, y + 1), (x + cell - 1, y + 1), (x + cell - 1, y + side)], fill=colour)


def _icon(background: tuple[int, int, int], colour: tuple[int, int, int], kind: str) -> Image.Image:
    """A legend swatch: a SWATCH-pixel cell of ``background`` with :func:`_mark` ``kind`` in ``colour``."""
    icon = Image.new("RGB", (SWATCH + 1, SWATCH + 1), background)
    _mark(ImageDraw.Draw(icon), 0, 0, SWATCH, colour, kind)
    return icon


# A legend entry: a colour (drawn as a filled square), a swatch picture (:func:`_icon`), or None (text only).
LegendEntry = tuple[tuple[int, int, int] | Image.Image | None, str]


def _compose(body: Image.Image, title: str | None, legend: list[LegendEntry]) -> Image.Image:
    """White picture: ``title`` above, ``body`` at (MARGIN, MARGIN [+ TITLE_HEIGHT]), legend entries below, wrapped.

    The legend wraps at the body's width (at least 240 pixels), so pictures of one example with other
    titles (the frames of :func:`render_segments`) keep one layout; a longer title widens the picture.
    """
    font, title_font = _font(13), _font(14)
    wrap = max(body.width, 240)
    rows, x = [[]], 0
    for swatch, label in legend:
        item = (SWATCH + 6 if swatch is not None else 0) + int(font.getlength(label)) + 14
        if x and x + item > wrap:
            rows.append([])
            x = 0
        rows[-1].append((x, swatch, label))
        x += item
    top = MARGIN + (TITLE_HEIGHT if title else 0)
    height = top + body.height + (LEGEND_ROW * len(rows) + 4 if legend else 0) + MARGIN
    width = max(wrap, int(title_font.getlength(title)) if title else 0)
    image = Image.new("RGB", (width + 2 * MARGIN, height), WHITE)
    image.paste(body, (MARGIN, top))
    draw = ImageDraw.Draw(image)
    if title:
        draw.text((MARGIN, MARGIN), title, fill=TEXT, font=title_font)
    y = top + body.height + 6
    for row in rows if legend else []:
        for x, swatch, label in row:
            if isinstance(swatch, Image.Image):
                image.paste(swatch, (MARGIN + x, y))
                draw.rectangle([MARGIN + x, y, MARGIN + x + SWATCH, y + SWATCH], outline=(120, 120, 120))
            elif swatch is not None:
                draw.rectangle([MARGIN + x, y, MARGIN + x + SWATCH, y + SWATCH], fill=swatch, outline=(120, 120, 120))
            draw.text((MARGIN + x + (SWATCH + 6 if swatch is not None else 0), y), label, fill=TEXT, font=font)
        y += LEGEND_ROW
    return image


# ----------------------------------------------------------------------------------------
# Right and wrong, and titles


def wrong_cells(labels, preds) -> np.ndarray:
    """bool, the shape of ``labels``: supervised positions (label not -100) where ``preds`` differs.

    ``labels`` and ``preds`` are integer tokens of one shape ([S] or [N, S], numpy or torch); a row is
    right, as in the reference's exact accuracy, when none of its cells is wrong.
    """
    labels, preds = _array(labels), _array(preds)
    return (labels != IGNORE_LABEL_ID) & (preds != labels)


def verdict(labels, preds) -> str:
    """"right", or "wrong: N of M cells" (M supervised positions), for one example's [S] tokens."""
    wrong = wrong_cells(labels, preds)
    if not wrong.any():
        return "right"
    return f"wrong: {int(wrong.sum())} of {int((_array(labels) != IGNORE_LABEL_ID).sum())} cells"


def example_title(task: str, name: str | None, step: int | None, labels, preds) -> str:
    """A picture's title, e.g. ``"sudoku · puzzle 17 · step 1200 · wrong: 3 of 81 cells"``.

    Args:
        task: "sudoku", "maze" or "arc".
        name: which example ("puzzle 17", an ARC task name); None leaves it out.
        step: the training step of the model; None (unknown) leaves it out.
        labels, preds: the example's [S] tokens; with ``preds`` None (no model) the verdict is left out.
    """
    parts = [task, name, None if step is None else f"step {step}", None if preds is None else verdict(labels, preds)]
    return " · ".join(part for part in parts if part)


# ----------------------------------------------------------------------------------------
# Sudoku


def render_sudoku(inputs, labels, preds=None, title: str | None = None) -> Image.Image:
    """A Sudoku grid: the clues, and the solution (``preds`` None) or the prediction with its mistakes marked.

    A clue (given) is always drawn as the puzzle's digit, black on grey; where the prediction changed it,
    an orange triangle marks the top-right corner (counted in the legend as "changed a given"). Only
    wrong filled-in cells are pink, the predicted digit red and the true one small in the corner. A
    filled-in cell without a digit predicted (blank, padding or out-of-range token) shows ``·``.

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
    wrong = wrong_cells(labels, shown)
    wrong_filled, changed = wrong & ~given, wrong & given
    digits = np.where(given, inputs, shown)
    no_digit = (digits < 2) | (digits > 10)
    colours = np.where(wrong_filled[:, None], WRONG_BG, np.where(given[:, None], GIVEN_BG, WHITE)).astype(np.uint8)
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
        colour = GIVEN_FG if given[i] else WRONG_FG if wrong_filled[i] else FILLED_FG
        digit = "·" if no_digit[i] else str(digits[i] - 1)
        draw.text((x + SUDOKU_CELL / 2, y + SUDOKU_CELL / 2 + 1), digit, fill=colour, font=big, anchor="mm")
        if wrong_filled[i] and 2 <= labels[i] <= 10:
            draw.text((x + 4, y + 2), str(labels[i] - 1), fill=TRUE_FG, font=small)
        if changed[i]:
            _mark(draw, x, y, SUDOKU_CELL, CHANGED_GIVEN, "corner")
    legend: list[LegendEntry] = [(GIVEN_BG, "given"), (FILLED_FG, "solution" if preds is None else "predicted, right")]
    if preds is not None:
        legend.append((WRONG_BG, f"wrong: {int(wrong_filled.sum())} filled cell(s), true digit in the corner"))
        if changed.any():
            legend.append((_icon(GIVEN_BG, CHANGED_GIVEN, "corner"), f"changed a given: {int(changed.sum())}"))
        if no_digit.any():
            legend.append((None, "· = no digit predicted"))
    return _compose(grid, title, legend)


# ----------------------------------------------------------------------------------------
# Maze


def maze_cell_size(size: int) -> int:
    """Pixels per cell for a size x size maze: about 480 pixels across, 6 to 24 per cell."""
    return max(6, min(24, 480 // size))


def render_maze(inputs, labels, preds=None, title: str | None = None) -> Image.Image:
    """A maze with its true path (``preds`` None) or with the predicted path drawn over the true one.

    Cells are filled from the labels (where a label is ignored, the input): walls, open cells, the true
    path (light blue), S and G. A prediction adds, in this order: a dark-blue square in the middle of
    each cell it puts on the path (not on S or G, which stay whole), then a ring on the edge of each
    wrong cell: orange (on the path, not on the true one), magenta (a true path cell missed), teal
    (any other wrong token). The middle of the S and G cells always shows their colour.

    Args:
        inputs, labels, preds: [size²] tokens (1 wall, 2 open, 3 S, 4 G, 5 path), row-major; size >= 2.
        title: optional line above the grid.
    Returns:
        RGB image; the grid's top-left corner is at (MARGIN, MARGIN [+ TITLE_HEIGHT]), cells
        ``maze_cell_size(size)`` pixels with 1-pixel grid lines at multiples of it. Colours:
        MAZE_COLOURS, MAZE_PREDICTED, MAZE_EXTRA, MAZE_MISSED, MAZE_OTHER.
    Raises:
        VisualizationError: sequences whose length is not a square, or that disagree in length.
    """
    seq_len = _array(inputs).size
    size = math.isqrt(seq_len)
    if size < 2 or size * size != seq_len:
        raise VisualizationError(f"maze inputs must be size² tokens (size >= 2), got {seq_len}")
    inputs = _tokens(inputs, seq_len, "maze inputs")
    labels = _tokens(labels, seq_len, "maze labels")
    cells = np.where(labels == IGNORE_LABEL_ID, inputs, labels)
    colours = np.full((seq_len, 3), 255, np.uint8)
    for token, colour in MAZE_COLOURS.items():
        colours[cells == token] = colour
    cell = maze_cell_size(size)
    grid = _cells_image(colours.reshape(size, size, 3), cell, (150, 150, 150))
    legend: list[LegendEntry] = [(MAZE_COLOURS[WALL], "wall"), (MAZE_COLOURS[START], "start S"),
                                 (MAZE_COLOURS[GOAL], "goal G")]
    if preds is None:
        return _compose(grid, title, legend + [(MAZE_COLOURS[PATH], "shortest path")])
    preds = _tokens(preds, seq_len, "maze predictions")
    on_pred, on_true, wrong = preds == PATH, labels == PATH, wrong_cells(labels, preds)
    marks = [(on_pred & ~np.isin(cells, (START, GOAL)), MAZE_PREDICTED, "square"),
             (wrong & on_pred & ~on_true, MAZE_EXTRA, "ring"),
             (wrong & ~on_pred & on_true, MAZE_MISSED, "ring"),
             (wrong & ~on_pred & ~on_true, MAZE_OTHER, "ring")]
    draw = ImageDraw.Draw(grid)
    for where, colour, kind in marks:
        for i in np.flatnonzero(where):
            r, c = divmod(int(i), size)
            _mark(draw, c * cell, r * cell, cell, colour, kind)
    legend += [(MAZE_COLOURS[PATH], "true path"), (_icon(WHITE, MAZE_PREDICTED, "square"), "predicted path"),
               (_icon(WHITE, MAZE_EXTRA, "ring"), "predicted, off the path"),
               (_icon(MAZE_COLOURS[PATH], MAZE_MISSED, "ring"), "path cell missed"),
               (_icon(WHITE, MAZE_OTHER, "ring"), "other wrong cell")]
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
# The answer after each ACT segment: frames, a GIF and a strip


def render_segments(task: str, inputs, labels, segment_preds, q_halt, title: str | None = None,
                    shown=None) -> list[Image.Image]:
    """One picture per ACT segment of one example: the answer the model would give if it halted there.

    Each frame is :func:`render_example` of that segment's answer, titled ``"<title> · segment t/T ·
    sigmoid(q_halt)=0.93 · wrong: N of M cells"``: sigmoid(q_halt) (σ, spelled out because the default
    font has no Greek) is the halting head's confidence that the answer is right (ACT, Graves 2016, as
    trained in HRM). Frames are padded with white to one size, for a GIF.

    Args:
        task: "sudoku", "maze" or "arc".
        inputs, labels: the example's [S] tokens.
        segment_preds: [T, S] integer tokens, the argmax answer after each of T >= 1 segments.
        q_halt: [T] float halting logits, one per segment.
        title: what the example is (e.g. :func:`example_title` without a prediction); None leaves it out.
        shown: the (0-based) segments to draw, for a long answer; None: all T. Titles keep ``t/T``.
    Returns:
        An RGB image of one size per segment drawn.
    Raises:
        VisualizationError: shapes that do not fit (T = 0, a segment not S long, q_halt not [T]) or
            tokens the task's renderer refuses.
    """
    segment_preds, q_halt = _array(segment_preds), _array(q_halt)
    seq_len = _array(labels).size
    if (segment_preds.ndim != 2 or not len(segment_preds) or segment_preds.shape[1] != seq_len
            or not np.issubdtype(segment_preds.dtype, np.integer)):
        raise VisualizationError(f"segment predictions must be [T >= 1, {seq_len}] integer tokens, "
                                 f"got {segment_preds.dtype} of shape {list(segment_preds.shape)}")
    if q_halt.shape != segment_preds.shape[:1] or not np.issubdtype(q_halt.dtype, np.floating):
        raise VisualizationError(f"segment q_halt must be [{len(segment_preds)}] floats, "
                                 f"got {q_halt.dtype} of shape {list(q_halt.shape)}")
    confidence = 0.5 * (1 + np.tanh(q_halt.astype(np.float64) / 2))  # sigmoid, without overflow for large |logit|
    total = len(segment_preds)
    frames = []
    for t in range(total) if shown is None else shown:
        preds = segment_preds[t]
        line = (f"segment {t + 1}/{total} · sigmoid(q_halt)={confidence[t]:.2f} · "
                f"{verdict(_array(labels).reshape(-1), preds)}")
        frames.append(render_example(task, inputs, labels, preds, title=f"{title} · {line}" if title else line))
    width, height = max(f.width for f in frames), max(f.height for f in frames)
    padded = []
    for frame in frames:
        canvas = Image.new("RGB", (width, height), WHITE)
        canvas.paste(frame, (0, 0))
        padded.append(canvas)
    return padded


def save_picture(image: Image.Image, path: Path, image_format: str = "PNG", **options) -> Path:
    """Write ``image`` to ``path`` whole or not at all (:func:`utils.outputs.write_atomically`).

    Raises:
        OutputWriteError: the write failed (full disk); nothing partial is left.
    """
    return write_atomically(path, lambda f: image.save(f, format=image_format, **options), "picture")


ANSWER_ENDINGS = (".png", ".gif", "_strip.png")  # what an answer's stem gets: its picture, then save_segments' files


def segments_gif(frames: list[Image.Image]) -> bytes:
    """:func:`render_segments` frames as an animated GIF: FRAME_MS milliseconds a frame and LAST_FRAME_MS on the last
    (the answer the model gives), looping forever.

    Raises:
        VisualizationError: no frames.
    """
    if not frames:
        raise VisualizationError("no segment frames to save")
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:],
                   duration=[FRAME_MS] * (len(frames) - 1) + [LAST_FRAME_MS], loop=0)
    return buffer.getvalue()


def save_segments(frames: list[Image.Image], path_stem: str | os.PathLike) -> tuple[Path, Path]:
    """Write :func:`render_segments` frames as ``<path_stem>.gif`` and ``<path_stem>_strip.png``.

    The GIF is :func:`segments_gif`'s. The strip puts the frames side by side, STRIP_GAP pixels apart, scaled down to
    STRIP_MAX_WIDTH pixels when wider. Each file is written whole or not at all.

    Args:
        frames: T >= 1 RGB images of one size.
        path_stem: the path without the suffix; parent directories are created.
    Returns:
        (GIF path, strip path).
    Raises:
        VisualizationError: no frames.
        OutputWriteError: a write failed (full disk, ...); that file is left as it was.
    """
    path_stem = Path(path_stem)
    gif = write_atomically(path_stem.with_name(f"{path_stem.name}.gif"), lambda f: f.write(segments_gif(frames)),
                           "picture")
    width = sum(f.width for f in frames) + STRIP_GAP * (len(frames) - 1)
    strip = Image.new("RGB", (width, max(f.height for f in frames)), WHITE)
    for i, frame in enumerate(frames):
        strip.paste(frame, (i * (frame.width + STRIP_GAP), 0))
    if width > STRIP_MAX_WIDTH:
        strip = strip.resize((STRIP_MAX_WIDTH, max(1, round(strip.height * STRIP_MAX_WIDTH / width))),
                             Image.Resampling.LANCZOS)
    return gif, save_picture(strip, path_stem.with_name(f"{path_stem.name}_strip.png"), "PNG")


# ----------------------------------------------------------------------------------------
# A gallery: pictures and index.html


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


def _name(names: list[str], identifier: int, metadata: PuzzleDatasetMetadata) -> str | None:
    """The puzzle's name in identifiers.json; None for the blank identifier (every Sudoku and maze puzzle)."""
    if identifier == metadata.blank_identifier_id:
        return None
    return names[identifier] if 0 <= identifier < len(names) else f"<id {identifier}>"


class _Item(NamedTuple):
    """One picture of the gallery: file stem, HTML caption, title name, [S] tokens, and per-segment answers."""
    stem: str
    caption: str
    name: str
    inputs: np.ndarray
    labels: np.ndarray
    preds: np.ndarray | None = None
    segments: tuple[np.ndarray, np.ndarray] | None = None  # ([T, S] answers, [T] q_halt logits)


def _dataset_items(data_path: Path, split: str, metadata: PuzzleDatasetMetadata, names: list[str],
                   num: int) -> list[_Item]:
    """The first example of each of the first ``num`` groups."""
    items = []
    for set_name, arrays in load_arrays(data_path, split, metadata).items():
        groups, puzzles = arrays["group_indices"], arrays["puzzle_indices"]
        for g in range(min(num - len(items), len(groups) - 1)):
            puzzle = int(groups[g])
            example = int(puzzles[puzzle])
            name = _name(names, int(arrays["puzzle_identifiers"][puzzle]), metadata)
            caption = f"{split} example {example}: puzzle {puzzle}" + (f" ({name})" if name else "") + f", group {g}"
            if len(metadata.sets) > 1:
                caption += f", set {set_name}"
            items.append(_Item(f"{split}_{set_name}_{example:07d}", caption, name or f"puzzle {puzzle}",
                               arrays["inputs"][example], arrays["labels"][example]))
    return items


def _segments(outputs: dict[str, torch.Tensor], seq_len: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The per-segment answers [N, T, seq_len] and q_halt logits [N, T] of saved outputs; None when not saved.

    Raises:
        OutputsError: only one of the two keys, or shapes that do not fit.
    """
    present = [k for k in SEGMENT_KEYS if k in outputs]
    if not present:
        return None
    if len(present) == 1:
        raise OutputsError(f"the outputs hold '{present[0]}' but not '{({*SEGMENT_KEYS} - {present[0]}).pop()}'; "
                           "per-segment pictures need both")
    preds, q_halt = (outputs[k] for k in SEGMENT_KEYS)
    if (preds.dim() != 3 or preds.shape[1] < 1 or preds.shape[2] != seq_len or preds.dtype.is_floating_point
            or tuple(q_halt.shape) != tuple(preds.shape[:2]) or not q_halt.dtype.is_floating_point):
        raise OutputsError(f"outputs 'segment_preds' must be integer [N, T, {seq_len}] and 'segment_q_halt' float "
                           f"[N, T]; got {preds.dtype} {list(preds.shape)} and {q_halt.dtype} {list(q_halt.shape)}")
    return preds.numpy(), q_halt.numpy()


def _outputs_items(files: list, metadata: PuzzleDatasetMetadata, names: list[str], num: int):
    """The first ``num`` real rows of saved outputs (with their per-segment answers when saved); and a summary."""
    outputs = load_outputs(files)
    missing = [k for k in ("inputs", "labels", "preds") if k not in outputs]
    if missing:
        raise OutputsError(f"the outputs lack {', '.join(missing)}; evaluate with "
                           "eval_save_outputs=[inputs,labels,puzzle_identifiers,preds,q_halt_logits]")
    for key in ("inputs", "labels", "preds"):
        if tuple(outputs[key].shape[1:]) != (metadata.seq_len,):
            raise OutputsError(f"outputs '{key}' is {list(outputs[key].shape)} but the dataset has seq_len "
                               f"{metadata.seq_len}; pass the dataset the outputs were evaluated on")
    segments = _segments(outputs, metadata.seq_len)
    inputs, labels, preds = (outputs[k].numpy() for k in ("inputs", "labels", "preds"))
    ids = (outputs["puzzle_identifiers"].numpy() if "puzzle_identifiers" in outputs
           else np.full(len(inputs), metadata.blank_identifier_id, np.int64))
    real = np.flatnonzero((inputs != metadata.pad_id).any(axis=1))  # the last batch's padding rows are all pad
    correct = ~wrong_cells(labels, preds).any(axis=1)
    items = []
    for row in real[:num]:
        name = _name(names, int(ids[row]), metadata)
        items.append(_Item(f"output_{row:07d}", "", f"row {row} ({name})" if name else f"puzzle {row}", inputs[row],
                           labels[row], preds[row], None if segments is None else (segments[0][row], segments[1][row])))
    summary = (f"exact accuracy {correct[real].mean():.1%} over {len(real)} rows "
               f"({int(correct[real].sum())} correct)" if len(real) else "no rows")
    return items, summary


def _outputs_step(files: list) -> int | None:
    """The training step in the outputs files' names (``step_<N>_all_preds.<rank>``); None when they do not say."""
    steps = {m.group(1) if m else None for m in (FILE_PATTERN.fullmatch(Path(f).name) for f in files)}
    return int(steps.pop()) if len(steps) == 1 and None not in steps else None


def _figure(src: str, caption: str, link: tuple[str, str] | None = None) -> str:
    """An HTML figure: picture ``src`` captioned ``caption`` (plain text), then an optional (href, text) link."""
    more = f' (<a href="{html.escape(link[0])}">{html.escape(link[1])}</a>)' if link else ""
    return (f'<figure><img src="{html.escape(src)}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}{more}</figcaption></figure>")


def write_gallery(data_path: str | os.PathLike, out_dir: str | os.PathLike, split: str = "test",
                  outputs: list | None = None, num: int = 16) -> Path:
    """Render dataset examples, or saved predictions, to ``out_dir`` as PNG files and an ``index.html`` listing them.

    Without ``outputs``: the first example of each of the first ``num`` groups of ``split`` (so augmented
    copies do not crowd the page). With ``outputs`` (the reference's ``step_<N>_all_preds.<rank>`` files,
    read with :func:`utils.data.saved_outputs.load_outputs`): the first ``num`` rows that are not batch padding,
    each titled right (every supervised token right, the reference's exact accuracy) or how many cells
    are wrong (:func:`example_title`; the step is read from the file names). When the outputs also hold
    ``segment_preds`` (int [N, T, seq_len], the answer after each ACT segment) and ``segment_q_halt``
    (float [N, T]), each row also gets ``<stem>_segments.gif`` and ``<stem>_segments_strip.png``
    (:func:`render_segments`, :func:`save_segments`). A puzzle without a name (the blank identifier, as
    in every Sudoku and maze dataset) is called ``puzzle <index>``. The task is read from ``split``'s
    metadata. Files of earlier runs with other names are left alone.

    Returns:
        the path of ``index.html``.
    Raises:
        DatasetError, OutputsError, VisualizationError: a missing or malformed dataset or outputs file, an
            unsupported task, outputs that do not fit the dataset, or ``num`` < 1.
        OutputWriteError: a picture could not be written (full disk, ...).
    """
    if num < 1:
        raise VisualizationError(f"--num must be >= 1, got {num}")
    data_path, out_dir = Path(data_path), Path(out_dir)
    metadata = load_metadata(data_path, split)
    task = detect_task(metadata)
    names = _identifiers(data_path)
    if outputs:
        items, summary = _outputs_items(outputs, metadata, names, num)
        source, step = ", ".join(str(f) for f in outputs), _outputs_step(outputs)
    else:
        items, summary = _dataset_items(data_path, split, metadata, names, num), None
        source, step = f"{data_path} ({split} split)", None
    if out_dir.exists() and not out_dir.is_dir():
        raise VisualizationError(f"--out {out_dir} is a file; pick a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = []
    for item in tqdm(items, desc="render", unit="picture"):
        title = example_title(task, item.name, step, item.labels, item.preds)
        save_picture(render_example(task, item.inputs, item.labels, item.preds, title), out_dir / f"{item.stem}.png",
                      "PNG")
        figures.append(_figure(f"{item.stem}.png", item.caption or title))
        if item.segments is not None:
            frames = render_segments(task, item.inputs, item.labels, *item.segments,
                                     title=example_title(task, item.name, step, item.labels, None))
            gif, strip = save_segments(frames, out_dir / f"{item.stem}_segments")
            figures.append(_figure(gif.name, f"{item.name}: the answer after each of {len(frames)} segments",
                                   (strip.name, "all side by side")))
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
        self.rows: list[tuple] = []  # (row index in this evaluation, inputs, labels, preds)
        self._seen = 0

    def update_batch(self, batch: dict, preds: dict) -> None:
        """Keep the first ``count`` real rows: ``batch`` ``inputs``/``labels`` [B, S], ``preds["preds"]`` [B, S]."""
        for inputs, labels, pred in zip(batch["inputs"], batch["labels"], preds["preds"]):
            if len(self.rows) >= self.count:
                return
            if (_array(labels) != IGNORE_LABEL_ID).any():
                self.rows.append((self._seen, inputs, labels, pred))
            self._seen += 1

    def images(self, step: int | None = None) -> dict[str, Image.Image]:
        """``{"eval/example_<i>": picture}`` of the kept rows, titled with the test row, ``step`` (when given)
        and whether the answer is right (:func:`example_title`)."""
        return {f"eval/example_{i}": render_example(self.task, inputs, labels, pred,
                                                    example_title(self.task, f"test row {row}", step, labels, pred))
                for i, (row, inputs, labels, pred) in enumerate(self.rows)}
