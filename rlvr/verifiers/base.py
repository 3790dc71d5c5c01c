"""Verifiers: judge a completion against a task's acceptance criteria (``task.spec``).

``VERIFIERS`` holds verifier *instances* keyed by ``Spec.kind``; ``get_verifier(task)`` picks
one. A verifier is deterministic, never raises on model output, and fails closed: anything it
cannot read is a failing ``Verdict`` with a reason, not an exception or partial credit.

Not here: reward shaping from verdicts (``rlvr.rewards``), running code (the sandbox).
"""

from __future__ import annotations

from typing import Protocol

from rlvr.registry import Registry
from rlvr.types import Task, Verdict


class Verifier(Protocol):
    """Anything with a ``name`` and ``check(task, completion) -> Verdict``."""

    name: str

    def check(self, task: Task, completion: str) -> Verdict: ...


VERIFIERS: Registry[Verifier] = Registry("verifier")


def get_verifier(task: Task) -> Verifier:
    """The verifier registered for ``task.spec.kind`` (``UserError`` listing choices if none)."""
    return VERIFIERS.get(task.spec.kind)
