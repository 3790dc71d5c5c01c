"""The caller's side of a serving engine (any thread), shared by ``Batcher`` and ``FastEngine``.

Requests go into a bounded waiting queue (``QueueFull`` past ``max_waiting``, ``NotReady`` after
``close``, ``ValueError`` for one that cannot fit ``max_context``); a weight update is loaded and
checked here, then queued for the engine thread, which applies it between decode steps
(``_copy_in``: into the full-precision model, quantised again for an int8 engine) and resolves
its future with the new version. Both queues sit under one condition variable
(``_lock``), which the engine thread waits on.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future

import torch

from rlvr.serve.types import GenRequest, NotReady, QueueFull, RequestHandle


class Intake:
    """Mixed into an engine whose thread (``_thread``) takes from ``_waiting`` and ``_updates``."""

    _thread: threading.Thread

    def _open_intake(self, model: torch.nn.Module, max_waiting: int, max_context: int | None) -> None:
        self.max_context = int(max_context or getattr(model.config, "max_position_embeddings", 2048))
        self.max_waiting = max_waiting
        self._version, self._arrivals, self._closed = 0, 0, False
        self._lock = threading.Condition()
        self._waiting: deque[RequestHandle] = deque()
        self._updates: deque[tuple[dict, Future]] = deque()

    @property
    def version(self) -> int:
        return self._version

    @property
    def ready(self) -> bool:
        return not self._closed

    def submit(self, request: GenRequest) -> RequestHandle:
        if not request.prompt_ids:
            raise ValueError("the prompt has no tokens")
        if len(request.prompt_ids) + request.max_tokens > self.max_context:
            raise ValueError(f"prompt ({len(request.prompt_ids)} tokens) + max_tokens ({request.max_tokens}) "
                             f"exceeds the context of {self.max_context} tokens")
        handle = RequestHandle(request)
        with self._lock:
            if self._closed:
                raise NotReady("the server is shutting down")
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (--max-waiting {self.max_waiting})")
            self._waiting.append(handle)
            self._lock.notify()
        return handle

    def _queue_update(self, served: torch.nn.Module, model_dir: str) -> int:
        """``model_dir``'s weights, checked against ``served``'s names and shapes, handed to the engine
        thread; returns the new version once that thread applied them."""
        from rlvr.model.load import load_model

        params = dict(served.named_parameters())
        dtype, device = next(served.parameters()).dtype, next(served.parameters()).device
        new = dict(load_model(model_dir, dtype=dtype, device="cpu").named_parameters())
        if new.keys() != params.keys():
            raise ValueError(f"'{model_dir}' has other parameters than the served model "
                             f"(e.g. {sorted(new.keys() ^ params.keys())[:3]})")
        bad = [k for k in params if new[k].shape != params[k].shape]
        if bad:
            raise ValueError(f"'{model_dir}': parameter {bad[0]} has shape {tuple(new[bad[0]].shape)}, "
                             f"the served model {tuple(params[bad[0]].shape)}")
        done: Future = Future()
        with self._lock:
            if self._closed:
                raise NotReady("the server is shutting down")
            self._updates.append(({k: v.detach().to(device) for k, v in new.items()}, done))
            self._lock.notify()
        return done.result()

    def _serving_copy(self) -> torch.nn.Module:
        """What the engine serves: ``self.model`` (full precision), or its int8 copy when
        ``self.quantize`` is set (``model/quantize.py``)."""
        if not self.quantize:
            return self.model
        from rlvr.model.quantize import quantize_int8

        return quantize_int8(self.model)

    def _copy_in(self, params: dict) -> torch.nn.Module:
        """An update's weights into ``self.model`` (engine thread); returns ``_serving_copy()``
        of the updated model (an int8 one quantised again)."""
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for k, v in params.items():
                own[k].copy_(v)
        return self._serving_copy()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=30)
