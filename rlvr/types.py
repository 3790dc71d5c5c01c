"""Boundary types: the only objects that cross rlvr's package boundaries.

Frozen, typed and JSON-serialisable (``to_dict`` / ``from_dict``). ``Batch`` is the exception:
it holds tensors and lives only between the collator and the loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

Message = dict[str, str]  # {"role": "system" | "user" | "assistant" | "tool", "content": str}
FinishReason = Literal["stop", "length", "error"]
SINGLE_TURN = "single_turn"  # the environment of a task answered in one completion


def _plain(obj: Any) -> Any:
    """Recursively turn tuples into lists so the result is plain JSON."""
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


@dataclass(frozen=True)
class Spec:
    """Acceptance criteria of a task: a kind (which verifier) and its payload.

    ``math``: payload ``{"answer": "42", "tolerance": 0.0}``.
    """

    kind: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """One problem. ``id`` is stable and versioned, e.g. ``math.arith/v1/train/1/000042``.

    ``key`` is the canonical problem key (the train/eval disjointness check compares keys);
    ``reference`` a reference assistant response (the SFT demonstration; ``None`` if there is
    none); ``env`` the environment the task runs in (``ENVS``; ``single_turn``: one answer judged
    by the spec's verifier); ``actions`` a scripted expert's assistant turns for a multi-turn
    environment (SFT plays them); ``reveals`` the ``(domain, key)`` of other problems whose
    result ``reference`` states (a ``code.debug`` fix is a ``code.gen`` solution), which the
    disjointness check counts as seen in training. ``meta`` holds anything else (e.g. the
    ``source`` file).
    """

    id: str
    domain: str
    level: int
    prompt: tuple[Message, ...]
    spec: Spec
    meta: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    reference: str | None = None
    env: str = SINGLE_TURN
    actions: tuple[str, ...] = ()
    reveals: tuple[tuple[str, str], ...] = ()

    @property
    def multi_turn(self) -> bool:
        return self.env != SINGLE_TURN

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        """The inverse of ``to_dict``. ``key``, ``reference``, ``env`` and ``actions`` may also
        come inside ``meta`` (rlvr's task files before they were fields)."""
        meta = dict(d.get("meta", {}))
        typed = {name: d[name] if name in d else meta.pop(name) for name in TASK_FIELDS
                 if name in d or name in meta}
        return cls(
            id=d["id"],
            domain=d["domain"],
            level=int(d["level"]),
            prompt=tuple(dict(m) for m in d["prompt"]),
            spec=Spec(kind=d["spec"]["kind"], payload=dict(d["spec"].get("payload", {}))),
            meta=meta,
            **{k: _tuple_of(k, v) for k, v in typed.items()},
        )


TASK_FIELDS = ("key", "reference", "env", "actions", "reveals")  # an older file keeps them in ``meta``


def _tuple_of(name: str, value: Any) -> Any:
    if name == "actions":
        return tuple(value)
    if name == "reveals":
        return tuple(tuple(pair) for pair in value)
    return value


@dataclass(frozen=True)
class EpisodeInfo:
    """How a multi-turn episode ended, by its environment's account: ``env`` (its name),
    ``finish`` (submit, answer, turns, tokens, context, wall, length), ``turns`` (assistant turns
    taken) and ``max_tokens`` (the episode's policy-token budget, which the overlong penalty and
    the Dr. GRPO normaliser use instead of the single-turn generation budget)."""

    env: str
    finish: str
    turns: int
    max_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Trajectory:
    """What the policy did on one task: the exact token ids it saw and produced.

    ``token_ids``, ``loss_mask`` and ``logprobs`` have the same length: the full sequence
    (prompt + completion, for multi-turn also environment tokens). ``loss_mask`` is 1 on policy
    tokens, 0 elsewhere; ``logprobs`` are the sampling-time log-probabilities of policy tokens
    (0.0 where ``loss_mask`` is 0). ``completion`` is the decoded policy text (multi-turn: the
    last assistant turn; ``messages`` hold the whole conversation).

    Multi-turn episodes also keep ``segments``: ``(source, ids)`` pieces in order, ``source`` one of
    ``prompt`` | ``policy`` | ``env``; their concatenation is ``token_ids`` and ``loss_mask`` is 1
    exactly on ``policy`` pieces, and ``episode`` the environment's account of how it ended
    (``None`` for a single-turn completion).
    """

    task_id: str
    group_id: int
    messages: tuple[Message, ...]
    completion: str
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    policy_version: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    segments: tuple[tuple[str, tuple[int, ...]], ...] = ()
    episode: EpisodeInfo | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"token_ids ({n}), loss_mask ({len(self.loss_mask)}) and logprobs "
                f"({len(self.logprobs)}) must have the same length"
            )
        if self.segments and sum(len(ids) for _, ids in self.segments) != n:
            raise ValueError(f"segments cover {sum(len(ids) for _, ids in self.segments)} tokens, "
                             f"token_ids has {n}")

    @property
    def num_policy_tokens(self) -> int:
        return int(sum(self.loss_mask))

    def token_budget(self, default: int) -> int:
        """The policy-token budget this trajectory was generated under: its episode's own, else
        ``default`` (the single-turn ``max_new_tokens``)."""
        return self.episode.max_tokens if self.episode is not None else default

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))


@dataclass(frozen=True)
class Verdict:
    """A verifier's judgement. ``score`` in [0, 1]; ``reason`` is ``ok`` when passed, else
    e.g. ``mismatch``, ``no_answer``, ``multiple_answers``, ``timeout``, ``tampered``."""

    passed: bool
    score: float
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))


@dataclass(frozen=True)
class Scored:
    """A trajectory with the task it answered, its verdict, scalar reward and the named reward
    terms that sum to it; ``scores``: each reward source's unweighted score (``reward.sources``;
    a source of weight 0 is here and in no term), with ``proxy`` and ``gold`` for the
    over-optimisation watch."""

    task: Task
    trajectory: Trajectory
    verdict: Verdict
    reward: float
    terms: dict[str, float] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))


@dataclass(frozen=True)
class Batch:
    """Padded training tensors (right padding). B sequences, T tokens.

    input_ids      [B, T] long   token ids (pad where attention_mask is 0)
    attention_mask [B, T] long   1 on real tokens
    loss_mask      [B, T] float  1 on policy tokens whose log-prob is trained, aligned with input_ids
    old_logprobs   [B, T] float  sampling-time log-probs of input_ids (0 off the loss mask)
    advantages     [B]    float  one advantage per sequence ([B, T] per token: PPO with a critic, gae)
    ref_logprobs   [B, T] float  frozen-reference log-probs, when a KL term is used
    is_weights     [B, T] float  truncated importance weights of off-policy (async) samples, or None
    stale          [B]    bool   async single-pass update: rows generated by an older policy, whose
                                 pi_old and IS weights the loss takes from its own forward; or None
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    stale: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            **{
                f.name: (getattr(self, f.name).to(device) if getattr(self, f.name) is not None else None)
                for f in dataclasses.fields(self)
            }
        )
