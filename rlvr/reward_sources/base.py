"""One reward interface over every source: ``apply_sources`` turns the verifier's scored batch
into the run's reward under ``reward.sources`` (``rlvr.reward_source_config``).

    REWARD_SOURCES[kind](cfg) -> RewardSource
    RewardSource.score(batch: list[Scored]) -> [float | None]   one score per sample; None: this
                                                                sample's scoring failed (a source
                                                                whose policy is to score 0)

For each sample: the verifier's outcome term is scaled by its weight (dropped at 0), every other
source adds ``weight * score`` as its own term, and ``Scored.scores`` keeps each source's
unweighted score, ``<name>_failed`` (1/0) for sources that can fail, ``gold`` (the score of
``reward.gold``) and ``proxy`` (the sum of the trained-on terms of the sources other than the
verifier and the gold): the over-optimisation watch plots one against the other
(``monitor.overoptimization``).

Sources are built once per process and kept (a reward model is loaded once; on Ray each verifier
actor loads its own). A reward model scores the response *text* re-templated with its own
tokenizer: the policy's token ids are never handed to a model with another vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

from rlvr.reward_sources import judge, models, python_fn  # noqa: F401  (each registers its kinds)
from rlvr.reward_source_config import SourceConfig
from rlvr.reward_sources.registry import REWARD_SOURCES, RewardSource
from rlvr.types import Scored


_built: dict[str, RewardSource] = {}
_lock = threading.Lock()


def build_source(cfg: SourceConfig) -> RewardSource:
    """The source of ``cfg``, built on first use in this process and kept."""
    key = json.dumps(dataclasses.asdict(cfg), sort_keys=True)
    with _lock:
        if key not in _built:
            _built[key] = REWARD_SOURCES.get(cfg.kind)(cfg)
        return _built[key]


def forget_sources() -> None:
    """Drop the built sources (tests; a process that switches runs)."""
    with _lock:
        _built.clear()


def apply_sources(scored: list[Scored], cfg: Any) -> list[Scored]:
    """``scored`` with the reward of ``cfg.sources`` (``cfg``: the run's ``rlvr.rewards.RewardConfig``,
    not imported here: it imports this package's config); unchanged without sources."""
    if not cfg.sources or not scored:
        return scored
    verifier = next((s for s in cfg.sources if s.kind == "verifier"), SourceConfig(kind="verifier"))
    others = [s for s in cfg.sources if s.kind != "verifier"]
    raw = {s.name: build_source(s).score(scored) for s in others}
    can_fail = {s.name for s in others if build_source(s).can_fail}
    trained = [s for s in others if s.weight > 0 and s.name != cfg.gold]
    out = []
    for i, s in enumerate(scored):
        terms = dict(s.terms)
        outcome = terms.pop("outcome", 0.0)
        scores = {verifier.name: outcome}
        if verifier.weight > 0:
            terms["outcome"] = verifier.weight * outcome
        for src in others:
            value = raw[src.name][i]
            if src.name in can_fail:
                scores[f"{src.name}_failed"] = float(value is None)
            scores[src.name] = 0.0 if value is None else float(value)
            if src.weight > 0:
                terms[src.name] = src.weight * scores[src.name]
        scores["proxy"] = sum(terms[t.name] for t in trained)
        scores["gold"] = scores[cfg.gold]
        out.append(dataclasses.replace(s, terms=terms, reward=sum(terms.values()), scores=scores))
    return out
