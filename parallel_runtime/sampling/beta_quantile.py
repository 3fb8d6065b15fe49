"""Quantile function of the Beta distribution in float64 (replaces scipy.stats.beta.ppf for the beta scheduler)."""

from __future__ import annotations

import math

_TINY = 1e-300
_EPS = 1e-16


def _continued_fraction(a: float, b: float, x: float) -> float:
    """Lentz evaluation of the continued fraction of the incomplete beta function."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
            last = d * c
        if abs(last - 1.0) < _EPS:
            break
    return h


def beta_cdf(x: float, a: float, b: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _continued_fraction(b, a, 1.0 - x) / b


def beta_ppf(q: float, a: float, b: float) -> float:
    """Inverse of :func:`beta_cdf` in ``x``: bisection down to adjacent float64 values."""
    if q <= 0.0:
        return 0.0
    if q >= 1.0:
        return 1.0
    if a == b and q == 0.5:
        return 0.5
    if a == 1.0 and b == 1.0:
        return q
    lo, hi = 0.0, 1.0
    while True:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if beta_cdf(mid, a, b) < q:
            lo = mid
        else:
            hi = mid
    # the closer of the two bracketing values
    return lo if abs(beta_cdf(lo, a, b) - q) <= abs(beta_cdf(hi, a, b) - q) else hi
