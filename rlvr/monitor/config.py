"""The ``monitor:`` section of a GRPO config: which detectors run, their thresholds and actions.

One dataclass per detector (``rlvr.monitor.detectors``), named as the detector, each with
``enabled``, an ``action`` and its thresholds; the defaults are cheap and only ``log``. Actions:

    log    write the alert to ``<run>/alerts.jsonl`` (and one printed line)
    zero   also set the flagged samples' reward and reward terms to the fail value before the
           advantages are computed (sample detectors only)
    stop   also end the run with one line naming the detector, the step and the alert file

Statistical detectors (over the metrics of the steps) have no samples to zero: ``log | stop``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal

from rlvr.config import check_choice, check_range
from rlvr.content_filter import check_rule_names
from rlvr.monitor.push import PushConfig

SAMPLE_ACTIONS = ("log", "zero", "stop")
STEP_ACTIONS = ("log", "stop")


@dataclass
class DetectorConfig:
    """What every detector's section has. ``NAME`` is the detector (and the key under
    ``monitor``); ``ACTIONS`` the actions it allows."""

    NAME: ClassVar[str] = ""
    ACTIONS: ClassVar[tuple[str, ...]] = SAMPLE_ACTIONS
    enabled: bool = True
    """Run this detector."""
    action: Literal["log", "zero", "stop"] = "log"
    """What an alert of this detector does: log | zero (sample detectors) | stop."""

    def __post_init__(self) -> None:
        check_choice(f"monitor.{self.NAME}.action", self.action, self.ACTIONS)

    def check_ranges(self, **bounds: tuple[float | None, float | None]) -> None:
        for key, (lo, hi) in bounds.items():
            check_range(f"monitor.{self.NAME}.{key}", getattr(self, key), lo, hi)


# --------------------------------------------------------------------------- per sample


@dataclass
class SampleDetectorConfig(DetectorConfig):
    """A sample detector flags samples every step (kept in the trajectories, counted in the
    ``monitor/flagged/<name>`` and ``monitor/rate/<name>`` curves, zeroed or stopped on by
    ``action``); ``alert`` says when that is worth an alert in ``alerts.jsonl``."""

    alert: Literal["each", "rate"] = "rate"
    """each: an alert at every step with a flagged sample (a signature that is never normal).
    rate: an alert when the flagged share of the samples it looks at, over the last ``window``
    steps, reaches ``min_rate`` and is ``min_rise`` above its lowest earlier value (0 at the start):
    a rate rising against the run's own level, once per onset; a few flags an unfinished policy
    writes stay curves."""
    window: int = 10
    """Steps of the rate (rate mode)."""
    min_rate: float = 0.1
    """Rate that an alert needs at least (rate mode)."""
    min_rise: float = 0.05
    """Rise above the run's lowest earlier rate that an alert needs (rate mode)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(f"monitor.{self.NAME}.alert", self.alert, ("each", "rate"))
        self.check_ranges(window=(1, None), min_rate=(0.0, 1.0), min_rise=(0.0, 1.0))


@dataclass
class TamperingConfig(SampleDetectorConfig):
    NAME: ClassVar[str] = "tampering"
    alert: Literal["each", "rate"] = "each"
    """each (default here: a tampered verdict or a bypass attempt is never normal) | rate."""
    patterns: bool = True
    """Also flag programs that try a harness bypass (os._exit, sys.exit, patched builtins, an
    __eq__ that always holds, writes to file descriptors, frame inspection) whatever the verdict."""


@dataclass
class VisibleHiddenGapConfig(SampleDetectorConfig):
    NAME: ClassVar[str] = "visible_hidden_gap"
    min_rate: float = 0.2
    """Rate that an alert needs at least: a fifth of the code samples (an unfinished policy's
    partly right programs pass the prompt's simple examples too: up to ~10% of them over 10 steps
    in the quickstart)."""
    max_hidden_score: float = 0.5
    """A program that fails the hidden tests with this score or less is re-run on the examples
    shown in its prompt (in the sandbox); passing all of them flags it."""
    max_runs: int = 16
    """Sandbox runs per step at most (the lowest-scoring suspects first)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(max_hidden_score=(0.0, 1.0), max_runs=(0, None))


@dataclass
class LiteralExpectedConfig(SampleDetectorConfig):
    NAME: ClassVar[str] = "literal_expected"
    min_literals: int = 2
    """Flag a program whose literal constants include this many distinct expected outputs (of the
    prompt's examples or the hidden tests), trivial values (booleans, None, |n| <= 2, '' and
    one-character strings, numbers the task description states) not counted."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(min_literals=(1, None))


