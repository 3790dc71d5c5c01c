"""The boundary between ``rlvr serve``'s HTTP layer and a serving engine.

The HTTP layer (``rlvr/serve/app.py``) turns an OpenAI request into one ``GenRequest`` per
completion (``n`` requests for ``n`` choices), ``submit``s each to a ``ServingEngine`` and reads
``TokenEvent``s from the returned ``RequestHandle`` as the engine produces them. Token ids in,
token ids out: tokenisation, chat templates, stop-string trimming of the returned text and tool
calls stay in the HTTP layer, so an engine (continuous batching in ``rlvr/serve/batcher.py``, or
the fast mode) only decodes.

Threading: an engine owns its model on its own thread(s). ``submit`` and ``cancel`` may be called
from any thread (the asyncio event loop's in practice); the handle hands events to the event loop
with ``loop.call_soon_threadsafe``, so the loop never blocks on the engine, and to plain threads
through a blocking ``iter_sync`` (benchmarks, tests).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


class QueueFull(Exception):
    """``submit`` refused a request: the waiting queue is at its bound (HTTP 429)."""


class NotReady(Exception):
    """``submit`` refused a request: the engine is loading or shutting down (HTTP 503)."""


@dataclass
class GenRequest:
    """One completion to generate: the prompt's token ids and how to sample after it."""

    prompt_ids: list[int]
    """The prompt, already tokenised (chat template applied); at least one token."""
    max_tokens: int
    """Most tokens to generate (a stop token included); 0 generates nothing."""
    temperature: float = 1.0
    """Softmax temperature; 0 is greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    seed: int | None = None
    """Seeds this request's own random stream: the same seed gives the same tokens whatever else
    is in the batch (up to float error in the logits). None: drawn from the engine's stream."""
    stop_token_ids: tuple[int, ...] | None = None
    """Generation stops after one of these; None: the model's EOS id(s); () never stops."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends with the token whose text completes one (that token is
    delivered; the HTTP layer trims the text)."""
    logprobs: bool = False
    """Whether the caller wants log-probs (engines may always fill them; it is a hint)."""
    top_logprobs: int = 0
    """Also the log-probs of the ``top_logprobs`` most likely tokens at each step (``TokenEvent.top``),
    on an engine whose ``serves_top_logprobs`` is true."""
    prompt_logprobs: bool = False
    """Also score the prompt: the engine sets ``RequestHandle.prompt_logprobs`` (``log pi`` of each
    prompt token given the ones before it; the first token gets 0.0) before the first event
    (``echo`` + ``logprobs`` of ``/v1/completions``: the trainer's weight canary)."""
    request_id: str = ""
    """The caller's id, for logs and metrics."""


@dataclass(frozen=True)
class TokenEvent:
    """One step of one request: a generated token, or the end.

    ``token_id``/``logprob`` are None only on a final event that carries no token (a request
    cancelled or refused before its next token, or ``max_tokens`` 0). ``logprob`` is
    ``log pi(token)`` under the unmodified policy (temperature 1, no top-p), as the rollout engine
    records it. ``finish_reason`` is set on the last event of a request and None before.
    """

    token_id: int | None
    logprob: float | None
    finish_reason: FinishReason | None = None
    version: int = 0
    """The weights version that produced this token."""
    top: tuple[tuple[int, float], ...] = ()
    """``(token id, log-prob)`` of the most likely tokens at this step, most likely first, under the
    same plain policy as ``logprob`` (``GenRequest.top_logprobs`` of them; empty when not asked)."""


class RequestHandle:
    """What ``submit`` returns: the request, and its events in order.

    Created on the thread that submits; when that thread runs an asyncio loop, events go to an
    ``asyncio.Queue`` on that loop (``async for event in handle``), else to a thread-safe queue
    (``for event in handle.iter_sync()``). The engine calls ``put``; the last event has a
    ``finish_reason``.
    """

    def __init__(self, request: GenRequest):
        self.request = request
        self.cancelled = False
        self.prompt_logprobs: list[float] | None = None  # set by the engine (GenRequest.prompt_logprobs)
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._aq: asyncio.Queue[TokenEvent] | None = asyncio.Queue() if self._loop else None
        self._q: queue.SimpleQueue[TokenEvent] = queue.SimpleQueue()
        self._pending: list[TokenEvent] = []  # events not yet handed to the loop
        self._lock = threading.Lock()
        self.finished = False

    def put(self, event: TokenEvent) -> None:
        """Deliver one event (engine side; any thread). Events after the final one are dropped."""
        if self.finished:
            return
        self.finished = event.finish_reason is not None
        if self._loop is None:
            self._q.put(event)
            return
        with self._lock:
            self._pending.append(event)
            if len(self._pending) > 1:  # a wake-up is already scheduled: it takes this one too
                return
        try:  # one wake-up of the loop per batch of events: fewer GIL hand-overs
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _drain(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        for event in events:
            self._aq.put_nowait(event)

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        if self._aq is None:
            raise RuntimeError("this handle was submitted outside an event loop; use iter_sync()")
        while True:
            event = await self._aq.get()
            yield event
            if event.finish_reason is not None:
                return

    def iter_sync(self, timeout: float | None = None) -> Iterator[TokenEvent]:
        """Events for a handle submitted outside an event loop (blocks; ``queue.Empty`` after
        ``timeout`` seconds without an event)."""
        if self._loop is not None:
            raise RuntimeError("this handle delivers to an event loop; use `async for`")
        while True:
            event = self._q.get(timeout=timeout)
            yield event
            if event.finish_reason is not None:
                return


@runtime_checkable
class ServingEngine(Protocol):
    """A model that decodes ``GenRequest``s concurrently (see the module docstring).

    ``submit`` raises ``QueueFull`` when the waiting queue is full, ``NotReady`` while loading or
    after ``close``, and ``ValueError`` (message naming the field) for a request that cannot run
    (e.g. prompt + ``max_tokens`` longer than ``max_context``).
    """

    max_context: int
    """Longest prompt + completion, in tokens, a request may ask for."""

    def submit(self, request: GenRequest) -> RequestHandle: ...

    def cancel(self, handle: RequestHandle) -> None:
        """Stop generating for ``handle`` (a client went away); its last event has
        finish_reason ``"abort"``. Safe to call on a finished handle."""

    def stats(self) -> dict[str, int | float]:
        """Counters and gauges for /metrics: at least ``running``, ``waiting``,
        ``prefix_cache_hits`` (0 where there is no prefix cache), ``steps``."""

    def load_weights(self, model_dir: str) -> int:
        """Load a checkpoint directory of the same architecture between decode steps; returns the
        new ``version``. Raises ``ValueError`` for a directory that does not fit."""

    @property
    def version(self) -> int:
        """Weights version: 0 at start, +1 per ``load_weights``."""

    @property
    def ready(self) -> bool:
        """True once the model is loaded and requests are accepted."""

    def close(self) -> None:
        """Stop the engine thread; waiting and running requests end with ``"abort"``."""
