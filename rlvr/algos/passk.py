"""pass@k estimation and confidence intervals for evaluation reports.

``pass_at_k`` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", Codex paper, Sec. 2.1 and Fig. 3): from n samples of a task with c correct,
pass@k = 1 - C(n - c, k) / C(n, k), computed as a product so it never forms huge binomials.

Plain Python floats, no tensors: this module neither runs samples nor groups them by domain;
``rlvr/eval`` does that and calls these per task and per domain.
"""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, Fig. 3).

    Product form: C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i). pass@1 = c / n.
    Needs 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float:
    """Mean of per-task pass@k over ``counts`` = [(n, c), ...]. Raises on an empty list."""
    if not counts:
        raise ValueError("mean_pass_at_k needs at least one task")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def confidence_interval(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """Normal-approximation interval for the mean of per-task estimates, clipped to [0, 1].

    mean +- z * s / sqrt(m), with s the sample std (divisor m - 1) over the m tasks. It covers
    task-sampling noise only (the per-task estimates are treated as exact). With one task the
    spread is unknown and the interval is (0, 1). Raises on an empty list.
    """
    m = len(values)
    if m == 0:
        raise ValueError("confidence_interval needs at least one value")
    if m == 1:
        return 0.0, 1.0
    mean = sum(values) / m
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (m - 1))
    half = z * s / math.sqrt(m)
    return max(0.0, mean - half), min(1.0, mean + half)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927), e.g. pass@1 over n tasks
    with one sample each. Unlike the normal approximation it stays inside [0, 1] and is not
    degenerate at 0 or n successes. Needs n >= 1 and 0 <= successes <= n.
    """
    if not (n >= 1 and 0 <= successes <= n):
        raise ValueError(f"need n >= 1 and 0 <= successes <= n, got successes={successes}, n={n}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
