"""LoRA adapters through ``peft`` for the SFT, DPO and GRPO trainers (config key ``lora``).

What it does:
- ``LoraConfig``: rank, alpha, dropout, target modules and how ``final/`` is saved (merged or as
  an adapter), checked when the config is read.
- ``apply_lora(model, cfg)`` injects the adapters with ``peft.get_peft_model`` and returns the
  ``PeftModel``. The trainers keep training on ``peft.get_base_model()``: the same Hugging Face
  module tree (``LlamaForCausalLM``...) with the targeted ``nn.Linear`` layers replaced by LoRA
  layers, so the packed training forward, compiled layers and the rollout engine see the model
  class they know. Only the adapter matrices require grad (the optimizer holds only them).
- ``adapters_off(peft_model)``: the frozen base model from the same weights (``with
  adapters_off(m): ...``): DPO's reference and GRPO's KL reference, no second model in memory.
- ``sampling_weights(peft_model)``: the rollout engine samples from the merged weights
  ``W + scale * B @ A``. Each targeted layer's weight is swapped for a merged copy for the block
  (adapters disabled, so the forward is not adapted twice) and the original tensor put back
  after it: the base weights stay bit for bit what they were (a merge followed by an unmerge
  would round them a little at every step, worst in bf16). The engine's fast decoder reads the
  merged matrices like any Llama's.
- ``plain_state_dict(model)``: the weights under plain Hugging Face names (no ``lora_`` keys, no
  ``.base_layer``); within ``sampling_weights`` the merged weights, loadable into a plain copy
  of the model (an engine that keeps its own copy: ``rlvr.train.policy.Policy.engine_copy``).
- ``save_final``: ``final/`` as a merged Hugging Face directory (loads in plain transformers) or
  an adapter directory (``adapter_config.json`` + ``adapter_model.safetensors`` + tokenizer, the
  base model's absolute path in ``base_model_name_or_path``). ``load_adapter_weights`` puts a
  checkpoint's adapter back into a fresh ``apply_lora`` model (resume); ``load_adapter_dir``
  loads an adapter directory onto its base and merges it (``rlvr.model.load`` does this for any
  directory with ``adapter_config.json`` and no ``config.json``).

The trainers do not call these directly: ``rlvr.train.policy.Policy`` decides LoRA-versus-full
weights for them (loading, sampling, reference, checkpoints, ``final/``).

What it does not do: quantised bases (QLoRA), several adapters at once, or LoRA on embeddings
and the LM head. docs/lora.md.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.config import check_choice, check_range
from rlvr.errors import ConfigError, UserError

SAVE_MODES = ("merged", "adapter")
ALL_LINEAR = "all-linear"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER = "default"  # peft's name of the one adapter


@dataclass
class LoraConfig:
    """LoRA adapters instead of full fine-tuning (config key ``lora``; docs/lora.md)."""

    enabled: bool = False
    """Train LoRA adapters (the base weights frozen) instead of every weight."""
    r: int = 16
    """Rank of each adapter (A: r x in, B: out x r)."""
    alpha: float = 32.0
    """Scale numerator: the update is (alpha / r) * B @ A."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training. Above 0 the update's forward no longer
    equals the sampling policy (``rollout/logprob_mismatch_kl`` shows it)."""
    target_modules: list[str] = field(default_factory=lambda: [ALL_LINEAR])
    """Module names to adapt (e.g. [q_proj, k_proj, v_proj, o_proj]); [all-linear]: every linear
    layer of the decoder (attention and MLP projections), never the LM head (peft's rule)."""
    save: str = "merged"
    """How ``final/`` is written: merged (a plain Hugging Face model) | adapter (the adapter and
    the base model's path; ``rlvr`` loads it onto the base, so does ``peft``)."""

    def __post_init__(self) -> None:
        check_range("lora.r", self.r, 1)
        if self.alpha <= 0:
            raise ConfigError(f"config key 'lora.alpha' must be > 0, got {self.alpha}")
        check_range("lora.dropout", self.dropout, 0.0, 0.999)
        check_choice("lora.save", self.save, SAVE_MODES)
        if isinstance(self.target_modules, str):
            self.target_modules = [self.target_modules]
        if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            raise ConfigError(f"config key 'lora.target_modules' must be a non-empty list of module names, "
                              f"got {self.target_modules!r}")
        if ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            raise ConfigError("config key 'lora.target_modules': 'all-linear' stands alone (it covers every "
                              "linear layer but the LM head)")
        if "lm_head" in self.target_modules:
            raise ConfigError("config key 'lora.target_modules': the LM head is not adapted (rlvr's packed "
                              "forward and fast decoder read it as a plain linear layer)")


def peft_config(cfg: LoraConfig):
    from peft import LoraConfig as PeftLoraConfig

    targets = ALL_LINEAR if cfg.target_modules == [ALL_LINEAR] else list(cfg.target_modules)
    return PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                          bias="none", task_type="CAUSAL_LM")


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, base_path: str | Path | None = None):
    """``model`` with LoRA adapters injected (in place) as a ``PeftModel``; train on its
    ``get_base_model()``. ``base_path`` is recorded in the adapter's config for saving."""
    from peft import get_peft_model

    try:
        peft_model = get_peft_model(model, peft_config(cfg))
    except ValueError as e:  # e.g. a target module name the model does not have
        raise ConfigError(f"config key 'lora.target_modules': {str(e).splitlines()[0][:300]}") from None
    if base_path is not None:
        peft_model.peft_config[ADAPTER].base_model_name_or_path = str(Path(base_path).resolve())
    return peft_model


