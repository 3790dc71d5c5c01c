"""The curriculum's decisions as pure functions of plain values (tested one by one)."""

from __future__ import annotations

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


def seesaw_step(score: float, best: float | None, factor: float, *, tolerance: float, boost: float,
                max_factor: float) -> tuple[float, float, bool]:
    """One periodic eval of a group: ``(new factor, new best, triggered)``.

    More than ``tolerance`` below the best so far: the factor is multiplied by ``boost`` (capped at
    ``max_factor``) and the eval triggers; otherwise a raised factor relaxes by ``boost`` towards 1."""
    if best is None or score > best:
        best = score
    if score < best - tolerance:
        return min(factor * boost, max_factor), best, True
    return max(1.0, factor / boost), best, False


def recycle_accepts(retries: int, decay: float, u: float) -> bool:
    """Whether a due failed task on its ``retries``-th retry (>= 1) is drawn: ``u < decay**(retries-1)``."""
    return u < decay ** (retries - 1)


def normalised(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {k: (w / total if total > 0 else 0.0) for k, w in weights.items()}
