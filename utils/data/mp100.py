"""MP-100 (Xu et al., "Pose for Everything", arXiv 2207.10387) loading and episode sampling for CAPE.

On disk (the real dataset and ``scripts/build_synthetic_cape_dataset.py`` share it)::

    <data_root>/annotations/mp100_split{1..5}_{train,val,test}.json   COCO keypoint JSON
    <data_root>/images/<file_name>                                    ``file_name`` as in the JSON

Coordinates. Ground truth is kept twice: in **original image pixels** (PCK is measured there)
and in **normalised crop coordinates**: a crop is the instance's bbox, squared and enlarged by
``margin``, warped to ``image_size`` x ``image_size``; a point at crop pixel (x, y) has
normalised coordinates (x / image_size, y / image_size), so [0, 1] spans the crop edge to edge
and pixel i covers [i, i + 1) (its centre is i + 0.5). ``crop_to_orig`` [2, 3] maps crop
pixels back to original pixels. A keypoint is visible when its COCO flag v > 0, as in MP-100.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

SUBSETS = ("train", "val", "test")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


class MP100FormatError(ValueError):
    """An MP-100 annotation file or image folder is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class Category:
    """One MP-100 category. ``skeleton`` pairs are 1-indexed keypoint numbers, as stored in the JSON."""

    id: int
    name: str
    keypoint_names: tuple[str, ...]
    skeleton: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Instance:
    """One annotated object: ``bbox`` (x, y, w, h) and ``keypoints`` [N, 2] float32 in original pixels; ``visible`` [N] bool."""

    ann_id: int
    category_id: int
    image_path: Path
    bbox: tuple[float, float, float, float]
    keypoints: np.ndarray
    visible: np.ndarray


@dataclass
class MP100Split:
    """The categories and their instances from one annotation file (e.g. ``mp100_split1_train.json``)."""

    path: Path
    categories: dict[int, Category]
    instances: dict[int, list[Instance]]


@dataclass(frozen=True)
class Episode:
    """One CAPE episode: a category, K support and Q query instance indices into ``split.instances[category_id]``."""

    category_id: int
    support: tuple[int, ...]
    query: tuple[int, ...]


def annotation_path(data_root: str | Path, split: int, subset: str) -> Path:
    """``<data_root>/annotations/mp100_split{split}_{subset}.json``; split is 1..5, subset train/val/test."""
    if split not in range(1, 6) or subset not in SUBSETS:
        raise ValueError(f"split={split}, subset={subset!r}: MP-100 has splits 1..5 and subsets {SUBSETS}")
    return Path(data_root) / "annotations" / f"mp100_split{split}_{subset}.json"


def _require(obj: dict, keys: tuple[str, ...], where: str, path: Path) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise MP100FormatError(f"{path}: {where} lacks {missing}; MP-100 COCO JSON needs {list(keys)} there")


