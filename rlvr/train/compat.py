"""Which step components run with which rollout producers: the one compatibility table.

A GRPO run is one rollout **producer** (who generates and verifies the batches) and any set of
step **components** (what the update trains with). Both are read from the config:

    producer    sync (default) | async | ray | ray_async | torchrun | remote | remote_async | vllm
    components  lora, kl_reference, teacher, critic, dynamic_sampling, curriculum

Every (component, producer) cell is supported, or ``REFUSED`` names the reason; a producer that
cannot be built at all (torchrun with Ray, say) is in ``PRODUCER_REFUSALS``. Config validation
(``check``) is the only place a combination is refused, with one line naming the config key, the
producer and the reason; ``tests/test_compat.py`` walks every cell (a supported one runs two steps,
a refused one gives its error) and ``markdown()`` renders the matrix in docs/compatibility.md.
Conflicts between two components that are no producer's business (a refill that a critic would
waste) are ``CONFLICTS``, checked the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlvr.errors import ConfigError

GAE = "gae"  # the advantage estimator that needs a learned critic

PRODUCERS: dict[str, str] = {
    "sync": "the synchronous local loop (the default)",
    "async": "asynchronous.enabled: true",
    "ray": "backend: ray",
    "ray_async": "backend: ray + asynchronous.enabled: true",
    "torchrun": "torchrun, more than one process",
    "remote": "rollout.engine: remote",
    "remote_async": "rollout.engine: remote + asynchronous.enabled: true",
    "vllm": "rollout.engine: vllm",
}


@dataclass(frozen=True)
class Component:
    """A step component as the table sees it: its name, the config key that turns it on, and
    whether a config turns it on."""

    name: str
    key: str
    active: Callable[[object], bool]
    what: str


COMPONENTS: tuple[Component, ...] = (
    Component("lora", "lora.enabled", lambda c: c.lora.enabled,
              "the policy as a LoRA adapter on a frozen base"),
    Component("kl_reference", "algo.kl_coef", lambda c: c.algo.kl_coef > 0,
              "a frozen reference and a KL term (in the loss or the reward)"),
    Component("teacher", "distill.teacher", lambda c: c.distill.enabled,
              "on-policy distillation from a teacher's log-probs"),
    Component("critic", "algo.advantage", lambda c: c.algo.advantage == GAE,
              "PPO with a learned critic (GAE)"),
    Component("dynamic_sampling", "algo.dynamic_sampling_rounds", lambda c: c.algo.dynamic_sampling_rounds > 0,
              "zero-variance groups refilled (DAPO)"),
    Component("curriculum", "curriculum.enabled", lambda c: c.curriculum.enabled,
              "the curriculum scheduler draws the tasks"),
)

_VLLM_GPU = ("vLLM runs in the trainer's process on its CUDA GPU and takes full weights between "
             "updates; use rollout.engine: rlvr (or remote) for this")
_EXTERNAL_FULL = ("the external engine loads a full Hugging Face directory; the adapter is merged only for "
                  "rlvr's own engine copies")

REFUSED: dict[tuple[str, str], str] = {
    ("lora", "vllm"): _EXTERNAL_FULL,
    ("lora", "remote"): _EXTERNAL_FULL,
    ("lora", "remote_async"): _EXTERNAL_FULL,
}
"""(component, producer) -> why that cell does not run. Every other cell runs."""


@dataclass(frozen=True)
class ProducerRefusal:
    """A producer that cannot be built: when ``applies(cfg, world)``, ``key`` is refused for ``reason``."""

    key: str
    applies: Callable[[object, int], bool]
    reason: str
    where: str = ""
    """What it does not work with, when not the producer's own words (``check``)."""


PRODUCER_REFUSALS: tuple[ProducerRefusal, ...] = (
    ProducerRefusal("backend", lambda c, w: w > 1 and c.backend == "ray",
                    "data parallel under torchrun needs backend: local (Ray runs its own actors; launch it "
                    "without torchrun)"),
    ProducerRefusal("asynchronous.enabled", lambda c, w: w > 1 and c.asynchronous.enabled,
                    "under torchrun the ranks share each step's batch synchronously (docs/distributed.md)"),
    ProducerRefusal("rollout.engine", lambda c, w: w > 1 and c.rollout.engine != "rlvr",
                    "data parallel deals rollout chunks to the ranks' own rlvr engines"),
    ProducerRefusal("backend", lambda c, w: c.backend == "ray" and c.rollout.engine != "rlvr",
                    "with backend: ray the rollout actors are the engine; an external engine replaces them"),
    ProducerRefusal("asynchronous.enabled", lambda c, w: c.asynchronous.enabled and c.rollout.engine == "vllm",
                    _VLLM_GPU),
    ProducerRefusal("device", lambda c, w: c.rollout.engine == "vllm" and c.device == "cpu",
                    "vLLM shares the trainer's CUDA GPU; set device: cuda (or auto)"),
    ProducerRefusal("distributed.rollout_chunk", lambda c, w: w > 1 and not c.distributed.rollout_chunk,
                    "data parallel deals each step's tasks to the ranks in chunks: set it > 0 (e.g. "
                    "rollout.tasks_per_step / the number of processes)"),
    ProducerRefusal("distributed.shard", lambda c, w: w == 1 and c.distributed.shard,
                    "it splits the policy over torchrun processes: run with several (rlvr train --nproc N, "
                    "or torchrun --nproc_per_node N -m rlvr.cli train ...)", where="one process"),
)


