"""Reward sources that are models trained by ``rlvr rm``: ``reward_model`` and ``process_reward``.

``RewardScorer`` is the in-process scorer: it loads the directory once, re-templates each
(prompt, response) from text with the reward model's own tokenizer and chat template (the
policy's tokenizer may differ: its ids are never reused), scores in batches without gradients and
reports ``(r - mean) / std`` with the statistics stored at training time, clipped to
[-clip, clip]. ``ProcessScorer`` reads each step's score at its last token and reports the
``aggregate`` (min by default) of their sigmoids. A ``reward_model`` source with ``ensemble`` scores
with every member and combines them (``combine``: mean, worst case, or uncertainty-penalised).
"""

from __future__ import annotations

import torch

from rlvr.config import resolve_device
from rlvr.errors import UserError
from rlvr.reward_source_config import SourceConfig
from rlvr.reward_sources.registry import REWARD_SOURCES, response_of
from rlvr.rm.model import batch_tensors, encode, load_reward_model, step_ends
from rlvr.rm.process import steps_of
from rlvr.types import Message, Scored


class RewardScorer:
    """A reward model directory as a scorer of (prompt, response) texts."""

    def __init__(self, path: str, *, device: str = "cpu", batch_size: int = 32, clip: float = 0.0,
                 kind: str = "outcome", label: str = "reward_model") -> None:
        self.rm, self.tokenizer, self.meta = load_reward_model(path, device=resolve_device(f"{label}.device", device))
        if self.meta.kind != kind:
            raise UserError(f"{label}: {path} is a {self.meta.kind} reward model; a {kind} one is needed here")
        self.device = next(self.rm.parameters()).device
        self.batch_size, self.clip = batch_size, clip
        tok = self.tokenizer
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def score(self, items: list[tuple[tuple[Message, ...], str]]) -> list[float]:
        """The normalised (and clipped) reward of each (prompt, response)."""
        seqs = [encode(self.tokenizer, p, r, self.meta.max_length)[0] for p, r in items]
        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(seqs), self.batch_size):
                ids, mask = batch_tensors(seqs[i: i + self.batch_size], self.pad, self.device)
                out += ((self.rm(ids, mask).float() - self.meta.mean) / self.meta.std).tolist()
        return [max(-self.clip, min(self.clip, v)) if self.clip else v for v in out]

    def step_probs(self, items: list[tuple[tuple[Message, ...], str]]) -> list[list[float]]:
        """Each response's step scores as probabilities (sigmoid), one per non-empty line."""
        rows, ends = [], []
        for prompt, response in items:
            text = "\n".join(steps_of(response))
            ids, start = encode(self.tokenizer, prompt, text, self.meta.max_length)
            rows.append(ids)
            ends.append([start + e for e in step_ends(self.tokenizer, text) if start + e < len(ids) - 1] if text else [])
        out: list[list[float]] = []
        with torch.no_grad():
            for i in range(0, len(rows), self.batch_size):
                ids, mask = batch_tensors(rows[i: i + self.batch_size], self.pad, self.device)
                scores = torch.sigmoid(self.rm.token_scores(ids, mask))
                out += [scores[j, e].tolist() for j, e in enumerate(ends[i: i + self.batch_size])]
        return out


class ModelSource:
    can_fail = False

    def __init__(self, cfg: SourceConfig) -> None:
        self.name, self.cfg = cfg.name, cfg
        kind = "process" if cfg.kind == "process_reward" else "outcome"
        paths = [cfg.path, *(cfg.ensemble if kind == "outcome" else [])]
        self.scorers = [RewardScorer(p, device=cfg.device, batch_size=cfg.batch_size,
                                     clip=cfg.clip if kind == "outcome" else 0.0, kind=kind,
                                     label=f"reward.sources.{cfg.name}") for p in paths]

    def score(self, batch: list[Scored]) -> list[float | None]:
        items = [response_of(s) for s in batch]
        if self.cfg.kind == "process_reward":
            return [aggregate(p, self.cfg.aggregate) for p in self.scorers[0].step_probs(items)]
        members = [scorer.score(items) for scorer in self.scorers]
        return [combine(list(values), self.cfg.ensemble_aggregate, self.cfg.ensemble_std_coef)
                for values in zip(*members)]


def combine(values: list[float], how: str, std_coef: float) -> float:
    """One reward from an ensemble's scores of a sample: mean, min (worst case), or the mean minus
    ``std_coef`` x their (population) std (uncertainty-penalised); a single score is itself."""
    mean = sum(values) / len(values)
    if how == "min":
        return min(values)
    if how == "mean_minus_std":
        return mean - std_coef * (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return mean


def aggregate(probs: list[float], how: str) -> float:
    """One process reward from step probabilities; 0 for a response with no step."""
    if not probs:
        return 0.0
    return {"min": min, "mean": lambda p: sum(p) / len(p), "last": lambda p: p[-1]}[how](probs)


REWARD_SOURCES.register("reward_model")(ModelSource)
REWARD_SOURCES.register("process_reward")(ModelSource)
