"""``reward.sources``: the reward sources of a run beside (or instead of) the verifier, and their weights.

Each entry is one source; its ``kind`` names a ``REWARD_SOURCES`` entry (``rlvr.reward_sources.base``):

    verifier         the task's verifier (always run): its outcome term, scaled by ``weight``
    reward_model     a reward model directory (``rlvr rm``): its normalised score of the response
    process_reward   a process reward model (``rlvr rm`` with kind process): the weakest step's score
    judge            an LLM judge over an OpenAI-compatible endpoint: a rubric prompt, a parsed score
    python           a Python callable ``fn(prompts, completions, **columns) -> [float]`` (TRL's form)

Every source adds the term ``<name>`` = ``weight`` x its score to the reward; a weight of 0 means
"logged, not trained on" (the score is in ``rollout/score/<name>``, the reward is not moved).
Without a ``verifier`` entry the verifier keeps weight 1, as with no sources at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlvr.config import check_choice, check_range, from_dict
from rlvr.errors import ConfigError

KINDS = ("verifier", "reward_model", "process_reward", "judge", "python")
RESERVED_NAMES = ("proxy", "gold")  # per-sample scores the sources module adds itself

# the keys each kind reads beside kind, name and weight (any other key set is refused)
KIND_KEYS: dict[str, tuple[str, ...]] = {
    "verifier": (),
    "reward_model": ("path", "device", "batch_size", "clip", "ensemble", "ensemble_aggregate", "ensemble_std_coef"),
    "process_reward": ("path", "device", "batch_size", "aggregate"),
    "judge": ("url", "model", "api_key_env", "rubric", "parse", "min_score", "max_score", "timeout_s", "retries",
              "concurrency", "on_failure", "max_tokens"),
    "python": ("function",),
}


@dataclass
class SourceConfig:
    kind: Literal["verifier", "reward_model", "process_reward", "judge", "python"] = "verifier"
    """Which source (module docstring)."""
    name: str = ""
    """The term's name in the reward and the metrics (default: the kind)."""
    weight: float = 1.0
    """Multiplies the source's score in the reward; 0: logged only."""
    path: str = ""
    """reward_model, process_reward: the model directory ``rlvr rm`` wrote (its final/)."""
    device: str = "cpu"
    """reward_model, process_reward: where the model scores (cpu | cuda | cuda:N | auto)."""
    batch_size: int = 32
    """reward_model, process_reward: responses scored per forward."""
    clip: float = 5.0
    """reward_model: the normalised score is clipped to [-clip, clip] (0: no clip)."""
    ensemble: list[str] = field(default_factory=list)
    """reward_model: more reward-model directories scored beside ``path`` (an ensemble; each one's
    score normalised by its own statistics)."""
    ensemble_aggregate: Literal["mean", "min", "mean_minus_std"] = "mean"
    """reward_model with an ensemble: mean | min (worst case) | mean_minus_std (mean minus
    ``ensemble_std_coef`` x the members' std: uncertainty-penalised)."""
    ensemble_std_coef: float = 1.0
    """reward_model: the std's weight under ``mean_minus_std``."""
    aggregate: Literal["min", "mean", "last"] = "min"
    """process_reward: how step scores make one reward (min: the weakest step)."""
    url: str = ""
    """judge: the server's base URL (``http://host:port``; ``/v1`` is optional)."""
    model: str = ""
    """judge: the ``model`` field of its requests (empty: the first model the server lists at /v1/models)."""
    api_key_env: str = ""
    """judge: the environment variable holding its bearer key (empty: none sent)."""
    rubric: str = ""
    """judge: the rubric; ``{prompt}`` and ``{response}`` are filled in (empty: the default rubric)."""
    parse: Literal["number", "logprobs"] = "number"
    """judge: number = the first number in its answer; logprobs = the expected score over the
    digit tokens of its first answer token (``top_logprobs``; needs an integer score range within 0-9)."""
    min_score: float = 0.0
    """judge: the lowest score the rubric allows (scores are mapped to [0, 1])."""
    max_score: float = 10.0
    """judge: the highest score the rubric allows."""
    timeout_s: float = 30.0
    """judge: seconds one request may take before it counts as failed."""
    retries: int = 2
    """judge: further tries of a failed request (backoff 0.5 s, doubling)."""
    concurrency: int = 4
    """judge: requests in flight at once."""
    on_failure: Literal["fail", "zero"] = "fail"
    """judge: a request still failing after its retries either ends the run (fail: one line naming
    the judge) or scores 0 and is counted in ``rollout/score/<name>_failed`` (an alert:
    ``monitor.reward_source_failure``)."""
    max_tokens: int = 8
    """judge: the judge's answer length."""
    function: str = ""
    """python: ``module.path:fn`` or ``path/to/file.py:fn``."""

    def __post_init__(self) -> None:
        check_choice("reward.sources[].kind", self.kind, KINDS)
        self.name = self.name or self.kind
        prefix = f"reward.sources.{self.name}"
        if self.name in RESERVED_NAMES or not self.name.replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"config key '{prefix}.name' must be letters, digits, _ or . and not one of "
                              f"{', '.join(RESERVED_NAMES)}; got {self.name!r}")
        check_range(f"{prefix}.weight", self.weight, 0.0)
        check_choice(f"{prefix}.parse", self.parse, ("number", "logprobs"))
        check_choice(f"{prefix}.on_failure", self.on_failure, ("fail", "zero"))
        check_choice(f"{prefix}.aggregate", self.aggregate, ("min", "mean", "last"))
        check_choice(f"{prefix}.ensemble_aggregate", self.ensemble_aggregate, ("mean", "min", "mean_minus_std"))
        check_range(f"{prefix}.ensemble_std_coef", self.ensemble_std_coef, 0.0)
        check_range(f"{prefix}.batch_size", self.batch_size, 1)
        check_range(f"{prefix}.clip", self.clip, 0.0)
        check_range(f"{prefix}.timeout_s", self.timeout_s, 0.01)
        check_range(f"{prefix}.retries", self.retries, 0)
        check_range(f"{prefix}.concurrency", self.concurrency, 1)
        check_range(f"{prefix}.max_tokens", self.max_tokens, 1)
        if not self.max_score > self.min_score:
            raise ConfigError(f"config key '{prefix}.max_score' must be above min_score ({self.min_score})")
        needed = {"reward_model": "path", "process_reward": "path", "judge": "url", "python": "function"}.get(self.kind)
        if needed and not getattr(self, needed):
            raise ConfigError(f"config key '{prefix}.{needed}' is required for a {self.kind} source")
        if self.kind == "judge" and self.parse == "logprobs" and not (
                0 <= self.min_score and self.max_score <= 9 and float(self.min_score).is_integer()
                and float(self.max_score).is_integer()):
            raise ConfigError(f"config key '{prefix}.parse': logprobs reads single digit tokens, so min_score and "
                              f"max_score must be integers within 0-9")


