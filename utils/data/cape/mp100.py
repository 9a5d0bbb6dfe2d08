"""MP-100 (Xu et al., "Pose for Everything", arXiv 2207.10387): loading, category report, crops and episodes.

On disk (the real dataset and ``utils/data/cape/synthetic.py`` share it)::

    <data_root>/annotations/mp100_split{1..5}_{train,val,test}.json   COCO keypoint JSON
    <data_root>/images/<file_name>                                    ``file_name`` as in the JSON

Which annotations become instances, and in which order, is the reference's rule, because the
evaluation episodes are drawn by position in these lists (see ``utils/eval/pck.py``). It is
CapeFormer's ``TestPoseDataset._load_coco_keypoint_annotation_kernel`` (flyinglynx/CapeFormer,
``capeformer/datasets/datasets/mp100/test_dataset.py``; Pose Anything's copy is the same):
images in file order (xtcocotools ``COCO.getImgIds``), each image's annotations in file order
(``getAnnIds(imgIds=..., iscrowd=False)``; a missing ``iscrowd`` counts as 0), and an annotation
is dropped, by the first rule that applies, when

1. ``iscrowd`` is not 0;
2. its clipped box is empty or its ``area`` is present and not > 0 (see :func:`clean_bbox`);
3. ``max(keypoints) == 0`` (every value of the flat list is 0);
4. ``num_keypoints`` is present and 0.

CapeFormer's validation set (``TransformerPoseDataset``, same file layout) also drops annotations whose
image file does not exist; ``missing_images="drop"`` reproduces that. The reference silently skips an
annotation without ``bbox`` or ``keypoints``; here that is a format error (no official file has one).

Categories. The keypoint count comes from the annotations (``len(keypoints) / 3``, equal for every
annotation of a category: the length of its name list where it has one, else the count most of its annotations
have, so an error names the odd one out), because some categories have an empty keypoint-name list (both named ``face``:
id 18 holds 19-keypoint Amur tiger bodies, id 40 68-keypoint human faces). Skeletons are 1-based in most categories,
0-based in the CarFusion ones (car, bus, suv) and empty in many; the base is detected per category
and the skeleton is stored 0-based.

Coordinates. Ground truth is kept twice: in **original image pixels** (PCK is measured there) and
in **normalised crop coordinates**: a crop is the instance's clean box, squared and enlarged by
``margin``, warped to ``image_size`` x ``image_size``; a point at crop pixel (x, y) has normalised
coordinates (x / image_size, y / image_size), so [0, 1] spans the crop edge to edge and pixel i
covers [i, i + 1). ``crop_to_orig`` [2, 3] maps crop pixels back to original pixels. A keypoint is
visible when its COCO flag v > 0 (the reference's ``np.minimum(1, v) > 0``).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from utils.errors import UserError

SUBSETS = ("train", "val", "test")
MISSING_IMAGES = ("error", "drop", "allow")
# Why the reference drops an annotation (see the module docstring), and what would keep it.
DROP_REASONS = {
    "iscrowd": "set their iscrowd to 0 if each is one object",
    "empty bbox": "fix their bbox fields",
    "all keypoint values 0": "fix their keypoints fields",
    "num_keypoints 0": "fix their num_keypoints fields",
    "missing image": "add their image files",
}
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
_SHOWN = 5  # how many missing images or dropped ids a message lists before the count


class MP100FormatError(UserError):
    """An MP-100 annotation file or image folder is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class Category:
    """One MP-100 category.

    ``num_keypoints`` comes from the annotations (the name list may be empty); ``skeleton`` holds 0-based
    keypoint pairs; ``skeleton_base`` is how the file numbered them: 0, 1, or None for an empty skeleton.
    """

    id: int
    name: str
    keypoint_names: tuple[str, ...]
    num_keypoints: int
    skeleton: tuple[tuple[int, int], ...]
    skeleton_base: int | None