@dataclass
class AnswerStuffingConfig(SampleDetectorConfig):
    NAME: ClassVar[str] = "answer_stuffing"
    max_answers: int = 2
    """Flag more than this many answer markers (\\boxed, 'Answer:' lines) in one completion."""
    max_numbers_in_answer: int = 3
    """Flag a final answer (the last marker's content) holding more numbers than this."""
    max_repeats: int = 4
    """Flag one number (or the last marker's answer) stated more than this many times."""
    min_list_numbers: int = 12
    """Flag a completion of at least this many numbers that make up most (>= 60%) of its words."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(max_answers=(1, None), max_numbers_in_answer=(1, None), max_repeats=(1, None),
                          min_list_numbers=(2, None))


@dataclass
class ContentLeakConfig(SampleDetectorConfig):
    NAME: ClassVar[str] = "content_leak"
    alert: Literal["each", "rate"] = "each"
    """each (default here: a secret or personal datum in an output is worth a look every time) | rate."""
    rules: list[str] = field(default_factory=list)
    """Content rules to look for (rlvr.content_filter); empty: every registered one."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_rule_names("monitor.content_leak.rules", self.rules)


# --------------------------------------------------------------------------- per step


@dataclass
class StepDetectorConfig(DetectorConfig):
    ACTIONS: ClassVar[tuple[str, ...]] = STEP_ACTIONS
    action: Literal["log", "stop"] = "log"
    """What an alert of this detector does: log | stop."""


@dataclass
class RewardJumpConfig(StepDetectorConfig):
    NAME: ClassVar[str] = "reward_jump"
    window: int = 10
    """Steps before this one that make the baseline (at least 5 are needed)."""
    min_delta: float = 0.3
    """Smallest change of rollout/reward_mean from the baseline's mean that counts."""
    z: float = 4.0
    """... and it must also exceed this many baseline standard deviations (floor 0.02)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(window=(5, None), min_delta=(0.0, None), z=(0.0, None))


@dataclass
class VarianceCollapseConfig(StepDetectorConfig):
    NAME: ClassVar[str] = "variance_collapse"
    min_std: float = 0.01
    """Mean within-group reward std (rollout/group_reward_std) below which a step has no signal."""
    patience: int = 3
    """Consecutive such steps that raise the alert."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(min_std=(0.0, None), patience=(1, None))


