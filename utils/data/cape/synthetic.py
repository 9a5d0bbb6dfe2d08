"""A procedural stand-in for MP-100 (Xu et al., "Pose for Everything", arXiv 2207.10387): CAPE with no download.

    python scripts/build_synthetic_cape_dataset.py --output-dir data/synthetic_cape

Layout written (the MP-100 one, so ``utils/data/cape/mp100.py`` and the papers' PCK protocol apply unchanged)::

    <output-dir>/annotations/mp100_split{1..5}_{train,val,test}.json   COCO keypoint JSON
    <output-dir>/images/synthetic_<id>/<n>.png                         ``file_name`` is relative to images/

What makes it a CAPE task. Every category is a random creature of one of three kinds: "outline" (a
star-shaped body whose corners are the keypoints, like clothes or faces), "stick" (a small torso whose
centre is a keypoint, with 2-8 branching limbs whose joints and tips are the others, like skeletons
and insects) or "animal" (an outline body with limbs). All keypoints of a category look the same:
the whole figure is filled with one category pattern (solid, stripes or spots) inside a dark stroke,
and 70% of the categories put one dot, of one colour, on every keypoint (the others none). Nothing
local says which keypoint is keypoint i; where it sits in the structure does (which corner, which
limb, how far along it, how thick the limb is), and that is read off the annotated support.

Instances differ by non-rigid deformation (each limb turns about its parent joint and stretches, the
body turns, stretches and bulges; see :func:`deform`), rotation (+-``max_rotation``), anisotropic
scale and position (one in ten is cut by the image border), over textured, cluttered backgrounds;
three in ten have a loose limb in the category's own style nearby (a distractor) and about half have
occluders. A keypoint whose pixel an occluder covers, or one outside the image, is stored as
COCO stores unlabelled points: x = y = v = 0; the others have v = 2.

How hard (default build, 1 shot, MP-100 test episodes of all 5 splits, PCK@0.2): copying the support's
keypoints (in bbox-normalised coordinates) scores about 44; a similarity transform fitted with the true
correspondences about 93, so most of the gap is recovering the pose and which point is which.

Coordinates follow ``utils/data/cape/mp100.py``: continuous pixels, pixel i covers [i, i + 1), so a
marker drawn around pixel centre (i, j) marks the keypoint (i + 0.5, j + 0.5).

The JSON matches the real files: ``images`` (``id``, ``file_name``, ``width``, ``height``),
``annotations`` (``id``, ``image_id``, ``category_id``, ``bbox`` [x, y, w, h] of the figure's
silhouette, ``keypoints`` [x1, y1, v1, ...], ``num_keypoints``, ``area`` (silhouette pixels),
``iscrowd`` 0) and ``categories`` (``id``, ``name``, ``supercategory`` (the kind), ``keypoints`` names,
``skeleton`` as 1-based keypoint pairs, as most MP-100 categories store it: the outline's cycle and
every limb; keypoint N always appears and 0 never, so the base is unambiguous).

Splits as in MP-100: categories are shuffled once and cut into 5 blocks; split s tests on block s,
validates on the next ``round(n / 10)`` categories after it (cyclically) and trains on the rest:
70/10/20 for 100 categories, disjoint, and each category is a test category in exactly one split.
"""

from __future__ import annotations

import argparse
import colorsys
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from utils.errors import UserError
from utils.cli import ArgumentParser

MIN_KEYPOINTS, MAX_KEYPOINTS = 8, 68
KINDS = ("outline", "stick", "animal")
SUBSETS = ("train", "val", "test")
_DESCRIPTION = "synthetic CAPE dataset in the MP-100 layout"


class SyntheticCapeError(UserError):
    """Bad arguments for the synthetic CAPE builder, or an output folder it must not write into."""


@dataclass(frozen=True)
class Style:
    """How a category is drawn. Colours are RGB 0..255; ``marker`` is None for categories without keypoint dots."""

    fill: tuple[int, int, int]
    fill2: tuple[int, int, int]
    stroke: tuple[int, int, int]
    marker: tuple[int, int, int] | None
    pattern: str  # "solid", "stripes" or "spots"
    period: float  # pattern period as a fraction of the figure's extent