@dataclass(frozen=True)
class Instance:
    """One annotated object that passed the reference's filters.

    ``bbox`` is the clean box (x1, y1, w', h') of :func:`clean_bbox`, in original pixels (float);
    ``keypoints`` [N, 2] float32 original pixels (float32 as the reference's ``joints_3d``);
    ``visible`` [N] bool (v > 0); ``image_path`` the image file (it may not exist with ``missing_images="allow"``).
    """

    ann_id: int
    category_id: int
    image_path: Path
    bbox: tuple[float, float, float, float]
    keypoints: np.ndarray
    visible: np.ndarray

    @property
    def normaliser(self) -> float:
        """PCK's normaliser: the longer side of the clean box, max(w', h'), float64 pixels."""
        return max(self.bbox[2], self.bbox[3])


@dataclass
class MP100Split:
    """The categories and instances of one annotation file (e.g. ``mp100_split1_test.json``).

    ``categories`` and ``instances`` are in file order (``instances[cid]`` is the reference's per-category
    pool, in the order the evaluation episodes index it). ``dropped`` maps each reason in ``DROP_REASONS``
    to the dropped annotation ids; ``missing_images`` lists image files of kept instances that do not exist
    (only with ``missing_images="allow"``).
    """

    path: Path
    categories: dict[int, Category]
    instances: dict[int, list[Instance]]
    dropped: dict[str, list[int]] = field(default_factory=dict)
    missing_images: list[Path] = field(default_factory=list)

    @property
    def split_and_subset(self) -> tuple[int | None, str | None]:
        """(N, subset) parsed from a ``mp100_split{N}_{subset}.json`` file name, else (None, None)."""
        m = re.fullmatch(r"mp100_split(\d+)_(train|val|test)\.json", self.path.name)
        return (int(m[1]), m[2]) if m else (None, None)

    def instance_index(self) -> dict[int, tuple[int, int]]:
        """Annotation id -> (category id, position in ``instances[category id]``)."""
        return {inst.ann_id: (cid, i) for cid, insts in self.instances.items() for i, inst in enumerate(insts)}


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