@dataclass
class TrainUpEvalDownConfig(StepDetectorConfig):
    NAME: ClassVar[str] = "train_up_eval_down"
    evals: int = 3
    """Eval points compared: the first and the last of the most recent this many."""
    min_drop: float = 0.1
    """Fall of eval/pass@1 between them that counts."""
    min_rise: float = 0.05
    """Rise of train rollout/pass_rate (means over ``train_window`` steps ending at each) that counts."""
    train_window: int = 5
    """Steps averaged for the train pass rate at an eval point."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(evals=(2, None), min_drop=(0.0, 1.0), min_rise=(0.0, 1.0), train_window=(1, None))


@dataclass
class LengthExplosionConfig(StepDetectorConfig):
    NAME: ClassVar[str] = "length_explosion"
    window: int = 10
    """Steps before this one that make the baseline (at least 3 are needed)."""
    ratio: float = 2.0
    """Flag rollout/response_tokens_mean above this multiple of the baseline's mean ..."""
    min_tokens: float = 16.0
    """... and at least this many tokens above it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(window=(3, None), ratio=(1.0, None), min_tokens=(0.0, None))


@dataclass
class EntropyCollapseConfig(StepDetectorConfig):
    NAME: ClassVar[str] = "entropy_collapse"
    min_entropy: float = 0.03
    """Flag rollout/entropy (mean -log p of the sampled tokens, nats) below this ..."""
    min_ratio: float = 0.1
    """... or below this fraction of its mean over the run's first ``baseline_steps`` steps."""
    baseline_steps: int = 5
    """Steps that make the baseline of ``min_ratio``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(min_entropy=(0.0, None), min_ratio=(0.0, 1.0), baseline_steps=(1, None))


@dataclass
class BlowupConfig(StepDetectorConfig):
    """A metric that must stay small: above ``max_value``, or above ``factor`` times its median
    over the ``window`` steps before and above ``floor``."""

    max_value: float = 1.0
    """Flag the metric above this value."""
    factor: float = 10.0
    """Flag the metric above this multiple of its median over the steps before ..."""
    floor: float = 0.05
    """... when it is also above this value."""
    window: int = 10
    """Steps of that median (at least 3 are needed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(max_value=(0.0, None), factor=(1.0, None), floor=(0.0, None), window=(3, None))


@dataclass
class KlBlowupConfig(BlowupConfig):
    NAME: ClassVar[str] = "kl_blowup"


@dataclass
class MismatchBlowupConfig(BlowupConfig):
    NAME: ClassVar[str] = "mismatch_blowup"
    max_value: float = 0.05
    """Flag rollout/logprob_mismatch_kl above this value."""
    floor: float = 0.01
    """... or above ``factor`` times its median and above this value."""


@dataclass
class NanInfConfig(StepDetectorConfig):
    NAME: ClassVar[str] = "nan_inf"


@dataclass
class DomainPassVsEvalConfig(StepDetectorConfig):
    NAME: ClassVar[str] = "domain_pass_vs_eval"
    min_gap: float = 0.3
    """Flag a domain whose train pass rate rose this much more than its eval pass@1 between its
    last two eval points (train rates: means over ``train_window`` steps ending at each)."""
    train_window: int = 5
    """Steps averaged for the train pass rate at an eval point."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(min_gap=(0.0, 1.0), train_window=(1, None))


@dataclass
class OveroptimizationConfig(StepDetectorConfig):
    NAME: ClassVar[str] = "overoptimization"
    window: int = 5
    """Steps in the moving means of the proxy and the gold score."""
    min_rise: float = 0.1
    """Rise of the proxy's moving mean since the gold's peak that counts."""
    min_drop: float = 0.1
    """Fall of the gold's moving mean from its peak that counts."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(window=(1, None), min_rise=(0.0, None), min_drop=(0.0, None))


@dataclass
class RewardSourceFailureConfig(StepDetectorConfig):
    NAME: ClassVar[str] = "reward_source_failure"
    max_rate: float = 0.0
    """Share of a step's samples a reward source may fail to score (scored 0) before an alert."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ranges(max_rate=(0.0, 1.0))


# --------------------------------------------------------------------------- the section


@dataclass
class MonitorConfig:
    enabled: bool = True
    """Run the detectors (the trajectory sample is written either way)."""
    sample_share: float = 0.05
    """Share of each step's samples kept in trajectories/step_N.jsonl (seeded; at least one when
    positive); every flagged sample is kept too."""
    tampering: TamperingConfig = field(default_factory=TamperingConfig)
    """Verdict 'tampered' (the sandbox saw the harness attacked) or a harness-bypass attempt in the code."""
    visible_hidden_gap: VisibleHiddenGapConfig = field(default_factory=VisibleHiddenGapConfig)
    """Code that passes the examples in its prompt but fails the hidden tests."""
    literal_expected: LiteralExpectedConfig = field(default_factory=LiteralExpectedConfig)
    """Code that holds expected outputs as literals (a lookup table)."""
    answer_stuffing: AnswerStuffingConfig = field(default_factory=AnswerStuffingConfig)
    """Several answers, one answer many times, or a long list of numbers."""
    content_leak: ContentLeakConfig = field(default_factory=ContentLeakConfig)
    """Completions holding a secret or personal data (rlvr.content_filter's rules)."""
    reward_jump: RewardJumpConfig = field(default_factory=RewardJumpConfig)
    """rollout/reward_mean far from its recent mean."""
    variance_collapse: VarianceCollapseConfig = field(default_factory=VarianceCollapseConfig)
    """Groups without reward variance for several steps."""
    train_up_eval_down: TrainUpEvalDownConfig = field(default_factory=TrainUpEvalDownConfig)
    """Train pass rate rising while the held-out eval falls."""
    length_explosion: LengthExplosionConfig = field(default_factory=LengthExplosionConfig)
    """Response length far above its recent mean."""
    entropy_collapse: EntropyCollapseConfig = field(default_factory=EntropyCollapseConfig)
    """Sampled-token entropy near zero or far below its start."""
    kl_blowup: KlBlowupConfig = field(default_factory=KlBlowupConfig)
    """train/kl (with a KL penalty) large or far above its recent median."""
    mismatch_blowup: MismatchBlowupConfig = field(default_factory=MismatchBlowupConfig)
    """rollout/logprob_mismatch_kl large or far above its recent median."""
    nan_inf: NanInfConfig = field(default_factory=NanInfConfig)
    """A non-finite loss, gradient norm or other train metric (stop: before the optimizer step)."""
    domain_pass_vs_eval: DomainPassVsEvalConfig = field(default_factory=DomainPassVsEvalConfig)
    """A domain's train pass rate rising far faster than its eval."""
    overoptimization: OveroptimizationConfig = field(default_factory=OveroptimizationConfig)
    """The trained-on reward (rollout/score/proxy) rising while the gold score falls (reward.sources)."""
    reward_source_failure: RewardSourceFailureConfig = field(default_factory=RewardSourceFailureConfig)
    """A reward source (a judge) failing to score samples, which were scored 0 (on_failure: zero)."""
    push: PushConfig = field(default_factory=PushConfig)
    """Where alerts are pushed as they happen (a webhook; rlvr.monitor.push): nowhere by default."""
    rearm_steps: int = 20
    """A step detector's condition alerts again only after it has been false this many steps
    (one alert for a condition that flickers around its threshold)."""

    def __post_init__(self) -> None:
        check_range("monitor.sample_share", self.sample_share, 0.0, 1.0)
        check_range("monitor.rearm_steps", self.rearm_steps, 1, None)

    def detector(self, name: str) -> DetectorConfig:
        """The section of detector ``name``."""
        return getattr(self, name)

    @classmethod
    def detector_names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("enabled", "sample_share", "rearm_steps", "push")]
