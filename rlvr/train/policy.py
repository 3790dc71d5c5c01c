"""The trained policy of SFT, DPO and GRPO: full weights, or a LoRA adapter on a frozen base.

One object decides LoRA-versus-full-weights for the trainers (config key ``lora``,
``rlvr.model.lora``), so they do not:
- ``Policy.load(path, lora_cfg, ckpt)``: full weights from the checkpoint ``ckpt`` when resuming,
  else from ``path``; LoRA: the base from ``path`` with the adapters injected and, when resuming,
  the checkpoint's adapter loaded. ``Policy.wrap`` does the same for a model already loaded.
- ``model``: the module to train and call (with LoRA the ``PeftModel``'s ``get_base_model()``, the
  same Hugging Face module tree with LoRA layers in it); ``lora``: the ``PeftModel`` or None.
- ``sampling()``: the module to sample from (LoRA: the merged weights, ``sampling_weights``).
- ``reference()``: the frozen reference. With LoRA it is the same weights with the adapters off
  (no second model); full weights need a separately loaded one (``load_reference``).
- ``engine_copy()``: a frozen plain copy of the sampling policy, for an engine that keeps its own
  copy (asynchronous rollout, Ray workers); ``rlvr.model.lora.plain_state_dict`` of ``sampling()``
  gives the weights to load into it after an update.
- ``checkpoint_module()`` for ``save_checkpoint`` (LoRA: the adapter), ``save_final`` for ``final/``.
- ``shard()`` (GRPO's ``distributed.shard`` under torchrun): ``model`` sharded with FSDP2 over the
  ranks (``rlvr.train.sharded``); sampling, the reference, engine copies and ``final/`` then use
  ``sampler``, a plain whole copy that ``gather_weights`` refreshes after each update.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path

import torch

from rlvr.model.checkpoint import save_model_dir
from rlvr.model.load import ModelLoadConfig, load_model_and_tokenizer
from rlvr.model.lora import (
    LoraConfig,
    adapters_off,
    apply_lora,
    load_adapter_weights,
    plain_state_dict,
    sampling_weights,
    save_final,
)


class Policy:
    """The trained model (full weights or a LoRA adapter on a frozen base) and its tokenizer."""

    def __init__(self, model: torch.nn.Module, tokenizer, lora_cfg: LoraConfig, lora=None,
                 base_path: str | Path | None = None) -> None:
        self.model = model
        """The module to train and call (with LoRA: ``lora.get_base_model()``)."""
        self.tokenizer = tokenizer
        self.lora_cfg = lora_cfg
        self.lora = lora
        """The ``PeftModel`` around ``model``, or None (full weights; or LoRA after a merged ``save_final``)."""
        self.base_path = base_path
        """The starting weights' directory: the LoRA base, and the default reference."""
        self.sampler: Policy | None = None
        """Sharded (``shard``): the plain whole policy that sampling, evals and ``final/`` use."""
        self.mixed_precision = False
        """Sharded over float32 masters with FSDP2's bf16 policy (``shard`` with master weights)."""

    @property
    def is_lora(self) -> bool:
        return self.lora is not None

    @property
    def is_sharded(self) -> bool:
        return self.sampler is not None

    @classmethod
    def load(cls, path: str | Path, lora_cfg: LoraConfig, ckpt: str | Path | None = None, *, device,
             options: ModelLoadConfig) -> Policy:
        """Full weights: from the checkpoint ``ckpt`` when given, else from ``path``. LoRA: the base
        from ``path``, adapters injected, and the adapter of ``ckpt`` (resume) loaded when given."""
        source = str(ckpt) if ckpt is not None and not lora_cfg.enabled else path
        model, tokenizer = load_model_and_tokenizer(source, device=device, options=options)
        policy = cls.wrap(model, tokenizer, lora_cfg, path)
        if policy.is_lora and ckpt is not None:
            load_adapter_weights(policy.lora, ckpt)
        return policy

    @classmethod
    def wrap(cls, model: torch.nn.Module, tokenizer, lora_cfg: LoraConfig, base_path: str | Path | None) -> Policy:
        """The policy of a model already loaded (from ``base_path``): with ``lora_cfg.enabled`` the
        adapters are injected into it in place (only they require grad)."""
        if not lora_cfg.enabled:
            return cls(model, tokenizer, lora_cfg, base_path=base_path)
        lora = apply_lora(model, lora_cfg, base_path=base_path)
        return cls(lora.get_base_model(), tokenizer, lora_cfg, lora=lora, base_path=base_path)

    def sampling(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """The module to sample from for the block: with LoRA the merged weights
        (``sampling_weights``: the base restored bit for bit after), else ``model`` itself."""
        if self.sampler is not None:
            return self.sampler.sampling()
        return sampling_weights(self.lora) if self.is_lora else contextlib.nullcontext(self.model)

    def shard(self, master_weights: bool = False) -> None:
        """Shard ``model`` over the default process group with FSDP2 (``rlvr.train.sharded``), in
        place: each rank keeps 1/N of every parameter (LoRA: the frozen base and the adapters), so
        the gradients and the AdamW state built afterwards are 1/N too. Before that a plain copy
        of the whole policy becomes ``sampler``: rollouts, evals, the reference and ``final/`` run
        on it without collectives, and ``gather_weights`` refreshes it after each update (a whole
        copy per rank, as the inference engine beside FSDP training holds one in verl). With
        ``master_weights`` and a trainable parameter not in float32 (a bf16 model), the model is
        upcast first and sharded with bf16 mixed precision: the float32 shards are the masters,
        the sampler keeps the model's dtype and gets the rounded weights."""
        from rlvr.train.sharded import shard_for_training

        if self.lora is not None:
            lora = copy.deepcopy(self.lora).eval().requires_grad_(False)
            self.sampler = Policy(lora.get_base_model(), self.tokenizer, self.lora_cfg, lora=lora, base_path=self.base_path)
        else:
            plain = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.sampler = Policy(plain, self.tokenizer, self.lora_cfg, base_path=self.base_path)
        self.mixed_precision = shard_for_training(self.model, master_weights)

    @torch.no_grad()
    def gather_weights(self) -> None:
        """Sharded: the trained parameters (LoRA: the adapters) all-gathered into ``sampler`` (a
        collective: every rank calls it, after each update). No-op otherwise."""
        if self.sampler is None:
            return
        weights = {n: p.full_tensor() for n, p in self.model.named_parameters() if p.requires_grad}
        unexpected = self.sampler.model.load_state_dict(weights, strict=False).unexpected_keys
        if unexpected:
            raise RuntimeError(f"Policy.gather_weights: the sampler has no parameters {unexpected[:3]}")

    def load_reference(self, path: str | Path | None = None, *, device, options: ModelLoadConfig) -> torch.nn.Module | None:
        """A separately loaded frozen reference (eval, no grad) from ``path`` (None: the starting
        weights ``base_path``), for ``reference(loaded)``; None for a LoRA policy with ``path``
        None: its reference is its own weights with the adapters off, no second model. The caller
        holds it as long as it needs it (GRPO for the run, DPO for one pass)."""
        if path is None and self.is_lora:
            return None
        if path is None and self.base_path is None:
            raise ValueError("Policy.load_reference: no path and no base_path to load the reference from")
        model, _ = load_model_and_tokenizer(str(path if path is not None else self.base_path), device=device,
                                            options=options)
        return model.eval().requires_grad_(False)

    @contextlib.contextmanager
    def reference(self, loaded: torch.nn.Module | None = None) -> Iterator[torch.nn.Module]:
        """The frozen reference for the block: ``loaded`` (from ``load_reference``) when given; else
        with LoRA the same weights with the adapters off (``model`` in eval mode for the block, its
        mode restored after). Full weights hold no reference of their own: they need a separately
        loaded one (``load_reference``), and without it this raises. Call it under ``torch.no_grad``."""
        if loaded is not None:
            yield loaded
            return
        if self.sampler is not None:  # sharded: the plain copy's adapters off, no collectives
            with self.sampler.reference() as ref:
                yield ref
            return
        if not self.is_lora:
            raise ValueError("a full-weights policy has no reference of its own: load one with load_reference()")
        was_training = self.model.training
        self.model.eval()
        try:
            with adapters_off(self.lora) as ref:
                yield ref
        finally:
            self.model.train(was_training)

    def engine_copy(self) -> torch.nn.Module:
        """A frozen (eval, no grad) plain copy of the sampling policy for an engine that keeps its
        own copy: full weights a deep copy of ``model``; LoRA a plain module tree (no LoRA layers)
        holding exactly the merged weights of ``sampling()`` (not peft's ``merge_and_unload``, which
        on a bf16 base adds the float32 update before rounding and so can differ in the last bit).
        Later updates: ``load_state_dict(plain_state_dict(m))`` with ``m`` from ``sampling()``."""
        if self.sampler is not None:
            return self.sampler.engine_copy()
        if not self.is_lora:
            return copy.deepcopy(self.model).eval().requires_grad_(False)
        plain = copy.deepcopy(self.lora).unload()  # the base tree without the LoRA layers
        with torch.no_grad(), self.sampling() as merged:
            plain.load_state_dict(plain_state_dict(merged))
        return plain.eval().requires_grad_(False)

    def checkpoint_module(self) -> torch.nn.Module:
        """What ``save_checkpoint`` writes: with LoRA the ``PeftModel`` (the adapter), else ``model``."""
        return self.lora if self.is_lora else self.model

    def save_final(self, directory: str | Path) -> torch.nn.Module:
        """Write ``final/``: full weights as a Hugging Face directory; LoRA as ``lora.save`` says
        (``rlvr.model.lora.save_final``). Returns the model to use after it, also left in
        ``model``: merged, the plain model with the adapters merged in for good (``lora`` becomes
        None); adapter or full weights, ``model`` unchanged. Sharded: ``sampler`` writes it (the
        weights of the last ``gather_weights``; any one rank, no collectives)."""
        if self.sampler is not None:
            return self.sampler.save_final(directory)
        if not self.is_lora:
            save_model_dir(directory, self.model, self.tokenizer)
            return self.model
        self.model = save_final(directory, self.lora, self.tokenizer, self.lora_cfg)
        if self.lora_cfg.save != "adapter":  # merged: the adapters are in the weights now
            self.lora = None
        return self.model
