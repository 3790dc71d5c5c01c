"""The in-process generation engine for rollouts and eval: batched sampling with a KV cache.

What it does:
- ``generate`` samples ``n`` completions for each prompt (token ids in, token ids out). Prompts
  are left-padded into one batch; each distinct prompt is prefilled once and its KV cache copied
  to its ``n`` sample rows; decoding then runs one token per step for all rows, reusing the cache.
  Rows that finish leave the batch (the cache, mask and positions are compacted, at once or when
  worth it), so finished rows cannot affect the others.
- Two backends behind one loop: rlvr's own decoder for Llama-layout models
  (``rollout/decoder.py``: preallocated cache, fused weights, CUDA graphs on GPU; the default
  when the model fits) and the Hugging Face forward with its ``DynamicCache`` (any causal LM).
- A completion ends on a stop token (``stop_token_ids``, default the model's EOS), on a stop
  string (``stop``; the token whose decoded text completes one is kept), or at
  ``max_new_tokens``.
- It records, for every generated token, ``log pi(token)`` under the *unmodified* policy, i.e.
  ``log_softmax(logits)`` at temperature 1 without top-p truncation, whatever temperature/top-p
  was used to sample. That is the ``pi_old`` of the PPO ratio; it matches ``sequence_logprobs``
  on the same tokens (up to float error).
- Prefix reuse (fast decoder): ``keep_cache=True`` returns with each completion the K/V of its
  prompt and its tokens but the last (``Completion.cache``, a ``KVPrefix``); passing it back as
  ``past`` for a prompt that starts with those tokens (the next turn of an episode) runs only the
  new tokens. The Hugging Face path ignores ``past`` and returns no cache.
- ``sequence_logprobs`` is the training-side counterpart: per-token log-probs of given sequences,
  with gradients.

What it does not do: tokenisation, chat templates, multi-turn tool loops or trajectory bookkeeping
(``rlvr/rollout/collect.py``), and no paged attention or continuous batching (the vLLM adapter is
the fast path on big GPUs). Sampling is reproducible for a fixed ``generator`` and the same batch
composition; a different ``batch_size`` draws different random numbers. See docs/rollout.md.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from rlvr.rollout.decoder import FastLlama, KVPrefix, unsupported_reason

PRECISIONS = {"model": None, "bf16": torch.bfloat16}  # name -> GEMM dtype (None: the model's)


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
    stop: tuple[str, ...] = ()
    """Stop strings: a completion ends with the token whose text completes one of them (that token
    kept). Needs ``generate(..., tokenizer=...)``."""
    precision: str = "model"
    """``"model"``: compute in the model's dtype. ``"bf16"``: matrix multiplies in bfloat16, the
    rest (norms, attention, KV cache, logits, sampling) in the model's dtype; on a CPU with bf16
    GEMMs (AVX512-BF16/AMX) the fast decoder ran 1.3-1.4x faster, at bf16 rounding of the logprobs
    (``rollout/logprob_mismatch_kl`` shows it). The Hugging Face backend runs under
    ``torch.autocast`` instead."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")
        if self.stop_token_ids is not None:
            self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")


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
    cache: KVPrefix | None = field(default=None, repr=False)
    """With ``generate(keep_cache=True)`` on the fast decoder: the K/V of the prompt and of
    ``token_ids[:-1]`` (the last token was never fed), for ``generate(past=...)``."""


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
    scaled = logits if params.temperature == 1 else logits / params.temperature
    scaled = top_p_filter(scaled, params.top_p)
    # Inverse-CDF sampling: one uniform per row (torch.multinomial draws one exponential per
    # vocabulary entry, ~8x slower here). A token of probability 0 is never picked: its CDF step
    # is empty.
    cdf = scaled.softmax(dim=-1).cumsum(dim=-1)
    # The uniforms come from ``generator``'s device (a CPU generator also drives a GPU engine).
    at = generator.device if generator is not None else cdf.device
    u = torch.rand((cdf.shape[0], 1), generator=generator, device=at, dtype=cdf.dtype)
    if u.device != cdf.device:  # pinned, so the copy to the GPU does not wait for the GPU to drain
        u = u.pin_memory().to(cdf.device, non_blocking=True) if cdf.device.type == "cuda" else u.to(cdf.device)
    u = u * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


def generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    generator: torch.Generator | None = None,
    pad_token_id: int,
    batch_size: int | None = None,
    tokenizer=None,
    backend: Literal["auto", "fast", "hf"] = "auto",
    cuda_graphs: bool | None = None,
    past: Sequence[KVPrefix | None] | None = None,
    keep_cache: bool = False,
) -> list[Completion]:
    """Sample ``params.n`` completions per prompt; returns ``len(prompts) * n`` completions,
    prompt-major (all of prompt 0's samples first).

    ``batch_size`` caps the rows (samples) decoded together; None decodes everything at once.
    ``generator`` (on any device: the uniforms are drawn there) makes sampling reproducible; ``pad_token_id`` fills the
    left padding of prompts (it is masked, so any id works). ``tokenizer`` is needed only for
    ``params.stop`` (stop strings). ``backend``: ``"fast"`` is rlvr's own decoder for Llama-layout
    models (``rollout/decoder.py``), ``"hf"`` the Hugging Face forward with its cache, ``"auto"``
    the fast one when the model fits it. ``cuda_graphs`` (fast backend; default: on for CUDA)
    captures the decode step in CUDA graphs. ``past[i]`` (fast backend) is the K/V of prompt i's
    first tokens, from an earlier call's ``Completion.cache``; ``keep_cache`` fills
    ``Completion.cache``. Runs in eval mode under ``torch.inference_mode``
    and restores the model's train/eval mode afterwards.
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if params.stop and tokenizer is None:
        raise ValueError("SamplingParams.stop (stop strings) needs generate(..., tokenizer=...) to decode tokens")
    if backend not in ("auto", "fast", "hf"):
        raise ValueError(f"backend must be one of auto, fast, hf; got {backend!r}")
    if past is not None and len(past) != len(prompts):
        raise ValueError(f"past has {len(past)} entries for {len(prompts)} prompts")
    stop_ids = params.stop_token_ids if params.stop_token_ids is not None else _model_stop_ids(model)
    rows = [i for i in range(len(prompts)) for _ in range(params.n)]  # prompt index of each row
    step = batch_size or max(len(rows), 1)
    was_training = model.training
    model.eval()
    out: list[Completion] = []
    try:
        with torch.inference_mode():
            fast = None
            if backend != "hf":
                reason = unsupported_reason(model)
                if reason is not None and backend == "fast":
                    raise ValueError(f"the fast decoder cannot run this model: {reason}")
                fast = FastLlama(model, PRECISIONS[params.precision]) if reason is None else None
            graphs = False
            if fast is not None:
                on_cuda = fast.device.type == "cuda"
                graphs = on_cuda if cuda_graphs is None else (bool(cuda_graphs) and on_cuda)
            autocast = precision_autocast(model, params.precision) if fast is None else contextlib.nullcontext()
            for start in range(0, len(rows), step):
                chunk = rows[start : start + step]
                with autocast:
                    out += _generate_rows(model, fast, graphs, prompts, chunk, params, stop_ids, generator,
                                          pad_token_id, tokenizer, past if fast is not None else None,
                                          keep_cache and fast is not None)
    finally:
        model.train(was_training)
    return out


def precision_autocast(model: torch.nn.Module, precision: str):
    """A ``precision`` name (``PRECISIONS``) as a context for a Hugging Face forward:
    ``torch.autocast`` to bf16 on the model's device, or nothing for ``"model"``. Used by the hf
    backend and by the trainer's forward (``algo.precision``)."""
    dtype = PRECISIONS[precision]
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()


