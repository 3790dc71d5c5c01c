"""The in-process generation engine for rollouts and eval: batched sampling with a KV cache.

What it does:
- ``generate`` samples ``n`` completions for each prompt (token ids in, token ids out). Prompts
  are left-padded into one batch; each distinct prompt is prefilled once and its KV cache copied
  to its ``n`` sample rows; decoding then runs one token per step for all rows, reusing the cache.
  Rows that finish leave the batch (the cache, mask and positions are compacted, at once or when
  worth it), so finished rows cannot affect the others.
- Two backends behind one loop: rlvr's own decoder for Llama-layout models
  (``rollout/decoder.py`` and ``rollout/kv_cache.py``: preallocated cache, fused weights, CUDA
  graphs on GPU; the default when the model fits) and the Hugging Face forward with its
  ``DynamicCache`` (any causal LM; ``rollout/hf_backend.py``). Sampling: ``rollout/sampling.py``.
- A completion ends on a stop token (``stop_token_ids``, default the model's EOS), on a stop
  string (``stop``; the token whose decoded text completes one is kept), or at
  ``max_new_tokens``.
- It records, for every generated token, ``log pi(token)`` under the *unmodified* policy, i.e.
  ``log_softmax(logits)`` at temperature 1 without top-p truncation, whatever temperature/top-p
  was used to sample. That is the ``pi_old`` of the PPO ratio; it matches
  ``rlvr.model.logprobs.sequence_logprobs`` (the training-side forward) on the same tokens (up to
  float error).
- Prefix reuse (fast decoder): ``keep_cache=True`` returns with each completion the K/V of its
  prompt and its tokens but the last (``Completion.cache``, a ``KVPrefix``); passing it back as
  ``past`` for a prompt that starts with those tokens (the next turn of an episode) runs only the
  new tokens. The Hugging Face path ignores ``past`` and returns no cache.
- Long prompts (fast decoder): ``prefill_chunk`` runs the prefill a chunk of columns at a time
  (bounded activations, same results); ``kv_cache`` ``int8`` / ``sink_window`` bound the KV
  cache's memory (``rollout/kv_compress.py``; lossy, no CUDA graphs, no shared prompts, no prefix
  reuse; the Hugging Face backend refuses both settings). ``DecodeState.kv_bytes()`` reads the
  cache's size.

What it does not do: tokenisation, chat templates, multi-turn tool loops or trajectory bookkeeping
(``rlvr/rollout/collect.py``), and no paged attention or continuous batching. Sampling is
reproducible for a fixed ``generator`` and the same batch composition; a different
``batch_size`` draws different random numbers. See docs/rollout.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from rlvr.rollout.decoder import FastLlama, unsupported_reason
from rlvr.rollout.hf_backend import HFState
from rlvr.rollout.kv_cache import DecodeState, KVPrefix
from rlvr.rollout.kv_compress import KV_CACHES
from rlvr.rollout.sampling import sample, token_logprob

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
    rest (norms, attention, KV cache, logits, sampling) in the model's dtype, at bf16 rounding of
    the logprobs (``rollout/logprob_mismatch_kl`` shows it; speed: docs/rollout.md, "Precision").
    The Hugging Face backend runs under ``torch.autocast`` instead."""
    prefill_chunk: int = 0
    """Chunked prefill (fast decoder): the prompts' columns run this many at a time, each chunk
    attending to the cache before it plus itself, so prefill activations are bounded by the chunk
    instead of the prompt; 0 = the whole prompt at once. Same tokens and log-probs (to float
    rounding). The Hugging Face backend refuses it."""
    kv_cache: str = "full"
    """``full`` | ``int8`` | ``sink_window`` (fast decoder; ``rollout/kv_compress.py``). ``int8``:
    K/V older than the last ``kv_window`` tokens stored as int8 with a per-(row, head, token) scale.
    ``sink_window``: StreamingLLM, attention to the first ``kv_sinks`` and the last ``kv_window``
    tokens only, the cache bounded by that. Both are lossy (off-policy log-probs, see
    ``rollout/logprob_mismatch_kl``), turn off CUDA graphs and shared prompts, and refuse prefix
    reuse (``past``, ``keep_cache``) and the Hugging Face backend."""
    kv_window: int = 256
    """With ``kv_cache`` int8: recent tokens kept in full precision; sink_window: recent tokens
    kept at all (the current one included)."""
    kv_sinks: int = 4
    """With ``kv_cache: sink_window``: the first tokens of each sequence always attended to."""

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
        if self.prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0 (0 = whole prompt at once), got {self.prefill_chunk}")
        if self.kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHES)}; got {self.kv_cache!r}")
        if self.kv_window < 1:
            raise ValueError(f"kv_window must be >= 1 (tokens kept in full precision / kept at all), got {self.kv_window}")
        if self.kv_sinks < 0:
            raise ValueError(f"kv_sinks must be >= 0, got {self.kv_sinks}")
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


