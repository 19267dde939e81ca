"""Small, dependency-free statistics: confidence intervals and pass@k.

No SciPy here on purpose (it is not a project dependency); the only quantiles needed
are the normal one (stdlib ``statistics``) and Student's t, which a Cornish–Fisher
expansion gives to < 0.2 % for ν ≥ 3 (exact closed forms for ν = 1, 2).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Sequence


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a two-sided confidence interval over ``n`` samples."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"need 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    v = float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Mean with a Student-t interval; non-finite values are dropped, n counts the rest."""
    xs = [float(x) for x in values if math.isfinite(float(x))]
    n = len(xs)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = math.fsum(xs) / n
    if n == 1:
        return Estimate(mean, mean, mean, 1)
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    half = t_quantile(0.5 + confidence / 2, n - 1) * math.sqrt(var / n)
    return Estimate(mean, mean - half, mean + half, n)


def proportion_ci(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """Success rate with a Wilson score interval (sane at 0 %, 100 % and small n)."""
    if n <= 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} outside [0, {n}]")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Mathematically low <= p <= high; the clamps also absorb rounding at p = 0 and p = 1.
    return Estimate(p, min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)), n)


def clustered_proportion_ci(per_seed: Sequence[Sequence[float]], confidence: float = 0.95) -> Estimate:
    """Success rate over several episodes per task seed (0/1 outcomes, grouped by seed), with a Wilson interval at
    the effective sample size: the episodes of one seed are not independent, so n is shrunk by the design effect
    (the variance of the per-seed means over that of as many independent episodes), never grown past the
    episodes nor below the seeds. Stays inside [0, 1] unlike a t-interval; ``n`` of the result counts seeds."""
    groups = [[float(x) for x in g] for g in per_seed if len(g)]
    m, total = len(groups), sum(len(g) for g in groups)
    if m == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    p = math.fsum(math.fsum(g) for g in groups) / total
    means = [math.fsum(g) / len(g) for g in groups]
    n_eff = float(total)
    if m > 1 and 0 < p < 1:
        var_mean = math.fsum((x - p) ** 2 for x in means) / (m - 1) / m  # variance of the mean over seeds
        if var_mean > 0:
            n_eff = min(float(total), max(float(m), p * (1 - p) / var_mean))
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    denom = 1 + z * z / n_eff
    centre = (p + z * z / (2 * n_eff)) / denom
    half = z * math.sqrt(p * (1 - p) / n_eff + z * z / (4 * n_eff * n_eff)) / denom
    return Estimate(p, min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)), m)


def paired_difference_ci(pairs: Sequence[tuple[bool, bool]], confidence: float = 0.95) -> Estimate:
    """Difference of two success rates measured on the same tasks, ``after - before``, from (before, after) pairs:
    Newcombe's hybrid score interval for paired proportions (Newcombe 1998, method 10: Wilson intervals of both
    rates combined through the phi correlation of the pairs). Stays inside [-1, 1]; ``n`` counts the pairs."""
    n = len(pairs)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    a = sum(1 for x, y in pairs if x and y)
    b = sum(1 for x, y in pairs if x and not y)
    c = sum(1 for x, y in pairs if not x and y)
    d = n - a - b - c
    before, after = proportion_ci(a + b, n, confidence), proportion_ci(a + c, n, confidence)
    p1, p2 = before.mean, after.mean
    denom = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(denom) if denom > 0 else 0.0
    diff = p2 - p1
    down = math.sqrt(max(0.0, (p2 - after.low) ** 2 - 2 * phi * (p2 - after.low) * (before.high - p1)
                         + (before.high - p1) ** 2))
    up = math.sqrt(max(0.0, (after.high - p2) ** 2 - 2 * phi * (after.high - p2) * (p1 - before.low)
                       + (p1 - before.low) ** 2))
    return Estimate(diff, max(-1.0, diff - down), min(1.0, diff + up), n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): P(at least one of k draws out of n succeeds)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pct_ci(estimate: dict[str, float]) -> str:
    """``{"mean", "low", "high"}`` of a proportion as ``"mean [low, high]"`` in percent, one decimal (report tables)."""
    return f"{100 * estimate['mean']:.1f} [{100 * estimate['low']:.1f}, {100 * estimate['high']:.1f}]"
