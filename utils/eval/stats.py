"""Confidence intervals for the accuracies the evaluators report.

An accuracy over n test examples is a proportion; with n in the tens or hundreds its sampling error is
often larger than the difference between two runs. :func:`wilson_interval` gives the 95% interval, and
:func:`with_interval` adds it to a metrics dict as ``<key>_ci95_low`` / ``<key>_ci95_high``.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal: a two-sided 95% interval
ROUNDING = 1e-9          # a mean of sums divided by a count may land this far outside [0, 1]


def wilson_interval(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a proportion ``successes / n``.

    E. B. Wilson, "Probable inference, the law of succession, and statistical inference", JASA 22 (1927);
    recommended over the normal (Wald) interval by L. D. Brown, T. T. Cai and A. DasGupta, "Interval
    Estimation for a Binomial Proportion", Statistical Science 16(2) (2001), eq. (4). With p = successes / n:

        centre = (p + z² / 2n) / (1 + z² / n)
        half   = z / (1 + z² / n) · sqrt(p (1 - p) / n + z² / 4n²)

    Unlike the normal interval it stays inside [0, 1] and does not collapse to a point at p = 0 or 1.

    Args:
        successes: number of successes, 0 <= successes <= n; may be fractional (a mean score times n).
        n: number of trials (examples), >= 0.
        z: the standard normal quantile; the default gives a two-sided 95% interval.
    Returns:
        (low, high), floats in [0, 1]; (0.0, 1.0) when n is 0 (nothing is known).
    Raises:
        ValueError: n < 0, successes outside [0, n], z <= 0, or a value that is not finite.
    """
    if not all(math.isfinite(v) for v in (successes, n, z)) or n < 0 or z <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n and z > 0, all finite; "
                         f"got successes={successes}, n={n}, z={z}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    scale = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At p = 0 (p = 1) the bound is 0 (1) exactly; computed, it can land an ulp outside or inside.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def interval_keys(key: str) -> tuple[str, str]:
    """The names of ``key``'s 95% interval fields: ``(<key>_ci95_low, <key>_ci95_high)``."""
    return f"{key}_ci95_low", f"{key}_ci95_high"


def with_interval(metrics: dict[str, float], key: str, count: float) -> dict[str, float]:
    """``metrics`` with the 95% Wilson interval of the proportion ``metrics[key]`` over ``count`` examples.

    The proportion is taken as ``metrics[key] * count`` successes in ``count`` independent trials.

    Args:
        metrics: a flat ``{name: value}`` dict holding ``key``, a fraction in [0, 1].
        key: the proportion, e.g. ``"exact_accuracy"`` or ``"ARC/pass@2"``.
        count: the number of examples it was measured over.
    Returns:
        a new dict, in ``metrics``' order with ``<key>_ci95_low`` and ``<key>_ci95_high`` right after ``key``.
    Raises:
        KeyError: ``key`` is not in ``metrics``.
        ValueError: the value is not in [0, 1] (give or take ROUNDING), or ``count`` < 0 (see :func:`wilson_interval`).
    """
    value = metrics[key]
    if not -ROUNDING <= value <= 1 + ROUNDING:
        raise ValueError(f"{key} = {value} is not a proportion in [0, 1]; it has no binomial interval")
    low, high = wilson_interval(min(max(value, 0.0), 1.0) * count, count)
    out = {}
    for name, value in metrics.items():
        out[name] = value
        if name == key:
            out.update(zip(interval_keys(key), (low, high)))
    return out
