"""A step's rollout metrics: reward, pass rate, length, truncation (per level when there are several), entropy, per
domain, term and reward source."""

from __future__ import annotations

from collections import defaultdict

import torch

from rlvr.types import Scored


def rollout_metrics(scored: list[Scored], kept: list[Scored]) -> dict:
    n = len(scored)
    out = {
        "rollout/reward_mean": sum(s.reward for s in scored) / n,
        "rollout/pass_rate": sum(s.verdict.passed for s in scored) / n,
        "rollout/response_tokens_mean": sum(s.trajectory.num_policy_tokens for s in scored) / n,
        "rollout/truncated_frac": sum(s.trajectory.finish_reason == "length" for s in scored) / n,
        "rollout/kept_frac": len(kept) / n,
        "rollout/entropy": sampled_entropy(scored),
        "rollout/group_reward_std": group_reward_std(scored),
    }
    played = [s.trajectory.episode for s in scored if s.trajectory.episode]
    if played:  # multi-turn episodes: how long they ran and how they ended
        out["rollout/turns_mean"] = sum(e.turns for e in played) / len(played)
        for finish in sorted({e.finish for e in played}):
            out[f"rollout/finish/{finish}"] = sum(e.finish == finish for e in played) / len(played)
    for term in sorted({t for s in scored for t in s.terms}):
        out[f"rollout/reward_{term}"] = sum(s.terms.get(term, 0.0) for s in scored) / n
    for name in sorted({k for s in scored for k in s.scores}):
        values = [s.scores[name] for s in scored if name in s.scores]
        out[f"rollout/score/{name}"] = sum(values) / len(values)
    by_domain: dict[str, list[bool]] = defaultdict(list)
    for s in scored:
        by_domain[s.task.domain].append(s.verdict.passed)
    for domain, passed in by_domain.items():
        out[f"rollout/pass_rate/{domain}"] = sum(passed) / len(passed)
    by_level: dict[int, list[bool]] = defaultdict(list)
    for s in scored:
        by_level[s.task.level].append(s.trajectory.finish_reason == "length")
    if len(by_level) > 1:  # several levels (a length curriculum): where the length limit cuts
        for level, cut in sorted(by_level.items()):
            out[f"rollout/truncated_frac/level_{level}"] = sum(cut) / len(cut)
    return out


def sampled_entropy(scored: list[Scored]) -> float:
    """Mean -log pi of the sampled policy tokens (nats per token; the rollout's log-probs are the
    policy's at temperature 1): at sampling temperature 1, the policy's entropy estimated from its
    own samples (``entropy_collapse`` watches it)."""
    total = sum(-lp for s in scored for lp, m in zip(s.trajectory.logprobs, s.trajectory.loss_mask) if m)
    return total / max(1, sum(s.trajectory.num_policy_tokens for s in scored))


def group_reward_std(scored: list[Scored]) -> float:
    """Mean over groups of the (population) std of their rewards: 0 when no group carries signal."""
    groups: dict[int, list[float]] = defaultdict(list)
    for s in scored:
        groups[s.trajectory.group_id].append(s.reward)
    stds = [float(torch.tensor(r, dtype=torch.float64).std(unbiased=False)) for r in groups.values()]
    return sum(stds) / len(stds)
