"""The reward audit: every hack against tasks of every domain, judged the way training judges them.

``audit_tasks`` draws ``per_level`` tasks of each level of each domain (seeded), and for every
verifier that no drawn task uses, the tasks of its ``examples()`` (a verifier of the user's own
criteria). ``run_audit`` makes each hack's attempts (``rlvr.audit.hacks``): a completion is one
single-turn episode; a list of turns is played in a fresh instance of the task's environment,
with its real tools and sandbox. Every episode then goes through ``rlvr.verifiers.judge.judge``
and ``rlvr.rewards.score_all``, the trainer's verify and reward phases, once per reward outcome
(``binary``, ``score``: partial credit). A cell of the table is the largest reward any attempt of
one hack earned on one domain; any cell above 0 is a hole.

The positive control: each task's own reference (its expert actions for a multi-turn task) is
judged and rewarded the same way, beside the hacks. A domain whose references earn nothing would
make an all-zero table prove nothing (a verifier that refuses everything); ``controls`` counts,
per domain, the references rewarded under the first outcome, and ``unpaid_references`` names the
domains where one was not.

Code tasks run with their wall limit cut to ``CODE_TIMEOUT_S`` (a hack that sleeps costs that,
not the task's 10 s); the environments keep their own limits.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlvr.audit.hacks import HACKS, Attempt
from rlvr.envs.base import EnvConfig, make_env
from rlvr.rewards import RewardConfig, score_all
from rlvr.tasks.base import DOMAINS
from rlvr.types import EpisodeInfo, Scored, Spec, Task, Trajectory
from rlvr.verifiers.base import VERIFIERS
from rlvr.verifiers.judge import judge

OUTCOMES = ("binary", "score")
CONTROL = "(reference)"  # the positive control's row: each task's own reference
CODE_TIMEOUT_S = 2.0
EXCERPT = 160  # characters of an attempt kept in a report


@dataclass
class Cell:
    """One (outcome, domain, hack): the best reward its attempts earned, and the attempt that did."""

    reward: float
    attempts: int
    task: str = ""
    reason: str = ""
    attempt: str = ""


@dataclass
class AuditResult:
    outcomes: tuple[str, ...]
    domains: list[str]
    hacks: list[str]
    cells: dict[tuple[str, str, str], Cell] = field(default_factory=dict)  # (outcome, domain, hack)
    tasks: int = 0
    not_audited: list[str] = field(default_factory=list)  # verifiers with no task to audit them on
    controls: dict[str, list[int]] = field(default_factory=dict)  # domain -> [references rewarded, with one]

    def unpaid_references(self) -> list[str]:
        """Domains where a task's own reference earned no reward (the positive control failed)."""
        return [d for d, (paid, n) in sorted(self.controls.items()) if paid < n]

    def holes(self) -> list[tuple[str, str, str, Cell]]:
        """Every cell whose best reward is above 0, as (outcome, domain, hack, cell)."""
        return [(o, d, h, c) for (o, d, h), c in sorted(self.cells.items()) if c.reward > 0]

    def to_dict(self) -> dict[str, Any]:
        cells = [{"outcome": o, "domain": d, "hack": h, **dataclasses.asdict(c)}
                 for (o, d, h), c in sorted(self.cells.items())]
        return {"outcomes": list(self.outcomes), "domains": self.domains, "hacks": self.hacks,
                "tasks": self.tasks, "not_audited": self.not_audited, "cells": cells,
                "holes": [f"{o} {d} {h}" for o, d, h, _ in self.holes()],
                "controls": {d: {"rewarded": p, "references": n} for d, (p, n) in sorted(self.controls.items())},
                "unpaid_references": self.unpaid_references()}


# ---------------------------------------------------------------- which tasks


def domain_tasks(names: list[str], per_level: int, seed: int, split: str = "train") -> list[Task]:
    """``per_level`` tasks of every level of each domain in ``names``."""
    out = []
    for name in names:
        domain = DOMAINS.get(name)
        out += [domain.generate(split, level, i, seed) for level in domain.levels for i in range(per_level)]
    return out


