"""The engine's fallback backend: the Hugging Face forward with its own cache (any causal LM),
behind the interface of the fast decoder's ``DecodeState`` (``prefill``, ``step``, ``compact``,
``worth_compacting``). It takes no ``past`` prefixes and gives none (no ``prefix``)."""

from __future__ import annotations

import inspect

import torch


def cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the KV-cache argument of ``model.forward``: ``cache`` in recent transformers,
    ``past_key_values`` before (still accepted, with a deprecation warning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class HFState:
    """The Hugging Face forward with its own cache, behind the interface of ``DecodeState``."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache_kwarg = cache_kwarg(model)

    def prefill(self, prompts: list, expand: torch.Tensor, pad_token_id: int, past=None) -> torch.Tensor:
        """Run the prompts once, left-padded, with positions counted over real tokens only, then
        copy each prompt's cache, mask and position to its sample rows."""
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for k, p in enumerate(prompts):
            input_ids[k, width - lengths[k] :] = torch.tensor(list(p), dtype=torch.long)
            mask[k, width - lengths[k] :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        cache = getattr(out, "cache", None)
        if cache is None:  # transformers < 5.x names it past_key_values
            cache = out.past_key_values
        cache.batch_select_indices(expand)
        self.cache, self.mask, self.next_pos = cache, mask[expand], (positions[:, -1] + 1)[expand]
        return out.logits[:, -1].float()[expand]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; returns the next logits [n, V] float32."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        logits = self.model(
            input_ids=tokens[:, None], attention_mask=self.mask, position_ids=self.next_pos[:, None],
            use_cache=True, **{self.cache_kwarg: self.cache},
        ).logits[:, -1].float()
        self.next_pos = self.next_pos + 1
        return logits

    def compact(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]

    def worth_compacting(self, alive: int, remaining: int) -> bool:
        return True  # finished rows leave at once
