"""The ``python`` reward source: a callable in TRL's ``reward_funcs`` form,
``fn(prompts, completions, task_ids=..., **columns) -> [float]``, resolved once (a module path or a
``.py`` file: ``rlvr.verifiers.python_reward.resolve_reward_fn``). A value that is None or not a
finite number scores 0 and is counted as failed; a wrong-length answer stops the run."""

from __future__ import annotations

import math

from rlvr.errors import UserError
from rlvr.reward_source_config import SourceConfig
from rlvr.reward_sources.registry import REWARD_SOURCES
from rlvr.types import Scored
from rlvr.verifiers.python_reward import resolve_reward_fn


class PythonSource:
    can_fail = True

    def __init__(self, cfg: SourceConfig) -> None:
        self.name, self.fn = cfg.name, resolve_reward_fn(cfg.function)
        self.ref = cfg.function

    def score(self, batch: list[Scored]) -> list[float | None]:
        prompts = [s.task.prompt[-1]["content"] if len(s.task.prompt) == 1 else [dict(m) for m in s.task.prompt]
                   for s in batch]
        values = list(self.fn(prompts, [s.trajectory.completion for s in batch], task_ids=[s.task.id for s in batch]))
        if len(values) != len(batch):
            raise UserError(f"reward.sources.{self.name}: {self.ref} returned {len(values)} values for "
                            f"{len(batch)} completions")
        return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
                for v in values]


REWARD_SOURCES.register("python")(PythonSource)