def clean_bbox(bbox, width, height) -> tuple[float, float, float, float] | None:
    """The reference's sanitised box, or None when it is empty (then the annotation is dropped).

    ``x1 = max(0, x)``, ``x2 = min(W - 1, x1 + max(0, w - 1))``, likewise y with H; the box is
    (x1, y1, x2 - x1, y2 - y1) when ``x2 > x1`` and ``y2 > y1``. Computed in Python numbers as the
    reference does, so a negative width or height, or a box of width <= 1, gives None. Source: CapeFormer
    ``TestPoseDataset._load_coco_keypoint_annotation_kernel`` (the rule of mmpose up to 0.26; mmpose 0.27+
    uses ``max(0, w)``, but CapeFormer and Pose Anything carry their own copy with ``w - 1``).

    Args:
        bbox: COCO (x, y, w, h) in original pixels. width, height: the image's size from its ``images`` entry.
    """
    x, y, w, h = bbox
    x1, y1 = max(0, x), max(0, y)
    x2, y2 = min(width - 1, x1 + max(0, w - 1)), min(height - 1, y1 + max(0, h - 1))
    if x2 > x1 and y2 > y1:
        return float(x1), float(y1), float(x2 - x1), float(y2 - y1)
    return None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Checker:
    """Raises one-line :class:`MP100FormatError` messages naming the file, the entry and the field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, problem: str, fix: str = "fix or re-download the file") -> MP100FormatError:
        return MP100FormatError(f"{self.path}: {where} {problem}; {fix}")

    def entries(self, coco: dict, key: str) -> list[dict]:
        if key not in coco:
            raise self.fail("the top level", f"lacks {[key]}", "MP-100 COCO JSON needs 'images', 'annotations' and "
                                                                "'categories' there")
        if not isinstance(coco[key], list) or not all(isinstance(e, dict) for e in coco[key]):
            raise self.fail("the top level", f"has {key!r} that is not a list of objects")
        return coco[key]

    def require(self, entry: dict, keys: tuple[str, ...], kind: str) -> None:
        missing = [k for k in keys if k not in entry]
        if missing:
            raise self.fail(f"{kind} {entry.get('id', '?')}", f"lacks {missing}",
                            f"MP-100 COCO JSON needs {list(keys)} in every {kind}")

    def number(self, entry: dict, key: str, kind: str, integer: bool = False) -> None:
        v = entry[key]
        if not (_is_int(v) if integer else _is_number(v)):
            raise self.fail(f"{kind} {entry.get('id', '?')}", f"has field {key!r} = {v!r}, not "
                            f"{'an integer' if integer else 'a finite number'}")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise MP100FormatError(f"annotation file {path} not found: pass --data_root pointing at an MP-100 folder "
                               "(with annotations/ and images/), or build the synthetic one with "
                               "python scripts/build_synthetic_cape_dataset.py")
    try:
        with open(path, encoding="utf-8") as f:
            coco = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MP100FormatError(f"{path} is not valid JSON ({e}); re-download or rebuild it") from e
    if not isinstance(coco, dict):
        raise MP100FormatError(f"{path}: the top level is a {type(coco).__name__}, not a COCO object; re-download it")
    return coco


def _skeleton(check: _Checker, c: dict, n: int) -> tuple[tuple[tuple[int, int], ...], int | None]:
    """The category's skeleton 0-based, and the base it was stored in (None when empty).

    0-based when some edge uses keypoint 0, 1-based when some edge uses keypoint N; an edge outside
    0..N, both 0 and N, or neither (the base cannot be told) is an error.
    """
    where = f"category {c['id']} ({c['name']!r})"
    edges = c["skeleton"]
    if not isinstance(edges, list) or not all(isinstance(e, list) and len(e) == 2 and all(map(_is_int, e))
                                              for e in edges):
        raise check.fail(where, f"has field 'skeleton' = {str(edges)[:80]}, not a list of [i, j] integer pairs")
    if not edges:
        return (), None
    lo, hi = min(min(e) for e in edges), max(max(e) for e in edges)
    if lo < 0 or hi > n or (lo == 0 and hi == n):
        raise check.fail(where, f"has field 'skeleton' with keypoints {lo}..{hi}, which fit neither 0..{n - 1} "
                         f"(0-based) nor 1..{n} (1-based) for its {n} keypoints")
    if lo > 0 and hi < n:
        raise check.fail(where, f"has field 'skeleton' using keypoints {lo}..{hi} only, so whether it counts from "
                         f"0 or 1 (of {n} keypoints) cannot be told", "renumber it so that it names keypoint 0 "
                                                                      "(0-based) or keypoint N (1-based)")
    base = 0 if lo == 0 else 1
    return tuple((i - base, j - base) for i, j in edges), base


def _keypoint_count(check: _Checker, c: dict, counts: dict[int, int]) -> int:
    """The keypoint count of category ``c``: the length of its name list, or with no names, the count most of its
    annotations have (the first seen of those tied); ``counts`` maps its annotation ids to their counts, in file order.

    Raises:
        MP100FormatError: naming the first annotation that disagrees, and the names or an annotation it disagrees with.
    """
    names = c["keypoints"]
    tally = Counter(counts.values())  # most_common orders ties by first appearance
    n = len(names) if names or not counts else tally.most_common(1)[0][0]
    odd = next((aid for aid, k in counts.items() if k != n), None)
    if odd is None:
        return n
    if names:
        raise check.fail(f"annotation {odd}", f"has {counts[odd]} keypoints in field 'keypoints', but its category "
                         f"{c['id']} ({c['name']!r}) names {n}")
    agreeing = next(aid for aid, k in counts.items() if k == n)
    raise check.fail(f"annotation {odd}", f"has {counts[odd]} keypoints in field 'keypoints', but annotation "
                     f"{agreeing} of the same category {c['id']} has {n} (as {tally[n]} of its {len(counts)} "
                     "annotations do)")


def _drop_reason(a: dict, width, height) -> str | None:
    """The first of the reference's rules that drops annotation ``a`` (see the module docstring), else None."""
    if a.get("iscrowd", 0) != 0:
        return "iscrowd"
    if ("area" in a and not a["area"] > 0) or clean_bbox(a["bbox"], width, height) is None:
        return "empty bbox"
    if max(a["keypoints"]) == 0:
        return "all keypoint values 0"
    if a.get("num_keypoints") == 0:
        return "num_keypoints 0"
    return None


