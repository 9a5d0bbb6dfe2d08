"""Build a procedural CAPE dataset in the MP-100 layout, for training and testing with no download.

    python scripts/build_synthetic_cape_dataset.py --output-dir data/synthetic_cape

Layout written (the same as MP-100, so ``utils/data/mp100.py`` reads both):

    <output-dir>/annotations/mp100_split{1..5}_{train,val,test}.json   COCO keypoint JSON
    <output-dir>/images/<category>/<n>.png                             ``file_name`` is relative to images/

Each category is a random tree of 8 to 68 keypoints (the skeleton is its edges, 1-indexed as in
MP-100). An instance is the template under a non-rigid deformation (each limb turns about its
parent joint and stretches, plus jitter), a random rotation, anisotropic scale and position,
drawn over a textured, cluttered background. Limbs are drawn in the category's colour and each
keypoint as a marker whose (shape, colour) pair is unique within the category, so keypoints can
be told apart by local appearance: a model that learns to match a support keypoint's look in
the query generalises to unseen categories, while copying support coordinates does not follow
the pose. Occluders hide some keypoints (visibility 0, coordinates 0, as COCO stores unlabelled
points). Splits: categories are shuffled once; split s tests on the s-th block of 20, validates
on 10 others and trains on the remaining 70, so each category is a test category exactly once.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

MIN_KEYPOINTS, MAX_KEYPOINTS = 8, 68
_SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring")
# 16 well-separated hues at full saturation; with 6 shapes that is 96 distinct markers >= 68.
_PALETTE = [tuple(int(255 * c) for c in rgb) for rgb in (
    (1, 0, 0), (1, .5, 0), (1, 1, 0), (.5, 1, 0), (0, 1, 0), (0, 1, .6), (0, 1, 1), (0, .5, 1),
    (0, 0, 1), (.5, 0, 1), (1, 0, 1), (1, 0, .5), (1, 1, 1), (.1, .1, .1), (.6, .3, .1), (.6, .6, .6))]


def make_template(rng: np.random.Generator, num_keypoints: int) -> tuple[np.ndarray, list[int]]:
    """A random keypoint tree: positions ``[N, 2]`` in a unit box centred on 0, and ``parent[i]`` (-1 for the root).

    Limb length shrinks as 1/sqrt(N) so large categories stay compact; points closer than half
    a limb to an existing point are redrawn (a few tries) so markers do not pile up.
    """
    limb = 1.0 / math.sqrt(num_keypoints)
    points, parent = [np.zeros(2)], [-1]
    for i in range(1, num_keypoints):
        for _ in range(20):
            # Prefer recent nodes as parents: chains read as limbs rather than one big star.
            p = int(rng.integers(max(0, i - 4), i)) if rng.random() < 0.7 else int(rng.integers(0, i))
            angle = rng.uniform(0, 2 * math.pi)
            cand = points[p] + limb * rng.uniform(0.7, 1.2) * np.array([math.cos(angle), math.sin(angle)])
            if min(np.linalg.norm(cand - q) for q in points) > 0.5 * limb:
                break
        points.append(cand)
        parent.append(p)
    pts = np.stack(points)
    pts -= (pts.max(0) + pts.min(0)) / 2
    return pts / (pts.max(0) - pts.min(0)).max(), parent


def deform(rng: np.random.Generator, template: np.ndarray, parent: list[int]) -> np.ndarray:
    """Articulate the tree: each limb turns by N(0, 18 deg) on top of its parent's turn and stretches by U(0.85, 1.15)."""
    out = template.copy()
    turn = np.zeros(len(parent))
    for i in range(1, len(parent)):  # parents always precede children
        p = parent[i]
        turn[i] = turn[p] + rng.normal(0, math.radians(18))
        c, s = math.cos(turn[i]), math.sin(turn[i])
        limb = (template[i] - template[p]) * rng.uniform(0.85, 1.15)
        out[i] = out[p] + np.array([c * limb[0] - s * limb[1], s * limb[0] + c * limb[1]])
    return out + rng.normal(0, 0.015, out.shape)