class _HFState:
    """The Hugging Face forward with its own cache, behind the interface of ``DecodeState``."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache_kwarg = _cache_kwarg(model)

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
        return True


def _stop_string_hit(tokenizer, history: list[int], stops: tuple[str, ...], window: int) -> bool:
    """Whether the text of the last ``window`` tokens contains a stop string. Called after every
    token of a live row, so a hit is the first one and ends on the newest token (the window is
    long enough for a stop string of maximal length even at 4 tokens per character)."""
    text = tokenizer.decode(history[-window:])
    return any(s in text for s in stops)


def _generate_rows(
    model: torch.nn.Module,
    fast: FastLlama | None,
    cuda_graphs: bool,
    prompts: Sequence[Sequence[int]],
    rows: list[int],
    params: SamplingParams,
    stop_ids: tuple[int, ...],
    generator: torch.Generator | None,
    pad_token_id: int,
    tokenizer,
    past: Sequence[KVPrefix | None] | None = None,
    keep_cache: bool = False,
) -> list[Completion]:
    """Generate one completion per entry of ``rows`` (prompt indices, grouped by prompt)."""
    if params.max_new_tokens == 0:
        return [Completion(i, [], [], "length") for i in rows]
    unique = list(dict.fromkeys(rows))  # distinct prompts in order of appearance
    row_of = {p: k for k, p in enumerate(unique)}
    B, T = len(rows), params.max_new_tokens
    if fast is not None:
        device = fast.device
        width = max(len(prompts[p]) for p in unique)
        state = fast.start(B, width + T, cuda_graphs=cuda_graphs)
    else:
        state = _HFState(model)
        device = state.device
    # One prefill per distinct prompt; its cache, logits and mask are copied to its sample rows.
    expand = torch.tensor([row_of[p] for p in rows], device=device)
    logits = state.prefill([prompts[p] for p in unique], expand, pad_token_id,
                           past=[past[p] for p in unique] if past is not None else None)
    caches: list[KVPrefix | None] = [None] * B
    if keep_cache:  # column where each row's prompt starts (prompts are left-padded to ``width``)
        starts = [width - len(prompts[p]) for p in rows]

    tokens = torch.full((B, T), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((B, T), dtype=torch.float32, device=device)
    lengths = [T] * B
    stopped = [False] * B
    present = list(range(B))  # original row of each row in the decoder, in order
    present_t: torch.Tensor | None = None  # the same as a tensor; None while it is arange(B)
    alive = [True] * B  # per present row: not finished yet (finished rows wait for compaction)
    n_alive = B
    stop_tensor = torch.tensor(stop_ids, dtype=torch.long, device=device)
    stops = tuple(params.stop)
    history: list[list[int]] = [[] for _ in range(B)] if stops else []
    window = 4 * max((len(s) for s in stops), default=0) + 4

    for t in range(T):
        token = _sample(logits, params, generator)
        lp = logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
        # Every present row is recorded; what a finished row writes past its length is dropped.
        if present_t is None:
            tokens[:, t], logprobs[:, t] = token, lp
        else:
            tokens[present_t, t], logprobs[present_t, t] = token, lp
        finished: list[int] = []  # indices into present
        if stops:
            token_l = token.tolist()
            for i, r in enumerate(present):
                if alive[i]:
                    history[r].append(token_l[i])
                    if token_l[i] in stop_ids or _stop_string_hit(tokenizer, history[r], stops, window):
                        finished.append(i)
        elif stop_tensor.numel():
            done = torch.isin(token, stop_tensor)
            if n_alive < len(present):
                done &= torch.tensor(alive, device=device)
            if done.any():
                finished = done.nonzero().squeeze(-1).tolist()
        for i in finished:
            alive[i] = False
            lengths[present[i]], stopped[present[i]] = t + 1, True
            if keep_cache:  # before compaction drops the row
                caches[present[i]] = state.prefix(i, starts[present[i]])
        n_alive -= len(finished)
        if n_alive == 0 or t == T - 1:
            if keep_cache:
                for i, r in enumerate(present):
                    if alive[i]:
                        caches[r] = state.prefix(i, starts[r])
            break
        if finished and state.worth_compacting(n_alive, T - 1 - t):
            keep_l = [i for i, a in enumerate(alive) if a]
            keep = torch.tensor(keep_l, device=device)
            state.compact(keep)
            token = token.index_select(0, keep)
            present = [present[i] for i in keep_l]
            present_t = torch.tensor(present, device=device)
            alive = [True] * len(present)
        logits = state.step(token)

    tokens_l, logprobs_l = tokens.tolist(), logprobs.tolist()
    return [
        Completion(
            prompt_index=p,
            token_ids=tokens_l[r][: lengths[r]],
            logprobs=logprobs_l[r][: lengths[r]],
            finish_reason="stop" if stopped[r] else "length",
            cache=caches[r],
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
