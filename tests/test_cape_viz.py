"""Pose pictures (utils/viz/pose.py): grid size, un-normalisation, what is drawn where (by pixel colour), captions,
the legend, marks that scale with the tile, and the prediction picture of scripts/predict_pose.py."""

import numpy as np
import torch
from PIL import Image

from utils.data.cape.mp100 import IMAGENET_MEAN, IMAGENET_STD
from utils.viz.pose import (BACKGROUND, SAMPLE, Marks, denormalise, keypoint_colours, pose_grid, prediction_picture,
                            tile_origin)

TILE = 96
RED, GREEN, BLUE, BLACK, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (0, 0, 0), (255, 255, 255)


def black_batch():
    """One episode of category 7, one support and one query, all-black crops, 3 keypoints with the skeleton 0-1."""
    black = torch.tensor(-IMAGENET_MEAN / IMAGENET_STD).view(3, 1, 1).expand(3, 32, 32)
    points = torch.tensor([[0.25, 0.25], [0.75, 0.25], [0.5, 0.75]])
    adjacency = torch.zeros(1, 3, 3, dtype=torch.bool)
    adjacency[0, 0, 1] = adjacency[0, 1, 0] = True
    return {"support_image": black[None, None].clone(), "query_image": black[None, None].clone(),
            "support_keypoints": points[None, None].clone(), "query_keypoints": points[None, None].clone(),
            "support_visible": torch.tensor([[[True, True, False]]]),
            "query_visible": torch.tensor([[[True, True, True]]]),
            "keypoint_mask": torch.ones(1, 3, dtype=torch.bool), "adjacency": adjacency,
            "category_id": torch.tensor([7])}


def pixel(array, origin, x, y):
    return tuple(array[origin[1] + y, origin[0] + x].tolist())


def colours_near(array, origin, x, y, radius):
    x, y = origin[0] + x, origin[1] + y
    patch = array[y - radius: y + radius + 1, x - radius: x + radius + 1]
    return {tuple(c) for c in patch.reshape(-1, 3).tolist()}


def test_grid_size_and_pixel_format():
    batch = {k: torch.cat([v] * 3) for k, v in black_batch().items()}        # 3 episodes
    batch["query_image"] = torch.cat([batch["query_image"]] * 4, 1)          # 4 queries each
    for key in ("query_keypoints", "query_visible"):
        batch[key] = torch.cat([batch[key]] * 4, 1)
    image = pose_grid(batch, batch["query_keypoints"], max_episodes=2, max_queries=3, tile=TILE)
    marks = Marks(TILE)
    assert image.size[0] == marks.gap + 4 * (TILE + marks.gap) and image.mode == "RGB"
    below_rows = tile_origin(2, 0, TILE)[1] - 2 * marks.caption
    assert image.size[1] > below_rows  # the legend comes under the two rows
    array = np.asarray(image)
    assert array.shape == (image.size[1], image.size[0], 3) and array.dtype == np.uint8
    assert tuple(array[0, 0].tolist()) == BACKGROUND


