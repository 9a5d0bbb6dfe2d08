"""CAPE on a user's own images: read the support keypoints file, crop like the evaluation loader, predict, map back.

The support keypoints file (JSON), one entry per support image, in the order the images are given::

    {"supports": [{"keypoints": [[x, y], ...],      # N points, original pixels of that image
                   "visible": [1, 0, ...],          # optional, N values: 0/false = not annotated
                   "bbox": [x, y, w, h]},           # optional, the object's box in pixels; default: the whole image
                  ...],
     "skeleton": [[i, j], ...],                     # optional, 0-based keypoint pairs
     "names": ["nose", ...]}                        # optional, N keypoint names

Pixel coordinates are those of COCO and MP-100 (x right, y down, (0, 0) the top-left corner of the image as
stored; EXIF orientation is not applied). Every support needs the same N. A crop is what the evaluation loader
makes of an instance (``utils/data/cape/mp100.py`` ``load_instance``): the box, cleaned as the reference cleans it,
squared and enlarged by 1.25, warped to the model's ``image_size``; queries are cropped around the whole image.
A keypoint is predicted only when it is visible in every support (the model's rule, as in the protocol).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from utils.data.cape.mp100 import Instance, clean_bbox, collate_episodes, crop_to_original, load_instance
from utils.errors import UserError

SUPPORT_FIELDS = ("keypoints", "visible", "bbox")
TOP_FIELDS = ("supports", "skeleton", "names")


class PoseInputError(UserError):
    """An input image or the support keypoints file is missing, unreadable or malformed."""


@dataclass(frozen=True)
class SupportPoses:
    """The support keypoints file, checked: per support ``keypoints`` [N, 2] float32 original pixels, ``visible``
    [N] bool and ``bbox`` (x, y, w, h) or None; ``skeleton`` 0-based pairs; ``names`` N strings or None."""

    keypoints: list[np.ndarray]
    visible: list[np.ndarray]
    bboxes: list[tuple[float, float, float, float] | None]
    skeleton: tuple[tuple[int, int], ...]
    names: tuple[str, ...] | None

    @property
    def num_keypoints(self) -> int:
        return len(self.keypoints[0])

    def predicted(self) -> np.ndarray:
        """[N] bool: the keypoints visible in every support, the ones the model predicts."""
        return np.stack(self.visible).all(0)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_support_poses(path: str | Path, num_images: int) -> SupportPoses:
    """Read and check the support keypoints file (format in the module docstring).

    Args:
        path: the JSON file. num_images: how many support images were given (the file needs one entry each).

    Raises:
        PoseInputError: one line naming the file, the position in it (e.g. ``supports[1].keypoints[3]``) and what
            is wrong: not JSON, a wrong shape or type, an unknown field, keypoint counts that differ, a skeleton
            pair out of range, or no keypoint visible in every support.
    """
    path = Path(path)
    fail = functools.partial(_format_error, path)
    if not path.is_file():
        raise PoseInputError(f"--support-keypoints {path} not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PoseInputError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("supports"), list):
        raise fail("the top level", 'is not an object with a "supports" list')
    unknown = sorted(set(data) - set(TOP_FIELDS))
    if unknown:
        raise fail("the top level", f"has unknown field(s) {unknown}; the fields are {list(TOP_FIELDS)}")
    entries = data["supports"]
    if len(entries) != num_images:
        raise fail('"supports"', f"has {len(entries)} entries, but {num_images} --support image(s) were given; "
                                 "give one entry per support image, in the same order")
    keypoints, visible, bboxes = [], [], []
    for s, entry in enumerate(entries):
        points, flags, box = _read_support(fail, f"supports[{s}]", entry, len(keypoints[0]) if keypoints else None)
        keypoints.append(points)
        visible.append(flags)
        bboxes.append(box)
    skeleton, names = _read_skeleton_and_names(fail, data, len(keypoints[0]))
    poses = SupportPoses(keypoints, visible, bboxes, skeleton, names)
    if not poses.predicted().any():
        raise fail('"supports"', "have no keypoint visible in every support: there is nothing to predict")
    return poses


def _format_error(path: Path, where: str, problem: str) -> PoseInputError:
    """The one-line error for ``problem`` at ``where`` (e.g. ``supports[1].keypoints[3]``) in ``path``."""
    return PoseInputError(f"{path}: {where} {problem} (see python scripts/predict_pose.py --help for the format)")


def _read_support(fail, where: str, entry, count: int | None
                  ) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float, float] | None]:
    """One ``supports`` entry checked: keypoints float32 [K, 2], visible bool [K] and the bbox (or None);
    ``count`` is the keypoint count of the first support, which every other one must have."""
    if not isinstance(entry, dict) or "keypoints" not in entry:
        raise fail(where, 'is not an object with "keypoints"')
    unknown = sorted(set(entry) - set(SUPPORT_FIELDS))
    if unknown:
        raise fail(where, f"has unknown field(s) {unknown}; the fields are {list(SUPPORT_FIELDS)}")
    points = entry["keypoints"]
    if not isinstance(points, list) or not points:
        raise fail(f"{where}.keypoints", "is not a non-empty list of [x, y] points")
    for j, p in enumerate(points):
        if not (isinstance(p, list) and len(p) == 2 and all(map(_finite, p))):
            raise fail(f"{where}.keypoints[{j}]", f"= {p!r} is not [x, y] with two finite numbers")
    if count is not None and len(points) != count:
        raise fail(f"{where}.keypoints", f"has {len(points)} points but supports[0] has {count}; "
                                         "every support needs the same keypoints")
    flags = entry.get("visible", [1] * len(points))
    if not (isinstance(flags, list) and len(flags) == len(points)
            and all(isinstance(v, bool) or _finite(v) for v in flags)):
        raise fail(f"{where}.visible", f"is not a list of {len(points)} booleans or numbers (0 = not annotated)")
    box = entry.get("bbox")
    if box is not None and not (isinstance(box, list) and len(box) == 4 and all(map(_finite, box))
                                and box[2] > 0 and box[3] > 0):
        raise fail(f"{where}.bbox", f"= {box!r} is not [x, y, w, h] with w, h > 0")
    return (np.array(points, np.float32), np.array([bool(v) and v > 0 for v in flags]),
            None if box is None else tuple(float(v) for v in box))


def _read_skeleton_and_names(fail, data: dict, n: int) -> tuple[tuple[tuple[int, int], ...], tuple[str, ...] | None]:
    """The file's ``skeleton`` (pairs of 0-based indices below ``n``; default none) and ``names`` (or None)."""
    skeleton = data.get("skeleton", [])
    if not isinstance(skeleton, list):
        raise fail('"skeleton"', "is not a list of [i, j] pairs")
    for e, pair in enumerate(skeleton):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(i, int) and not isinstance(i, bool)
                                                                   and 0 <= i < n for i in pair)):
            raise fail(f"skeleton[{e}]", f"= {pair!r} is not a pair of 0-based keypoint indices in 0..{n - 1}")
    names = data.get("names")
    if names is not None and not (isinstance(names, list) and len(names) == n and all(isinstance(x, str) for x in names)):
        raise fail('"names"', f"is not a list of {n} strings (one per keypoint)")
    return tuple((i, j) for i, j in skeleton), None if names is None else tuple(names)