@dataclass(frozen=True)
class Category:
    """One synthetic category: a keypoint template and how to deform and draw it.

    ``template`` [N, 2] keypoints in a unit box centred on 0. Keypoints ``0 .. num_outline - 1`` are the body
    outline's corners in order around it; ``parent[i]`` is the keypoint a limb keypoint hangs from (-1 for
    the body's keypoints). ``width[i]`` is the thickness of the limb from ``parent[i]`` to i (template units).
    ``centre`` [2] is the body centre; ``torso`` [M, 2] the torso outline of "stick" categories (else None),
    whose keypoint 0 is the torso centre. ``bend`` is the std (radians) of each limb's turn per instance;
    ``segment`` the typical limb length (template units).
    """

    id: int
    kind: str
    template: np.ndarray
    parent: tuple[int, ...]
    num_outline: int
    width: np.ndarray
    centre: np.ndarray
    torso: np.ndarray | None
    bend: float
    segment: float
    style: Style

    @property
    def name(self) -> str:
        return f"synthetic_{self.id:03d}"

    @property
    def skeleton(self) -> list[list[int]]:
        """Edges as 1-based keypoint pairs (MP-100's usual convention): the outline cycle, then every limb."""
        n_out = self.num_outline
        ring = [[k + 1, (k + 1) % n_out + 1] for k in range(n_out)] if n_out >= 3 else []
        return ring + [[p + 1, i + 1] for i, p in enumerate(self.parent) if p >= 0]

    def coco(self) -> dict:
        """The COCO ``categories`` entry."""
        names = [f"outline_{k}" for k in range(self.num_outline)]
        if self.kind == "stick":
            names.append("torso")
        names += [f"limb_{i}" for i in range(len(names), len(self.parent))]
        return {"supercategory": self.kind, "id": self.id, "name": self.name, "keypoints": names,
                "skeleton": self.skeleton}


def _rotation(angle: float) -> np.ndarray:
    return np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])


