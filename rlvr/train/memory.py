"""Memory options of the training forward that are not the optimizer's (``rlvr.train.common``
has the float32 master weights).

Activation (gradient) checkpointing: each decoder layer keeps only its input during the forward
and recomputes its activations during the backward (transformers' own
``activation_checkpointing_enable``, non-reentrant), trading about one more forward per update for
activation memory that no longer grows with the number of layers. The rollout engine is
unaffected (checkpointing acts in training mode only).
"""

from __future__ import annotations

import torch

from rlvr.errors import ConfigError


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(f"config key 'algo.gradient_checkpointing': {type(model).__name__} does not support "
                          "activation checkpointing (transformers' supports_gradient_checkpointing is False)")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name warns)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def disable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Undo ``enable_activation_checkpointing`` (the memory plan switches it per batch)."""
    if hasattr(model, "activation_checkpointing_disable"):  # transformers >= 5
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def checkpointing(model: torch.nn.Module) -> bool:
    """Whether ``model`` recomputes its layers in the backward."""
    if hasattr(model, "is_activation_checkpointing"):  # transformers >= 5 (the old name warns)
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))