def load_split(path: str | Path, image_root: str | Path, check_images: bool = True) -> MP100Split:
    """Read one MP-100 COCO keypoint file. Annotations with no visible keypoint or an empty bbox are dropped.

    Raises:
        MP100FormatError: the file is missing or not JSON, a required key is missing, a keypoint
            list has the wrong length, an annotation names an unknown image or category, or
            (with ``check_images``) image files are missing under ``image_root``.
    """
    path, image_root = Path(path), Path(image_root)
    if not path.is_file():
        raise MP100FormatError(f"annotation file {path} not found: pass --data_root pointing at an MP-100 folder "
                               "(with annotations/ and images/), or build the synthetic one with "
                               "python scripts/build_synthetic_cape_dataset.py")
    try:
        with open(path, encoding="utf-8") as f:
            coco = json.load(f)
    except json.JSONDecodeError as e:
        raise MP100FormatError(f"{path} is not valid JSON ({e}); re-download or rebuild it") from e
    _require(coco, ("images", "annotations", "categories"), "the top level", path)

    categories = {}
    for c in coco["categories"]:
        _require(c, ("id", "name", "keypoints", "skeleton"), f"category {c.get('id', '?')}", path)
        categories[c["id"]] = Category(c["id"], c["name"], tuple(c["keypoints"]), tuple(tuple(e) for e in c["skeleton"]))
    images = {}
    for im in coco["images"]:
        _require(im, ("id", "file_name"), f"image {im.get('id', '?')}", path)
        images[im["id"]] = image_root / im["file_name"]

    instances: dict[int, list[Instance]] = {cid: [] for cid in categories}
    for a in coco["annotations"]:
        _require(a, ("id", "image_id", "category_id", "bbox", "keypoints"), f"annotation {a.get('id', '?')}", path)
        if a["category_id"] not in categories:
            raise MP100FormatError(f"{path}: annotation {a['id']} has category_id {a['category_id']}, not in 'categories'")
        if a["image_id"] not in images:
            raise MP100FormatError(f"{path}: annotation {a['id']} has image_id {a['image_id']}, not in 'images'")
        n = len(categories[a["category_id"]].keypoint_names)
        kps = np.asarray(a["keypoints"], np.float32)
        if kps.shape != (3 * n,):
            raise MP100FormatError(f"{path}: annotation {a['id']} has {kps.size} keypoint values; its category "
                                   f"{categories[a['category_id']].name!r} has {n} keypoints, so 3*{n} = {3 * n} are needed")
        kps = kps.reshape(n, 3)
        if len(a["bbox"]) != 4:
            raise MP100FormatError(f"{path}: annotation {a['id']} has bbox {a['bbox']}; COCO boxes are [x, y, width, height]")
        x, y, w, h = (float(v) for v in a["bbox"])
        if w <= 0 or h <= 0 or not (kps[:, 2] > 0).any():
            continue
        instances[a["category_id"]].append(
            Instance(a["id"], a["category_id"], images[a["image_id"]], (x, y, w, h), kps[:, :2].copy(), kps[:, 2] > 0))

    if check_images:
        missing = sorted({str(i.image_path) for insts in instances.values() for i in insts if not i.image_path.is_file()})
        if missing:
            raise MP100FormatError(f"{len(missing)} image file(s) named in {path} are missing under {image_root}, "
                                   f"e.g. {missing[0]}; download the MP-100 images into that folder")
    return MP100Split(path, categories, instances)


def load_mp100(data_root: str | Path, split: int, check_images: bool = True) -> dict[str, MP100Split]:
    """Load train/val/test of MP-100 split ``split`` (1..5) from ``data_root`` and check their categories are disjoint.

    Raises:
        MP100FormatError: see :func:`load_split` and :func:`check_disjoint`.
    """
    splits = {s: load_split(annotation_path(data_root, split, s), Path(data_root) / "images", check_images) for s in SUBSETS}
    check_disjoint(splits)
    return splits


def check_disjoint(splits: dict[str, MP100Split]) -> None:
    """CAPE evaluates on unseen categories, so no category may appear in two subsets.

    Raises:
        MP100FormatError: naming the shared categories and the two files.
    """
    names = list(splits)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = sorted(set(splits[a].categories) & set(splits[b].categories))
            if shared:
                cats = [splits[a].categories[c].name for c in shared[:5]]
                raise MP100FormatError(f"categories {cats} ({len(shared)} in all) are in both {splits[a].path.name} and "
                                       f"{splits[b].path.name}; CAPE needs disjoint train/val/test categories")


class EpisodeSampler:
    """Draws episodes: one category, then K supports and Q queries, all distinct instances of it.

    Categories with fewer than K + Q instances cannot form an episode and are left out.

    Raises:
        MP100FormatError: no category of the split has K + Q instances.
    """

    def __init__(self, split: MP100Split, shots: int, queries: int):
        self.split, self.shots, self.queries = split, shots, queries
        need = shots + queries
        self.category_ids = sorted(c for c, insts in split.instances.items() if len(insts) >= need)
        if not self.category_ids:
            raise MP100FormatError(f"{split.path}: no category has {need} instances for {shots} shot(s) + {queries} "
                                   "queries; lower --shots/--queries")

    def sample(self, rng: np.random.Generator, category_id: int | None = None) -> Episode:
        """A random episode (of ``category_id`` if given, else of a uniformly drawn category)."""
        cid = self.category_ids[int(rng.integers(len(self.category_ids)))] if category_id is None else category_id
        idx = rng.choice(len(self.split.instances[cid]), self.shots + self.queries, replace=False)
        return Episode(cid, tuple(int(i) for i in idx[:self.shots]), tuple(int(i) for i in idx[self.shots:]))

    def fixed_episodes(self, episodes_per_category: int, seed: int) -> list[Episode]:
        """The seeded evaluation set: ``episodes_per_category`` episodes for each category, the same on every call."""
        return [self.sample(np.random.default_rng([seed, cid, e]), cid)
                for cid in self.category_ids for e in range(episodes_per_category)]