def model_stop_ids(model: torch.nn.Module) -> tuple[int, ...]:
    """EOS id(s) from the model's generation config, falling back to its config."""
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(cfg, "eos_token_id", None)
        if eos is not None:
            return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    raise ValueError("the model has no eos_token_id; pass SamplingParams(stop_token_ids=...)")


def precision_autocast(model: torch.nn.Module, precision: str):
    """A ``precision`` name (``PRECISIONS``) as a context for a Hugging Face forward:
    ``torch.autocast`` to bf16 on the model's device, or nothing for ``"model"``. Used by the hf
    backend and by the trainer's forward (``algo.precision``)."""
    dtype = PRECISIONS[precision]
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()


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
    _check_generate_args(prompts, params, batch_size, tokenizer, backend, past)
    stop_ids = params.stop_token_ids if params.stop_token_ids is not None else model_stop_ids(model)
    rows = [i for i in range(len(prompts)) for _ in range(params.n)]  # prompt index of each row
    step = batch_size or max(len(rows), 1)
    was_training = model.training
    model.eval()
    out: list[Completion] = []
    try:
        with torch.inference_mode():
            longest = max((len(p) for p in prompts), default=0) + params.max_new_tokens
            fast = _fast_decoder(model, backend, params.precision, longest)
            _check_fast_only(params, fast, past, keep_cache)
            call = _Call(model, fast, _use_cuda_graphs(fast, cuda_graphs), prompts, params, stop_ids, generator,
                         pad_token_id, tokenizer, past if fast is not None else None, keep_cache and fast is not None)
            autocast = precision_autocast(model, params.precision) if fast is None else contextlib.nullcontext()
            for start in range(0, len(rows), step):
                with autocast:
                    out += _generate_rows(call, rows[start : start + step])
    finally:
        model.train(was_training)
    return out


def _check_generate_args(prompts, params: SamplingParams, batch_size, tokenizer, backend, past) -> None:
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


def _check_fast_only(params: SamplingParams, fast: FastLlama | None, past, keep_cache: bool) -> None:
    """``prefill_chunk`` and a non-``full`` ``kv_cache`` need the fast decoder; a lossy cache keeps
    no exact prefix to reuse."""
    if fast is None:
        for name, on in (("prefill_chunk", params.prefill_chunk > 0), ("kv_cache", params.kv_cache != "full")):
            if on:
                raise ValueError(f"SamplingParams.{name} needs the fast decoder (backend='fast' on a Llama-layout "
                                 f"model); the Hugging Face backend cannot honour it: set {name} to its default")
    if params.kv_cache != "full" and (past is not None or keep_cache):
        raise ValueError(f"kv_cache={params.kv_cache!r} keeps no exact K/V: prefix reuse (past, keep_cache) "
                         "needs kv_cache='full'")


def _fast_decoder(model: torch.nn.Module, backend: str, precision: str, longest: int | None = None) -> FastLlama | None:
    """The fast decoder on ``model``'s weights, or None for the Hugging Face backend (asked for,
    or ``"auto"`` with a model the fast decoder refuses on sequences of up to ``longest`` tokens)."""
    if backend == "hf":
        return None
    reason = unsupported_reason(model, longest)
    if reason is not None and backend == "fast":
        raise ValueError(f"the fast decoder cannot run this model: {reason}")
    return FastLlama(model, PRECISIONS[precision]) if reason is None else None