def _inside(polygon: np.ndarray, point: np.ndarray) -> bool:
    """Even-odd rule: is ``point`` [2] inside the closed ``polygon`` [M, 2]?"""
    (x, y), xs, ys = point, polygon[:, 0], polygon[:, 1]
    xn, yn = np.roll(xs, -1), np.roll(ys, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = ((ys > y) != (yn > y)) & (x < (xn - xs) * (y - ys) / (yn - ys) + xs)
    return bool(crossing.sum() % 2)


def _star_polygon(rng: np.random.Generator, n: int, radius: float) -> np.ndarray:
    """``n`` corners [n, 2] of a random star-shaped polygon around 0, in order of angle (so never self-crossing).

    Low harmonics give the overall shape; a per-corner radius factor (larger for fewer corners, so a
    many-cornered outline stays a smooth blob) makes the corners differ from each other.
    """
    angles = rng.uniform(0, 2 * math.pi) + np.cumsum(rng.dirichlet(np.full(n, 4.0)) * 2 * math.pi)
    r = np.ones(n)
    for k in (2, 3, 4):
        r += rng.uniform(0, 0.25) / k * np.cos(k * angles + rng.uniform(0, 2 * math.pi))
    jag = 0.25 * math.sqrt(12 / max(12, n))
    r *= rng.uniform(1 - jag, 1 + jag, n)
    aspect = rng.uniform(0.55, 1.0)
    pts = radius * r[:, None] * np.stack([np.cos(angles), aspect * np.sin(angles)], 1)
    return pts @ _rotation(rng.uniform(0, 2 * math.pi)).T


def _grow_limbs(rng: np.random.Generator, points: list, parent: list, heading: list, width: list, anchors: list[int],
                num_limbs: int, segment: float, body: np.ndarray) -> None:
    """Append ``num_limbs`` limb keypoints (in place): 2-8 limbs leave the ``anchors``, then branch.

    The body centre is 0. A limb goes on with probability ``1 - 1 / mean_chain`` (mean_chain ~ U(1.5, 4)) up to
    5 joints; otherwise the next limb leaves an anchor not used yet (until 2-8 have been) or branches off a
    limb joint at 30-90 degrees. ``heading[i]`` is the direction (radians) a limb leaving keypoint i starts from;
    each joint turns by N(0, 20 deg) from it. Limbs grow outwards: a candidate joint nearer than half a
    segment to another keypoint, inside the ``body`` outline (a stick's torso), or not farther from 0 than
    its parent, is redrawn with a wider spread (the last condition is dropped after 20 tries, all after 40).
    """
    mean_chain = rng.uniform(1.5, 4.0)
    base_width = segment * rng.uniform(0.2, 0.5)
    free = [int(a) for a in rng.permutation(anchors)]
    roots = int(rng.integers(2, 9))
    depth = [0] * len(points)
    tip = None
    for _ in range(num_limbs):
        if tip is not None and depth[tip] < 5 and rng.random() > 1 / mean_chain:
            p, direction, w = tip, heading[tip], width[tip] * rng.uniform(0.75, 1.0)
        elif roots > 0 or tip is None:
            roots -= 1
            p = free.pop() if len(free) > 1 else free[0]  # a torso centre is never used up
            if len(anchors) == 1:  # limbs leave the torso centre: take the least crowded of 6 directions
                options = rng.uniform(0, 2 * math.pi, 6)
                used = [heading[i] for i in range(len(points)) if parent[i] == p]
                gap = [min([abs((a - b + math.pi) % (2 * math.pi) - math.pi) for b in used] + [math.pi])
                       for a in options]
                direction = float(options[int(np.argmax(gap))])
            else:
                direction = heading[p]
            w = base_width * rng.uniform(0.7, 1.4)
        else:
            p = int(rng.choice([i for i in range(len(points)) if parent[i] >= 0]))
            direction = heading[p] + rng.choice([-1, 1]) * rng.uniform(math.radians(30), math.radians(90))
            w = width[p] * rng.uniform(0.6, 0.9)
        for attempt in range(40):
            angle = direction + rng.normal(0, math.radians(20 + 5 * attempt))
            length = segment * rng.uniform(0.7, 1.3)
            cand = points[p] + length * np.array([math.cos(angle), math.sin(angle)])
            clear = min(np.linalg.norm(cand - q) for q in points) > 0.5 * segment
            outwards = attempt >= 20 or np.linalg.norm(cand) > np.linalg.norm(points[p]) + 0.3 * length
            if clear and outwards and not _inside(body, cand):
                break
        points.append(cand)
        parent.append(p)
        heading.append(angle)
        width.append(min(w, 0.5 * length))
        depth.append(depth[p] + 1)
        tip = len(points) - 1


def make_category(rng: np.random.Generator, cat_id: int, num_keypoints: int) -> Category:
    """A random category with ``num_keypoints`` keypoints (8..68): its kind, template, limbs and style."""
    n = num_keypoints
    kind = str(rng.choice(KINDS, p=[0.25, 0.25, 0.5]))
    segment = rng.uniform(0.8, 1.2) / math.sqrt(n)
    torso = None
    if kind == "stick":
        torso = body = _star_polygon(rng, 12, 0.6 * segment)
        points, heading = [np.zeros(2)], [0.0]
    else:
        n_out = n if kind == "outline" else int(np.clip(round(n * rng.uniform(0.25, 0.6)), 4, n - 2))
        body = _star_polygon(rng, n_out, 0.5 if kind == "outline" else rng.uniform(0.25, 0.4))
        points, heading = list(body), [math.atan2(y, x) for x, y in body]  # limbs leave the body outwards
    num_outline = 0 if kind == "stick" else len(points)
    parent, width = [-1] * len(points), [0.0] * len(points)
    _grow_limbs(rng, points, parent, heading, width, list(range(len(points))), n - len(points), segment, body)

    template = np.stack(points)
    shift = (template.max(0) + template.min(0)) / 2
    scale = 1.0 / (template.max(0) - template.min(0)).max()
    hue = rng.uniform(0, 1)
    fill = _hsv(hue, rng.uniform(0.45, 1.0), rng.uniform(0.55, 1.0))
    style = Style(
        fill=fill,
        fill2=_hsv((hue + rng.uniform(-0.1, 0.1)) % 1, rng.uniform(0.3, 1.0), rng.uniform(0.3, 0.7)),
        stroke=_hsv(hue, rng.uniform(0.3, 1.0), rng.uniform(0.05, 0.25)),
        marker=None if rng.random() < 0.3 else _hsv((hue + 0.5) % 1, rng.uniform(0.0, 1.0), 1.0),
        pattern=str(rng.choice(["solid", "stripes", "spots"])),
        period=rng.uniform(0.06, 0.15))
    return Category(
        id=cat_id, kind=kind, template=(template - shift) * scale, parent=tuple(parent), num_outline=num_outline,
        width=np.array(width) * scale, centre=-shift * scale,
        torso=None if torso is None else (torso - shift) * scale, bend=math.radians(rng.uniform(12, 30)),
        segment=segment * scale, style=style)


def _hsv(h: float, s: float, v: float) -> tuple[int, int, int]:
    return tuple(int(round(255 * c)) for c in colorsys.hsv_to_rgb(h, s, v))


def deform(rng: np.random.Generator, cat: Category) -> tuple[np.ndarray, np.ndarray | None]:
    """One non-rigid pose in template units: keypoints [N, 2] and the torso outline [M, 2] (or None).

    The body turns (N(0, 6 deg)), stretches per axis (U(0.9, 1.1)) and each outline corner moves radially
    (N(0, 4%)); each limb then turns about its parent joint by N(0, ``cat.bend``) on top of its parent's turn
    and stretches by U(0.9, 1.1).
    """
    body_turn = rng.normal(0, math.radians(6))
    body = _rotation(body_turn) @ np.diag(rng.uniform(0.9, 1.1, 2))
    t, c = cat.template, cat.centre
    out = t.copy()
    n_body = max(cat.num_outline, 1)  # a stick category's keypoint 0 is the torso centre
    bulge = 1 + rng.normal(0, 0.04, (n_body, 1))
    out[:n_body] = c + ((t[:n_body] - c) * bulge) @ body.T
    turn = np.full(len(t), body_turn)
    for i, p in enumerate(cat.parent):  # parents always precede their limbs
        if p >= 0:
            turn[i] = turn[p] + rng.normal(0, cat.bend)
            out[i] = out[p] + _rotation(turn[i]) @ (t[i] - t[p]) * rng.uniform(0.9, 1.1)
    torso = None if cat.torso is None else c + (cat.torso - c) @ body.T
    return out, torso


def background(rng: np.random.Generator, size: int) -> Image.Image:
    """A ``size`` x ``size`` RGB background: muted smooth colour noise with a stripe texture, then 3-9 clutter
    shapes (polygons, ellipses, lines, dots) in random colours."""
    low = rng.uniform(40, 210, (int(rng.integers(3, 8)), int(rng.integers(3, 8)), 3))
    low = low * 0.5 + low.mean(-1, keepdims=True) * 0.5  # desaturated, so the figure is not the only colour
    base = np.asarray(Image.fromarray(low.astype(np.uint8)).resize((size, size), Image.BICUBIC), np.float32)
    yy, xx = np.mgrid[0:size, 0:size]
    angle, freq = rng.uniform(0, math.pi), rng.uniform(0.05, 0.5)
    stripes = rng.uniform(5, 30) * np.sin(freq * (xx * math.cos(angle) + yy * math.sin(angle)))[..., None]
    im = Image.fromarray(np.clip(base + stripes, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 10))):
        colour = _hsv(rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.2, 1))
        centre, r = rng.uniform(0, size, 2), rng.uniform(0.02, 0.12) * size
        shape = rng.integers(4)
        if shape == 0:
            draw.polygon([tuple(p) for p in centre + _star_polygon(rng, int(rng.integers(3, 7)), r)], fill=colour)
        elif shape == 1:
            draw.ellipse([tuple(centre - r), tuple(centre + r * rng.uniform(0.3, 1.0, 2))], fill=colour)
        elif shape == 2:
            end = centre + rng.normal(0, 2 * r, 2)
            draw.line([tuple(centre), tuple(end)], fill=colour, width=int(rng.integers(1, 4)))
        else:
            draw.ellipse([tuple(centre - 2), tuple(centre + 2)], fill=colour)
    return im


