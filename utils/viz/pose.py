"""Pictures of CAPE poses: episodes of the trainer's validation (:func:`pose_grid`) and the predictions of
``scripts/predict_pose.py`` on a user's images (:func:`prediction_picture`).

Each keypoint index has one colour in every tile of a picture (evenly spaced hues), so a support keypoint and
its prediction on a query match by colour. The marks, explained by the legend under every picture:

- support keypoint (the annotation the model is given): a filled disc with a white rim;
- ground truth on a query: a ring (hollow circle);
- prediction: a cross (x) with a black rim, drawn where the keypoint is visible in every support (the model
  predicts only those);
- error: a white line from a prediction to its ground truth (a correct prediction lies inside the ring
  or close to it);
- skeleton: coloured lines between the support's keypoints on a support and between the predictions on
  a query; each line takes the colour of its lower-numbered keypoint.

Marker sizes, line widths and text scale with the tile side, so a picture reads the same at any size.
Crops are ImageNet-normalised in the batch (``utils/data/cape/mp100.py``) and are un-normalised for display. Both
functions return an RGB PIL image (utils/run/metrics.MetricsWriter.log_images writes it as a PNG and to
TensorBoard).
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from utils.data.cape.mp100 import IMAGENET_MEAN, IMAGENET_STD

BACKGROUND = (40, 40, 40)
TEXT = (230, 230, 230)
WHITE, BLACK = (255, 255, 255), (0, 0, 0)
SAMPLE = (255, 200, 0)  # the keypoint colour of the legend's sample marks
LEGEND = {
    "support": "support keypoint (given to the model)",
    "truth": "ground truth",
    "prediction": "prediction",
    "error": "error: prediction to its ground truth",
    "skeleton": "skeleton (support: annotations; query: predictions)",
}


@dataclass(frozen=True)
class Marks:
    """Sizes in pixels for a tile of side ``tile``: marker radius, line widths, font and the spacing around text."""

    tile: int

    @property
    def radius(self) -> int:
        return max(3, round(self.tile / 32))

    @property
    def line(self) -> int:
        return max(2, round(self.tile / 96))

    @property
    def error_line(self) -> int:
        return max(1, round(self.tile / 128))

    @property
    def font_size(self) -> int:
        """Text height: a thirteenth of the tile, within 10..18 pixels (readable, not dominating a large tile)."""
        return min(18, max(10, round(self.tile / 13)))

    @property
    def gap(self) -> int:
        return max(4, round(self.tile / 40))

    @property
    def caption(self) -> int:
        """Height of a text line (a tile's caption, a row title, a legend line)."""
        return round(self.font_size * 1.5)

    def font(self, fit: str | None = None) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
        """Pillow's bundled font at :attr:`font_size`, smaller where needed for the text ``fit`` to span at most a
        tile (its fixed bitmap font on a Pillow without ``size``, < 10.1)."""
        size = self.font_size
        try:
            font = ImageFont.load_default(size=size)
        except (TypeError, ImportError):
            return ImageFont.load_default()
        while fit is not None and size > 8 and font.getlength(fit) > self.tile:
            size -= 1
            font = ImageFont.load_default(size=size)
        return font


def keypoint_colours(n: int) -> np.ndarray:
    """``[n, 3]`` uint8 RGB: fully saturated colours at evenly spaced hues, keypoint i at hue i / n."""
    return np.array([[round(255 * c) for c in colorsys.hsv_to_rgb(i / max(n, 1), 1.0, 1.0)] for i in range(n)],
                    np.uint8).reshape(n, 3)


def denormalise(image: torch.Tensor) -> np.ndarray:
    """An ImageNet-normalised crop ``[3, S, S]`` float -> ``[S, S, 3]`` uint8 RGB."""
    rgb = image.detach().float().cpu().numpy().transpose(1, 2, 0) * IMAGENET_STD + IMAGENET_MEAN
    return (np.clip(rgb, 0, 1) * 255 + 0.5).astype(np.uint8)


def _colour(colours: np.ndarray, n: int) -> tuple[int, int, int]:
    return tuple(int(c) for c in colours[n])


def draw_skeleton(draw: ImageDraw.ImageDraw, points: np.ndarray, shown: np.ndarray, edges: Sequence[tuple[int, int]],
                  colours: np.ndarray, marks: Marks) -> None:
    """Lines between shown keypoints ``points`` ``[N, 2]`` (pixels of the drawing) joined by ``edges``."""
    for i, j in edges:
        if shown[i] and shown[j]:
            draw.line([tuple(points[i]), tuple(points[j])], fill=_colour(colours, min(i, j)), width=marks.line)


def draw_errors(draw: ImageDraw.ImageDraw, pred: np.ndarray, truth: np.ndarray, shown: np.ndarray,
                marks: Marks) -> None:
    """White lines from each shown prediction to its ground truth (both ``[N, 2]`` pixels)."""
    for n in np.flatnonzero(shown):
        draw.line([tuple(pred[n]), tuple(truth[n])], fill=WHITE, width=marks.error_line)


def draw_keypoints(draw: ImageDraw.ImageDraw, points: np.ndarray, shown: np.ndarray, colours: np.ndarray,
                   marks: Marks, kind: str) -> None:
    """Markers of ``kind`` ``"support"`` (disc with a white rim), ``"truth"`` (ring) or ``"prediction"``
    (cross with a black rim) at the shown keypoints ``points`` ``[N, 2]`` (pixels of the drawing).

    Raises:
        ValueError: an unknown ``kind``.
    """
    r = marks.radius
    for n in np.flatnonzero(shown):
        (x, y), c = points[n], _colour(colours, n)
        box = [x - r, y - r, x + r, y + r]
        if kind == "support":
            draw.ellipse(box, fill=c, outline=WHITE, width=max(1, marks.line // 2))
        elif kind == "truth":
            draw.ellipse([x - r - 1, y - r - 1, x + r + 1, y + r + 1], outline=BLACK, width=marks.line + 2)
            draw.ellipse(box, outline=c, width=marks.line)
        elif kind == "prediction":
            arms = [[(x - r, y - r), (x + r, y + r)], [(x - r, y + r), (x + r, y - r)]]
            for arm in arms:
                draw.line(arm, fill=BLACK, width=marks.line + 3)
            for arm in arms:
                draw.line(arm, fill=c, width=marks.line + 1)
        else:
            raise ValueError(f"kind {kind!r} is not 'support', 'truth' or 'prediction'")


def _flow(items: list[tuple[str, object]], width: int, marks: Marks) -> Image.Image:
    """Legend entries laid out left to right, wrapped at ``width``: ``(text, sample)`` where sample is a mark kind,
    ``"error"``, ``"skeleton"``, an RGB colour (a swatch) or None (text alone)."""
    font, h, gap, r = marks.font(), marks.caption, marks.gap, marks.radius
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    sample_w = 4 * r
    placed, x, y = [], gap, 0
    for text, sample in items:
        w = (sample_w + gap if sample is not None else 0) + int(probe.textlength(text, font=font))
        if x > gap and x + w > width - gap:
            x, y = gap, y + h
        placed.append((x, y, text, sample))
        x += w + 3 * gap
    canvas = Image.new("RGB", (width, y + h + gap), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    colours = np.array([SAMPLE], np.uint8)
    for x, y, text, sample in placed:
        cy = y + h / 2
        if sample is not None:
            left, right = np.array([[x + r, cy]]), np.array([[x + sample_w - r, cy]])
            if sample in ("support", "truth", "prediction"):
                draw_keypoints(draw, np.array([[x + sample_w / 2, cy]]), np.ones(1, bool), colours, marks, sample)
            elif sample == "error":
                draw_errors(draw, left, right, np.ones(1, bool), marks)
            elif sample == "skeleton":
                draw_skeleton(draw, np.concatenate([left, right]), np.ones(2, bool), [(0, 1)], colours, marks)
            else:
                draw_keypoints(draw, np.array([[x + sample_w / 2, cy]]), np.ones(1, bool),
                               np.array([sample], np.uint8), marks, "support")
            x += sample_w + gap
        draw.text((x, cy), text, fill=TEXT, font=font, anchor="lm")
    return canvas


def legend(width: int, marks: Marks, kinds: Sequence[str], note: str | None = None,
           names: Sequence[str] | None = None, colours: np.ndarray | None = None) -> Image.Image:
    """The legend strip: a sample and :data:`LEGEND`'s text for each of ``kinds``, then ``note``, then (when given)
    each keypoint's name beside a disc of its colour (``colours`` ``[N, 3]``)."""
    items: list[tuple[str, object]] = [(LEGEND[k], k) for k in kinds]
    if note:
        items.append((note, None))
    if names is not None:
        items += [(name, tuple(int(c) for c in colours[n])) for n, name in enumerate(names)]
    return _flow(items, width, marks)


def _stack(parts: list[Image.Image]) -> Image.Image:
    """Images one under the other, left-aligned, on the background."""
    canvas = Image.new("RGB", (max(p.width for p in parts), sum(p.height for p in parts)), BACKGROUND)
    y = 0
    for p in parts:
        canvas.paste(p, (0, y))
        y += p.height
    return canvas


def tile_origin(row: int, col: int, tile: int) -> tuple[int, int]:
    """Top-left pixel (x, y) of the crop in grid cell (row, col) of :func:`pose_grid`, below the row's title and
    the tile's caption."""
    m = Marks(tile)
    return m.gap + col * (tile + m.gap), m.gap + row * (2 * m.caption + tile + m.gap) + 2 * m.caption


def _edges(adjacency: torch.Tensor | None) -> list[tuple[int, int]]:
    if adjacency is None:
        return []
    return [(int(i), int(j)) for i, j in torch.nonzero(torch.triu(adjacency.bool(), 1)).tolist()]


def _crop_tile(image: torch.Tensor, marks: Marks, colours: np.ndarray, edges: list[tuple[int, int]],
               truth: np.ndarray, truth_shown: np.ndarray, pred: np.ndarray | None = None,
               pred_shown: np.ndarray | None = None) -> Image.Image:
    """One crop, ``marks.tile`` pixels square, with its keypoints (normalised ``[N, 2]``; ``*_shown`` ``[N]`` bool):
    a support's (``pred`` None) or a query's ground truth and prediction. Drawing on the tile alone clips whatever
    falls outside the crop."""
    canvas = Image.fromarray(denormalise(image)).resize((marks.tile, marks.tile), Image.BILINEAR)
    draw = ImageDraw.Draw(canvas)
    truth = truth * marks.tile
    if pred is None:
        draw_skeleton(draw, truth, truth_shown, edges, colours, marks)
        draw_keypoints(draw, truth, truth_shown, colours, marks, "support")
        return canvas
    pred = pred * marks.tile
    draw_skeleton(draw, pred, pred_shown, edges, colours, marks)
    draw_errors(draw, pred, truth, pred_shown & truth_shown, marks)
    draw_keypoints(draw, truth, truth_shown, colours, marks, "truth")
    draw_keypoints(draw, pred, pred_shown, colours, marks, "prediction")
    return canvas


def pose_grid(batch: dict[str, torch.Tensor], prediction: torch.Tensor, max_episodes: int = 2, max_queries: int = 3,
              tile: int = 192, category_names: Mapping[int, str] | None = None,
              query_pck: np.ndarray | None = None) -> Image.Image:
    """Draw the first episodes of a batch, one row each: a title (category name and id, shots, keypoints), the
    K support crops, then the query crops captioned with their PCK; the legend below (see the module docstring).

    Args:
        batch: :func:`utils.data.cape.mp100.collate_episodes` tensors: ``support_image`` ``[B, K, 3, S, S]``,
            ``support_keypoints`` ``[B, K, N, 2]``, ``support_visible`` ``[B, K, N]``, ``query_image``,
            ``query_keypoints``, ``query_visible``, ``keypoint_mask`` ``[B, N]``, if present ``category_id``
            ``[B]`` and ``adjacency`` ``[B, N, N]`` bool (the skeleton; without it no lines are drawn).
        prediction: ``[B, Q, N, 2]`` normalised (e.g. ``outputs["refined"][-1]``); drawn where the keypoint is
            real and visible in every support (the keypoints the model predicts).
        max_episodes, max_queries: how many rows and query tiles per row. tile: tile side in pixels; marks and
            text scale with it.
        category_names: category id -> name (``MP100Split.categories``), for the row titles.
        query_pck: ``[B, Q]`` per-query PCK@0.2 in percent (e.g. ``100 * utils.eval.pck.batch_pck(...)``), for
            the query captions.

    Returns:
        An RGB PIL image.
    """
    marks = Marks(tile)
    font = marks.font(fit="query 9: PCK@0.2 100.0%")
    episodes = min(max_episodes, batch["support_image"].shape[0])
    k, queries = batch["support_image"].shape[1], min(max_queries, batch["query_image"].shape[1])
    width = marks.gap + (k + queries) * (tile + marks.gap)
    canvas = Image.new("RGB", (width, tile_origin(episodes, 0, tile)[1] - 2 * marks.caption), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    host = {key: value.detach().cpu() for key, value in batch.items() if isinstance(value, torch.Tensor)}
    prediction = prediction.detach().float().cpu().numpy()
    for b in range(episodes):
        real = host["keypoint_mask"][b].numpy()
        colours = np.zeros((len(real), 3), np.uint8)
        colours[:real.sum()] = keypoint_colours(int(real.sum()))  # padding comes last (collate_episodes)
        edges = _edges(host["adjacency"][b] if "adjacency" in host else None)
        predicted = real & host["support_visible"][b].all(0).numpy()
        title = f"episode {b + 1}"
        if "category_id" in host:
            cid = int(host["category_id"][b])
            name = (category_names or {}).get(cid)
            title = f"{name} (category {cid})" if name else f"category {cid}"
        x, y = tile_origin(b, 0, tile)
        draw.text((x, y - 2 * marks.caption), f"{title}: {k}-shot, {int(real.sum())} keypoints", fill=TEXT,
                  font=font)
        tiles = [(f"support {s + 1}", _crop_tile(host["support_image"][b, s], marks, colours, edges,
                                                 host["support_keypoints"][b, s].numpy(),
                                                 real & host["support_visible"][b, s].numpy()))
                 for s in range(k)]
        tiles += [(f"query {q + 1}" + ("" if query_pck is None else f": PCK@0.2 {float(query_pck[b][q]):.1f}%"),
                   _crop_tile(host["query_image"][b, q], marks, colours, edges, host["query_keypoints"][b, q].numpy(),
                              real & host["query_visible"][b, q].numpy(), prediction[b, q], predicted))
                  for q in range(queries)]
        for col, (caption, picture) in enumerate(tiles):
            x, y = tile_origin(b, col, tile)
            canvas.paste(picture, (x, y))
            draw.text((x, y - marks.caption), caption, fill=TEXT, font=font)
    note = "colour: keypoint index, the same in every tile of a row; unseen by a support: not predicted"
    return _stack([canvas, legend(width, marks, list(LEGEND), note)])


def _panel(image: Image.Image, height: int) -> tuple[Image.Image, float]:
    """``image`` in RGB scaled to ``height`` pixels high (aspect kept), and the scale factor."""
    scale = height / image.height
    return image.convert("RGB").resize((max(1, round(image.width * scale)), height), Image.BILINEAR), scale


def prediction_picture(supports: Sequence[tuple[Image.Image, np.ndarray, np.ndarray]], query: Image.Image,
                       pred: np.ndarray, pred_shown: np.ndarray, edges: Sequence[tuple[int, int]] = (),
                       names: Sequence[str] | None = None, captions: Sequence[str] | None = None,
                       height: int = 384) -> Image.Image:
    """The supports with their keypoints beside a query with its predicted keypoints, on the original images
    scaled to ``height`` pixels, with the skeleton and a legend (keypoint names by colour when given).

    Args:
        supports: per support, ``(image, keypoints [N, 2] original pixels, visible [N] bool)``.
        query: the query image. pred: ``[N, 2]`` predictions in the query's original pixels. pred_shown: ``[N]``
            bool, the keypoints predicted (visible in every support).
        edges: skeleton, 0-based keypoint pairs. names: ``N`` keypoint names, listed in the legend.
        captions: one caption per panel (supports, then the query); default ``support i`` / ``query``.
        height: panel height in pixels; marks and text scale with it.

    Returns:
        An RGB PIL image.
    """
    marks = Marks(height)
    n = len(pred)
    colours = keypoint_colours(n)
    captions = captions or [f"support {s + 1}" for s in range(len(supports))] + ["query"]
    panels = []
    for image, points, visible in supports:
        panel, scale = _panel(image, height)
        draw = ImageDraw.Draw(panel)
        draw_skeleton(draw, points * scale, visible, edges, colours, marks)
        draw_keypoints(draw, points * scale, visible, colours, marks, "support")
        panels.append(panel)
    panel, scale = _panel(query, height)
    draw = ImageDraw.Draw(panel)
    draw_skeleton(draw, pred * scale, pred_shown, edges, colours, marks)
    draw_keypoints(draw, pred * scale, pred_shown, colours, marks, "prediction")
    panels.append(panel)
    width = marks.gap + sum(p.width + marks.gap for p in panels)
    canvas = Image.new("RGB", (width, marks.caption + height + marks.gap), BACKGROUND)
    draw, x, font = ImageDraw.Draw(canvas), marks.gap, marks.font()
    for caption, panel in zip(captions, panels):
        draw.text((x, 0), caption, fill=TEXT, font=font)
        canvas.paste(panel, (x, marks.caption))
        x += panel.width + marks.gap
    note = "colour: keypoint index, the same in every panel; unseen by a support: not predicted"
    return _stack([canvas, legend(width, marks, ["support", "prediction", "skeleton"], note, names, colours)])
