"""The in-process generation engine for rollouts and eval: batched sampling with a KV cache.

What it does:
- ``generate`` samples ``n`` completions for each prompt (token ids in, token ids out). Prompts
  are left-padded into one batch; each distinct prompt is prefilled once and its KV cache copied
  to its ``n`` sample rows; decoding then runs one token per step for all rows, reusing the cache.
  Rows that hit a stop token leave the batch (the cache, mask and positions are compacted), so
  finished rows cost nothing and cannot affect the others.
- It records, for every generated token, ``log pi(token)`` under the *unmodified* policy, i.e.
  ``log_softmax(logits)`` at temperature 1 without top-p truncation, whatever temperature/top-p
  was used to sample. That is the ``pi_old`` of the PPO ratio; it matches ``sequence_logprobs``
  on the same tokens (up to float error).
- ``sequence_logprobs`` is the training-side counterpart: per-token log-probs of given sequences,
  with gradients.

What it does not do: tokenisation, chat templates, multi-turn tool loops or trajectory bookkeeping
(``rlvr/rollout/collect.py``), and no paged attention or continuous batching (the vLLM adapter is
the fast path on GPUs). Sampling is reproducible for a fixed ``generator`` and the same batch
composition; a different ``batch_size`` draws different random numbers.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F


@dataclass
class SamplingParams:
    """How to sample completions."""

    max_new_tokens: int = 128
    """Most tokens generated per completion (the stop token included)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest set of tokens with probability >= top_p."""
    n: int = 1
    """Completions per prompt."""
    stop_token_ids: tuple[int, ...] | None = None
    """Generation stops after any of these; None means the model's eos token id(s), () never stops."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.stop_token_ids is not None:
            self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)


@dataclass
class Completion:
    """One sampled continuation of ``prompts[prompt_index]``.

    ``token_ids`` are the generated tokens (ending with the stop token when
    ``finish_reason == "stop"``); ``logprobs[i]`` is ``log pi(token_ids[i])`` under the model's
    plain softmax (temperature 1, no top-p), whatever the sampling settings.
    """

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


def _model_stop_ids(model: torch.nn.Module) -> tuple[int, ...]:
    """EOS id(s) from the model's generation config, falling back to its config."""
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(cfg, "eos_token_id", None)
        if eos is not None:
            return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    raise ValueError("the model has no eos_token_id; pass SamplingParams(stop_token_ids=...)")