def background(rng: np.random.Generator, size: int) -> Image.Image:
    """Muted smooth colour noise plus stripes, with a few saturated clutter shapes."""
    low = rng.uniform(40, 200, (int(rng.integers(3, 8)), int(rng.integers(3, 8)), 3))
    low = low * 0.5 + low.mean(-1, keepdims=True) * 0.5  # desaturate so the object is not the only colour
    base = np.asarray(Image.fromarray(low.astype(np.uint8)).resize((size, size), Image.BICUBIC), np.float32)
    yy, xx = np.mgrid[0:size, 0:size]
    angle, freq = rng.uniform(0, math.pi), rng.uniform(0.05, 0.4)
    stripes = 20 * np.sin(freq * (xx * math.cos(angle) + yy * math.sin(angle)))[..., None]
    img = np.clip(base + stripes, 0, 255).astype(np.uint8)
    im = Image.fromarray(img)
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(2, 7))):
        x, y, r = rng.uniform(0, size), rng.uniform(0, size), rng.uniform(2, 6)
        draw_marker(draw, _SHAPES[int(rng.integers(len(_SHAPES)))], x, y, r, _PALETTE[int(rng.integers(len(_PALETTE)))])
    return im


def draw_marker(draw: ImageDraw.ImageDraw, shape: str, x: float, y: float, r: float, colour: tuple) -> None:
    """Draw one keypoint marker of radius ``r`` pixels centred on (x, y)."""
    box = (x - r, y - r, x + r, y + r)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=colour)
    elif shape == "diamond":
        draw.polygon([(x, y - r), (x - r, y), (x, y + r), (x + r, y)], fill=colour)
    elif shape == "cross":
        w = max(1, int(r / 2))
        draw.line([(x - r, y), (x + r, y)], fill=colour, width=w)
        draw.line([(x, y - r), (x, y + r)], fill=colour, width=w)
    else:  # ring
        draw.ellipse(box, outline=colour, width=max(1, int(r / 2)))


