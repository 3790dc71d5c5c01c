"""Reward composition: verdict -> scalar reward plus named terms that sum to it.

reward = outcome   pass / fail value (``outcome: binary``), or with ``outcome: score`` the
                   verifier's partial score for a failure (docs/verifiers.md says what earns
                   it and what zeroes it), or the value of the user's reward functions (a
                   verdict with details["reward"])
       + format    small bonus when the answer is in the required form
       + overlong  DAPO soft punishment near the generation limit, or a fixed penalty for
                   samples truncated at the limit
       + length    -length_penalty per response token beyond length_target
       + process   process_weight * lint score of the extracted program (code tasks; rlvr.lint)
       + content   -content_penalty when the completion matches a content rule (a secret or
                   personal data; rlvr.content_filter)
Each term is present only when configured, and returned separately so it can be logged as
``rollout/reward_<term>``. ``reward.domains`` overrides any field for one task domain, e.g.
``{"code.gen": {"process_weight": 0.05, "fail_reward": 0.0}}``.

Reward models, judges and other weighted sources (``reward.sources``) add their terms after these,
in the verify phase (``rlvr.reward_sources.base.apply_sources``).

``score_all`` scores a batch (one ruff call for every program in it); ``score`` one trajectory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

import torch

from rlvr.algos.penalties import overlong_penalty
from rlvr.config import coerce, check_range
from rlvr.content_filter import check_rule_names, scan
from rlvr.errors import ConfigError
from rlvr.lint import lint_scores
from rlvr.reward_source_config import SourceConfig, parse_sources, source_names
from rlvr.types import Scored, Task, Trajectory, Verdict


@dataclass
class RewardConfig:
    pass_reward: float = 1.0
    """Outcome reward when the verifier passes."""
    fail_reward: float = 0.0
    """Outcome reward when it fails."""
    outcome: Literal["binary", "score"] = "binary"
    """`binary`: pass_reward if the verdict passed, else fail_reward. `score`: fail + (pass - fail)
    * verdict.score: a pass pays pass_reward, a failure its partial score, which is 0 for most
    verifiers; `code` pays the hidden cases right beyond the best constant or argument-returning
    program (so those earn 0), `tool.use` 0.5 for a grounded result that was exactly the gold but
    not carried into the answer (docs/verifiers.md, "What each reward mode pays"). Either way, a
    verdict of the user's reward functions (spec kind `python`) gives its own value
    (details['reward'], the weighted sum) as the outcome."""
    format_weight: float = 0.0
    """Added when the verifier reports details['format_ok'] (0 disables)."""
    overlong: Literal["none", "soft", "truncated"] = "none"
    """`soft`: DAPO linear penalty over the last `overlong_buffer` tokens; `truncated`: a fixed
    penalty for samples cut at the length limit."""
    overlong_buffer: int = 8
    """Tokens before the limit over which the soft penalty ramps from 0 to -overlong_penalty."""
    overlong_penalty: float = 1.0
    """Size of the overlong penalty."""
    length_penalty: float = 0.0
    """Penalty per response token beyond `length_target` (0 disables)."""
    length_target: int = 0
    """Response length in tokens up to which the length penalty is 0."""
    process_weight: float = 0.0
    """Weight of the lint score in [0, 1] of the program in details['code'] (0 disables; rlvr.lint)."""
    content_penalty: float = 0.0
    """Subtracted from a sample whose completion matches a content rule (a secret, personal data:
    rlvr.content_filter); 0 disables."""
    content_rules: list[str] = field(default_factory=list)
    """The content rules of that penalty; empty: every registered one."""
    domains: dict[str, dict] = field(default_factory=dict)
    """Per-domain overrides of the fields above, e.g. {code.gen: {process_weight: 0.05}}."""
    sources: list[SourceConfig | dict] = field(default_factory=list)
    """Reward sources beside the verifier, each weighted (``rlvr.reward_source_config``): reward
    models, process reward models, LLM judges, Python callables; a ``verifier`` entry sets the
    verifier's own weight (0: logged as the gold score, not trained on). Empty: the verifier alone."""
    gold: str = "verifier"
    """The source whose score the over-optimisation watch holds the others against
    (``rollout/score/gold`` vs ``rollout/score/proxy``, ``monitor.overoptimization``)."""

    def __post_init__(self) -> None:
        _check_ranges(vars(self), "reward")
        check_rule_names("reward.content_rules", self.content_rules)
        self.domains = _flatten_domains(self.domains)
        self.sources = parse_sources(self.sources)
        if self.sources and self.gold not in ["verifier", *source_names(self.sources)]:
            raise ConfigError(f"config key 'reward.gold' must name a source: verifier or one of "
                              f"{', '.join(source_names(self.sources))}; got {self.gold!r}")
        for domain in self.domains:
            self.for_domain(domain)  # validate every override now, not at the first batch

    def for_domain(self, domain: str) -> RewardConfig:
        """The effective config for tasks of ``domain``: this one with its overrides applied."""
        overrides = self.domains.get(domain)
        if not overrides:
            return self
        prefix = f"reward.domains.{domain}"
        hints = get_type_hints(RewardConfig)
        allowed = [f.name for f in dataclasses.fields(RewardConfig) if f.name not in ("domains", "sources", "gold")]
        values = {}
        for key, value in overrides.items():
            if key not in allowed:
                raise ConfigError(f"unknown config key '{prefix}.{key}'; allowed keys in "
                                  f"'{prefix}': {', '.join(sorted(allowed))}")
            values[key] = coerce(f"{prefix}.{key}", value, hints[key])
        _check_ranges(values, prefix)
        return dataclasses.replace(self, domains={}, sources=list(self.sources), **values)