def _listed(items: list, shown: int = _SHOWN) -> str:
    head = ", ".join(str(i) for i in items[:shown])
    return head + (f", ... ({len(items)} in all)" if len(items) > shown else "")


def _dropped_note(dropped: dict[str, list[int]]) -> str:
    """`` (N annotations were dropped: <reason>: ids 1, 2, 3, ... (M in all), <fix>; ...)``, or "" when none were."""
    parts = [f"{reason}: ids {_listed(ids, 3)}, {DROP_REASONS[reason]}" for reason, ids in dropped.items() if ids]
    total = sum(map(len, dropped.values()))
    return f" ({total} annotation(s) were dropped: {'; '.join(parts)})" if parts else ""


def load_split(path: str | Path, image_root: str | Path, missing_images: str = "error") -> MP100Split:
    """Read one MP-100 COCO keypoint file with the reference's instance rules (see the module docstring).

    Args:
        path: the annotation JSON. image_root: the folder ``file_name`` is relative to.
        missing_images: what to do when a kept instance's image file does not exist: ``"error"`` (training
            and evaluation need every image), ``"drop"`` (leave the instance out, as CapeFormer's validation
            dataset does) or ``"allow"`` (keep it and list the file in ``missing_images``; for reports and
            annotation-only work).

    Raises:
        MP100FormatError: the file is missing or not JSON; an entry lacks a required field or has a field of
            the wrong type or length (the message names the file, the entry id and the field); ids repeat;
            an annotation names an unknown image or category; a category's annotations disagree on the
            keypoint count or disagree with its non-empty name list; a skeleton's base cannot be told; or, with
            ``missing_images="error"``, image files are missing (the first few are listed, with the count).
        ValueError: ``missing_images`` is not one of ``MISSING_IMAGES``.
    """
    if missing_images not in MISSING_IMAGES:
        raise ValueError(f"missing_images={missing_images!r}: use one of {MISSING_IMAGES}")
    path, image_root = Path(path), Path(image_root)
    check = _Checker(path)
    coco = _read_json(path)
    raw_categories, raw_images, raw_annotations = (check.entries(coco, k)
                                                   for k in ("categories", "images", "annotations"))
    by_id = _read_categories(check, raw_categories)
    images = _read_images(check, raw_images)
    per_image, counts = _read_annotations(check, raw_annotations, by_id, images)
    categories = {}
    for cid, c in by_id.items():
        n = _keypoint_count(check, c, counts.get(cid, {}))
        categories[cid] = Category(cid, str(c["name"]), tuple(c["keypoints"]), n, *_skeleton(check, c, n))
    instances, dropped, missing = _keep_instances(categories, images, per_image, image_root, missing_images)
    if missing and missing_images == "error":
        raise MP100FormatError(f"{len(missing)} image file(s) named in {path} are missing under {image_root}: "
                               f"{_listed([str(p) for p in missing])}; download the MP-100 images into that folder "
                               "(or load with missing_images='drop' to leave those instances out)")
    return MP100Split(path, categories, instances, dropped, missing)