def make_category(rng: np.random.Generator, cat_id: int, num_keypoints: int) -> dict:
    """A category: template, tree, per-keypoint marker and style, plus its COCO ``categories`` entry."""
    template, parent = make_template(rng, num_keypoints)
    markers = rng.choice(len(_SHAPES) * len(_PALETTE), num_keypoints, replace=False)
    return {
        "template": template, "parent": parent,
        "markers": [(_SHAPES[m % len(_SHAPES)], _PALETTE[m // len(_SHAPES)]) for m in markers],
        "limb_colour": tuple(int(c) for c in rng.integers(0, 256, 3)),
        "limb_width": float(rng.uniform(1.5, 4)),
        "coco": {
            "id": cat_id, "name": f"synthetic_{cat_id:03d}", "supercategory": "synthetic",
            "keypoints": [f"kp{i}" for i in range(num_keypoints)],
            "skeleton": [[parent[i] + 1, i + 1] for i in range(1, num_keypoints)],
        },
    }


def make_instance(rng: np.random.Generator, cat: dict, size: int, max_rotation: float) -> tuple[Image.Image, list, list]:
    """Render one instance. Returns the image, its COCO ``keypoints`` [x1, y1, v1, ...] and ``bbox`` [x, y, w, h] (pixels)."""
    pts = deform(rng, cat["template"], cat["parent"])
    theta = math.radians(rng.uniform(-max_rotation, max_rotation))
    rot = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    extent = rng.uniform(0.4, 0.75) * size
    pts = (pts * rng.uniform(0.8, 1.2, 2)) @ rot.T * extent
    pts += rng.uniform(0.5 * extent, size - 0.5 * extent, 2) - (pts.max(0) + pts.min(0)) / 2
    dist = np.linalg.norm(pts[:, None] - pts[None], axis=-1) + np.diag(np.full(len(pts), np.inf))
    nearest = dist.min()
    radius = float(np.clip(0.4 * nearest, 2.0, 5.0))

    im = background(rng, size)
    draw = ImageDraw.Draw(im)
    for i, p in enumerate(cat["parent"]):
        if p >= 0:
            draw.line([tuple(pts[p]), tuple(pts[i])], fill=cat["limb_colour"], width=max(1, round(cat["limb_width"] * extent / 100)))
    for (shape, colour), (x, y) in zip(cat["markers"], pts):
        draw_marker(draw, shape, x, y, radius, colour)

    visible = np.all((pts >= 0) & (pts < size), axis=1)
    if rng.random() < 0.35:  # an occluder of background-like texture over a random keypoint
        cx, cy = pts[int(rng.integers(len(pts)))] + rng.normal(0, 0.05 * extent, 2)
        half = rng.uniform(0.08, 0.18) * extent * rng.uniform(0.7, 1.4, 2)
        patch = background(rng, size).crop((0, 0, int(2 * half[0]) + 1, int(2 * half[1]) + 1))
        im.paste(patch, (int(cx - half[0]), int(cy - half[1])))
        inside = (np.abs(pts[:, 0] - cx) < half[0] + radius) & (np.abs(pts[:, 1] - cy) < half[1] + radius)
        visible &= ~inside

    lo = np.clip(pts.min(0) - radius, 0, size)
    hi = np.clip(pts.max(0) + radius, 0, size)
    keypoints = []
    for (x, y), v in zip(pts, visible):
        keypoints += [round(float(x), 2), round(float(y), 2), 2] if v else [0, 0, 0]
    return im, keypoints, [round(float(lo[0]), 2), round(float(lo[1]), 2), round(float(hi[0] - lo[0]), 2), round(float(hi[1] - lo[1]), 2)]


def build(output_dir: str | Path, num_categories: int = 100, instances_per_category: int = 40,
          image_size: int = 160, max_rotation: float = 60.0, seed: int = 0) -> Path:
    """Write the dataset (see the module docstring) and return ``output_dir``.

    Raises:
        ValueError: fewer than 10 categories (the 70/10/20 split needs 10), or under 2 instances per category.
    """
    if num_categories < 10 or instances_per_category < 2:
        raise ValueError(f"need >= 10 categories and >= 2 instances each, got {num_categories} and {instances_per_category}")
    out = Path(output_dir)
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    # Spread keypoint counts over 8..68, denser at the low end as in MP-100; both ends always occur.
    counts = MIN_KEYPOINTS + np.round((MAX_KEYPOINTS - MIN_KEYPOINTS) * rng.random(num_categories) ** 2.5).astype(int)
    counts[0], counts[-1] = MIN_KEYPOINTS, MAX_KEYPOINTS

    categories, images, annotations = [], {}, {}
    for c in range(num_categories):
        cat_rng = np.random.default_rng([seed, c])
        cat = make_category(cat_rng, c + 1, int(counts[c]))
        categories.append(cat["coco"])
        (out / "images" / cat["coco"]["name"]).mkdir(parents=True, exist_ok=True)
        images[c + 1], annotations[c + 1] = [], []
        for n in range(instances_per_category):
            uid = c * instances_per_category + n + 1
            im, kps, bbox = make_instance(cat_rng, cat, image_size, max_rotation)
            file_name = f"{cat['coco']['name']}/{n:04d}.png"
            im.save(out / "images" / file_name, compress_level=1)
            images[c + 1].append({"id": uid, "file_name": file_name, "width": image_size, "height": image_size})
            annotations[c + 1].append({
                "id": uid, "image_id": uid, "category_id": c + 1, "bbox": bbox, "keypoints": kps,
                "num_keypoints": sum(1 for v in kps[2::3] if v > 0), "area": round(bbox[2] * bbox[3], 2), "iscrowd": 0,
            })

    order = [int(i) for i in rng.permutation(num_categories) + 1]
    n_test, n_val = num_categories // 5, num_categories // 10
    for s in range(5):
        test = order[s * n_test:(s + 1) * n_test]
        rest = [c for c in order if c not in test]
        subsets = {"test": test, "val": rest[:n_val], "train": rest[n_val:]}
        for subset, ids in subsets.items():
            coco = {
                "info": {"description": f"synthetic CAPE dataset, MP-100 layout, split {s + 1} {subset}", "seed": seed},
                "images": [im for i in ids for im in images[i]],
                "annotations": [a for i in ids for a in annotations[i]],
                "categories": [categories[i - 1] for i in ids],
            }
            with open(out / "annotations" / f"mp100_split{s + 1}_{subset}.json", "w", encoding="utf-8") as f:
                json.dump(coco, f)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", default="data/synthetic_cape")
    ap.add_argument("--num-categories", type=int, default=100)
    ap.add_argument("--instances-per-category", type=int, default=40)
    ap.add_argument("--image-size", type=int, default=160, help="square image side in pixels")
    ap.add_argument("--max-rotation", type=float, default=60.0, help="instance rotation range +-degrees")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        out = build(args.output_dir, args.num_categories, args.instances_per_category, args.image_size, args.max_rotation, args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.num_categories} categories x {args.instances_per_category} instances to {out} in {time.time() - t0:.0f}s")
    return 0