def image_size_of(path: str | Path, what: str) -> tuple[int, int]:
    """(width, height) of an image file, read whole so a cut-off file fails here, before any work.

    Args:
        what: how the user gave it, for the message (e.g. ``"--query image 2"``).

    Raises:
        PoseInputError: the file is missing or is not a readable image.
    """
    path = Path(path)
    if not path.is_file():
        raise PoseInputError(f"{what} {path} not found")
    try:
        with Image.open(path) as im:
            im.load()
            return im.size
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise PoseInputError(f"{what} {path} cannot be read as an image ({e})") from None


def user_instance(index: int, image: str | Path, size: tuple[int, int], bbox: tuple[float, float, float, float] | None,
                  keypoints: np.ndarray, visible: np.ndarray, what: str) -> Instance:
    """An :class:`Instance` for ``load_instance``: the box cleaned as the reference cleans it (the whole image when
    ``bbox`` is None); ``keypoints`` [N, 2] original pixels, ``visible`` [N] bool (all False for a query).

    Raises:
        PoseInputError: the box lies outside the image (nothing left after cleaning), or a visible keypoint does.
    """
    width, height = size
    clean = clean_bbox(bbox or (0.0, 0.0, float(width), float(height)), width, height)
    if clean is None and bbox is None:
        raise PoseInputError(f"{what}: the image is {width} x {height} pixels; an image needs at least 2 x 2 (the "
                             "reference's box rule keeps width - 1 by height - 1 pixels)")
    if clean is None:
        raise PoseInputError(f"{what}: the bbox {list(bbox)} leaves nothing of the {width} x {height} image")
    outside = np.flatnonzero(visible & ((keypoints < 0).any(1) | (keypoints[:, 0] > width) | (keypoints[:, 1] > height)))
    if len(outside):
        raise PoseInputError(f"{what}: keypoint {int(outside[0])} at {keypoints[outside[0]].tolist()} lies outside the "
                             f"{width} x {height} image; keypoints are in the image's pixels")
    return Instance(index, 0, Path(image), clean, keypoints.astype(np.float32), visible.astype(bool))


@torch.no_grad()
def predict_keypoints(model: torch.nn.Module, supports: list[Instance], queries: list[Instance],
                      adjacency: np.ndarray, image_size: int, device: torch.device,
                      batch_size: int = 8) -> np.ndarray:
    """Predict the supports' keypoints on every query, as an evaluation episode does.

    Args:
        model: a CAPE model in eval mode on ``device`` (``models.cape.checkpoint.load_trained``).
        supports: K instances with keypoints. queries: Q instances (their keypoints are not used).
        adjacency: [N, N] bool skeleton. image_size: the model's crop side (its ``architecture["image_size"]``).
        batch_size: queries per forward pass (one episode of the K supports and up to this many queries).

    Returns:
        [Q, N, 2] float64 predictions in each query's original pixels (meaningful where the keypoint is visible in
        every support; see :meth:`SupportPoses.predicted`). They may fall outside the image by up to the crop's
        margin, since the crop is the box enlarged by 1.25.
    """
    shots = [load_instance(inst, image_size) for inst in supports]
    out = []
    for start in range(0, len(queries), batch_size):
        crops = [load_instance(inst, image_size) for inst in queries[start:start + batch_size]]
        episode = {"adjacency": adjacency}
        for prefix, items in (("support", shots), ("query", crops)):
            for key in ("image", "keypoints", "visible"):
                episode[f"{prefix}_{key}"] = np.stack([it[key] for it in items])
        batch = {k: v.to(device) for k, v in collate_episodes([episode]).items()}
        pred = model(batch["support_image"], batch["support_keypoints"], batch["support_visible"],
                     batch["query_image"], batch["keypoint_mask"], batch["adjacency"])["refined"][-1].float().cpu()
        to_orig = torch.as_tensor(np.stack([it["crop_to_orig"] for it in crops]))[None]
        out.append(crop_to_original(pred, to_orig, image_size)[0].numpy())
    return np.concatenate(out)
