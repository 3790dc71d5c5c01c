"""Verifiers: judge a completion against a task's acceptance criteria (``task.spec``).

``VERIFIERS`` holds verifier *instances* keyed by ``Spec.kind``; ``get_verifier(task)`` picks
one. A verifier is deterministic, never raises on model output, and fails closed: anything it
cannot read is a failing ``Verdict`` with a reason, not an exception or partial credit.

Not here: reward shaping from verdicts (``rlvr.rewards``), running code (the sandbox).
"""

from __future__ import annotations

from typing import Protocol

from rlvr.registry import Registry
from rlvr.types import Spec, Task, Verdict


class Verifier(Protocol):
    """Anything with a ``name`` and ``check(task, completion) -> Verdict``.

    A verifier may also have ``check_many(pairs) -> list[Verdict]`` (same verdicts, in order,
    computed together); ``check_all`` uses it when present.
    """

    name: str

    def check(self, task: Task, completion: str) -> Verdict: ...


VERIFIERS: Registry[Verifier] = Registry("verifier")


def get_verifier(task: Task) -> Verifier:
    """The verifier registered for ``task.spec.kind`` (``UserError`` listing choices if none)."""
    return VERIFIERS.get(task.spec.kind)


def check_all(pairs: list[tuple[Task, str]]) -> list[Verdict]:
    """Verdicts for ``(task, completion)`` pairs, in input order.

    Pairs are grouped by verifier; a verifier with ``check_many(pairs)`` (e.g. ``code``, which
    sends a whole batch to the sandbox at once) gets its group in one call, others are called
    with ``check`` one pair at a time.
    """
    verdicts: list[Verdict | None] = [None] * len(pairs)
    groups: dict[str, list[int]] = {}
    for i, (task, _completion) in enumerate(pairs):
        groups.setdefault(task.spec.kind, []).append(i)
    for kind, indices in groups.items():
        verifier = VERIFIERS.get(kind)
        check_many = getattr(verifier, "check_many", None)
        if callable(check_many):
            out = check_many([pairs[i] for i in indices])
            if len(out) != len(indices):
                raise RuntimeError(f"verifier {kind!r}: check_many returned {len(out)} verdicts "
                                   f"for {len(indices)} pairs")
        else:
            out = [verifier.check(*pairs[i]) for i in indices]
        for i, verdict in zip(indices, out):
            verdicts[i] = verdict
    return verdicts  # type: ignore[return-value]  (every slot is filled above)


def prepare_all(pairs: list[tuple[Task, str]], prepare) -> tuple[list[Verdict | None], list]:
    """``prepare(index, task, completion)`` on each pair: a ``Verdict`` (found before any run) goes
    into its slot of the first list; anything else (work for the sandbox) into the second."""
    verdicts: list[Verdict | None] = [None] * len(pairs)
    pending = []
    for i, (task, completion) in enumerate(pairs):
        p = prepare(i, task, completion)
        if isinstance(p, Verdict):
            verdicts[i] = p
        else:
            pending.append(p)
    return verdicts, pending


def example_task(kind: str, i: int, question: str, payload: dict) -> Task:
    """A small task of spec ``kind`` for a verifier's ``examples()`` (the conformance suite checks
    verifiers that no built-in domain uses through them)."""
    return Task(id=f"{kind}/example/{i}", domain=f"file.{kind}", level=1,
                prompt=({"role": "user", "content": question},), spec=Spec(kind, payload), key=question)
