"""Weight sync from the trainer to a rollout engine's copy of the policy, checked by a canary.

In asynchronous mode the rollout engine generates with its own copy of the model while the
trainer updates the original, so weights travel explicitly:

    trainer:  sync.push(model, version)    after each update: a detached copy of the state dict,
                                           the version, and the trainer's canary probe at it
    engine:   sync.pull(engine_model)      before generating: load the newest pushed weights (if
                                           newer than what it serves), then run the canary

The canary is a fixed prompt + continuation (token ids); its per-token log-probs under the
engine's model must match the trainer's probe of the same version within ``tolerance``
(1e-4 in fp32: identical weights agree to ~1e-6; one optimizer step moves them by far more).
A mismatch (a load that did not happen, the wrong version loaded, a partial load) raises
``StaleWeightsError`` naming both versions. ``pull`` also checks the version it ends up serving
is the one it was handed.

In-process (a copy in memory). Ray rollout workers (``rlvr.workers``) keep the same contract:
push = broadcast + version, load = ``load_state_dict`` + ``check_canary`` against the trainer's probe.
"""

from __future__ import annotations

import threading

import torch

from rlvr.model.logprobs import sequence_logprobs
from rlvr.model.lora import plain_state_dict


class StaleWeightsError(RuntimeError):
    """The rollout engine does not serve the weights the trainer pushed."""


def canary_ids(vocab_size: int, length: int = 24, seed: int = 1234) -> list[int]:
    """A fixed, seeded token sequence (prompt + continuation) used as the probe."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=g).tolist()


def probe(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Per-token log-probs of the canary sequence under ``model`` (eval mode, no grad) -> [T]."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        x = torch.tensor([ids], dtype=torch.long, device=device)
        with torch.no_grad():
            return sequence_logprobs(model, x, torch.ones_like(x))[0].float().cpu()
    finally:
        model.train(was_training)


class WeightSync:
    """One trainer, one engine. Thread-safe: ``push`` from the trainer thread, ``pull`` from the
    producer thread. Only the newest push is kept (an engine that fell behind skips versions)."""

    def __init__(self, vocab_size: int, tolerance: float = 1e-4) -> None:
        self.ids = canary_ids(vocab_size)
        self.tolerance = tolerance
        self._lock = threading.Lock()
        self._pushed: tuple[int, dict, torch.Tensor] | None = None
        self.pushes = 0
        self.loads = 0

    @property
    def latest_version(self) -> int:
        with self._lock:
            return -1 if self._pushed is None else self._pushed[0]

    def push(self, model: torch.nn.Module, version: int) -> None:
        """Publish ``model``'s current weights as ``version`` (copied: the trainer keeps training)."""
        state = {k: v.clone() for k, v in plain_state_dict(model).items()}  # a LoRA policy: merged, plain names
        expected = probe(model, self.ids)
        with self._lock:
            if self._pushed is not None and version <= self._pushed[0]:
                raise ValueError(f"weight versions must increase: pushed {self._pushed[0]}, then {version}")
            self._pushed = (version, state, expected)
            self.pushes += 1

    def pull(self, engine: torch.nn.Module, serving: int) -> int:
        """Bring ``engine`` (serving version ``serving``) to the newest pushed version; returns
        the version it serves now. Raises ``StaleWeightsError`` if the canary disagrees."""
        with self._lock:
            pushed = self._pushed
        if pushed is None or pushed[0] == serving:
            return serving
        version, state, expected = pushed
        self.load(engine, state)
        self.loads += 1
        self.check(engine, version, expected, serving)
        return version

    def load(self, engine: torch.nn.Module, state: dict) -> None:
        """Copy the weights into the engine's model (a remote engine would receive a broadcast)."""
        engine.load_state_dict(state)

    def check(self, engine: torch.nn.Module, version: int, expected: torch.Tensor, previous: int) -> None:
        """The canary: the engine's log-probs of the fixed sequence against the trainer's probe."""
        check_canary(engine, self.ids, expected, version, previous, self.tolerance)


def check_canary(engine: torch.nn.Module, ids: list[int], expected: torch.Tensor, version: int, previous: int,
                 tolerance: float) -> None:
    """Raise ``StaleWeightsError`` unless ``engine``'s log-probs of the canary ``ids`` match the
    trainer's probe ``expected`` of ``version`` within ``tolerance`` (in-process and on workers)."""
    compare_canary(probe(engine, ids), expected, version, previous, tolerance)


def compare_canary(got: torch.Tensor, expected: torch.Tensor, version: int, previous: int, tolerance: float) -> None:
    """The canary's verdict on log-probs ``got`` from any engine (a model copy, or vLLM's prompt
    log-probs: ``rlvr.rollout.vllm_engine``) against the trainer's probe ``expected``."""
    err = float((got.float() - expected.float()).abs().max())
    if not err <= tolerance:  # also catches nan
        raise StaleWeightsError(
            f"rollout engine serves stale weights: trainer pushed version {version}, the engine's "
            f"canary log-probs differ by {err:.3g} (> {tolerance:g}); it was serving version "
            f"{previous} before the sync")