def trainable_count(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


@contextlib.contextmanager
def adapters_off(peft_model) -> Iterator[torch.nn.Module]:
    """The base model (adapters disabled) for the block: the frozen reference from the same
    weights. Yields the module to call (``get_base_model()``)."""
    with peft_model.disable_adapter():
        yield peft_model.get_base_model()


def lora_layers(peft_model) -> list[torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    return [m for m in peft_model.get_base_model().modules() if isinstance(m, LoraLayer) and ADAPTER in m.lora_A]


@contextlib.contextmanager
def sampling_weights(peft_model) -> Iterator[torch.nn.Module]:
    """The merged model for the block (for the rollout engine and eval): each LoRA layer's base
    weight swapped for ``W + delta`` with adapters disabled; the original tensors restored after,
    untouched (and float32 adapters on a bf16 base shown in bf16, for the fast decoder's
    one-dtype rule). Yields ``get_base_model()``. Costs one extra copy of the targeted matrices
    while it lasts."""
    layers = lora_layers(peft_model)
    originals = []
    with torch.no_grad():
        merged = [layer.get_base_layer().weight.detach() + layer.get_delta_weight(ADAPTER).to(layer.get_base_layer().weight.dtype)
                  for layer in layers]
    dtype = peft_model.get_base_model().get_input_embeddings().weight.dtype
    with adapters_off(peft_model) as base:
        try:
            for layer, w in zip(layers, merged):
                param = layer.get_base_layer().weight
                originals.append((param, param.data))
                param.data = w
            # peft keeps the adapters in float32 on a bf16/fp16 base; unused while they are off,
            # they are shown in the base's dtype so the engine's fast decoder (one dtype) takes it
            for name, param in base.named_parameters():
                if "lora_" in name and param.dtype != dtype:
                    originals.append((param, param.data))
                    param.data = param.data.to(dtype)
            yield base
        finally:
            for param, data in originals:
                param.data = data


def plain_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict (detached) under plain Hugging Face names: the LoRA matrices left
    out and ``.base_layer`` taken out of the wrapped layers' names. Pass the module tree
    (``get_base_model()``), not the ``PeftModel``. Within ``sampling_weights`` these are the merged
    weights, loadable with ``load_state_dict`` into a plain copy of the model; a model without
    LoRA layers gives its own state dict."""
    out = {}
    for key, value in model.state_dict().items():
        parts = key.split(".")
        if not any(p.startswith("lora_") for p in parts):
            out[".".join(p for p in parts if p != "base_layer")] = value.detach()
    return out


def save_final(directory: str | Path, peft_model, tokenizer, cfg: LoraConfig) -> torch.nn.Module:
    """Write ``final/`` (atomically) as ``cfg.save`` says and return the model to use after it:
    merged: the adapters merged into the base weights for good (``merge_and_unload``) and saved
    as a plain Hugging Face directory; adapter: the adapter directory (the model unchanged)."""
    from rlvr.model.checkpoint import save_model_dir

    if cfg.save == "adapter":
        save_model_dir(directory, peft_model, tokenizer)
        return peft_model.get_base_model()
    model = peft_model.merge_and_unload()
    save_model_dir(directory, model, tokenizer)
    return model


def load_adapter_weights(peft_model, directory: str | Path) -> None:
    """Load the adapter weights saved in ``directory`` (a checkpoint of a LoRA run) into
    ``peft_model``, which must have the same LoRA config."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(directory) / "adapter_model.safetensors"
    if not path.is_file():
        raise UserError(f"'{directory}' holds no adapter (adapter_model.safetensors): was it written by a run "
                        "without lora.enabled?")
    device = next(peft_model.parameters()).device
    result = set_peft_model_state_dict(peft_model, load_file(str(path), device=str(device)))
    missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if missing:
        raise UserError(f"the adapter in '{directory}' does not fit this model/lora config: {missing[:3]}")


def is_adapter_dir(path: str | Path) -> bool:
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def adapter_base(path: str | Path) -> str:
    """The base model directory recorded in an adapter directory's config."""
    try:
        base = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise UserError(f"adapter directory '{path}': {ADAPTER_CONFIG} is not readable JSON: {e}") from None
    if not base:
        raise UserError(f"adapter directory '{path}' does not name its base model (base_model_name_or_path)")
    return str(base)


def load_adapter_dir(model: torch.nn.Module, path: str | Path) -> Any:
    """The base ``model`` with the adapter in ``path`` loaded and merged in: a plain model."""
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(model, str(path), is_trainable=False).merge_and_unload()
    except Exception as e:  # a bad adapter file, or one that does not fit the base
        raise UserError(f"could not load the adapter in '{path}' onto its base: {str(e).splitlines()[0][:300]}") from e