def _cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the KV-cache argument of ``model.forward``: ``cache`` in recent transformers,
    ``past_key_values`` before (still accepted, with a deprecation warning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the nucleus: the smallest set of most likely tokens whose
    probability reaches ``top_p`` (the most likely token is always kept). ``logits``: [B, V]."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    # mass strictly before each token: a token is in the nucleus if that mass is still < top_p
    before = probs.cumsum(dim=-1) - probs
    drop_sorted = before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row from float32 logits [B, V] -> [B]."""
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    scaled = top_p_filter(logits / params.temperature, params.top_p)
    probs = scaled.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    generator: torch.Generator | None = None,
    pad_token_id: int,
    batch_size: int | None = None,
) -> list[Completion]:
    """Sample ``params.n`` completions per prompt; returns ``len(prompts) * n`` completions,
    prompt-major (all of prompt 0's samples first).

    ``batch_size`` caps the rows (samples) decoded together; None decodes everything at once.
    ``generator`` (on the model's device) makes sampling reproducible; ``pad_token_id`` fills the
    left padding of prompts (it is masked, so any id works). Runs in eval mode under
    ``torch.inference_mode`` and restores the model's train/eval mode afterwards.
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    stop_ids = params.stop_token_ids if params.stop_token_ids is not None else _model_stop_ids(model)
    rows = [i for i in range(len(prompts)) for _ in range(params.n)]  # prompt index of each row
    step = batch_size or max(len(rows), 1)
    was_training = model.training
    model.eval()
    out: list[Completion] = []
    try:
        with torch.inference_mode():
            for start in range(0, len(rows), step):
                chunk = rows[start : start + step]
                out += _generate_rows(model, prompts, chunk, params, stop_ids, generator, pad_token_id)
    finally:
        model.train(was_training)
    return out


def _prefill(
    model: torch.nn.Module, prompts: list[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, object, torch.Tensor, torch.Tensor]:
    """Run the prompts once, left-padded, with positions counted over real tokens only.

    Returns the last-position logits [U, V] (float32), the KV cache, the attention mask [U, W]
    and the position of the next token [U].
    """
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for k, p in enumerate(prompts):
        input_ids[k, width - lengths[k] :] = torch.tensor(p, dtype=torch.long)
        mask[k, width - lengths[k] :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = getattr(out, "cache", None)
    if cache is None:  # transformers < 5.x names it past_key_values
        cache = out.past_key_values
    return out.logits[:, -1].float(), cache, mask, positions[:, -1] + 1


def _generate_rows(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    rows: list[int],
    params: SamplingParams,
    stop_ids: tuple[int, ...],
    generator: torch.Generator | None,
    pad_token_id: int,
) -> list[Completion]:
    """Generate one completion per entry of ``rows`` (prompt indices, grouped by prompt)."""
    if params.max_new_tokens == 0:
        return [Completion(i, [], [], "length") for i in rows]
    device = next(model.parameters()).device
    unique = list(dict.fromkeys(rows))  # distinct prompts in order of appearance
    row_of = {p: k for k, p in enumerate(unique)}
    logits, cache, mask, next_pos = _prefill(model, [prompts[p] for p in unique], pad_token_id, device)
    # Copy each prompt's cache, logits and mask to its sample rows: one prefill per distinct prompt.
    expand = torch.tensor([row_of[p] for p in rows], device=device)
    cache.batch_select_indices(expand)
    logits, mask, next_pos = logits[expand], mask[expand], next_pos[expand]
    cache_kwarg = _cache_kwarg(model)

    B, T = len(rows), params.max_new_tokens
    tokens = torch.full((B, T), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((B, T), dtype=torch.float32, device=device)
    lengths = torch.full((B,), T, dtype=torch.long, device=device)
    stopped = torch.zeros(B, dtype=torch.bool, device=device)
    stop_tensor = torch.tensor(stop_ids, dtype=torch.long, device=device)
    active = torch.arange(B, device=device)  # original row of each row still in the batch

    for t in range(T):
        token = _sample(logits, params, generator)
        tokens[active, t] = token
        logprobs[active, t] = logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
        done = torch.isin(token, stop_tensor)
        if done.any():
            stopped[active[done]] = True
            lengths[active[done]] = t + 1
            keep = (~done).nonzero().squeeze(-1)
            if keep.numel() == 0:
                break
            # Compact: finished rows leave the batch, the KV cache included.
            active, token, mask, next_pos = active[keep], token[keep], mask[keep], next_pos[keep]
            cache.batch_select_indices(keep)
        if t == T - 1:
            break
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        logits = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=next_pos[:, None],
            use_cache=True,
            **{cache_kwarg: cache},
        ).logits[:, -1].float()
        next_pos = next_pos + 1

    tokens_l, logprobs_l = tokens.tolist(), logprobs.tolist()
    lengths_l, stopped_l = lengths.tolist(), stopped.tolist()
    return [
        Completion(
            prompt_index=p,
            token_ids=tokens_l[r][: lengths_l[r]],
            logprobs=logprobs_l[r][: lengths_l[r]],
            finish_reason="stop" if stopped_l[r] else "length",
        )
        for r, p in enumerate(rows)
    ]


def sequence_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Log-prob of each token given the tokens before it: [B, T] -> [B, T] float32.

    Inputs are right-padded. Position 0 and padded positions get 0.0. Gradients flow when called
    outside ``inference_mode``/``no_grad`` (the trainer's use). Computed as
    ``logit[y] - logsumexp(logits)`` so no [B, T, V] log-softmax tensor is kept besides the logits.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1].float()
    targets = input_ids[:, 1:]
    token_logits = logits.gather(-1, targets[..., None]).squeeze(-1)
    lp = token_logits - torch.logsumexp(logits, dim=-1)
    lp = lp * attention_mask[:, 1:].to(lp.dtype)
    return F.pad(lp, (1, 0), value=0.0)