def _pattern(rng: np.random.Generator, style: Style, size: int, extent: float) -> Image.Image:
    """The category's fill texture over the whole image (pasted through the figure's mask), at a random phase."""
    if style.pattern == "solid":
        return Image.new("RGB", (size, size), style.fill)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) * (2 * math.pi / (style.period * extent))
    if style.pattern == "stripes":
        angle = rng.uniform(0, math.pi)
        on = np.sin(xx * math.cos(angle) + yy * math.sin(angle) + rng.uniform(0, 2 * math.pi)) > 0
    else:  # spots
        on = np.sin(xx + rng.uniform(0, 2 * math.pi)) * np.sin(yy + rng.uniform(0, 2 * math.pi)) > 0.4
    return Image.fromarray(np.where(on[..., None], style.fill2, style.fill).astype(np.uint8))


def _disc(draw: ImageDraw.ImageDraw, centre: np.ndarray, r: float, fill) -> None:
    x, y = centre
    draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)


def draw_figure(im: Image.Image, pattern: Image.Image, style: Style, points: np.ndarray, parent: tuple[int, ...] | list,
                width: np.ndarray, outlines: list[np.ndarray], marker_radius: float, stroke: int) -> Image.Image:
    """Draw one figure on ``im`` in place and return its silhouette (an "L" mask, 255 on the figure).

    Args:
        points: [N, 2] keypoints in continuous pixels (pixel i covers [i, i + 1)). parent: [N] limb parents (-1: none).
        width: [N] limb thickness in pixels. outlines: filled closed polygons [M, 2] (continuous pixels).
        marker_radius: radius in pixels of the dot drawn on every keypoint when ``style.marker`` is set.
        stroke: pixels of dark stroke around the union of the figure's parts.

    Every part is drawn twice, into a stroke mask (grown by ``stroke``) and a fill mask; the stroke colour goes
    through the first and the pattern through the second, so overlapping parts merge into one outlined shape.
    """
    edge, inner = Image.new("L", im.size), Image.new("L", im.size)
    de, di = ImageDraw.Draw(edge), ImageDraw.Draw(inner)
    pix = points - 0.5  # PIL puts pixel centres on integers
    for poly in outlines:
        xy = [tuple(p) for p in poly - 0.5]
        de.polygon(xy, fill=255)
        de.line(xy + xy[:1], fill=255, width=2 * stroke + 1, joint="curve")
        for corner in poly - 0.5:  # PIL's wide lines can miss the pixel of a sharp corner
            _disc(de, corner, stroke + 0.5, 255)
        di.polygon(xy, fill=255)
    for i, p in enumerate(parent):
        if p < 0:
            continue
        for draw, grow in ((de, stroke), (di, 0)):
            draw.line([tuple(pix[p]), tuple(pix[i])], fill=255, width=max(1, round(width[i] + 2 * grow)))
            for end in (pix[p], pix[i]):  # round joints and tips
                _disc(draw, end, width[i] / 2 + grow, 255)
    im.paste(style.stroke, mask=edge)
    im.paste(pattern, mask=inner)
    if style.marker is not None:
        draw = ImageDraw.Draw(im)
        for q in pix:
            _disc(draw, q, marker_radius, style.marker)
            _disc(de, q, marker_radius, 255)
    return edge


