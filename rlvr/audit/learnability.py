"""Does a level's reward teach? GRPO on the reference policy with noise.

Where the tiny default cannot learn a level, that may be the model's fault or the reward's: a
reward that does not separate the right answer from its near misses, or that pays a laundered
one, teaches nothing to any model. This module takes the model out of the question. The policy
is a task's own reference passed through one of a few *noise arms* (``ARMS``, per spec kind):
the clean reference first, then the mistakes a model makes on that kind of task (a number off by
1% or 10%, in the wrong scale, hedged; an SVG or CAD program with its coordinates jittered by a
few units; a data answer submitted without a query, or through a constant query). Its parameters
are one logit per arm, shared by every task; it starts mostly noisy (``start``: the clean arm's
probability).

Each step draws training tasks, samples ``samples_per_task`` arms per task, plays and judges
every attempt exactly as training does (``rlvr.audit.rewards.reward_attempts``: the real
verifier, environment and sandbox, ``rlvr.rewards.score_all`` under ``outcome``), and updates the
logits with the trainer's own pieces: group-relative ``grpo`` advantages and the ``ppo_clip``
loss on the chosen arms' log-probabilities. Held-out pass@1 is exact for this policy: every arm
is judged once on every held-out task, and pass@1 = mean over tasks of sum_a pi(a) * passed(a).

``run_learnability`` checks a built-in domain (its eval split held out); ``learn_tasks`` a list of
tasks such as a user's task file (every fifth held out).

It shows that the reward carries a signal GRPO climbs on held-out tasks (and which arms it pays);
it does not show that a neural model can learn the skill (docs/benchmarks.md says which can).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlvr.algos.advantages import grpo
from rlvr.algos.losses import POLICY_LOSSES
from rlvr.audit.hacks import Attempt
from rlvr.audit.rewards import reward_attempts
from rlvr.tasks.base import DOMAINS
from rlvr.types import Task
from rlvr.verifiers.base import VERIFIERS

Arm = Callable[[Task, random.Random], Attempt]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_LITERAL = re.compile(r"(?<![\w.#-])\d+(?:\.\d+)?")  # a numeric literal, not part of a name or hex colour
_FILL = re.compile(r'fill="#[0-9a-fA-F]{6}"')
PALETTE = ("#ff0000", "#0000ff", "#008000", "#ffff00", "#800080", "#ffa500", "#00ffff", "#a52a2a")


# ---------------------------------------------------------------- noise on numbers


def off_by(number: str, rel: float, rng: random.Random) -> str:
    """``number`` (as written: commas, decimals) moved by ``rel`` of itself, up or down, written
    with the same decimals; at least one unit of its last decimal away from it."""
    plain = number.replace(",", "")
    decimals = len(plain.split(".")[1]) if "." in plain else 0
    value = float(plain)
    moved = value * (1 + rel * rng.choice((-1, 1)))
    step = 10.0 ** -decimals
    if round(moved, decimals) == round(value, decimals):
        moved = value + step * (1 if moved >= value else -1)
    return f"{moved:.{decimals}f}"


def _replace_answer(text: str, new: Callable[[str], str], rng: random.Random | None = None) -> str:
    """``text`` with the number in its last ``Answer:`` line replaced by ``new(number)``; a text
    without one (a result table) has one of its numbers, drawn with ``rng``, replaced instead."""
    lines = list(re.finditer(r"Answer:[^\n]*", text))
    span = (lines[-1].start(), lines[-1].end()) if lines else (0, len(text))
    numbers = list(_NUMBER.finditer(text, *span))
    if not numbers:
        raise ValueError(f"no number to replace in {text[span[0]:span[1]]!r}")
    number = numbers[0] if lines or rng is None else rng.choice(numbers)
    return text[: number.start()] + new(number.group(0)) + text[number.end():]


def _wrong_scale(number: str, percent: bool) -> str:
    value = float(number.replace(",", ""))
    return f"{value / 100:.4f}" if percent else f"{value * 1000:.0f}" if value == int(value) else f"{value * 1000:g}"


def jitter_literals(text: str, sigma: int, rng: random.Random) -> str:
    """Every numeric literal of ``text`` moved by a whole number in [-sigma, sigma] (a positive
    one stays at least 1: a size or radius stays a size)."""
    def move(m: re.Match) -> str:
        value = float(m.group(0))
        moved = value + rng.randint(-sigma, sigma)
        moved = max(moved, 1.0) if value > 0 else moved
        return f"{moved:g}"
    return _LITERAL.sub(move, text)


# ---------------------------------------------------------------- the arms of each spec kind


def _number_arms() -> list[tuple[str, Arm]]:
    def percent(t: Task) -> bool:
        return "%" in str(t.spec.payload.get("answer", ""))
    return [
        ("reference", lambda t, rng: t.reference),
        ("off_1pct", lambda t, rng: _replace_answer(t.reference, lambda n: off_by(n, 0.01, rng))),
        ("off_10pct", lambda t, rng: _replace_answer(t.reference, lambda n: off_by(n, 0.10, rng))),
        ("wrong_scale", lambda t, rng: _replace_answer(t.reference, lambda n: _wrong_scale(n, percent(t)))),
        ("hedge", lambda t, rng: _replace_answer(t.reference, lambda n: f"{n} or {off_by(n, 0.10, rng)}")),
    ]


def _body_jitter(sigma: int) -> Arm:
    """An SVG whose shapes (not its ``<svg ...>`` tag) have every coordinate jittered by ``sigma``."""
    def arm(t: Task, rng: random.Random) -> str:
        svg = t.reference
        head = svg.index(">") + 1
        return svg[:head] + jitter_literals(svg[head:], sigma, rng)
    return arm


def _recolour(t: Task, rng: random.Random) -> str:
    return _FILL.sub(lambda m: f'fill="{rng.choice([c for c in PALETTE if c not in m.group(0).lower()])}"',
                     t.reference)


def _svg_arms() -> list[tuple[str, Arm]]:
    return [("reference", lambda t, rng: t.reference), ("jitter_2", _body_jitter(2)), ("jitter_5", _body_jitter(5)),
            ("jitter_12", _body_jitter(12)), ("recolour", _recolour)]


def _program_jitter(sigma: int) -> Arm:
    def arm(t: Task, rng: random.Random) -> str:
        head, _, body = t.reference.partition("def part():")
        return head + "def part():" + jitter_literals(body, sigma, rng)
    return arm


def _cad_arms() -> list[tuple[str, Arm]]:
    return [("reference", lambda t, rng: t.reference), ("jitter_1", _program_jitter(1)),
            ("jitter_2", _program_jitter(2)), ("jitter_4", _program_jitter(4)), ("jitter_8", _program_jitter(8))]


def _sql(query: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'sql', 'arguments': {'query': query}})}</tool_call>"


def _constant_query(answer: object) -> str:
    """A query that selects ``answer`` (a number, or a table's rows) as constants: the data never read."""
    if not isinstance(answer, list):
        return f"SELECT {answer}"
    def value(v: object) -> str:
        return repr(v) if isinstance(v, str) else str(v)
    return " UNION ALL ".join("SELECT " + ", ".join(value(v) for v in row) for row in answer)


def _data_arms() -> list[tuple[str, Arm]]:
    def off(rel: float) -> Arm:
        return lambda t, rng: [*t.actions[:-1], _replace_answer(t.actions[-1], lambda n: off_by(n, rel, rng), rng)]
    return [
        ("reference", lambda t, rng: list(t.actions)),
        ("answer_only", lambda t, rng: [t.actions[-1]]),  # the right deliverable, never looked up
        # laundered: the deliverable selected as constants
        ("constant_query", lambda t, rng: [_sql(_constant_query(t.spec.payload["answer"])), t.actions[-1]]),
        ("off_1pct", off(0.01)),
        ("off_10pct", off(0.10)),
    ]


ARMS: dict[str, Callable[[], list[tuple[str, Arm]]]] = {
    "number": _number_arms, "svg": _svg_arms, "cad": _cad_arms, "data.analysis": _data_arms}
"""Spec kind -> its noise arms, the clean reference first. Add a kind here to check its domains."""


def arms_for(task: Task) -> list[tuple[str, Arm]]:
    if task.spec.kind not in ARMS:
        raise ValueError(f"no noise arms for spec kind {task.spec.kind!r} (task {task.id}); "
                         f"kinds with arms: {', '.join(sorted(ARMS))}")
    return ARMS[task.spec.kind]()


# ---------------------------------------------------------------- GRPO on the arms


@dataclass
class LearnabilityConfig:
    domain: str
    levels: tuple[int, ...] = (1, 2)
    steps: int = 15
    tasks_per_step: int = 8
    samples_per_task: int = 8
    lr: float = 0.3
    start: float = 0.05
    """The clean reference's probability at the start; the noisy arms share the rest evenly."""
    outcome: str = "binary"
    eval_tasks: int = 40
    """Held-out tasks, spread over ``levels``."""
    seed: int = 0
    workers: int = 2


@dataclass
class LearnabilityResult:
    domain: str
    outcome: str
    arms: list[str]
    arm_pass: dict[str, float]
    """Held-out pass rate of each arm alone (the reference's should be 1.0)."""
    pass_before: float
    pass_after: float
    probs_before: list[float]
    probs_after: list[float]
    curve: list[dict[str, float]] = field(default_factory=list)
    """Per step: the mean rollout reward and held-out pass@1 after the update."""
    eval_tasks: int = 0
    verifications: int = 0


def _initial_logits(k: int, start: float) -> torch.Tensor:
    if not 0.0 < start < 1.0:
        raise ValueError(f"start must be in (0, 1), got {start}")
    logits = torch.zeros(k)
    logits[0] = math.log(start / (1 - start) * (k - 1))
    return logits


def _tasks(domain: str, split: str, levels: tuple[int, ...], n: int, seed: int, offset: int = 0) -> list[Task]:
    d = DOMAINS.get(domain)
    return [d.generate(split, levels[i % len(levels)], offset + i // len(levels), seed) for i in range(n)]


def run_learnability(cfg: LearnabilityConfig) -> LearnabilityResult:
    """GRPO on the noise arms of the built-in domain ``cfg.domain``: held-out tasks from its eval
    split, training tasks from its train split; see the module docstring."""
    held_out = _tasks(cfg.domain, "eval", cfg.levels, cfg.eval_tasks, cfg.seed)
    return learn(cfg, held_out, lambda step: _tasks(cfg.domain, "train", cfg.levels, cfg.tasks_per_step, cfg.seed,
                                                    offset=step * cfg.tasks_per_step))


def learn_tasks(cfg: LearnabilityConfig, tasks: list[Task]) -> LearnabilityResult:
    """``learn`` on a list of tasks of one spec kind (a task file's rows): every fifth held out
    (``split_file_tasks``), the rest drawn in turn; a task without a reference gets its verifier's
    gold completion. Raises ValueError for what cannot be checked (say which)."""
    tasks = [_with_reference(t) for t in tasks]
    if any(t.reference is None and not t.multi_turn for t in tasks):
        raise ValueError("a row has no reference and its verifier no gold answer to add noise to")
    kinds = sorted({t.spec.kind for t in tasks})
    if len(kinds) > 1:
        raise ValueError(f"rows of several verifiers ({', '.join(kinds)}); check one at a time (--split, --verifier)")
    train, held_out = split_file_tasks(tasks, cfg.eval_tasks)
    arms_for(held_out[0])

    def draw(step: int) -> list[Task]:
        start = step * cfg.tasks_per_step
        return [train[(start + i) % len(train)] for i in range(cfg.tasks_per_step)]

    return learn(cfg, held_out, draw)


def _with_reference(task: Task) -> Task:
    if task.reference is not None or task.multi_turn:
        return task
    gold = getattr(VERIFIERS.get(task.spec.kind), "gold_completion", None)
    return dataclasses.replace(task, reference=gold(task.spec.payload)) if callable(gold) else task


def split_file_tasks(tasks: list[Task], eval_tasks: int) -> tuple[list[Task], list[Task]]:
    """A task file's rows as (training pool, held-out): every fifth row held out, at most
    ``eval_tasks`` of them; the rest train."""
    if len(tasks) < 2:
        raise ValueError(f"need at least 2 tasks to hold some out, got {len(tasks)}")
    held_out = tasks[::5][:eval_tasks]
    chosen = {id(t) for t in held_out}
    return [t for t in tasks if id(t) not in chosen], held_out


def learn(cfg: LearnabilityConfig, held_out: list[Task], draw: Callable[[int], list[Task]]) -> LearnabilityResult:
    """GRPO on the noise arms: ``draw(step)`` gives each step's training tasks, ``held_out`` the
    tasks pass@1 is measured on (exactly: every arm judged once on each)."""
    rng = random.Random(cfg.seed)
    names = [name for name, _ in arms_for(held_out[0])]
    k = len(names)
    for t in held_out:
        if [name for name, _ in arms_for(t)] != names:
            raise ValueError(f"task {t.id} has spec kind {t.spec.kind!r}; the held-out tasks mix kinds")
    runs = [(t, arm(t, rng)) for t in held_out for _, arm in arms_for(t)]
    judged = reward_attempts(runs, ("binary",), workers=cfg.workers)["binary"]
    passed = torch.tensor([float(s.verdict.passed) for s in judged]).view(len(held_out), k)
    verifications = len(runs)

    logits = _initial_logits(k, cfg.start).requires_grad_(True)
    optimiser = torch.optim.Adam([logits], lr=cfg.lr)
    loss_fn = POLICY_LOSSES.get("ppo_clip")

    def pass_at_1() -> float:
        return float((passed * torch.softmax(logits.detach(), 0)).sum(1).mean())

    before, probs_before = pass_at_1(), torch.softmax(logits.detach(), 0).tolist()
    gen = torch.Generator().manual_seed(cfg.seed)
    curve = []
    for step in range(cfg.steps):
        tasks = draw(step)
        with torch.no_grad():
            choice = torch.multinomial(torch.softmax(logits, 0), cfg.samples_per_task * len(tasks), replacement=True,
                                       generator=gen)
        batch = [(t, arms_for(t)[int(a)][1](t, rng)) for i, t in enumerate(tasks)
                 for a in choice[i * cfg.samples_per_task:(i + 1) * cfg.samples_per_task]]
        scored = reward_attempts(batch, (cfg.outcome,), workers=cfg.workers)[cfg.outcome]
        rewards = torch.tensor([s.reward for s in scored])
        verifications += len(batch)
        groups = torch.arange(len(tasks)).repeat_interleave(cfg.samples_per_task)
        logprobs = torch.log_softmax(logits, 0)[choice].unsqueeze(1)
        loss, _ = loss_fn(logprobs, logprobs.detach(), grpo(rewards, groups), torch.ones_like(logprobs))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        curve.append({"step": step + 1, "reward": float(rewards.mean()), "pass@1": pass_at_1()})
    return LearnabilityResult(cfg.domain, cfg.outcome, names, dict(zip(names, passed.mean(0).tolist())), before,
                              pass_at_1(), probs_before, torch.softmax(logits.detach(), 0).tolist(), curve,
                              len(held_out), verifications)


def summary(r: LearnabilityResult) -> str:
    """One line: held-out pass@1 before and after, each arm's pass rate, the arms' probabilities after."""
    arms = ", ".join(f"{a} {r.arm_pass[a]:.0%}" for a in r.arms)
    after = ", ".join(f"{a} {p:.2f}" for a, p in zip(r.arms, r.probs_after))
    return (f"{r.domain} ({r.outcome}): held-out pass@1 {r.pass_before:.1%} -> {r.pass_after:.1%} over "
            f"{r.eval_tasks} tasks; arms pass: {arms}; probabilities after: {after}; {r.verifications} attempts judged")


def to_dict(r: LearnabilityResult) -> dict:
    return {"domain": r.domain, "outcome": r.outcome, "pass_before": r.pass_before, "pass_after": r.pass_after,
            "arm_pass": r.arm_pass, "probs_before": dict(zip(r.arms, r.probs_before)),
            "probs_after": dict(zip(r.arms, r.probs_after)), "curve": r.curve, "eval_tasks": r.eval_tasks,
            "verifications": r.verifications}