def _read_categories(check: _Checker, raw: list[dict]) -> dict[int, dict]:
    """The ``categories`` entries by id, each checked for its fields and its list of keypoint names."""
    by_id: dict[int, dict] = {}
    for c in raw:
        check.require(c, ("id", "name", "keypoints", "skeleton"), "category")
        check.number(c, "id", "category", integer=True)
        if c["id"] in by_id:
            raise check.fail(f"category {c['id']}", "appears twice in 'categories'")
        if not isinstance(c["keypoints"], list) or not all(isinstance(k, str) for k in c["keypoints"]):
            raise check.fail(f"category {c['id']}", "has field 'keypoints' that is not a list of names")
        by_id[c["id"]] = c
    return by_id


def _read_images(check: _Checker, raw: list[dict]) -> dict[int, dict]:
    """The ``images`` entries by id, in file order (the reference's ``getImgIds()`` order), each checked."""
    images: dict[int, dict] = {}
    for im in raw:
        check.require(im, ("id", "file_name", "width", "height"), "image")
        check.number(im, "id", "image", integer=True)
        for key in ("width", "height"):
            check.number(im, key, "image")
        if not isinstance(im["file_name"], str):
            raise check.fail(f"image {im['id']}", f"has field 'file_name' = {im['file_name']!r}, not a path")
        if im["id"] in images:
            raise check.fail(f"image {im['id']}", "appears twice in 'images'")
        images[im["id"]] = im
    return images


def _read_annotations(check: _Checker, raw: list[dict], categories: dict[int, dict], images: dict[int, dict]
                      ) -> tuple[dict[int, list[dict]], dict[int, dict[int, int]]]:
    """The ``annotations`` entries checked and grouped by image id (file order within an image), and each
    category's keypoint counts ``{category id: {annotation id: count}}`` for :func:`_keypoint_count`."""
    per_image: dict[int, list[dict]] = {}
    counts: dict[int, dict[int, int]] = {}
    seen: set = set()
    for a in raw:
        check.require(a, ("id", "image_id", "category_id", "bbox", "keypoints"), "annotation")
        for key in ("id", "image_id", "category_id"):
            check.number(a, key, "annotation", integer=True)
        where = f"annotation {a['id']}"
        if a["id"] in seen:
            raise check.fail(where, "appears twice in 'annotations'")
        seen.add(a["id"])
        if a["category_id"] not in categories:
            raise check.fail(where, f"has field 'category_id' = {a['category_id']!r}, not in 'categories'")
        if a["image_id"] not in images:
            raise check.fail(where, f"has field 'image_id' = {a['image_id']!r}, not in 'images'")
        if not isinstance(a["bbox"], list) or len(a["bbox"]) != 4 or not all(map(_is_number, a["bbox"])):
            raise check.fail(where, f"has field 'bbox' = {a['bbox']!r}; COCO boxes are [x, y, width, height]")
        kps = a["keypoints"]
        if not isinstance(kps, list) or not kps or len(kps) % 3 or not all(map(_is_number, kps)):
            raise check.fail(where, "has field 'keypoints' that is not a non-empty list of numbers [x, y, v, ...] "
                             f"(it has {len(kps) if isinstance(kps, list) else type(kps).__name__} values)")
        for key in ("iscrowd", "area", "num_keypoints"):
            if key in a and not (key == "iscrowd" and isinstance(a[key], bool)):  # xtcocotools itself writes False
                check.number(a, key, "annotation")
        counts.setdefault(a["category_id"], {})[a["id"]] = len(kps) // 3
        per_image.setdefault(a["image_id"], []).append(a)
    return per_image, counts