@dataclass
class Rendered:
    """One rendered instance: ``keypoints`` [N, 2] float64 continuous pixels, ``visible`` [N] bool,
    ``bbox`` (x, y, w, h) of the silhouette clipped to the image, ``area`` its pixel count."""

    image: Image.Image
    keypoints: np.ndarray
    visible: np.ndarray
    bbox: tuple[int, int, int, int]
    area: int


def _place(rng: np.random.Generator, pts: np.ndarray, size: int, max_rotation: float) -> tuple[np.ndarray, float]:
    """The [2, 3] affine from template units to pixels (rotation, anisotropic scale, position) and the figure's
    extent in pixels. One instance in ten is pushed partly out of the image (truncation)."""
    a = _rotation(math.radians(rng.uniform(-max_rotation, max_rotation))) @ np.diag(rng.uniform(0.85, 1.15, 2))
    extent = rng.uniform(0.45, 0.8) * size
    span = np.ptp(pts @ a.T, 0) * extent
    extent *= min(1.0, 0.95 * size / span.max())
    q = pts @ a.T * extent
    lo, span = q.min(0), np.ptp(q, 0)
    offset = rng.uniform(0, size - span) - lo
    if rng.random() < 0.1:
        axis = int(rng.integers(2))
        offset[axis] += rng.choice([-1, 1]) * rng.uniform(0.05, 0.2) * span[axis]
        inside = np.all((q + offset >= 0) & (q + offset < size), 1)
        if inside.mean() < 0.5:
            offset = rng.uniform(0, size - span) - lo
    return np.concatenate([a * extent, offset[:, None]], 1), extent


def _apply(m: np.ndarray, pts: np.ndarray) -> np.ndarray:
    return pts @ m[:, :2].T + m[:, 2]


