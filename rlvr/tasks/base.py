"""Domains: deterministic, levelled task generators with a train/eval split by construction.

A domain turns ``(split, level, index, seed)`` into a ``Task`` and writes a pretraining corpus
from its train split. Every random choice comes from ``seeded_rng`` (a sha256 of the parts,
never ``seed + idx``). Every problem has a canonical ``key``; ``split_of`` hashes the key, so a
problem belongs to exactly one split whatever seed, index or level asked for it. A train problem
must also not *reveal* an eval problem: its reference may not state the result of an eval key
(e.g. the step ``12 + 7 = 19`` of a train word problem when ``12+7`` is an eval arithmetic
problem). Eval problems may reuse train facts; that is composition, not leakage.

Deliberately not here: task files (loaders), choosing which tasks to train on (curriculum),
checking answers (``rlvr.verifiers``).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Literal, Protocol

from rlvr.errors import UserError
from rlvr.registry import Registry
from rlvr.types import SINGLE_TURN, Spec, Task

Split = Literal["train", "eval"]
SPLITS: tuple[str, ...] = ("train", "eval")
EVAL_FRACTION = 0.2
MAX_DRAWS = 1000  # candidates tried per (split, level, index) before giving up
MAX_DUPLICATES = 200  # consecutive duplicate keys before generate_tasks gives up on a level
DOC_ITEMS = 8  # problems per corpus document


class DomainLike(Protocol):
    """What the rest of rlvr relies on. Registered entries need not subclass ``Domain``."""

    name: str
    version: str
    levels: tuple[int, ...]

    def generate(self, split: str, level: int, index: int, seed: int) -> Task: ...

    def corpus(self, seed: int, n_docs: int) -> list[str]: ...


DOMAINS: Registry[DomainLike] = Registry("domain")


def seeded_rng(*parts: object) -> random.Random:
    """A RNG derived from a sha256 of the JSON of ``parts`` (ints, strings, ...).

    Distinct part tuples give independent streams: ``(0, "x", 1)`` and ``(1, "x", 0)`` do not
    overlap the way ``seed + index`` streams do.
    """
    blob = json.dumps(parts, separators=(",", ":")).encode()
    return random.Random(int.from_bytes(hashlib.sha256(blob).digest(), "big"))


def split_of(domain_name: str, key: str) -> Split:
    """``"eval"`` for about ``EVAL_FRACTION`` of keys, ``"train"`` for the rest; a pure hash."""
    digest = hashlib.sha256(f"{domain_name}\x00{key}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % 10_000 < EVAL_FRACTION * 10_000 else "train"


def task_id(domain: str, version: str, split: str, level: int, index: int) -> str:
    return f"{domain}/{version}/{split}/{level}/{index:06d}"


@dataclass(frozen=True)
class Problem:
    """One sampled problem, before it becomes a ``Task``.

    ``reveals`` lists ``(domain, key)`` of other problems whose result ``reference`` states;
    a train problem may reveal only train keys. ``actions``: a scripted expert's assistant turns
    (multi-turn domains).
    """

    key: str
    prompt: str
    spec: Spec
    reference: str
    reveals: tuple[tuple[str, str], ...] = ()
    actions: tuple[str, ...] = ()


class Domain:
    """Base class: subclasses set ``name``/``levels`` and implement ``sample``."""

    name: str = ""
    version: str = "v1"
    levels: tuple[int, ...] = (1, 2, 3, 4)
    needs_sandbox: bool = False  # its verifier executes model output (the trainer opens a sandbox)
    env: str = SINGLE_TURN  # the environment its tasks run in (``Task.env``)
    corpus_levels: tuple[int, ...] = ()  # the levels its pretraining documents draw from (empty: all)

    def sample(self, level: int, rng: random.Random) -> Problem:
        """Draw one candidate problem of ``level``; may land in either split."""
        raise NotImplementedError

    def corpus_text(self, problem: Problem, rng: random.Random) -> str:
        """How one problem reads in a pretraining document (default: prompt, then reference)."""
        return f"{problem.prompt}\n{problem.reference}"

    def in_split(self, problem: Problem, split: str) -> bool:
        if split == "eval":
            return split_of(self.name, problem.key) == "eval"
        keys = ((self.name, problem.key), *problem.reveals)
        return all(split_of(domain, key) == "train" for domain, key in keys)

    def draw(self, split: str, level: int, *rng_parts: object) -> Problem:
        """The first candidate in ``split``, candidate ``i`` drawn from ``seeded_rng(*parts, i)``."""
        for attempt in range(MAX_DRAWS):
            problem = self.sample(level, seeded_rng(*rng_parts, attempt))
            if self.in_split(problem, split):
                return problem
        raise RuntimeError(f"{self.name}: no {split} problem at level {level} in {MAX_DRAWS} draws")

    def generate(self, split: str, level: int, index: int, seed: int) -> Task:
        if split not in SPLITS:
            raise UserError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
        if level not in self.levels:
            raise UserError(f"{self.name} has no level {level}; levels are {list(self.levels)}")
        p = self.draw(split, level, seed, self.name, self.version, split, level, index)
        return Task(
            id=task_id(self.name, self.version, split, level, index),
            domain=self.name,
            level=level,
            prompt=({"role": "user", "content": p.prompt},),
            spec=p.spec,
            key=p.key,
            reference=p.reference,
            env=self.env,
            actions=p.actions,
            reveals=p.reveals,
        )

    def corpus(self, seed: int, n_docs: int) -> list[str]:
        """Raw text documents (not chat format) made only of train problems, levels mixed."""
        return self._documents(seed, n_docs, "train")

    def _documents(self, seed: int, n_docs: int, split: str) -> list[str]:
        # ``split`` is a parameter only so tests can build an eval corpus as a negative control.
        docs = []
        for d in range(n_docs):
            rng = seeded_rng(seed, self.name, self.version, "corpus", d)
            items = []
            for i in range(DOC_ITEMS):
                level = rng.choice(self.corpus_levels or self.levels)
                problem = self.draw(split, level, seed, self.name, self.version, "corpus", split, d, i)
                items.append(self.corpus_text(problem, rng))
            docs.append("\n\n".join(items))
        return docs


def generate_tasks(
    domains: list[str] | str, split: str, n: int, seed: int, levels: list[int] | None = None,
    weights: dict[str, float] | None = None,
) -> list[Task]:
    """``n`` tasks, round-robin over (domain, level), without duplicate keys. Deterministic.

    A (domain, level) that yields ``MAX_DUPLICATES`` duplicates in a row is exhausted; the
    remaining slots are filled from the others. Raises ``UserError`` if all are exhausted.
    ``weights`` (domain -> relative share, missing domains weigh 1) splits ``n`` between the
    domains first (largest remainder); each domain's tasks are then the ones it would give alone,
    grouped by domain (a ``TaskPool`` shuffles them).
    """
    names = [domains] if isinstance(domains, str) else list(domains)
    if weights:
        counts = weighted_counts(n, [float(weights.get(name, 1.0)) for name in names])
        return [t for name, k in zip(names, counts) if k for t in generate_tasks(name, split, k, seed, levels)]
    slots = [
        (DOMAINS.get(name), level)
        for name in names
        for level in DOMAINS.get(name).levels
        if levels is None or level in levels
    ]
    if not slots:
        raise UserError(f"no levels {levels} in domains {names}")
    next_index = [0] * len(slots)
    active = list(range(len(slots)))
    seen: set[tuple[str, str]] = set()
    tasks: list[Task] = []
    while len(tasks) < n:
        if not active:
            raise UserError(f"only {len(tasks)} unique {split} tasks exist in {names} levels {levels}")
        slot = active[len(tasks) % len(active)]
        domain, level = slots[slot]
        for _ in range(MAX_DUPLICATES):
            task = domain.generate(split, level, next_index[slot], seed)
            next_index[slot] += 1
            if (task.domain, task.key) not in seen:
                seen.add((task.domain, task.key))
                tasks.append(task)
                break
        else:
            active.remove(slot)
    return tasks


def weighted_counts(n: int, weights: list[float]) -> list[int]:
    """``n`` split in proportion to ``weights`` (largest remainder; ties to the earlier entry).
    Raises ``ValueError`` for a negative weight or weights that sum to zero."""
    if any(w < 0 for w in weights) or not sum(weights) > 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {list(weights)}")
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def seen_in(task: Task) -> set[tuple[str, str]]:
    """The ``(domain, key)`` problems a model trained on ``task`` has seen solved: its own (a task
    without a key counts by its id) and the ones its reference reveals."""
    return {(task.domain, task.key or task.id), *task.reveals}


def overlap(train: list[Task], eval: list[Task]) -> list[tuple[str, str]]:
    """``(domain, key)`` of the eval tasks that a train task is or reveals, in eval order."""
    seen = set().union(*(seen_in(t) for t in train)) if train else set()
    return [(t.domain, t.key or t.id) for t in eval if (t.domain, t.key or t.id) in seen]


def check_disjoint(train: list[Task], eval: list[Task]) -> None:
    """Raise ``ValueError`` naming an eval problem that a train task is or reveals."""
    leaked = overlap(train, eval)
    if leaked:
        domain, key = leaked[0]
        raise ValueError(f"task key {key!r} of {domain} is in both train and eval "
                         f"({len(leaked)} eval task(s) seen in training)")
