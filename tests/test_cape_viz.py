"""Pose pictures (utils/viz/pose.py): grid size, un-normalisation, and what is drawn where, by pixel colour."""

import numpy as np
import torch

from utils.data.mp100 import IMAGENET_MEAN, IMAGENET_STD
from utils.viz.pose import BACKGROUND, GAP, HEADER, denormalise, keypoint_colours, pose_grid, tile_origin

TILE = 96
RED, GREEN, BLUE, BLACK, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (0, 0, 0), (255, 255, 255)


def black_batch():
    """One episode, one support and one query, all-black crops, 3 keypoints with the skeleton 0-1."""
    black = torch.tensor(-IMAGENET_MEAN / IMAGENET_STD).view(3, 1, 1).expand(3, 32, 32)
    points = torch.tensor([[0.25, 0.25], [0.75, 0.25], [0.5, 0.75]])
    adjacency = torch.zeros(1, 3, 3, dtype=torch.bool)
    adjacency[0, 0, 1] = adjacency[0, 1, 0] = True
    return {"support_image": black[None, None].clone(), "query_image": black[None, None].clone(),
            "support_keypoints": points[None, None].clone(), "query_keypoints": points[None, None].clone(),
            "support_visible": torch.tensor([[[True, True, False]]]),
            "query_visible": torch.tensor([[[True, True, True]]]),
            "keypoint_mask": torch.ones(1, 3, dtype=torch.bool), "adjacency": adjacency}


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
    assert image.size == (GAP + 4 * (TILE + GAP), GAP + 2 * (TILE + HEADER + GAP)) and image.mode == "RGB"
    array = np.asarray(image)
    assert array.shape == (image.size[1], image.size[0], 3) and array.dtype == np.uint8
    assert tuple(array[0, 0].tolist()) == BACKGROUND


def test_denormalise_inverts_the_imagenet_normalisation():
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3)).astype(np.uint8)
    normalised = torch.tensor(((rgb / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1), dtype=torch.float32)
    assert np.array_equal(denormalise(normalised), rgb)


def test_keypoints_skeleton_and_prediction_are_drawn():
    assert keypoint_colours(3).tolist() == [list(RED), list(GREEN), list(BLUE)]
    batch = black_batch()
    prediction = torch.tensor([[[[0.25, 0.6], [0.75, 0.6], [0.5, 0.9]]]])
    array = np.asarray(pose_grid(batch, prediction, tile=TILE))
    support, query = tile_origin(0, 0, TILE), tile_origin(0, 1, TILE)

    # Support: ground truth as rings, the skeleton edge 0-1 in keypoint 0's colour, nothing for the keypoint the
    # support does not see.
    assert RED in colours_near(array, support, 24, 24, 4) and GREEN in colours_near(array, support, 72, 24, 4)
    assert RED in colours_near(array, support, 48, 24, 1) and GREEN not in colours_near(array, support, 48, 24, 1)
    assert colours_near(array, support, 48, 72, 5) == {BLACK}

    # Query: predictions as filled discs (keypoint 2 is not predicted: unseen by the support), ground truth as
    # rings in the same colours, a white error line between them, the skeleton between the predictions.
    assert pixel(array, query, 24, 58) == RED and pixel(array, query, 72, 58) == GREEN
    assert colours_near(array, query, 48, 86, 2) == {BLACK}
    assert RED in colours_near(array, query, 24, 24, 4)
    assert pixel(array, query, 48, 72) == BLACK and BLUE in colours_near(array, query, 48, 72, 4)  # a hollow ring
    assert pixel(array, query, 24, 40) == WHITE
    assert RED in colours_near(array, query, 48, 58, 1) and colours_near(array, query, 48, 24, 1) == {BLACK}

    del batch["adjacency"]  # no skeleton known: no lines
    array = np.asarray(pose_grid(batch, prediction, tile=TILE))
    assert colours_near(array, support, 48, 24, 1) == {BLACK}