_RANGES = {"overlong_buffer": 0, "format_weight": 0.0, "length_penalty": 0.0, "length_target": 0,
           "process_weight": 0.0, "content_penalty": 0.0}  # lower bounds


def _check_ranges(values: dict[str, Any], prefix: str) -> None:
    for key, lo in _RANGES.items():
        if key in values:
            check_range(f"{prefix}.{key}", values[key], lo)


def _flatten_domains(domains: dict[str, Any], parent: str = "") -> dict[str, Any]:
    """Nested sections become dotted domain names, so ``--set reward.domains.code.gen.fail_reward=0``
    (parsed as {code: {gen: {...}}}) means domain ``code.gen``. A field name is never a domain."""
    fields = {f.name for f in dataclasses.fields(RewardConfig)}
    out: dict[str, Any] = {}
    for name, section in domains.items():
        domain = f"{parent}.{name}" if parent else str(name)
        if not isinstance(section, dict):
            raise ConfigError(f"config key 'reward.domains.{domain}' must be a mapping of reward "
                              f"fields to values, got {section!r}")
        own = {k: v for k, v in section.items() if k in fields or not isinstance(v, dict)}
        nested = {k: v for k, v in section.items() if k not in own}
        if own or not nested:
            out[domain] = {**out.get(domain, {}), **own}
        for sub, sub_section in _flatten_domains(nested, domain).items():
            out[sub] = {**out.get(sub, {}), **sub_section}
    return out


# --------------------------------------------------------------------------- scoring


def score_all(tasks: list[Task], verdicts: list[Verdict], trajectories: list[Trajectory], cfg: RewardConfig,
              max_new_tokens: int) -> list[Scored]:
    """Compose the reward of a batch; ``tasks[i]`` is the task of ``trajectories[i]``.

    Applies ``cfg.domains`` per task domain and lints every program that needs a process term
    in one ruff call.
    """
    if not len(tasks) == len(verdicts) == len(trajectories):
        raise ValueError(f"need one task and one verdict per trajectory, got {len(tasks)} tasks, "
                         f"{len(verdicts)} verdicts and {len(trajectories)} trajectories")
    by_domain = {d: cfg.for_domain(d) for d in {t.domain for t in tasks}}
    effective = [by_domain[t.domain] for t in tasks]
    programs = [_program(v) if c.process_weight > 0 else None for c, v in zip(effective, verdicts)]
    todo = list(dict.fromkeys(p for p in programs if p is not None))
    linted = dict(zip(todo, lint_scores(todo))) if todo else {}
    return [_compose(task, v, traj, c, max_new_tokens, linted.get(p, 0.0))
            for task, v, traj, c, p in zip(tasks, verdicts, trajectories, effective, programs)]


def score(task: Task, verdict: Verdict, trajectory: Trajectory, cfg: RewardConfig, max_new_tokens: int) -> Scored:
    """Compose the reward for one trajectory of ``task`` under ``cfg`` as given (no domain overrides)."""
    program = _program(verdict) if cfg.process_weight > 0 else None
    lint = lint_scores([program])[0] if program is not None else 0.0
    return _compose(task, verdict, trajectory, cfg, max_new_tokens, lint)


def _program(verdict: Verdict) -> str | None:
    code = verdict.details.get("code")
    return code if isinstance(code, str) else None


def _compose(task: Task, verdict: Verdict, trajectory: Trajectory, cfg: RewardConfig, max_new_tokens: int,
             lint: float) -> Scored:
    """The named terms for one trajectory; ``lint`` is its program's lint score (0 if none)."""
    if "reward" in verdict.details:  # a custom reward function's own value (rlvr.verifiers.python_reward)
        outcome = float(verdict.details["reward"])
    elif cfg.outcome == "binary":
        outcome = cfg.pass_reward if verdict.passed else cfg.fail_reward
    else:
        outcome = cfg.fail_reward + (cfg.pass_reward - cfg.fail_reward) * float(verdict.score)
    terms = {"outcome": outcome}
    if cfg.format_weight:
        terms["format"] = cfg.format_weight * float(bool(verdict.details.get("format_ok", False)))
    if cfg.overlong == "soft":
        length = torch.tensor([float(trajectory.num_policy_tokens)])
        budget = trajectory.token_budget(max_new_tokens)
        terms["overlong"] = float(overlong_penalty(length, max_tokens=budget,
                                                   buffer=cfg.overlong_buffer, penalty=cfg.overlong_penalty)[0])
    elif cfg.overlong == "truncated":
        terms["overlong"] = -cfg.overlong_penalty if trajectory.finish_reason == "length" else 0.0
    if cfg.length_penalty:
        terms["length"] = -cfg.length_penalty * max(0, trajectory.num_policy_tokens - cfg.length_target)
    if cfg.process_weight:
        terms["process"] = cfg.process_weight * lint
    if cfg.content_penalty:
        terms["content"] = -cfg.content_penalty if scan(trajectory.completion, cfg.content_rules or None) else 0.0
    return Scored(task=task, trajectory=trajectory, verdict=verdict, reward=sum(terms.values()), terms=terms)