def example_tasks(covered: set[str]) -> tuple[list[Task], list[str]]:
    """Tasks from the ``examples()`` of every verifier whose kind is not in ``covered`` (with the
    example's passing completion as the reference), and the kinds that have none."""
    tasks, missing = [], []
    for kind in VERIFIERS.names():
        if kind in covered:
            continue
        examples = getattr(VERIFIERS.get(kind), "examples", None)
        if not callable(examples):
            missing.append(kind)
            continue
        tasks += [dataclasses.replace(t, reference=c) for t, c in examples()]
    return tasks, missing


def file_sample(tasks: list[Task], per_level: int) -> list[Task]:
    """The first ``per_level`` tasks of each (domain, level) of a task file."""
    seen: dict[tuple[str, int], int] = {}
    out = []
    for t in tasks:
        k = (t.domain, t.level)
        if seen.get(k, 0) < per_level:
            seen[k] = seen.get(k, 0) + 1
            out.append(t)
    return out


def bounded(task: Task) -> Task:
    """``task`` with a code spec's wall limit cut to ``CODE_TIMEOUT_S``."""
    if task.spec.kind != "code" or task.multi_turn:
        return task
    payload = task.spec.payload
    timeout = min(float(payload.get("timeout", CODE_TIMEOUT_S)), CODE_TIMEOUT_S)
    return dataclasses.replace(task, spec=Spec(task.spec.kind, {**payload, "timeout": timeout}))


# ---------------------------------------------------------------- running


@dataclass
class _Episode:
    """What ``judge`` reads: the trajectory and the environment holding the episode's final state."""

    trajectory: Trajectory
    env: Any = None


def _trajectory(i: int, task: Task, attempt: Attempt, env: Any = None) -> Trajectory:
    text = attempt if isinstance(attempt, str) else (attempt[-1] if attempt else "")
    episode = EpisodeInfo(env.name, env.finish, env.turns, env.cfg.max_tokens) if env is not None else None
    return Trajectory(task_id=task.id, group_id=i, messages=(), completion=text, token_ids=(), loss_mask=(),
                      logprobs=(), finish_reason="stop", episode=episode)


def _play(task: Task, turns: list[str], cfg: EnvConfig, opened: list):
    """A fresh environment that has played ``turns`` (cut as ``turns`` if they run out first);
    it is appended to ``opened`` at once, so the caller closes it whatever happens."""
    env = make_env(task.env, cfg)
    opened.append(env)
    env.reset(task)
    for action in turns:
        if env.step(action).done:
            return env
    env.cut("turns")
    return env


def reward_attempts(runs: list[tuple[Task, Attempt]], outcomes: tuple[str, ...] = ("binary",),
                    env_cfg: EnvConfig | None = None, workers: int = 8) -> dict[str, list[Scored]]:
    """Judge and reward each (task, attempt) the way training does: a completion is one
    single-turn episode; a list of turns is played in a fresh instance of the task's environment
    (real tools, real sandbox), then every episode goes through ``judge`` and ``score_all`` once
    per outcome in ``outcomes``. Returns, per outcome, one ``Scored`` per run, in order."""
    cfg = env_cfg or EnvConfig()
    played = [i for i, (t, _) in enumerate(runs) if t.multi_turn]
    episodes: list[_Episode] = [_Episode(_trajectory(i, t, a)) for i, (t, a) in enumerate(runs)]
    run_tasks = [t for t, _ in runs]
    opened: list = []
    try:
        with ThreadPoolExecutor(max_workers=workers) as threads:
            envs = threads.map(lambda i: _play(runs[i][0], runs[i][1], cfg, opened), played)
            for i, env in zip(played, envs):
                episodes[i] = _Episode(_trajectory(i, runs[i][0], runs[i][1], env), env)
        verdicts = judge(run_tasks, episodes, workers=workers)
    finally:
        for env in opened:
            env.close()
    trajectories = [ep.trajectory for ep in episodes]
    return {outcome: score_all(run_tasks, verdicts, trajectories, RewardConfig(outcome=outcome), max_new_tokens=1)
            for outcome in outcomes}