def parse_sources(entries: list[Any]) -> list[SourceConfig]:
    """``SourceConfig``s from the config's list; a key the kind does not read, a duplicate name or
    two verifier entries are refused naming the key."""
    defaults = {k: v for k, v in vars(SourceConfig()).items() if k != "name"}
    out: list[SourceConfig] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, SourceConfig):
            out.append(entry)
            continue
        if not isinstance(entry, dict):
            raise ConfigError(f"config key 'reward.sources[{i}]' must be a mapping with a kind, got {entry!r}")
        kind = entry.get("kind", "verifier")
        check_choice(f"reward.sources[{i}].kind", kind, KINDS)
        # a key of another kind at its default is what a written-out config holds: accepted
        extra = sorted(k for k in entry if k not in ("kind", "name", "weight", *KIND_KEYS[kind]) and k in defaults
                       and entry[k] != defaults[k])
        if extra:
            raise ConfigError(f"config key 'reward.sources[{i}].{extra[0]}' does not apply to a {kind} source; "
                              f"its keys: {', '.join(('kind', 'name', 'weight', *KIND_KEYS[kind]))}")
        out.append(from_dict(SourceConfig, entry, prefix=f"reward.sources[{i}]"))
    names = [s.name for s in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigError(f"config key 'reward.sources': two sources are named {dup!r}; give each a distinct name")
    if sum(s.kind == "verifier" for s in out) > 1:
        raise ConfigError("config key 'reward.sources': the verifier is listed twice")
    return out


def source_names(sources: list[SourceConfig]) -> list[str]:
    """The names of ``sources``, in order."""
    return [s.name for s in sources]
