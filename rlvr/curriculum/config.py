"""The curriculum recipe: which domains how often, easy to hard, which tasks to skip or retry.

``CurriculumConfig.enabled = false`` (the default) keeps the plain ``TaskPool`` (uniform over the
pool in seeded epochs); ``true`` draws through ``rlvr.curriculum.scheduler.Curriculum``.
docs/curriculum.md explains each rule with its defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.config import check_choice, check_range

LEVEL_CHOICES = ("learnability", "frontier")


@dataclass
class StageConfig:
    """Easy to hard: each domain starts at its lowest level and is promoted one level at a time."""

    enabled: bool = True
    """false: every level of the pool from the start (no frontier)."""
    promote_at: float = 0.6
    """Rolling sample pass rate of a domain's frontier level that unlocks its next level."""
    window: int = 128
    """Samples in the rolling pass rate of each (domain, level)."""
    min_samples: int = 64
    """Samples seen at the frontier level before it can promote."""
    level_choice: str = "learnability"
    """How a draw picks among a domain's unlocked levels: learnability (weight p(1-p) of each level's
    rolling pass rate: most where a group is most likely to carry signal) | frontier (the frontier
    level with probability ``frontier_share``, else a lower one)."""
    frontier_share: float = 0.7
    """With ``level_choice: frontier``: share of a domain's draws from its frontier level; the rest
    review the unlocked lower levels."""

    def __post_init__(self) -> None:
        check_range("curriculum.stages.promote_at", self.promote_at, 0.0, 1.0)
        check_range("curriculum.stages.window", self.window, 1)
        check_range("curriculum.stages.min_samples", self.min_samples, 1, self.window)
        check_range("curriculum.stages.frontier_share", self.frontier_share, 0.0, 1.0)
        check_choice("curriculum.stages.level_choice", self.level_choice, LEVEL_CHOICES)


@dataclass
class FilterConfig:
    """Tasks GRPO cannot learn from: solved by every sample, or by none (zero-variance groups)."""

    enabled: bool = True
    """Retire tasks that are always solved, recycle (then retire) tasks that are never solved."""
    solved_after: int = 2
    """A task whose every sample passed in this many consecutive groups is retired as solved."""
    refill_rounds: int = 2
    """Dynamic sampling: after a step's rollout, draw and roll out tasks for the zero-variance
    groups up to this many more times, so the update sees the full ``tasks_per_step`` groups with
    signal (0 = off: the zero-variance groups are simply dropped)."""

    def __post_init__(self) -> None:
        check_range("curriculum.filter.solved_after", self.solved_after, 1)
        check_range("curriculum.filter.refill_rounds", self.refill_rounds, 0)


@dataclass
class RecycleConfig:
    """Failed tasks (no sample passed) come back later, a limited number of times."""

    retry_limit: int = 2
    """Times a never-solved task is retried before it is retired as unsolved (0: retired at once)."""
    delay_steps: int = 20
    """Steps before a failed task is due again."""
    decay: float = 0.5
    """A due task is taken with probability ``decay ** (retries - 1)`` (1 on its first retry); a
    task passed over waits another ``delay_steps``."""
    max_share: float = 0.1
    """At most this share of a draw (rounded up) comes from recycled tasks."""

    def __post_init__(self) -> None:
        check_range("curriculum.recycle.retry_limit", self.retry_limit, 0)
        check_range("curriculum.recycle.delay_steps", self.delay_steps, 1)
        check_range("curriculum.recycle.decay", self.decay, 0.0, 1.0)
        check_range("curriculum.recycle.max_share", self.max_share, 0.0, 1.0)


@dataclass
class SeesawConfig:
    """Against the seesaw effect: a domain group whose periodic eval falls gets more weight."""

    enabled: bool = True
    """Adapt the mix to the periodic eval (needs ``eval_every`` > 0 and the group in ``eval.domains``)."""
    tolerance: float = 0.03
    """Drop of a group's eval pass@1 below its best so far (absolute, 0.03 = 3 points) that triggers,
    if the eval's sampling error does not explain it (``z``)."""
    z: float = 1.0
    """Standard errors of the difference of two evals of the group's size a drop must also exceed
    (0: the tolerance alone; a 50-task eval near 75% has a standard error of about 8.7 points)."""
    boost: float = 1.5
    """Weight multiplier per triggering eval; divided back out per eval within tolerance."""
    max_factor: float = 4.0
    """A group's weight never exceeds its configured weight times this."""

    def __post_init__(self) -> None:
        check_range("curriculum.seesaw.tolerance", self.tolerance, 0.0, 1.0)
        check_range("curriculum.seesaw.boost", self.boost, 1.0)
        check_range("curriculum.seesaw.max_factor", self.max_factor, 1.0)
        check_range("curriculum.seesaw.z", self.z, 0.0)


@dataclass
class CurriculumConfig:
    enabled: bool = False
    """false: uniform draws from the pool (``TaskPool``); true: the scheduler below."""
    weights: dict[str, float] = field(default_factory=dict)
    """Mix of the draws: a training domain (``code.debug``) or a family prefix (``math`` = every
    ``math.*`` training domain, shared equally) -> relative weight. Empty: every domain equal.
    A domain covered by no key is not drawn."""
    stages: StageConfig = field(default_factory=StageConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    recycle: RecycleConfig = field(default_factory=RecycleConfig)
    seesaw: SeesawConfig = field(default_factory=SeesawConfig)

    def __post_init__(self) -> None:
        for key, w in self.weights.items():
            check_range(f"curriculum.weights.{key}", w, 0.0)
