"""Wilson score intervals against hand-computed and published values, and the metrics helper."""

import math

import pytest

from utils.eval.stats import Z95, interval_keys, wilson_interval, with_interval


def by_hand(successes, n, z=Z95):
    """Wilson's interval as the roots of (p̂ - p)² = z² p (1 - p) / n, solved for p with the quadratic formula."""
    p_hat = successes / n
    a, b, c = 1 + z * z / n, -(2 * p_hat + z * z / n), p_hat * p_hat
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


def test_edges_and_the_middle():
    # 0 of 10: the upper bound is z² / (n + z²) = 3.8415 / 13.8415.
    assert wilson_interval(0, 10) == (0.0, pytest.approx(Z95 ** 2 / (10 + Z95 ** 2), abs=1e-12))
    assert wilson_interval(0, 10)[1] == pytest.approx(0.2775328, abs=1e-7)
    assert wilson_interval(10, 10) == (pytest.approx(1 - 0.2775328, abs=1e-7), 1.0)  # the mirror image
    low, high = wilson_interval(5, 10)  # centred on 1/2: 0.5 ± 1.95996 / 1.38415 · sqrt(0.025 + 0.0096)
    assert (low, high) == (pytest.approx(0.2365931, abs=1e-7), pytest.approx(0.7634069, abs=1e-7))
    assert low + high == pytest.approx(1.0, abs=1e-15)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("successes, n, low, high", [
    # R. G. Newcombe, "Two-sided confidence intervals for the single proportion: comparison of seven
    # methods", Statistics in Medicine 17 (1998), Table I, method 3 (score method without continuity correction).
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_published_values(successes, n, low, high):
    assert wilson_interval(successes, n) == (pytest.approx(low, abs=5e-5), pytest.approx(high, abs=5e-5))


@pytest.mark.parametrize("successes, n, z", [(13, 16, Z95), (3, 7, 1.0), (2.5, 6, Z95), (199, 200, 2.5758)])
def test_matches_the_quadratic_roots(successes, n, z):
    assert wilson_interval(successes, n, z) == pytest.approx(by_hand(successes, n, z), abs=1e-12)


@pytest.mark.parametrize("successes, n, z", [(-1, 10, Z95), (11, 10, Z95), (1, -1, Z95), (1, 10, 0.0),
                                              (math.nan, 10, Z95), (1, math.inf, Z95)])
def test_bad_arguments(successes, n, z):
    with pytest.raises(ValueError, match="wilson_interval needs 0 <= successes <= n"):
        wilson_interval(successes, n, z)


def test_with_interval_puts_the_fields_after_the_key():
    metrics = {"accuracy": 0.9, "exact_accuracy": 0.8125, "count": 16.0}
    out = with_interval(metrics, "exact_accuracy", 16)
    assert list(out) == ["accuracy", "exact_accuracy", *interval_keys("exact_accuracy"), "count"]
    assert (out["exact_accuracy_ci95_low"], out["exact_accuracy_ci95_high"]) == pytest.approx(wilson_interval(13, 16))
    assert (round(out["exact_accuracy_ci95_low"], 2), round(out["exact_accuracy_ci95_high"], 2)) == (0.57, 0.93)
    assert metrics == {"accuracy": 0.9, "exact_accuracy": 0.8125, "count": 16.0}  # not changed in place
    # a mean that rounds a hair past 1 is still all successes
    assert with_interval({"p": (0.1 * 3) / 0.3}, "p", 3)["p_ci95_high"] == 1.0
    with pytest.raises(ValueError, match=r"p = 1.5 is not a proportion in \[0, 1\]"):
        with_interval({"p": 1.5}, "p", 3)
    with pytest.raises(KeyError):
        with_interval({}, "p", 3)
