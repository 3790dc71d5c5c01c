"""Continuous batching: the ``ServingEngine`` that ``rlvr serve`` runs by default.

One scheduler thread owns the model. Each turn of its loop, between two decode steps:

1. a pending weight update is applied (``load_weights``; see below);
2. cancelled requests leave (their handle gets ``finish_reason="abort"``);
3. waiting requests are admitted while there is a free row: they are prefilled together (a
   prompt shared by several requests, the ``n`` choices of one, once) and join the running batch
   (``rlvr/serve/rows.py``); their first tokens are sampled from the prefill;
4. one decode step runs for every running row; each row's token is sampled with its request's
   own settings and stream (``rlvr/serve/sampling.py``) and delivered; rows that finished
   (stop token, stop string, ``max_tokens``) leave the batch.

``batching="none"`` is the same loop with one row: a request starts when the previous one ends
(the baseline the load benchmark compares against).

Bounds: at most ``max_batch`` running rows; at most ``max_waiting`` waiting requests, past which
``submit`` raises ``QueueFull`` (HTTP 429); a request whose prompt + ``max_tokens`` exceeds
``max_context`` is refused with ``ValueError`` (HTTP 400).

Weight updates: ``load_weights(dir)`` reads the checkpoint on the caller's thread, checks that
every parameter name and shape matches, then the scheduler copies it in between two steps and
bumps ``version``. Requests in flight are not stopped: their tokens after the swap come from the
new weights over a KV cache computed by the old ones, and every ``TokenEvent`` carries the
version that produced it, so a client can tell (or drop) a completion that straddles the swap.

Reproducibility: a request with a ``seed`` samples from its own generator, so its tokens do not
depend on the batch it shares; without one, its seed is derived from the engine's ``seed`` and the
request's arrival number. Greedy (temperature 0) is batch-independent up to float error.

The fast mode (``rlvr serve --fast`` without a draft) is this engine with two options:
``prefix_cache_bytes`` > 0 puts a prefix cache across requests in front of the prefill
(``rows.py``; cleared on a weight update), and ``quantize="int8"`` serves an int8 copy of the
model (``model/quantize.py``: decoder Linear layers in dynamic int8, run by the fast decoder);
weight updates go into the full-precision model, which is quantised again.

Not here: speculative decoding (the fast mode's ``rlvr/serve/fast.py``, in waves), CUDA graphs
(batch shapes change every step), chunked prefill (a long prompt's prefill delays the running
rows by one forward).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal

import torch

from rlvr.errors import UserError
from rlvr.model.logprobs import sequence_logprobs
from rlvr.rollout.decoder import FastLlama, unsupported_reason
from rlvr.rollout.engine import model_stop_ids
from rlvr.rollout.prefix_cache import PrefixCache
from rlvr.serve.rows import FastRows, HFRows
from rlvr.serve.intake import Intake
from rlvr.serve.sampling import top_logprobs, request_generator, sample_rows
from rlvr.serve.types import NotReady, RequestHandle, TokenEvent

log = logging.getLogger(__name__)


@dataclass
class _Running:
    """A request in the running batch."""

    handle: RequestHandle
    generator: torch.Generator
    stop_ids: frozenset[int]
    history: list[int] = field(default_factory=list)
    next_token: int = 0  # sampled, not yet fed


class Batcher(Intake):
    """Continuous batching on rlvr's fast decoder (see the module docstring); with
    ``prefix_cache_bytes`` > 0 a prefix cache of ``prefix_block``-token blocks, with
    ``quantize="int8"`` an int8 copy of the model (the fast mode)."""

    serves_top_logprobs = True

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_batch: int = 16, max_waiting: int = 64,
                 max_context: int | None = None, batching: Literal["continuous", "none"] = "continuous",
                 seed: int = 0, prefix_cache_bytes: int = 0, prefix_block: int = 16, quantize: str | None = None):
        if batching not in ("continuous", "none"):
            raise UserError(f"--batching must be continuous or none, got {batching!r}")
        if max_batch < 1 or max_waiting < 0:
            raise UserError(f"--max-batch must be >= 1 and --max-waiting >= 0 (got {max_batch}, {max_waiting})")
        if quantize not in (None, "int8"):
            raise UserError(f"--quantize must be int8 (or absent), got {quantize!r}")
        self.model, self.tokenizer, self.quantize = model.eval(), tokenizer, quantize
        self.served = self._serving_copy()  # what the decoder runs
        self.cache = PrefixCache(prefix_cache_bytes, prefix_block) if prefix_cache_bytes > 0 else None
        self._open_intake(model, max_waiting, max_context)
        self.max_batch = 1 if batching == "none" else max_batch
        self.batching, self.seed = batching, seed
        self.stop_ids = model_stop_ids(model)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        reason = unsupported_reason(self.served, self.max_context)
        if reason is not None and batching == "continuous":
            raise UserError(f"continuous batching runs on rlvr's fast decoder, which cannot run this model "
                            f"({reason}); pass --batching none (one request at a time on the Hugging Face forward)")
        self.backend = "fast" if reason is None else "hf"
        self.rows = self._new_rows()
        self._running: list[_Running] = []
        self.counters = {"steps": 0, "admitted": 0, "generated_tokens": 0, "prefix_cache_hits": 0, "cancelled": 0}
        self._thread = threading.Thread(target=self._loop, name="rlvr-serve-batcher", daemon=True)
        self._thread.start()

    def _new_rows(self):
        if self.backend == "fast":
            return FastRows(FastLlama(self.served), self.max_batch, self.max_context, self.pad, self.cache)
        return HFRows(self.served, self.pad)

    # -- the ServingEngine interface (any thread) -------------------------------------------------
    def cancel(self, handle: RequestHandle) -> None:
        with self._lock:
            handle.cancelled = True
            self._lock.notify()

    def stats(self) -> dict[str, int | float]:
        caches = self.cache.stats() if self.cache is not None else {}
        with self._lock:
            return {"running": len(self._running), "waiting": len(self._waiting), "version": self._version,
                    **self.counters, **caches}

    def load_weights(self, model_dir: str) -> int:
        return self._queue_update(self.model, model_dir)

    # -- the scheduler thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not (self._closed or self._waiting or self._running or self._updates):
                        self._lock.wait()
                    if self._closed:
                        break
                    updates = list(self._updates)
                    self._updates.clear()
                    admit = self._take_admissions()
                try:
                    self._turn(updates, admit)
                except Exception:  # noqa: BLE001 - one failed step must not stop the server
                    self._recover(admit)
        self._abort_all()

    def _turn(self, updates: list[tuple[dict, Future]], admit: list[RequestHandle]) -> None:
        """One turn between decode steps (the module docstring's steps 1-4)."""
        for params, done in updates:
            self._swap(params, done)
        self._drop_cancelled()
        if admit:
            self._admit(admit)
        if self._running:
            self._step()

    def _recover(self, admit: list[RequestHandle]) -> None:
        """After an error in a turn (out of memory, say): log it, end the running and just admitted
        requests with ``"abort"`` (the HTTP layer answers 503) and start from an empty batch."""
        log.exception("rlvr serve: a decode turn failed; its requests are aborted")
        failed = [*admit, *(r.handle for r in self._running)]
        with self._lock:
            self._running = []
        self.rows = self._new_rows()
        for handle in failed:
            handle.put(TokenEvent(None, None, "abort", self._version))

    def _take_admissions(self) -> list[RequestHandle]:
        """Waiting requests that fit in the free rows (under the lock); cancelled ones end here."""
        admit = []
        while self._waiting and len(self._running) + len(admit) < self.max_batch:
            handle = self._waiting.popleft()
            if handle.cancelled:
                self.counters["cancelled"] += 1
                handle.put(TokenEvent(None, None, "abort", self._version))
            else:
                admit.append(handle)
        return admit

    def _swap(self, params: dict, done: Future) -> None:
        try:
            self.served = self._copy_in(params)
            if self.backend == "hf":
                self.rows.model = self.served
            if self.cache is not None:  # its K/V came from the old weights
                self.cache.clear()
                if self.backend == "fast":
                    self.rows.retire_prefix()
            if self.backend == "fast":  # the fast decoder reads (and may pack) the weights once
                fast = FastLlama(self.served)
                self.rows.fast = fast
                self.rows.state.f = fast
            self._version += 1
            done.set_result(self._version)
        except Exception as e:  # noqa: BLE001 - handed to the caller
            done.set_exception(e)

    def _drop_cancelled(self) -> None:
        keep = [i for i, r in enumerate(self._running) if not r.handle.cancelled]
        if len(keep) < len(self._running):
            for r in self._running:
                if r.handle.cancelled:
                    self.counters["cancelled"] += 1
                    r.handle.put(TokenEvent(None, None, "abort", self._version))
            self._remove(keep)

    def _admit(self, handles: list[RequestHandle]) -> None:
        """Start ``handles``: one prefill for all of them (each distinct prompt once), their rows
        joined to the batch and their first tokens sampled."""
        rows = []
        for handle in handles:
            req = handle.request
            self._arrivals += 1
            self.counters["admitted"] += 1
            key = ("seed", req.seed) if req.seed is not None else ("engine", self.seed, self._arrivals)
            stop = frozenset(req.stop_token_ids if req.stop_token_ids is not None else self.stop_ids)
            if req.prompt_logprobs:
                ids = torch.tensor([req.prompt_ids], device=self._device())
                handle.prompt_logprobs = sequence_logprobs(self.served, ids, torch.ones_like(ids))[0].tolist()
            if req.max_tokens == 0:
                handle.put(TokenEvent(None, None, "length", self._version))
            else:
                rows.append(_Running(handle, request_generator(*key), stop))
        if rows:
            logits = self.rows.join([list(r.handle.request.prompt_ids) for r in rows])
            self._running.extend(rows)
            self._deliver(logits)

    def _step(self) -> None:
        tokens = torch.tensor([r.next_token for r in self._running], dtype=torch.long, device=self._device())
        logits = self.rows.step(tokens)
        self.counters["steps"] += 1
        self._deliver(logits)

    def _deliver(self, logits: torch.Tensor) -> None:
        """Sample the last ``len(logits)`` running rows' tokens, hand them out, drop finished rows."""
        rows = self._running[len(self._running) - logits.shape[0]:]
        reqs = [r.handle.request for r in rows]
        tokens, logprobs = sample_rows(logits, [q.temperature for q in reqs], [q.top_p for q in reqs],
                                       [r.generator for r in rows])
        tops = top_logprobs(logits, [q.top_logprobs for q in reqs])
        offset = len(self._running) - len(rows)
        finished, last = [], []
        for i, (r, t, lp) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist())):
            r.history.append(t)
            r.next_token = t
            reason = self._finish_reason(r, t)
            if reason is None:
                r.handle.put(TokenEvent(t, lp, None, self._version, tops[i]))
            else:
                finished.append(offset + i)
                last.append((r.handle, TokenEvent(t, lp, reason, self._version, tops[i])))
        self.counters["generated_tokens"] += len(rows)
        if finished:
            done = set(finished)
            self._remove([i for i in range(len(self._running)) if i not in done])
        for handle, event in last:  # after the rows left: a finished request is never counted as running
            handle.put(event)

    def _finish_reason(self, r: _Running, token: int) -> Literal["stop", "length"] | None:
        req = r.handle.request
        if token in r.stop_ids:
            return "stop"
        if req.stop:
            window = 4 * max(len(s) for s in req.stop) + 4  # enough tokens for the longest stop string
            text = self.tokenizer.decode(r.history[-window:])
            if any(s in text for s in req.stop):
                return "stop"
        return "length" if len(r.history) >= req.max_tokens else None

    def _remove(self, keep: list[int]) -> None:
        self.rows.keep(keep)
        with self._lock:
            self._running = [self._running[i] for i in keep]

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _abort_all(self) -> None:
        with self._lock:
            pending = list(self._waiting) + [r.handle for r in self._running]
            self._waiting.clear()
            self._running = []
        for handle in pending:
            handle.put(TokenEvent(None, None, "abort", self._version))
        for _, done in self._updates:
            done.set_exception(NotReady("the server is shutting down"))


def wait_idle(engine: Batcher, timeout: float = 10.0) -> bool:
    """Block until nothing runs or waits (tests, benchmarks); False on timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = engine.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            return True
        time.sleep(0.01)
    return False
