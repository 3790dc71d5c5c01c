"""The rollout engine seam: what the trainer's rollout phase generates with (``rollout.engine``).

An engine does one thing for the rollout code (``rlvr.rollout.collect``, ``rlvr.rollout.episodes``):

    engine.generate(model, prompts, params, generator=..., pad_token_id=..., batch_size=...,
                    past=..., keep_cache=...) -> list[Completion]

prompt token-id lists in; ``params.n`` completions per prompt out, prompt-major, each with its
token ids, the per-token sampling log-probs (``log pi`` at temperature 1, no top-p: the PPO
``pi_old``) and its finish reason; random draws come from ``generator``. And one thing for the
trainer:

    engine.push(model, version)       after each update: the engine serves ``model``'s weights as
                                      ``version`` from now on, checked by the canary
                                      (``rlvr.rollout.weights``); ``engine.version`` says which

Engines (``ROLLOUT_ENGINES``, the names ``rollout.engine`` accepts):
- ``rlvr`` (default): rlvr's own engine (``rlvr.rollout.engine.generate``) on the trainer's
  model; nothing to push. The trainer does not even build it: the rollout code's default
  (``engine=None``) calls ``generate`` directly, so the default path is the one it always was.
- ``vllm``: vLLM in the trainer's process on its GPU (``rlvr.rollout.vllm_engine``; the
  optional ``vllm`` extra).
- ``remote``: an OpenAI-compatible server that returns token ids and log-probs (``rlvr serve``,
  vLLM, SGLang; ``rlvr.rollout.remote_engine``), weights pushed through a shared directory.

``EngineSource`` puts an engine with weights of its own under the synchronous rollout source: it
pushes after each update and checks, before each batch, that the engine serves the trainer's
version. A test registers a throwaway engine with ``ROLLOUT_ENGINES.temporary(name, factory)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from rlvr.registry import Registry
from rlvr.rollout.engine import Completion, SamplingParams, generate
from rlvr.rollout.kv_cache import KVPrefix
from rlvr.rollout.source import RolloutBatch, RolloutSource
from rlvr.rollout.weights import StaleWeightsError


class RolloutEngine(Protocol):
    """What the rollout code and the trainer need from a generation engine."""

    name: str
    version: int
    """The policy version whose weights the engine serves."""

    def generate(self, model: torch.nn.Module, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 generator: torch.Generator | None = None, pad_token_id: int, batch_size: int | None = None,
                 past: Sequence[KVPrefix | None] | None = None, keep_cache: bool = False) -> list[Completion]:
        """``params.n`` completions per prompt, prompt-major (``rlvr.rollout.engine.generate``'s
        contract). ``model`` is the trainer's; an engine with its own copy ignores it. ``past`` and
        ``keep_cache`` are the built-in engine's prefix reuse; other engines ignore them (their
        completions carry no cache)."""
        ...

    def push(self, model: torch.nn.Module, version: int) -> None:
        """Serve ``model``'s current weights as ``version``; raise ``StaleWeightsError`` when the
        canary says the engine does not."""
        ...

    def close(self) -> None:
        """Release what the engine holds (GPU memory). Idempotent."""
        ...


@dataclass
class EngineSetup:
    """What an engine factory gets from the trainer (``rlvr.train.grpo.engine_source``)."""

    model: torch.nn.Module
    tokenizer: object
    rollout: object  # rlvr.train.grpo.RolloutConfig (its ``vllm`` / ``remote`` section, ``batch_size``)
    run_dir: Path
    model_source: str  # the run's ``model`` key: a directory, or a built-in name such as "tiny"
    version: int  # the trainer's version now (0, or the step a resumed run continues from)
    seed: int


class BuiltinEngine:
    """rlvr's own engine on the trainer's model (``rlvr.rollout.engine``): nothing to push."""

    name = "rlvr"

    def __init__(self, version: int = 0) -> None:
        self.version = version

    def generate(self, model, prompts, params, *, generator=None, pad_token_id, batch_size=None, past=None,
                 keep_cache=False) -> list[Completion]:
        return generate(model, prompts, params, generator=generator, pad_token_id=pad_token_id,
                        batch_size=batch_size, past=past, keep_cache=keep_cache)

    def push(self, model: torch.nn.Module, version: int) -> None:
        self.version = version  # it samples from ``model`` itself

    def close(self) -> None:
        pass


def _vllm(setup: EngineSetup) -> RolloutEngine:
    from rlvr.rollout.vllm_engine import vllm_engine

    return vllm_engine(setup)


def _remote(setup: EngineSetup) -> RolloutEngine:
    from rlvr.rollout.remote_engine import remote_engine

    return remote_engine(setup)


ROLLOUT_ENGINES: Registry[Callable[[EngineSetup], RolloutEngine]] = Registry("rollout engine")
ROLLOUT_ENGINES.register("rlvr")(lambda setup: BuiltinEngine(setup.version))
ROLLOUT_ENGINES.register("vllm")(_vllm)
ROLLOUT_ENGINES.register("remote")(_remote)


class EngineSource:
    """A ``RolloutSource`` whose phase function generates on ``engine``: ``push`` sends the
    trainer's weights to the engine after each update (the wrapped source's ``push`` has nothing
    to copy), and ``next`` first checks the engine serves ``trainer_version``."""

    takes_weights = True

    def __init__(self, source: RolloutSource, engine: RolloutEngine) -> None:
        self.source, self.engine = source, engine

    def next(self, trainer_version: int) -> RolloutBatch:
        if self.engine.version != trainer_version:
            raise StaleWeightsError(f"rollout engine {self.engine.name!r} serves version {self.engine.version}, "
                                    f"the trainer is at version {trainer_version}")
        return self.source.next(trainer_version)

    def push(self, model: torch.nn.Module, version: int) -> None:
        self.source.push(model, version)
        self.engine.push(model, version)

    def metrics(self, batch: RolloutBatch, trainer_version: int) -> dict[str, float]:
        return self.source.metrics(batch, trainer_version)

    def close(self) -> None:
        try:
            self.source.close()
        finally:
            self.engine.close()
