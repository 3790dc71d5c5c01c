"""The ``REWARD_SOURCES`` registry: kind -> builder of a ``RewardSource`` (``rlvr.reward_sources.base``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rlvr.registry import Registry
from rlvr.reward_source_config import SourceConfig
from rlvr.types import Scored


class RewardSource(Protocol):
    name: str
    can_fail: bool

    def score(self, batch: list[Scored]) -> list[float | None]:
        """One score per sample of ``batch`` (None: failed, to be scored 0 and counted)."""
        ...


REWARD_SOURCES: Registry[Callable[[SourceConfig], RewardSource]] = Registry("reward source")


def response_of(s: Scored) -> tuple[tuple, str]:
    """What a learned source scores: the task's prompt messages and the response text (a
    multi-turn episode's last assistant turn)."""
    return tuple(s.task.prompt), s.trajectory.completion