def _decoy(rng: np.random.Generator, cat: Category, extent: float) -> tuple[np.ndarray, list[int], np.ndarray]:
    """A loose limb of 2-4 joints in the category's proportions, around 0: points [k, 2] px, parents, widths [k] px."""
    k = int(rng.integers(2, 5))
    limbs = cat.width[np.asarray(cat.parent) >= 0]
    thickness = (float(np.median(limbs)) if limbs.size else 0.3 * cat.segment) * extent
    angle, pts = rng.uniform(0, 2 * math.pi), [np.zeros(2)]
    for _ in range(k - 1):
        angle += rng.normal(0, math.radians(30))
        step = cat.segment * extent * rng.uniform(0.7, 1.3)
        pts.append(pts[-1] + step * np.array([math.cos(angle), math.sin(angle)]))
    pts = np.stack(pts)
    return pts - pts.mean(0), [-1] + list(range(k - 1)), np.maximum(thickness * rng.uniform(0.7, 1.3, k), 2.0)


def _occlude(rng: np.random.Generator, im: Image.Image, pts: np.ndarray, visible: np.ndarray,
             extent: float) -> np.ndarray:
    """Paste 0-2 occluders (background texture or a flat colour) over parts of the figure; return ``visible``
    with the keypoints whose pixel they cover turned off. An occluder that would leave fewer than half of the
    visible keypoints (or none) is redrawn, up to 5 times, then skipped."""
    size = im.size[0]
    cells = np.clip(np.floor(pts).astype(int), 0, size - 1)
    for _ in range(int(rng.choice(3, p=[0.45, 0.4, 0.15]))):
        for _attempt in range(5):
            mask = Image.new("L", im.size)
            draw = ImageDraw.Draw(mask)
            centre = pts[int(rng.integers(len(pts)))] + rng.normal(0, 0.1 * extent, 2)
            half = extent * rng.uniform(0.06, 0.18, 2)
            shape = rng.integers(3)
            if shape == 0:
                draw.ellipse([tuple(centre - half), tuple(centre + half)], fill=255)
            elif shape == 1:
                draw.rectangle([tuple(centre - half), tuple(centre + half)], fill=255)
            else:
                draw.polygon([tuple(p) for p in centre + _star_polygon(rng, int(rng.integers(4, 8)), 1.0) * half],
                             fill=255)
            covered = np.asarray(mask)[cells[:, 1], cells[:, 0]] > 0
            left = visible & ~covered
            if left.sum() >= max(1, visible.sum() / 2):
                texture = background(rng, size) if rng.random() < 0.5 else _hsv(rng.uniform(0, 1), rng.uniform(0, 1),
                                                                                 rng.uniform(0.2, 1))
                im.paste(texture, mask=mask)
                visible = left
                break
    return visible


def render_instance(rng: np.random.Generator, cat: Category, size: int, max_rotation: float) -> Rendered:
    """Draw one instance of ``cat`` on a ``size`` x ``size`` image (see the module docstring for what varies)."""
    pose, torso = deform(rng, cat)
    to_pixels, extent = _place(rng, pose, size, max_rotation)
    pts = _apply(to_pixels, pose)
    if torso is not None:
        outlines = [_apply(to_pixels, torso)]
    else:
        outlines = [pts[:cat.num_outline]] if cat.num_outline >= 3 else []
    pattern = _pattern(rng, cat.style, size, extent)
    marker_radius = float(np.clip(0.02 * extent, 1.5, 3.5))
    stroke = max(1, round(extent / 80))

    im = background(rng, size)
    if rng.random() < 0.3:  # a loose limb beside the figure, in the figure's own style
        box_lo, box_hi = pts.min(0) - 0.05 * extent, pts.max(0) + 0.05 * extent
        decoy, decoy_parent, decoy_width = _decoy(rng, cat, extent)
        for _ in range(10):
            at = decoy + rng.uniform(0, size, 2)
            lo, hi = at.min(0) - decoy_width.max(), at.max(0) + decoy_width.max()
            if np.any(hi < box_lo) or np.any(lo > box_hi):
                draw_figure(im, pattern, cat.style, at, decoy_parent, decoy_width, [], marker_radius, stroke)
                break
    limb_width = np.maximum(cat.width * extent, 2.0)  # thinner limbs vanish at this resolution
    silhouette = draw_figure(im, pattern, cat.style, pts, cat.parent, limb_width, outlines, marker_radius, stroke)
    visible = np.all((pts >= 0) & (np.round(pts, 2) < size), 1)  # as stored: to 0.01 px, inside the image
    visible = _occlude(rng, im, pts, visible, extent)
    x0, y0, x1, y1 = silhouette.getbbox()
    area = int(np.count_nonzero(np.asarray(silhouette)))
    return Rendered(im, pts, visible, (x0, y0, x1 - x0, y1 - y0), area)