@dataclass(frozen=True)
class Conflict:
    """Two settings that contradict each other whatever the producer."""

    key: str
    applies: Callable[[object], bool]
    reason: str


def _curriculum_refills(c) -> bool:
    return c.curriculum.enabled and c.curriculum.filter.enabled and bool(c.curriculum.filter.refill_rounds)


CONFLICTS: tuple[Conflict, ...] = (
    Conflict("algo.compile", lambda c: c.algo.compile and c.distributed.shard,
             "compiled decoder layers are not built over FSDP2's sharded units: set algo.compile: false with "
             "distributed.shard"),
    Conflict("algo.logits_chunk", lambda c: c.algo.logits_chunk > 0 and c.distributed.shard,
             "a sharded policy's LM head runs inside the model's own forward (its root FSDP2 unit gathers the "
             "head there), not chunk by chunk: set algo.logits_chunk: 0 with distributed.shard"),
    Conflict("algo.dynamic_sampling_rounds", lambda c: c.algo.dynamic_sampling_rounds > 0 and _curriculum_refills(c),
             "it and curriculum.filter.refill_rounds both refill zero-variance groups: with the curriculum set "
             "curriculum.filter.refill_rounds only (and algo.dynamic_sampling_rounds: 0)"),
    Conflict("algo.dynamic_sampling_rounds", lambda c: c.algo.dynamic_sampling_rounds > 0 and c.algo.advantage == GAE,
             "it refills zero-variance groups, which algo.advantage: gae keeps and trains on (the critic's "
             "advantages are not zero there): set algo.dynamic_sampling_rounds: 0"),
    Conflict("distill.teacher", lambda c: c.distill.enabled and c.algo.advantage == GAE,
             "the teacher's per-token signal is added to a group estimator's advantages (ADVANTAGES): "
             "set algo.advantage to one, e.g. grpo"),
    Conflict("algo.dynamic_sampling_rounds", lambda c: c.distill.alone and c.algo.dynamic_sampling_rounds > 0,
             "it acts on the verifiable reward, which distill.mode: alone does not use: set distill.mode: add, "
             "or turn it off"),
    Conflict("algo.kl_in_reward", lambda c: c.distill.alone and c.algo.kl_in_reward,
             "it acts on the verifiable reward, which distill.mode: alone does not use: set distill.mode: add, "
             "or turn it off"),
)


def producer(cfg, world: int) -> str:
    """The producer name of ``cfg`` run with ``world`` processes (after ``PRODUCER_REFUSALS``)."""
    if world > 1:
        return "torchrun"
    if cfg.rollout.engine != "rlvr":  # vllm, or an engine with weights of its own behind an API (remote)
        return ("vllm" if cfg.rollout.engine == "vllm" else "remote") + ("_async" if cfg.asynchronous.enabled else "")
    if cfg.backend == "ray":
        return "ray_async" if cfg.asynchronous.enabled else "ray"
    return "async" if cfg.asynchronous.enabled else "sync"


def check(cfg, world: int) -> None:
    """The one refusal path: raise ``ConfigError`` (one line) for the first producer that cannot be
    built, component the producer does not run, or conflict ``cfg`` contains."""
    for r in PRODUCER_REFUSALS:
        if r.applies(cfg, world):
            where = r.where or (f"{world} torchrun processes" if world > 1 else f"rollout.engine: {cfg.rollout.engine}")
            raise ConfigError(f"config key '{r.key}' does not work with {where}: {r.reason}")
    name = producer(cfg, world)
    for c in COMPONENTS:
        reason = REFUSED.get((c.name, name))
        if reason and c.active(cfg):
            raise ConfigError(f"config key '{c.key}' ({c.what}) does not run with {PRODUCERS[name]}: {reason}")
    for conflict in CONFLICTS:
        if conflict.applies(cfg):
            raise ConfigError(f"config key '{conflict.key}': {conflict.reason}")


def cells() -> list[tuple[str, str, str | None]]:
    """Every (component, producer, reason or None) of the table, row by row."""
    return [(c.name, p, REFUSED.get((c.name, p))) for c in COMPONENTS for p in PRODUCERS]


def markdown() -> str:
    """The table as the Markdown matrix of docs/compatibility.md (yes, or a footnote's reason)."""
    reasons: list[str] = []
    rows = ["| component | " + " | ".join(PRODUCERS) + " |", "|---" * (len(PRODUCERS) + 1) + "|"]
    for c in COMPONENTS:
        marks = []
        for p in PRODUCERS:
            reason = REFUSED.get((c.name, p))
            if reason is None:
                marks.append("yes")
                continue
            if reason not in reasons:
                reasons.append(reason)
            marks.append(f"no ({reasons.index(reason) + 1})")
        rows.append(f"| `{c.name}` ({c.key}) | " + " | ".join(marks) + " |")
    notes = [f"{i}. {r}" for i, r in enumerate(reasons, 1)]
    producers = [f"- `{p}`: {what}" for p, what in PRODUCERS.items()]
    refusals = [f"- `{r.key}`: {r.reason}" for r in PRODUCER_REFUSALS]
    conflicts = [f"- `{c.key}`: {c.reason}" for c in CONFLICTS]
    return "\n".join(["Producers:", *producers, "", *rows, "", *notes, "", "Producers that cannot be built:",
                      *refusals, "", "Settings that contradict each other, whatever the producer:", *conflicts]) + "\n"