def _keep_instances(categories: dict[int, Category], images: dict[int, dict], per_image: dict[int, list[dict]],
                    image_root: Path, missing_images: str
                    ) -> tuple[dict[int, list[Instance]], dict[str, list[int]], list[Path]]:
    """The instances the reference keeps, by category in image order; the dropped annotation ids by reason;
    and the missing image files (listed unless ``missing_images`` is ``"drop"``, which drops their instances).
    Each image file is looked up once, and only when one of its instances would be kept."""
    instances: dict[int, list[Instance]] = {cid: [] for cid in categories}
    dropped: dict[str, list[int]] = {r: [] for r in DROP_REASONS}
    missing: list[Path] = []
    exists: dict[Path, bool] = {}
    for image_id, im in images.items():
        image_path = image_root / im["file_name"]
        for a in per_image.get(image_id, []):
            reason = _drop_reason(a, im["width"], im["height"])
            if reason is None and image_path not in exists:
                exists[image_path] = image_path.is_file()
                if not exists[image_path] and missing_images != "drop":
                    missing.append(image_path)
            if reason is None and not exists[image_path] and missing_images == "drop":
                reason = "missing image"
            if reason is not None:
                dropped[reason].append(a["id"])
                continue
            kps = np.asarray(a["keypoints"], np.float32).reshape(-1, 3)
            instances[a["category_id"]].append(Instance(
                a["id"], a["category_id"], image_path, clean_bbox(a["bbox"], im["width"], im["height"]),
                kps[:, :2].copy(), kps[:, 2] > 0))
    return instances, dropped, missing


def load_mp100(data_root: str | Path, split: int, missing_images: str = "error") -> dict[str, MP100Split]:
    """Load train/val/test of MP-100 split ``split`` (1..5) from ``data_root`` and check their categories are disjoint.

    Raises:
        MP100FormatError: see :func:`load_split` and :func:`check_disjoint`.
    """
    root = Path(data_root)
    splits = {s: load_split(annotation_path(root, split, s), root / "images", missing_images) for s in SUBSETS}
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


def category_report(split: MP100Split) -> list[dict]:
    """One row per category, in file order: ``id``, ``name``, ``keypoints`` (count), ``named`` (whether the
    file names the keypoints), ``instances`` (kept), ``skeleton_edges`` and ``skeleton_base`` (0, 1 or None)."""
    return [{"id": c.id, "name": c.name, "keypoints": c.num_keypoints, "named": bool(c.keypoint_names),
             "instances": len(split.instances[c.id]), "skeleton_edges": len(c.skeleton),
             "skeleton_base": c.skeleton_base} for c in split.categories.values()]


def format_report(split: MP100Split) -> str:
    """A printable per-category table of :func:`category_report`, with what was dropped and which images are missing."""
    rows = category_report(split)
    kept = sum(r["instances"] for r in rows)
    lines = [f"{split.path.name}: {len(rows)} categories, {kept} instances"]
    for reason, ids in split.dropped.items():
        if ids:
            lines.append(f"  dropped ({reason}): {len(ids)} annotation(s): {_listed(ids)}")
    if split.missing_images:
        lines.append(f"  missing images: {_listed([str(p) for p in split.missing_images])}")
    lines.append(f"  {'id':>4} {'name':<28} {'kpts':>4} {'inst':>5} {'edges':>5} base")
    for r in rows:
        base = "empty" if r["skeleton_base"] is None else f"{r['skeleton_base']}-based"
        kpts = f"{r['keypoints']}" + ("" if r["named"] else "*")
        lines.append(f"  {r['id']:>4} {r['name'][:28]:<28} {kpts:>4} {r['instances']:>5} "
                     f"{r['skeleton_edges']:>5} {base}")
    if not all(r["named"] for r in rows):
        lines.append("  * the file gives no keypoint names; the count comes from the annotations")
    return "\n".join(lines)