def coco_keypoints(keypoints: np.ndarray, visible: np.ndarray) -> list:
    """COCO's flat [x1, y1, v1, ...]: v = 2 and coordinates to 0.01 px where visible, 0, 0, 0 where not."""
    flat = []
    for (x, y), v in zip(keypoints, visible):
        flat += [round(float(x), 2), round(float(y), 2), 2] if v else [0, 0, 0]
    return flat


def keypoint_counts(rng: np.random.Generator, num_categories: int) -> np.ndarray:
    """Keypoints per category, spread over 8..68 and denser at the low end as in MP-100; both ends always occur."""
    counts = MIN_KEYPOINTS + np.round((MAX_KEYPOINTS - MIN_KEYPOINTS) * rng.random(num_categories) ** 2.5).astype(int)
    counts[0], counts[-1] = MIN_KEYPOINTS, MAX_KEYPOINTS
    return counts


def split_categories(rng: np.random.Generator, category_ids: list[int]) -> list[dict[str, list[int]]]:
    """The 5 MP-100-style splits: for each, ``{"train": ids, "val": ids, "test": ids}`` (ids sorted).

    Categories are shuffled and cut into 5 near-equal blocks; split s tests on block s and validates on the
    ``max(1, round(n / 10))`` categories that follow it in the shuffled order (wrapping round).
    """
    order = [int(c) for c in rng.permutation(category_ids)]
    n, n_val = len(order), max(1, round(len(order) / 10))
    bounds = np.cumsum([0] + [len(b) for b in np.array_split(np.arange(n), 5)])
    splits = []
    for s in range(5):
        test = order[bounds[s]:bounds[s + 1]]
        val = [order[(bounds[s + 1] + k) % n] for k in range(n_val)]
        train = [c for c in order if c not in test and c not in val]
        splits.append({"train": sorted(train), "val": sorted(val), "test": sorted(test)})
    return splits