def test_denormalise_inverts_the_imagenet_normalisation():
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3)).astype(np.uint8)
    normalised = torch.tensor(((rgb / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1), dtype=torch.float32)
    assert np.array_equal(denormalise(normalised), rgb)


def test_keypoints_skeleton_prediction_and_error_lines_are_drawn():
    assert keypoint_colours(3).tolist() == [list(RED), list(GREEN), list(BLUE)]
    batch = black_batch()
    prediction = torch.tensor([[[[0.25, 0.6], [0.75, 0.6], [0.5, 0.9]]]])
    array = np.asarray(pose_grid(batch, prediction, tile=TILE))
    support, query = tile_origin(0, 0, TILE), tile_origin(0, 1, TILE)

    # Support: filled discs, the skeleton edge 0-1 in keypoint 0's colour, nothing for the keypoint it does not see.
    assert pixel(array, support, 24, 24) == RED and pixel(array, support, 72, 24) == GREEN
    assert RED in colours_near(array, support, 48, 24, 1) and GREEN not in colours_near(array, support, 48, 24, 1)
    assert colours_near(array, support, 48, 72, 5) == {BLACK}

    # Query: predictions as crosses (keypoint 2 is not predicted: unseen by the support), ground truth as rings in
    # the same colours, a white error line between them, the skeleton between the predictions.
    assert pixel(array, query, 24, 58) == RED and pixel(array, query, 72, 58) == GREEN
    assert colours_near(array, query, 48, 86, 2) == {BLACK}
    assert RED in colours_near(array, query, 24, 24, 4)
    assert pixel(array, query, 48, 72) == BLACK and BLUE in colours_near(array, query, 48, 72, 4)  # a hollow ring
    assert pixel(array, query, 24, 40) == WHITE
    assert RED in colours_near(array, query, 48, 58, 1) and colours_near(array, query, 48, 24, 1) == {BLACK}

    del batch["adjacency"]  # no skeleton known: no lines
    array = np.asarray(pose_grid(batch, prediction, tile=TILE))
    assert colours_near(array, support, 48, 24, 1) == {BLACK}


def test_titles_captions_and_the_legend_are_written():
    batch, prediction = black_batch(), black_batch()["query_keypoints"]
    plain = np.asarray(pose_grid(batch, prediction, tile=TILE))
    told = np.asarray(pose_grid(batch, prediction, tile=TILE, category_names={7: "okapi"},
                                query_pck=np.array([[66.7]])))
    query, marks = tile_origin(0, 1, TILE), Marks(TILE)
    caption = np.s_[query[1] - marks.caption: query[1], query[0]: query[0] + TILE]
    title = np.s_[query[1] - 2 * marks.caption: query[1] - marks.caption]
    assert (plain[caption] != told[caption]).any() and (plain[title] != told[title]).any()
    assert (plain[caption] != BACKGROUND).any()  # "query 1" even without a PCK
    legend = plain[tile_origin(1, 0, TILE)[1] - 2 * marks.caption:]
    assert (legend == SAMPLE).all(-1).any() and (legend == WHITE).all(-1).any()  # sample marks, the error line


def test_marks_scale_with_the_tile():
    small, large = Marks(96), Marks(384)
    assert large.radius == 4 * small.radius and large.line > small.line and large.font_size > small.font_size
    batch = black_batch()
    red = [(np.asarray(pose_grid(batch, batch["query_keypoints"], tile=t)) == RED).all(-1).sum() for t in (96, 384)]
    assert red[1] > 8 * red[0]  # areas grow with the square of the side


def test_prediction_picture_draws_supports_the_query_and_names():
    support = Image.new("RGB", (200, 100), BLACK)
    query = Image.new("RGB", (100, 100), BLACK)
    points = np.array([[50.0, 50.0], [150.0, 50.0]])
    picture = prediction_picture([(support, points, np.array([True, True]))], query, np.array([[25.0, 25.0],
                                 [75.0, 75.0]]), np.array([True, False]), edges=[(0, 1)], names=["nose", "tail"],
                                 height=200)
    array, marks, cyan = np.asarray(picture), Marks(200), tuple(keypoint_colours(2)[1].tolist())
    top = marks.caption
    assert pixel(array, (marks.gap, top), 100, 100) == RED and pixel(array, (marks.gap, top), 300, 100) == cyan
    assert pixel(array, (marks.gap, top), 200, 100) == RED  # the skeleton between the support's keypoints
    q = (marks.gap + 400 + marks.gap, top)
    assert pixel(array, q, 50, 50) == RED and colours_near(array, q, 150, 150, 6) == {BLACK}  # 1 is not predicted
    below = array[top + 200:]
    assert (below == cyan).all(-1).any()  # the name list shows keypoint 1's colour