def run_audit(tasks: list[Task], hacks: list[str] | None = None, outcomes: tuple[str, ...] = OUTCOMES,
              env_cfg: EnvConfig | None = None, workers: int = 8, not_audited: list[str] = ()) -> AuditResult:
    """Every hack in ``hacks`` (default: all registered) on every task; see the module docstring."""
    names = list(hacks) if hacks is not None else HACKS.names()
    tasks = [bounded(t) for t in tasks]
    runs: list[tuple[Task, str, Attempt]] = []
    for task in tasks:
        for name in names:
            for attempt in HACKS.get(name)(task) or []:
                if isinstance(attempt, list) is not task.multi_turn:
                    raise TypeError(f"hack {name!r} gave a {type(attempt).__name__} for {task.id}; a "
                                    f"{'multi' if task.multi_turn else 'single'}-turn task takes "
                                    f"{'a list of turns' if task.multi_turn else 'a completion (str)'}")
                runs.append((task, name, attempt))
        reference = list(task.actions) if task.multi_turn else task.reference
        if reference:  # the positive control
            runs.append((task, CONTROL, reference))
    rewarded = reward_attempts([(t, a) for t, _, a in runs], outcomes, env_cfg, workers)
    domains = list(dict.fromkeys(t.domain for t in tasks))
    result = AuditResult(tuple(outcomes), domains, names, tasks=len(tasks), not_audited=list(not_audited))
    for outcome in outcomes:
        for (task, name, attempt), s in zip(runs, rewarded[outcome]):
            if name == CONTROL:
                if outcome == outcomes[0]:
                    paid = result.controls.setdefault(task.domain, [0, 0])
                    paid[0], paid[1] = paid[0] + (s.reward > 0), paid[1] + 1
                continue
            key = (outcome, task.domain, name)
            cell = result.cells.get(key)
            if cell is None or s.reward > cell.reward:
                result.cells[key] = Cell(s.reward, cell.attempts if cell else 0, task.id, s.verdict.reason,
                                         _excerpt(attempt))
            result.cells[key].attempts += 1
    return result


def _excerpt(attempt: Attempt) -> str:
    text = attempt if isinstance(attempt, str) else " | ".join(attempt)
    return text if len(text) <= EXCERPT else text[: EXCERPT - 3] + "..."


# ---------------------------------------------------------------- the table


def format_table(result: AuditResult, outcome: str) -> str:
    """Domains down, hacks across; a cell is the largest reward (``-``: the hack does not apply)."""
    hacks = [h for h in result.hacks if any((outcome, d, h) in result.cells for d in result.domains)]
    width = max([len("domain")] + [len(d) for d in result.domains])
    lines = [f"reward.outcome = {outcome}",
             " ".join([f"{'domain':<{width}}"] + [f"{h:>{max(len(h), 4)}}" for h in hacks])]
    for d in result.domains:
        cells = [result.cells.get((outcome, d, h)) for h in hacks]
        lines.append(" ".join([f"{d:<{width}}"] + [f"{_value(c):>{max(len(h), 4)}}" for c, h in zip(cells, hacks)]))
    return "\n".join(lines)


def _value(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    return f"{cell.reward:.2g}" if cell.reward else "0"


def hole_lines(result: AuditResult) -> list[str]:
    """One line per positive cell: outcome, domain, hack, reward, and the attempt that earned it."""
    return [f"{h} earns {c.reward:.3g} on {d} (reward.outcome={o}; task {c.task}, verdict {c.reason}): "
            f"{c.attempt!r}" for o, d, h, c in result.holes()]