class EpisodeSampler:
    """Draws training episodes: one category, then K supports and Q queries, all distinct instances of it.

    Not the evaluation protocol (that is ``utils.eval.pck.protocol_episodes``). Categories with fewer than
    K + Q instances cannot form an episode and are left out.

    Raises:
        MP100FormatError: no category of the split has K + Q instances (the message counts the annotations the
            loader dropped, by reason, with their first ids and the fix).
    """

    def __init__(self, split: MP100Split, shots: int, queries: int):
        self.split, self.shots, self.queries = split, shots, queries
        need = shots + queries
        self.category_ids = sorted(c for c, insts in split.instances.items() if len(insts) >= need)
        if not self.category_ids:
            raise MP100FormatError(f"{split.path}: no category has {need} instances for {shots} shot(s) + {queries} "
                                   f"queries{_dropped_note(split.dropped)}; lower --shots/--queries")

    def sample(self, rng: np.random.Generator, category_id: int | None = None) -> Episode:
        """A random episode (of ``category_id`` if given, else of a uniformly drawn category)."""
        cid = self.category_ids[int(rng.integers(len(self.category_ids)))] if category_id is None else category_id
        idx = rng.choice(len(self.split.instances[cid]), self.shots + self.queries, replace=False)
        return Episode(cid, tuple(int(i) for i in idx[:self.shots]), tuple(int(i) for i in idx[self.shots:]))


@dataclass(frozen=True)
class Augmentation:
    """Training augmentation, mmpose 0.x ``TopDownGetRandomScaleRotation`` as the CAPE papers configure it
    (scale_factor 0.15, rot_factor 15, rot_prob 0.6), plus optional colour jitter (the papers use none).

    The crop scale is ``clip(1 + scale * n, 1 - scale, 1 + scale)``; with probability ``rotation_prob`` the
    rotation is ``clip(rotation * n, -2 rotation, 2 rotation)`` degrees, else 0 (n ~ N(0, 1)); brightness,
    contrast and saturation factors are uniform in [1 - colour, 1 + colour].
    """

    scale: float = 0.15
    rotation: float = 15.0
    rotation_prob: float = 0.6
    colour: float = 0.0

    def sample(self, rng: np.random.Generator) -> tuple[float, float]:
        """``(scale, rotation in degrees)`` for one crop."""
        scale = float(np.clip(1 + self.scale * rng.standard_normal(), 1 - self.scale, 1 + self.scale))
        rotate = rng.random() <= self.rotation_prob
        rotation = float(np.clip(self.rotation * rng.standard_normal(), -2 * self.rotation, 2 * self.rotation))
        return scale, rotation if rotate else 0.0


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


def crop_to_original(points: torch.Tensor, crop_to_orig: torch.Tensor, image_size: int) -> torch.Tensor:
    """Map normalised crop coordinates [..., N, 2] to original pixels (float64) with per-image affines [..., 2, 3]
    (the inverse of :func:`crop_transform`, as the loader stores it in ``*_crop_to_orig``)."""
    pix = points.double() * image_size
    a = crop_to_orig.double()
    return pix @ a[..., :2].transpose(-1, -2) + a[..., None, :, 2]


def _jitter_colour(img: np.ndarray, rng: np.random.Generator, amount: float) -> np.ndarray:
    """Random brightness, contrast and saturation on an [H, W, 3] float image in [0, 1]."""
    img = img * rng.uniform(1 - amount, 1 + amount)
    img = (img - img.mean()) * rng.uniform(1 - amount, 1 + amount) + img.mean()
    grey = img.mean(-1, keepdims=True)
    img = (img - grey) * rng.uniform(1 - amount, 1 + amount) + grey
    return np.clip(img, 0, 1)


