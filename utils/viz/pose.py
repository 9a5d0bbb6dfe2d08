"""Pictures of CAPE episodes: supports with their keypoints, queries with ground truth and prediction.

One row per episode: the K support crops, then the query crops. Each keypoint index has one colour in every
tile of a row (evenly spaced hues), so a support keypoint and its prediction on a query match by colour.

- ground truth: a ring (hollow circle) in the keypoint's colour;
- prediction: a filled disc in the keypoint's colour with a black outline, joined to its ground truth by a thin
  white line (the error);
- skeleton: on a support, lines between its ground-truth keypoints; on a query, between the predicted ones;
  each line takes the colour of its lower-numbered keypoint.

Crops are ImageNet-normalised in the batch (``utils/data/mp100.py``) and are un-normalised for display.
:func:`pose_grid` returns the picture as an RGB PIL image (utils/run/metrics.MetricsWriter.log_images writes it
as a PNG and to TensorBoard).
"""

from __future__ import annotations

import colorsys

import numpy as np
import torch
from PIL import Image, ImageDraw

from utils.data.mp100 import IMAGENET_MEAN, IMAGENET_STD

GAP = 4              # pixels between tiles and around the grid
HEADER = 14          # caption strip above each tile
BACKGROUND = (40, 40, 40)
TEXT = (230, 230, 230)


def keypoint_colours(n: int) -> np.ndarray:
    """``[n, 3]`` uint8 RGB: fully saturated colours at evenly spaced hues, keypoint i at hue i / n."""
    return np.array([[round(255 * c) for c in colorsys.hsv_to_rgb(i / max(n, 1), 1.0, 1.0)] for i in range(n)],
                    np.uint8).reshape(n, 3)


def denormalise(image: torch.Tensor) -> np.ndarray:
    """An ImageNet-normalised crop ``[3, S, S]`` float -> ``[S, S, 3]`` uint8 RGB."""
    rgb = image.detach().float().cpu().numpy().transpose(1, 2, 0) * IMAGENET_STD + IMAGENET_MEAN
    return (np.clip(rgb, 0, 1) * 255 + 0.5).astype(np.uint8)


def tile_origin(row: int, col: int, tile: int) -> tuple[int, int]:
    """Top-left pixel (x, y) of the crop in grid cell (row, col), below its caption."""
    return GAP + col * (tile + GAP), GAP + row * (tile + HEADER + GAP) + HEADER


def _edges(adjacency: torch.Tensor | None) -> list[tuple[int, int]]:
    if adjacency is None:
        return []
    return [(int(i), int(j)) for i, j in torch.nonzero(torch.triu(adjacency.bool(), 1)).tolist()]


def _draw_tile(image: torch.Tensor, tile: int, colours: np.ndarray, edges: list[tuple[int, int]],
               truth: np.ndarray, truth_shown: np.ndarray, pred: np.ndarray | None = None,
               pred_shown: np.ndarray | None = None) -> Image.Image:
    """One crop, ``tile`` pixels square, with its keypoints (normalised ``[N, 2]``; ``*_shown`` ``[N]`` bool).
    Drawing on the tile alone clips whatever falls outside the crop."""
    canvas = Image.fromarray(denormalise(image)).resize((tile, tile), Image.BILINEAR)
    draw = ImageDraw.Draw(canvas)
    radius = max(3, tile // 48)

    def px(p: np.ndarray) -> tuple[float, float]:
        return float(p[0]) * tile, float(p[1]) * tile

    skeleton, skeleton_shown = (pred, pred_shown) if pred is not None else (truth, truth_shown)
    for i, j in edges:
        if skeleton_shown[i] and skeleton_shown[j]:
            draw.line([px(skeleton[i]), px(skeleton[j])], fill=tuple(colours[i].tolist()), width=2)
    if pred is not None:
        for n in np.flatnonzero(pred_shown & truth_shown):
            draw.line([px(pred[n]), px(truth[n])], fill=(255, 255, 255), width=1)
    for n in np.flatnonzero(truth_shown):
        (x, y), c = px(truth[n]), tuple(colours[n].tolist())
        draw.ellipse([x - radius - 1, y - radius - 1, x + radius + 1, y + radius + 1], outline=c, width=2)
    if pred is not None:
        for n in np.flatnonzero(pred_shown):
            (x, y), c = px(pred[n]), tuple(colours[n].tolist())
            draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=c, outline=(0, 0, 0))
    return canvas


def pose_grid(batch: dict[str, torch.Tensor], prediction: torch.Tensor, max_episodes: int = 2, max_queries: int = 3,
              tile: int = 192) -> Image.Image:
    """Draw the first episodes of a batch (see the module docstring).

    Args:
        batch: :func:`utils.data.mp100.collate_episodes` tensors: ``support_image`` ``[B, K, 3, S, S]``,
            ``support_keypoints`` ``[B, K, N, 2]``, ``support_visible`` ``[B, K, N]``, ``query_image``,
            ``query_keypoints``, ``query_visible``, ``keypoint_mask`` ``[B, N]`` and, if present, ``adjacency``
            ``[B, N, N]`` bool (the skeleton; without it no lines are drawn).
        prediction: ``[B, Q, N, 2]`` normalised (e.g. ``outputs["refined"][-1]``); drawn where the keypoint is
            real and visible in every support (the keypoints the model predicts).
        max_episodes, max_queries: how many rows and query tiles per row. tile: tile side in pixels.

    Returns:
        An RGB PIL image.
    """
    episodes = min(max_episodes, batch["support_image"].shape[0])
    k, queries = batch["support_image"].shape[1], min(max_queries, batch["query_image"].shape[1])
    width = GAP + (k + queries) * (tile + GAP)
    height = GAP + episodes * (tile + HEADER + GAP)
    canvas = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    host = {key: value.detach().cpu() for key, value in batch.items() if isinstance(value, torch.Tensor)}
    prediction = prediction.detach().float().cpu().numpy()
    for b in range(episodes):
        real = host["keypoint_mask"][b].numpy()
        colours = np.zeros((len(real), 3), np.uint8)
        colours[:real.sum()] = keypoint_colours(int(real.sum()))  # padding comes last (collate_episodes)
        edges = _edges(host["adjacency"][b] if "adjacency" in host else None)
        predicted = real & host["support_visible"][b].all(0).numpy()
        tiles = [(f"support {s + 1}", _draw_tile(host["support_image"][b, s], tile, colours, edges,
                                                 host["support_keypoints"][b, s].numpy(),
                                                 real & host["support_visible"][b, s].numpy()))
                 for s in range(k)]
        tiles += [(f"query {q + 1}: o truth, * prediction",
                   _draw_tile(host["query_image"][b, q], tile, colours, edges, host["query_keypoints"][b, q].numpy(),
                              real & host["query_visible"][b, q].numpy(), prediction[b, q], predicted))
                  for q in range(queries)]
        for col, (caption, picture) in enumerate(tiles):
            x, y = tile_origin(b, col, tile)
            canvas.paste(picture, (x, y))
            draw.text((x + 2, y - HEADER + 1), caption, fill=TEXT)
    return canvas