def _use_cuda_graphs(fast: FastLlama | None, cuda_graphs: bool | None) -> bool:
    """CUDA graphs only for the fast decoder on CUDA; there by default."""
    if fast is None:
        return False
    on_cuda = fast.device.type == "cuda"
    return on_cuda if cuda_graphs is None else (bool(cuda_graphs) and on_cuda)


@dataclass
class _Call:
    """What one ``generate`` call decodes with, the same for every chunk of rows (``past`` and
    ``keep_cache`` already cleared for the Hugging Face backend)."""

    model: torch.nn.Module
    fast: FastLlama | None
    cuda_graphs: bool
    prompts: Sequence[Sequence[int]]
    params: SamplingParams
    stop_ids: tuple[int, ...]
    generator: torch.Generator | None
    pad_token_id: int
    tokenizer: object
    past: Sequence[KVPrefix | None] | None
    keep_cache: bool


def _generate_rows(call: _Call, rows: list[int]) -> list[Completion]:
    """Generate one completion per entry of ``rows`` (prompt indices, grouped by prompt): prefill,
    then per step sample, record, mark the rows that finished, and drop them from the decoder
    when that is worth it."""
    T = call.params.max_new_tokens
    if T == 0:
        return [Completion(i, [], [], "length") for i in rows]
    state, logits, device, width = _prefill(call, rows)
    starts = [width - len(call.prompts[p]) for p in rows] if call.keep_cache else None
    book = _Rows(rows, T, call.pad_token_id, device, starts)
    stops = _Stops(call.stop_ids, call.params.stop, call.tokenizer, len(rows), device)
    for t in range(T):
        token = sample(logits, call.params.temperature, call.params.top_p, call.generator)
        book.record(t, token, token_logprob(logits, token))
        finished = stops.finished(token, book.present, book.alive, book.n_alive)
        book.finish(finished, t, state)
        if book.n_alive == 0 or t == T - 1:
            book.keep_live_caches(state)
            break
        if finished and state.worth_compacting(book.n_alive, T - 1 - t):
            token = book.compact(state, token)
        logits = state.step(token)
    return book.completions()


def _prefill(call: _Call, rows: list[int]) -> tuple[DecodeState | HFState, torch.Tensor, torch.device, int]:
    """A decode state for ``rows``, after one prefill per distinct prompt (its cache, logits and
    mask copied to its sample rows): (state, logits [rows, V], device, prompt width)."""
    unique = list(dict.fromkeys(rows))  # distinct prompts in order of appearance
    row_of = {p: k for k, p in enumerate(unique)}
    width = max(len(call.prompts[p]) for p in unique)
    if call.fast is not None:
        device = call.fast.device
        pr = call.params
        state = call.fast.start(len(rows), width + pr.max_new_tokens, cuda_graphs=call.cuda_graphs and pr.kv_cache == "full",
                                kv_cache=pr.kv_cache, kv_window=pr.kv_window, kv_sinks=pr.kv_sinks)
    else:
        state = HFState(call.model)
        device = state.device
    expand = torch.tensor([row_of[p] for p in rows], device=device)
    chunk = {"chunk": call.params.prefill_chunk} if call.fast is not None else {}
    logits = state.prefill([call.prompts[p] for p in unique], expand, call.pad_token_id,
                           past=[call.past[p] for p in unique] if call.past is not None else None, **chunk)
    return state, logits, device, width


