"""Opt-in ``torch.compile`` of the policy's decoder layers for the training forward (``algo.compile``).

Eager PyTorch runs each RMSNorm, rotary embedding and SwiGLU as several memory-bound kernels
(and as many again in the backward); ``torch.compile`` fuses them into a few generated kernels
per layer. The GEMMs and attention are the same calls either way, so log-probs, loss and
gradients match the eager forward up to float summation order (tests/test_compiled.py).

- ``compiled_layers(model)``: a context in which ``model``'s decoder layers run compiled. The
  layers are swapped for ``torch.compile(layer, dynamic=True)`` wrappers (same parameters, built
  once per model and kept) only inside the context, so the rollout engine, evaluation,
  ``state_dict`` and checkpoints never see them, and the backward of a forward taken inside runs
  the compiled backward after the context has closed.
- Dynamic shapes: packed batches change rows and width every step; one compile serves them all
  (about 20-30 s on 2 CPU cores for the benchmark models, once per run; a change of autocast or
  grad mode compiles once more).
- On CPU the generated kernels are C++ and need a compiler (``g++``/``clang++``) on the machine:
  without one the first compiled forward raises ``ConfigError`` naming ``algo.compile``.
- A model whose decoder layers cannot be found (``model.<base_model_prefix>.layers``) runs eager.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import weakref
from collections.abc import Iterator

import torch

from rlvr.errors import ConfigError

_COMPILED: weakref.WeakKeyDictionary[torch.nn.Module, list[torch.nn.Module]] = weakref.WeakKeyDictionary()


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The ``ModuleList`` of decoder layers of a Hugging Face causal LM, or None."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    layers = getattr(base, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) and len(layers) else None


@contextlib.contextmanager
def compiled_layers(model: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """Run ``model``'s decoder layers compiled inside the context (no-op when not ``enabled`` or
    when the layers cannot be found)."""
    layers = decoder_layers(model) if enabled else None
    if layers is None:
        yield
        return
    eager = list(layers)
    compiled = _COMPILED.get(model)
    if compiled is None or any(c._orig_mod is not e for c, e in zip(compiled, eager)):
        if next(model.parameters()).device.type == "cpu":
            check_cpu_compiler()
        compiled = [torch.compile(layer, dynamic=True) for layer in eager]
        _COMPILED[model] = compiled
    for i, c in enumerate(compiled):
        layers[i] = c
    try:
        yield
    finally:
        for i, e in enumerate(eager):
            layers[i] = e


def cpu_compiler_found() -> bool:
    """Whether inductor finds a C++ compiler for its CPU kernels (``$CXX``, else ``g++``,
    ``clang++`` or ``c++`` on the PATH)."""
    cxx = os.environ.get("CXX")
    return bool((cxx and shutil.which(cxx)) or any(shutil.which(c) for c in ("g++", "clang++", "c++")))


def check_cpu_compiler(key: str = "algo.compile") -> None:
    """Raise ``ConfigError`` naming ``key`` when no C++ compiler is found: inductor's CPU kernels
    are C++ built at run time."""
    if not cpu_compiler_found():
        raise ConfigError(f"config key '{key}': torch.compile on CPU builds C++ kernels at run time and no "
                          f"C++ compiler was found ($CXX, g++, clang++ or c++); install one or set {key}=false")