@dataclass(frozen=True)
class Augmentation:
    """Training augmentation: crop scale in [1 - scale, 1 + scale], rotation in +-``rotation`` degrees,
    and brightness/contrast/saturation factors in [1 - colour, 1 + colour]."""

    scale: float = 0.15
    rotation: float = 15.0
    colour: float = 0.2


def crop_transform(bbox: tuple[float, float, float, float], image_size: int, margin: float = 1.25,
                   scale: float = 1.0, rotation_deg: float = 0.0) -> np.ndarray:
    """The affine [2, 3] mapping original pixels to crop pixels: centred on the bbox, side ``max(w, h) * margin * scale``,
    rotated by ``rotation_deg`` about the bbox centre (continuous coordinates, pixel centres at i + 0.5)."""
    x, y, w, h = bbox
    side = max(w, h) * margin * scale
    k = image_size / side
    t = math.radians(rotation_deg)
    a = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]]) * k
    centre = np.array([x + w / 2, y + h / 2])
    return np.concatenate([a, (image_size / 2 - a @ centre)[:, None]], 1)


def invert_affine(m: np.ndarray) -> np.ndarray:
    """Inverse of a [2, 3] affine map."""
    full = np.vstack([m, [0, 0, 1]])
    return np.linalg.inv(full)[:2]