class _Rows:
    """One chunk's results while it decodes: tokens and logprobs per step, where each row
    finished, and which rows the decoder still holds (``present``: the original row of each
    decoder row, in order; ``alive``: not finished yet, per present row: finished rows wait for
    compaction, and what they record past their length is dropped). ``starts`` (with
    ``keep_cache``): the column where each row's prompt starts in the left-padded cache."""

    def __init__(self, rows: list[int], T: int, pad_token_id: int, device: torch.device,
                 starts: list[int] | None):
        B = len(rows)
        self.rows, self.device, self.starts = rows, device, starts
        self.tokens = torch.full((B, T), pad_token_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((B, T), dtype=torch.float32, device=device)
        self.lengths = [T] * B
        self.stopped = [False] * B
        self.caches: list[KVPrefix | None] = [None] * B
        self.present = list(range(B))
        self.present_t: torch.Tensor | None = None  # ``present`` as a tensor; None while it is arange(B)
        self.alive = [True] * B
        self.n_alive = B

    def record(self, t: int, token: torch.Tensor, lp: torch.Tensor) -> None:
        """Step ``t``'s token and logprob of every present row."""
        if self.present_t is None:
            self.tokens[:, t], self.logprobs[:, t] = token, lp
        else:
            self.tokens[self.present_t, t], self.logprobs[self.present_t, t] = token, lp

    def finish(self, finished: list[int], t: int, state) -> None:
        """Present rows ``finished`` stopped at step ``t``; their caches are kept now, before
        compaction drops them."""
        for i in finished:
            self.alive[i] = False
            r = self.present[i]
            self.lengths[r], self.stopped[r] = t + 1, True
            if self.starts is not None:
                self.caches[r] = state.prefix(i, self.starts[r])
        self.n_alive -= len(finished)

    def keep_live_caches(self, state) -> None:
        """At the end: the caches of the rows still alive (with ``keep_cache``)."""
        if self.starts is not None:
            for i, r in enumerate(self.present):
                if self.alive[i]:
                    self.caches[r] = state.prefix(i, self.starts[r])

    def compact(self, state, token: torch.Tensor) -> torch.Tensor:
        """Drop the finished rows from the decoder; returns the live rows' ``token``."""
        keep_l = [i for i, a in enumerate(self.alive) if a]
        keep = torch.tensor(keep_l, device=self.device)
        state.compact(keep)
        self.present = [self.present[i] for i in keep_l]
        self.present_t = torch.tensor(self.present, device=self.device)
        self.alive = [True] * len(self.present)
        return token.index_select(0, keep)

    def completions(self) -> list[Completion]:
        tokens_l, logprobs_l = self.tokens.tolist(), self.logprobs.tolist()
        return [
            Completion(
                prompt_index=p,
                token_ids=tokens_l[r][: self.lengths[r]],
                logprobs=logprobs_l[r][: self.lengths[r]],
                finish_reason="stop" if self.stopped[r] else "length",
                cache=self.caches[r],
            )
            for r, p in enumerate(self.rows)
        ]


class _Stops:
    """Which live rows a step's tokens finish: a stop token, or (checked on the host, only when
    stop strings are given) a stop string completed by the newest token."""

    def __init__(self, stop_ids: tuple[int, ...], strings: tuple[str, ...], tokenizer, rows: int,
                 device: torch.device):
        self.ids, self.device, self.tokenizer = stop_ids, device, tokenizer
        self.tensor = torch.tensor(stop_ids, dtype=torch.long, device=device)
        self.strings = tuple(strings)
        self.history: list[list[int]] = [[] for _ in range(rows)] if self.strings else []
        # long enough for a stop string of maximal length even at 4 tokens per character
        self.window = 4 * max((len(s) for s in self.strings), default=0) + 4

    def finished(self, token: torch.Tensor, present: list[int], alive: list[bool], n_alive: int) -> list[int]:
        """Indices into ``present`` of the live rows that ``token`` finishes."""
        if self.strings:
            return self._finished_with_strings(token.tolist(), present, alive)
        if not self.tensor.numel():
            return []
        done = torch.isin(token, self.tensor)
        if n_alive < len(present):
            done &= torch.tensor(alive, device=self.device)
        return done.nonzero().squeeze(-1).tolist() if done.any() else []

    def _finished_with_strings(self, token_l: list[int], present: list[int], alive: list[bool]) -> list[int]:
        """Stop tokens and stop strings, row by row. Checked after every token of a live row, so a
        hit is the first one and ends on the newest token."""
        finished = []
        for i, r in enumerate(present):
            if alive[i]:
                self.history[r].append(token_l[i])
                if token_l[i] in self.ids or self._string_hit(self.history[r]):
                    finished.append(i)
        return finished

    def _string_hit(self, history: list[int]) -> bool:
        """Whether the text of the last ``window`` tokens contains a stop string."""
        text = self.tokenizer.decode(history[-self.window:])
        return any(s in text for s in self.strings)
