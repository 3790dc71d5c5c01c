"""The curriculum's decisions as pure functions of plain values (tested one by one)."""

from __future__ import annotations

import math

from rlvr.errors import ConfigError


def weight_groups(weights: dict[str, float], domains: list[str]) -> dict[str, list[str]]:
    """Each weight key -> the training domains it covers: the domain itself, or every domain under a
    family prefix (``math`` -> ``math.arith``, ``math.word``). No keys: one group per domain.

    Raises ``ConfigError`` for a key that covers no training domain and for a domain covered twice."""
    if not weights:
        return {d: [d] for d in domains}
    groups: dict[str, list[str]] = {}
    owner: dict[str, str] = {}
    for key in weights:
        covered = [d for d in domains if d == key or d.startswith(key + ".")]
        if not covered:
            raise ConfigError(f"config key 'curriculum.weights.{key}' names no training domain; "
                              f"choose domains or family prefixes of: {sorted(domains)}")
        for d in covered:
            if d in owner:
                raise ConfigError(f"config key 'curriculum.weights': domain {d} is covered by both "
                                  f"'{owner[d]}' and '{key}'")
            owner[d] = key
        groups[key] = covered
    if not any(weights[k] > 0 for k in groups):
        raise ConfigError("config key 'curriculum.weights': every weight is 0")
    return groups


def should_promote(window: list[int], *, min_samples: int, promote_at: float) -> bool:
    """Whether a frontier level with these recent sample outcomes (1 pass, 0 fail) is mastered."""
    return len(window) >= min_samples and sum(window) / len(window) >= promote_at


def choose_level(levels: list[int], frontier: int, frontier_share: float, u: float, v: float) -> int:
    """The level of one draw: ``frontier`` when ``u < frontier_share`` or no unlocked level lies
    below it, else one of the lower unlocked ``levels`` picked by ``v`` in [0, 1)."""
    below = [lv for lv in levels if lv < frontier]
    if u < frontier_share or not below:
        return frontier
    return below[min(int(v * len(below)), len(below) - 1)]


def learnability_level(levels: list[int], rates: dict[int, float | None], u: float, floor: float = 0.02) -> int:
    """A level drawn with weight ``p (1 - p)`` of its rolling pass rate ``p`` (the variance of a
    pass/fail reward: the expected signal of a GRPO group), at least ``floor``; a level without a
    rate yet weighs 0.25 (as p = 0.5)."""
    weights = [max(floor, 0.25 if rates.get(lv) is None else rates[lv] * (1 - rates[lv])) for lv in levels]
    return weighted_pick(levels, weights, u)


def weighted_pick(items: list, weights: list[float], u: float):
    """The item whose share of the cumulative (normalised) ``weights`` holds ``u`` in [0, 1)."""
    total, acc = sum(weights), 0.0
    for item, w in zip(items, weights):
        acc += w / total
        if u < acc:
            return item
    return items[-1]


def seesaw_step(score: float, best: float | None, factor: float, *, tolerance: float, boost: float,
                max_factor: float, noise: float = 0.0) -> tuple[float, float, bool]:
    """One periodic eval of a group: ``(new factor, new best, triggered)``.

    More than ``max(tolerance, noise)`` below the best so far: the factor is multiplied by ``boost``
    (capped at ``max_factor``) and the eval triggers; otherwise a raised factor relaxes by ``boost``
    towards 1. ``noise``: the drop the eval's own sampling error explains (``eval_noise``)."""
    if best is None or score > best:
        best = score
    if score < best - max(tolerance, noise):
        return min(factor * boost, max_factor), best, True
    return max(1.0, factor / boost), best, False


def eval_noise(best: float, n: int, z: float) -> float:
    """``z`` standard errors of the difference of two pass rates near ``best`` on ``n`` tasks each,
    with the rate Laplace-smoothed (``(best n + 1) / (n + 2)``) so that a rate near 0 or 1 on a
    small eval still has noise (2 of 28 tasks, then 0 of 28, is not a signal)."""
    if n <= 0:
        return 0.0
    p = (best * n + 1) / (n + 2)
    return z * math.sqrt(2 * p * (1 - p) / n)


def recycle_accepts(retries: int, decay: float, u: float) -> bool:
    """Whether a due failed task on its ``retries``-th retry (>= 1) is drawn: ``u < decay**(retries-1)``."""
    return u < decay ** (retries - 1)


def normalised(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {k: (w / total if total > 0 else 0.0) for k, w in weights.items()}