def apply_affine(m: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply a [2, 3] affine to points [..., 2]."""
    return points @ m[:, :2].T + m[:, 2]


def _jitter_colour(img: np.ndarray, rng: np.random.Generator, amount: float) -> np.ndarray:
    """Random brightness, contrast and saturation on an [H, W, 3] float image in [0, 1]."""
    img = img * rng.uniform(1 - amount, 1 + amount)
    img = (img - img.mean()) * rng.uniform(1 - amount, 1 + amount) + img.mean()
    grey = img.mean(-1, keepdims=True)
    img = (img - grey) * rng.uniform(1 - amount, 1 + amount) + grey
    return np.clip(img, 0, 1)


def load_instance(inst: Instance, image_size: int, augment: Augmentation | None = None,
                  rng: np.random.Generator | None = None, margin: float = 1.25) -> dict[str, np.ndarray]:
    """Crop one instance to its bbox (with ``margin``), optionally augmented, and normalise it.

    Returns numpy arrays: ``image`` [3, S, S] float32 ImageNet-normalised; ``keypoints`` [N, 2] float32 in
    normalised crop coordinates; ``visible`` [N] bool (with augmentation, points pushed out of the crop are
    marked invisible); ``keypoints_orig`` [N, 2] original pixels; ``bbox_size`` float max(w, h) in original
    pixels; ``crop_to_orig`` [2, 3] affine from crop pixels to original pixels.

    Raises:
        MP100FormatError: the image cannot be read.
    """
    scale, rot = 1.0, 0.0
    if augment is not None:
        scale = rng.uniform(1 - augment.scale, 1 + augment.scale)
        rot = rng.uniform(-augment.rotation, augment.rotation)
    to_crop = crop_transform(inst.bbox, image_size, margin, scale, rot)
    to_orig = invert_affine(to_crop)
    try:
        with Image.open(inst.image_path) as im:
            # PIL's AFFINE takes the output->input map and samples at pixel centres, matching our convention.
            crop = im.convert("RGB").transform((image_size, image_size), Image.AFFINE, to_orig.flatten().tolist(),
                                               resample=Image.BILINEAR)
    except (OSError, ValueError) as e:
        raise MP100FormatError(f"cannot read image {inst.image_path} (annotation {inst.ann_id}): {e}") from e
    img = np.asarray(crop, np.float32) / 255.0
    if augment is not None and augment.colour > 0:
        img = _jitter_colour(img, rng, augment.colour)
    kps = apply_affine(to_crop, inst.keypoints) / image_size
    visible = inst.visible.copy()
    if augment is not None:
        visible &= np.all((kps >= 0) & (kps < 1), axis=1)
    return {
        "image": ((img - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1).astype(np.float32),
        "keypoints": kps.astype(np.float32),
        "visible": visible,
        "keypoints_orig": inst.keypoints.astype(np.float32),
        "bbox_size": np.float32(max(inst.bbox[2], inst.bbox[3])),
        "crop_to_orig": to_orig.astype(np.float32),
    }


class EpisodeDataset(Dataset):
    """Episodes as a torch Dataset; item i is one episode (see :func:`collate_episodes` for batching).

    With ``fixed`` episodes it serves those, in order (evaluation). Otherwise it serves ``num_episodes``
    random ones, episode i of epoch e drawn from ``rng([seed, e, start + i])``, so the stream does not
    depend on the worker count and a run resumed at episode ``start`` replays the rest exactly.
    """

    def __init__(self, split: MP100Split, sampler: EpisodeSampler, image_size: int, augment: Augmentation | None,
                 seed: int = 0, num_episodes: int = 0, fixed: list[Episode] | None = None, rank: int = 0,
                 world_size: int = 1):
        self.split, self.sampler, self.image_size, self.augment, self.seed = split, sampler, image_size, augment, seed
        # Under torchrun, rank r serves episodes r, r + W, r + 2W, ... of the one seeded stream,
        # so the ranks partition exactly the episodes a single process would draw.
        self.rank, self.world_size = rank, world_size
        self.fixed, self.num_episodes = fixed, num_episodes
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Serve epoch ``epoch`` from its episode ``start`` on (call before building the DataLoader iterator)."""
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return len(self.fixed) if self.fixed is not None else self.num_episodes - self.start

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng([self.seed, self.epoch, (self.start + i) * self.world_size + self.rank])
        ep = self.fixed[i] if self.fixed is not None else self.sampler.sample(rng)
        insts = self.split.instances[ep.category_id]
        sup = [load_instance(insts[j], self.image_size, self.augment, rng) for j in ep.support]
        qry = [load_instance(insts[j], self.image_size, self.augment, rng) for j in ep.query]
        out = {"category_id": ep.category_id}
        for prefix, items in (("support", sup), ("query", qry)):
            for key in ("image", "keypoints", "visible"):
                out[f"{prefix}_{key}"] = np.stack([it[key] for it in items])
        for key in ("keypoints_orig", "bbox_size", "crop_to_orig"):
            out[f"query_{key}"] = np.stack([it[key] for it in qry])
        return out


def collate_episodes(episodes: list[dict]) -> dict[str, torch.Tensor]:
    """Batch B episodes whose categories may have different keypoint counts, padding to the largest N.

    Returns tensors: ``support_image`` [B, K, 3, S, S], ``support_keypoints`` [B, K, N, 2], ``support_visible``
    [B, K, N] bool, ``query_image`` [B, Q, 3, S, S], ``query_keypoints`` [B, Q, N, 2], ``query_visible`` [B, Q, N],
    ``query_keypoints_orig`` [B, Q, N, 2], ``query_bbox_size`` [B, Q], ``query_crop_to_orig`` [B, Q, 2, 3],
    ``keypoint_mask`` [B, N] bool (False on padding), ``category_id`` [B] int64. Padded keypoints are
    invisible and at 0.
    """
    n_max = max(e["support_keypoints"].shape[1] for e in episodes)
    out: dict[str, list] = {}
    for e in episodes:
        n = e["support_keypoints"].shape[1]
        for key, value in e.items():
            if key in ("support_keypoints", "support_visible", "query_keypoints", "query_visible", "query_keypoints_orig"):
                pad = [(0, 0)] * value.ndim
                pad[1] = (0, n_max - n)  # every per-keypoint array is [K or Q, N, ...]
                value = np.pad(value, pad)
            out.setdefault(key, []).append(value)
        out.setdefault("keypoint_mask", []).append(np.arange(n_max) < n)
    return {k: torch.as_tensor(np.stack(v)) for k, v in out.items()}