def _written_by_us(root: Path, path: Path) -> bool:
    """Is ``path`` (under ``root``) something :func:`build` writes? Annotation files must say so in their info."""
    rel = path.relative_to(root).parts
    if rel in (("annotations",), ("images",)):
        return True
    if rel[0] == "images":
        return rel[1].startswith("synthetic_") and len(rel) <= 3
    if rel[0] != "annotations" or len(rel) != 2 or not rel[1].startswith("mp100_split"):
        return False
    if rel[1].endswith(".json.tmp"):  # left by an interrupted atomic write
        return True
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)["info"]["description"].startswith(_DESCRIPTION)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _check_output_dir(out: Path) -> None:
    """Refuse a folder holding anything this builder does not write (a real MP-100 copy, say), so a rebuild
    never overwrites other data."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SyntheticCapeError(f"output {out} is a file; pass a folder path with --output-dir")
    for path in out.rglob("*"):
        if not _written_by_us(out, path):
            raise SyntheticCapeError(f"{out} holds {path.relative_to(out)}, which this builder did not write; "
                                     "pass a new or empty --output-dir (it never overwrites other data)")


def _write_json(path: Path, obj: dict) -> None:
    """Write atomically, so an interrupted build never leaves a truncated annotation file behind."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def build(output_dir: str | Path, num_categories: int = 100, instances_per_category: int = 40,
          image_size: int = 160, max_rotation: float = 60.0, seed: int = 0) -> Path:
    """Write the dataset (see the module docstring) to ``output_dir`` and return it as a Path.

    The same arguments give byte-identical files. An earlier build's annotation files are removed first and
    ``mp100_split5_test.json`` is written last, so its presence means the build finished. Images of an
    earlier, larger build that this one does not name are left in place, unused.

    Raises:
        SyntheticCapeError: fewer than 10 categories (a 70/10/20 split needs 10), fewer than 2 instances per
            category, ``image_size`` outside 32..4096, ``max_rotation`` outside 0..180 degrees, a negative
            ``seed``, or an ``output_dir`` holding files this builder did not write.
    """
    if num_categories < 10:
        raise SyntheticCapeError(f"num_categories={num_categories}: need at least 10 for disjoint train/val/test "
                                 "splits")
    if instances_per_category < 2:
        raise SyntheticCapeError(f"instances_per_category={instances_per_category}: an episode needs at least 2")
    if not 32 <= image_size <= 4096:
        raise SyntheticCapeError(f"image_size={image_size}: use 32..4096 pixels")
    if not 0 <= max_rotation <= 180:
        raise SyntheticCapeError(f"max_rotation={max_rotation}: use 0..180 degrees")
    if seed < 0:
        raise SyntheticCapeError(f"seed={seed}: use a seed >= 0")
    out = Path(output_dir)
    _check_output_dir(out)
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    # An earlier build's annotations (checked above) go first: a rebuild cut short must not look finished,
    # with old annotations over new images.
    for old in (out / "annotations").iterdir():
        old.unlink()

    counts = keypoint_counts(np.random.default_rng([seed, 0]), num_categories)
    categories, images, annotations = {}, {}, {}
    with tqdm(total=num_categories * instances_per_category, desc="synthetic CAPE", unit="img") as bar:
        for c in range(num_categories):
            cat = make_category(np.random.default_rng([seed, 1, c]), c + 1, int(counts[c]))
            categories[cat.id] = cat.coco()
            (out / "images" / cat.name).mkdir(parents=True, exist_ok=True)
            images[cat.id], annotations[cat.id] = [], []
            for n in range(instances_per_category):
                uid = c * instances_per_category + n + 1
                inst = render_instance(np.random.default_rng([seed, 2, c, n]), cat, image_size, max_rotation)
                file_name = f"{cat.name}/{n:04d}.png"
                inst.image.save(out / "images" / file_name, compress_level=1)
                images[cat.id].append({"id": uid, "file_name": file_name, "width": image_size, "height": image_size})
                annotations[cat.id].append({
                    "id": uid, "image_id": uid, "category_id": cat.id, "bbox": list(inst.bbox),
                    "keypoints": coco_keypoints(inst.keypoints, inst.visible),
                    "num_keypoints": int(inst.visible.sum()), "area": inst.area, "iscrowd": 0})
                bar.update()

    for s, subsets in enumerate(split_categories(np.random.default_rng([seed, 3]), list(categories)), 1):
        for subset in SUBSETS:
            ids = subsets[subset]
            _write_json(out / "annotations" / f"mp100_split{s}_{subset}.json", {
                "info": {"description": f"{_DESCRIPTION}, split {s} {subset}", "seed": seed},
                "images": [im for i in ids for im in images[i]],
                "annotations": [a for i in ids for a in annotations[i]],
                "categories": [categories[i] for i in ids]})
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line for :func:`build` (run it through :func:`utils.run.main.cli_main` for the one-line errors).

    Raises:
        SyntheticCapeError: bad arguments, a folder it did not write, or a failed write.
    """
    ap = ArgumentParser(
        description="Build the synthetic CAPE dataset: procedural categories whose keypoints can only be told apart "
                    "by their place in the figure, in the MP-100 layout (annotations/mp100_split{1..5}_{train,val,"
                    "test}.json and images/), readable by utils/data/cape/mp100.py.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--output-dir", default="data/synthetic_cape", help="new or empty folder (or an earlier build)")
    ap.add_argument("--num-categories", type=int, default=100, help="categories, at least 10 (MP-100 has 100)")
    ap.add_argument("--instances-per-category", type=int, default=40, help="images per category, one instance each")
    ap.add_argument("--image-size", type=int, default=160, help="square image side in pixels")
    ap.add_argument("--max-rotation", type=float, default=60.0, help="instances are rotated by up to +- this, degrees")
    ap.add_argument("--seed", type=int, default=0, help="the same seed gives byte-identical files")
    args = ap.parse_args(argv)
    try:
        out = build(args.output_dir, args.num_categories, args.instances_per_category, args.image_size,
                    args.max_rotation, args.seed)
    except OSError as e:
        raise SyntheticCapeError(f"could not write the dataset in {args.output_dir}: {e}") from None
    print(f"wrote {args.num_categories} categories x {args.instances_per_category} instances to {out}")
    return 0
