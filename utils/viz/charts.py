"""Line charts as Pillow pictures, for the README's curves (accuracy against training PFLOP, against test-time
compute). Pillow draws every other picture of the project, so a chart needs no plotting library."""

from __future__ import annotations

import math
from typing import Sequence

from PIL import Image, ImageDraw

from utils.viz.puzzles import _font

COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (23, 190, 207),
           (140, 86, 75), (127, 127, 127)]


def line_chart(series: dict[str, tuple[Sequence[float], Sequence[float]]], x_label: str, y_label: str, title: str,
               log_x: bool = False, y_range: tuple[float, float] | None = None,
               size: tuple[int, int] = (880, 520)) -> Image.Image:
    """One line with round markers per series, a legend, axes with ticks and labels.

    Args:
        series: ``{label: (xs, ys)}``, points in x order; a series may hold a single point.
        log_x: a logarithmic x axis (every x must be > 0).
        y_range: the y axis' span; None: from the data, 0 included.
    Returns:
        an RGB picture of ``size`` pixels.
    Raises:
        ValueError: no points, or an x <= 0 on a logarithmic axis.
    """
    points = [(x, y) for xs, ys in series.values() for x, y in zip(xs, ys)]
    if not points:
        raise ValueError("a chart needs at least one point")
    if log_x and min(x for x, _ in points) <= 0:
        raise ValueError("a logarithmic x axis needs every x > 0")
    fx = math.log10 if log_x else float
    x_lo, x_hi = min(fx(x) for x, _ in points), max(fx(x) for x, _ in points)
    x_lo = x_lo if log_x else min(x_lo, 0.0)  # a linear axis starts at 0, so distances compare
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_lo, y_hi = y_range or (min(0.0, min(y for _, y in points)), max(y for _, y in points) or 1.0)
    width, height = size
    left, right, top, bottom = 78, 24, 44, 64
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    small, big = _font(13), _font(16)

    def at(x: float, y: float) -> tuple[float, float]:
        u = (fx(x) - x_lo) / (x_hi - x_lo)
        v = (y - y_lo) / ((y_hi - y_lo) or 1.0)
        return left + u * (width - left - right), height - bottom - v * (height - top - bottom)

    draw.text((left, 12), title, fill="black", font=big)
    draw.rectangle([left, top, width - right, height - bottom], outline=(90, 90, 90))
    for k in range(6):
        y = y_lo + (y_hi - y_lo) * k / 5
        _, py = at(10 ** x_lo if log_x else x_lo, y)
        draw.line([left - 4, py, width - right, py], fill=(225, 225, 225) if k else (90, 90, 90))
        draw.text((left - 8, py), f"{y:.3g}", fill="black", font=small, anchor="rm")
    for x in _x_ticks(x_lo, x_hi, log_x):
        px, _ = at(x, y_lo)
        draw.line([px, height - bottom, px, height - bottom + 4], fill=(90, 90, 90))
        label = f"{x:.0f}" if x >= 1 and x == int(x) else f"{x:.3g}"
        draw.text((px, height - bottom + 8), label, fill="black", font=small, anchor="mt")
    draw.text(((left + width - right) / 2, height - 22), x_label, fill="black", font=small, anchor="mm")
    draw.text((10, top - 18), y_label, fill="black", font=small)
    for i, (xs, ys) in enumerate(series.values()):
        colour = COLOURS[i % len(COLOURS)]
        xy = [at(x, y) for x, y in zip(xs, ys)]
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=2)
        for px, py in xy:
            draw.ellipse([px - 3, py - 3, px + 3, py + 3], fill=colour)
    # The legend goes in the plot's corner that covers the fewest points, on white.
    box_w = 54 + max(draw.textlength(label, font=small) for label in series)
    box_h = 8 + 18 * len(series)
    corners = [(left + 4, top + 4), (width - right - 4 - box_w, height - bottom - 4 - box_h),
               (width - right - 4 - box_w, top + 4), (left + 4, height - bottom - 4 - box_h)]
    drawn = [at(x, y) for x, y in points]
    bx, by = min(corners, key=lambda c: sum(c[0] <= px <= c[0] + box_w and c[1] <= py <= c[1] + box_h
                                            for px, py in drawn))
    draw.rectangle([bx, by, bx + box_w, by + box_h], fill="white", outline=(200, 200, 200))
    for i, label in enumerate(series):
        ly = by + 13 + 18 * i
        draw.line([bx + 8, ly, bx + 32, ly], fill=COLOURS[i % len(COLOURS)], width=3)
        draw.text((bx + 38, ly), label, fill="black", font=small, anchor="lm")
    return image


def _x_ticks(lo: float, hi: float, log_x: bool) -> list[float]:
    """Tick values between ``lo`` and ``hi`` (their log10 on a logarithmic axis): powers of two or ten, or six
    evenly spaced values."""
    if log_x:
        base = 2 if hi - lo < 3 else 10
        first, last = math.ceil(lo / math.log10(base)), math.floor(hi / math.log10(base))
        return [float(base ** k) for k in range(first, last + 1)]
    return [lo + (hi - lo) * k / 5 for k in range(6)]