def load_instance(inst: Instance, image_size: int, augment: Augmentation | None = None,
                  rng: np.random.Generator | None = None, margin: float = 1.25) -> dict[str, np.ndarray]:
    """Crop one instance to its clean box (with ``margin``), optionally augmented, and normalise it.

    Returns numpy arrays: ``image`` [3, S, S] float32 ImageNet-normalised; ``keypoints`` [N, 2] float32 in
    normalised crop coordinates; ``visible`` [N] bool (with augmentation, points pushed out of the crop are
    marked invisible); ``keypoints_orig`` [N, 2] original pixels; ``bbox_size`` float32 max(w', h') in original
    pixels (the PCK normaliser, rounded to float32); ``crop_to_orig`` [2, 3] affine from crop pixels to original pixels.

    Raises:
        MP100FormatError: the image cannot be read.
    """
    scale, rot = augment.sample(rng) if augment is not None else (1.0, 0.0)
    to_crop = crop_transform(inst.bbox, image_size, margin, scale, rot)
    to_orig = invert_affine(to_crop)
    try:
        with Image.open(inst.image_path) as im:
            # PIL's AFFINE takes the output->input map and samples at pixel centres, matching our convention.
            crop = im.convert("RGB").transform((image_size, image_size), Image.AFFINE, to_orig.flatten().tolist(),
                                               resample=Image.BILINEAR)
    except (OSError, ValueError) as e:
        raise MP100FormatError(f"cannot read image {inst.image_path} (annotation {inst.ann_id}): {e}; replace it with the "
                                f"dataset's copy (an empty or cut-off file is an interrupted download)") from e
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
        "bbox_size": np.float32(inst.normaliser),
        "crop_to_orig": to_orig.astype(np.float32),
    }


def skeleton_adjacency(category: Category) -> np.ndarray:
    """[N, N] bool: True where the category's skeleton joins two keypoints (symmetric, no self-loops)."""
    adj = np.zeros((category.num_keypoints, category.num_keypoints), bool)
    for i, j in category.skeleton:
        if i != j:
            adj[i, j] = adj[j, i] = True
    return adj


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
        out = {"category_id": ep.category_id,
               "support_ann_id": np.array([insts[j].ann_id for j in ep.support], np.int64),
               "query_ann_id": np.array([insts[j].ann_id for j in ep.query], np.int64),
               "adjacency": skeleton_adjacency(self.split.categories[ep.category_id])}
        for prefix, items in (("support", sup), ("query", qry)):
            for key in ("image", "keypoints", "visible"):
                out[f"{prefix}_{key}"] = np.stack([it[key] for it in items])
        for key in ("keypoints_orig", "bbox_size", "crop_to_orig"):
            out[f"query_{key}"] = np.stack([it[key] for it in qry])
        return out


_PER_KEYPOINT = ("support_keypoints", "support_visible", "query_keypoints", "query_visible", "query_keypoints_orig")


def collate_episodes(episodes: list[dict]) -> dict[str, torch.Tensor]:
    """Batch B episodes whose categories may have different keypoint counts, padding to the largest N.

    Returns tensors: ``support_image`` [B, K, 3, S, S], ``support_keypoints`` [B, K, N, 2], ``support_visible``
    [B, K, N] bool, ``query_image`` [B, Q, 3, S, S], ``query_keypoints`` [B, Q, N, 2], ``query_visible`` [B, Q, N],
    ``query_keypoints_orig`` [B, Q, N, 2], ``query_bbox_size`` [B, Q], ``query_crop_to_orig`` [B, Q, 2, 3],
    ``keypoint_mask`` [B, N] bool (False on padding), ``category_id`` [B] int64, ``support_ann_id`` [B, K] and
    ``query_ann_id`` [B, Q] int64 (annotation ids), ``adjacency`` [B, N, N] bool (the category's skeleton,
    0-based and symmetric, no self-loops). Padded keypoints are invisible, at 0 and joined to nothing.
    """
    n_max = max(e["support_keypoints"].shape[1] for e in episodes)
    out: dict[str, list] = {}
    for e in episodes:
        n = e["support_keypoints"].shape[1]
        for key, value in e.items():
            if key in _PER_KEYPOINT:
                pad = [(0, 0)] * value.ndim
                pad[1] = (0, n_max - n)  # every per-keypoint array is [K or Q, N, ...]
                value = np.pad(value, pad)
            elif key == "adjacency":
                value = np.pad(value, [(0, n_max - n), (0, n_max - n)])
            out.setdefault(key, []).append(value)
        out.setdefault("keypoint_mask", []).append(np.arange(n_max) < n)
    return {k: torch.as_tensor(np.stack(v)) for k, v in out.items()}
