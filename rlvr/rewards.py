"""Reward composition: verdict -> scalar reward plus named terms that sum to it.

reward = outcome (pass / fail value, or the verifier's partial score if asked)
       + format term (small bonus when the answer is in the required form)
       + overlong penalty (DAPO soft punishment near the generation limit, or a fixed penalty
         for truncated samples)
Every term is returned separately so it can be logged as ``rollout/reward_<term>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rlvr.algos.penalties import overlong_penalty
from rlvr.config import check_range
from rlvr.types import Scored, Trajectory, Verdict


@dataclass
class RewardConfig:
    pass_reward: float = 1.0
    """Outcome reward when the verifier passes."""
    fail_reward: float = 0.0
    """Outcome reward when it fails."""
    outcome: Literal["binary", "score"] = "binary"
    """`binary`: pass/fail values; `score`: fail + (pass - fail) * verdict.score (partial credit)."""
    format_weight: float = 0.0
    """Added when the verifier reports details['format_ok'] (0 disables)."""
    overlong: Literal["none", "soft", "truncated"] = "none"
    """`soft`: DAPO linear penalty over the last `overlong_buffer` tokens; `truncated`: a fixed
    penalty for samples cut at the length limit."""
    overlong_buffer: int = 8
    """Tokens before the limit over which the soft penalty ramps from 0 to -overlong_penalty."""
    overlong_penalty: float = 1.0
    """Size of the overlong penalty."""

    def __post_init__(self) -> None:
        check_range("reward.overlong_buffer", self.overlong_buffer, 0)
        check_range("reward.format_weight", self.format_weight, 0.0)


def score(verdict: Verdict, trajectory: Trajectory, cfg: RewardConfig, max_new_tokens: int) -> Scored:
    """Compose the reward for one trajectory (pure)."""
    if cfg.outcome == "binary":
        outcome = cfg.pass_reward if verdict.passed else cfg.fail_reward
    else:
        outcome = cfg.fail_reward + (cfg.pass_reward - cfg.fail_reward) * float(verdict.score)
    terms = {"outcome": outcome}
    if cfg.format_weight:
        terms["format"] = cfg.format_weight * float(bool(verdict.details.get("format_ok", False)))
    if cfg.overlong == "soft":
        length = torch.tensor([float(trajectory.num_policy_tokens)])
        terms["overlong"] = float(overlong_penalty(length, max_tokens=max_new_tokens,
                                                   buffer=cfg.overlong_buffer, penalty=cfg.overlong_penalty)[0])
    elif cfg.overlong == "truncated":
        terms["overlong"] = -cfg.overlong_penalty if trajectory.finish_reason == "length" else 0.0
    return Scored(trajectory=trajectory, verdict=verdict, reward=sum(terms.values()), terms=terms)
