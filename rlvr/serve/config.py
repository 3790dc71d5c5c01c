"""``ServeConfig`` (the flags of ``rlvr serve``) and ``SERVING_ENGINES``, the registry of serving engines.

An engine is built by name from the loaded model: ``continuous`` (``rlvr/serve/batcher.py``,
the default) and ``none`` (the same scheduler, one request at a time). Another engine (the fast
mode's) registers a factory ``(cfg, model, tokenizer) -> ServingEngine`` under its own name and
``ServeConfig.engine_name`` picks it; the HTTP layer does not change.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass

from rlvr.config import check_choice
from rlvr.content_filter import ContentFilter
from rlvr.errors import ConfigError
from rlvr.registry import Registry
from rlvr.serve.types import ServingEngine

SERVING_ENGINES: Registry[Callable[..., ServingEngine]] = Registry("serving engine")


@dataclass
class ServeConfig:
    """How ``rlvr serve`` runs (each field is a CLI flag)."""

    model: str
    """Hugging Face causal-LM directory to serve."""
    host: str = "127.0.0.1"
    """Address to bind; anything but loopback needs --api-key."""
    port: int = 8000
    """TCP port."""
    device: str = "auto"
    """cpu | cuda | auto (cuda when available)."""
    dtype: str = "auto"
    """Weights' dtype: auto (as stored) | float32 | bfloat16 | float16."""
    max_batch: int = 16
    """Most requests (choices) decoded together."""
    max_waiting: int = 64
    """Most requests waiting for a row; past it, 429."""
    max_context: int = 0
    """Longest prompt + completion in tokens; 0: the model's max_position_embeddings."""
    batching: str = "continuous"
    """continuous (requests join and leave between decode steps) | none (one at a time)."""
    model_name: str = ""
    """The model id clients send; default: the directory's name."""
    admin_token: str = ""
    """Bearer token of POST /v1/weights (default: env RLVR_ADMIN_TOKEN); empty: weight updates off."""
    api_key: str = ""
    """Bearer key of the generation endpoints and /v1/models (default: env RLVR_API_KEY); empty: none needed."""
    seed: int = 0
    """Seed of the streams of requests that send no seed."""
    fast: bool = False
    """Fast mode: continuous batching with a prefix cache across requests (rlvr/serve/batcher.py); with --draft, speculative decoding in waves (rlvr/serve/fast.py); --quantize int8 on top."""
    draft: str = ""
    """--fast: draft model directory (the target's tokenizer), or "ngram": prompt-lookup drafts (the k tokens that followed the latest earlier match of the last 1-3 tokens in the request's own context; no draft model); empty: no speculative decoding (continuous batching + prefix cache)."""
    spec_tokens: int = 4
    """--fast with --draft: draft tokens proposed per round."""
    quantize: str = ""
    """--fast: int8 quantises the decoder's Linear layers (CPU only; empty: none)."""
    op_log: str = ""
    """Operation log (rlvr/oplog.py): every HTTP request, the model load and weight updates,
    hash-chained; empty: none."""
    filter: str = ""
    """Content rules every completion goes through (rlvr/content_filter.py): RULE[=redact|block],...
    or all; finish_reason content_filter where one acted; empty: none."""
    capture: str = ""
    """Traffic capture (off when empty): append every completed request and response to JSONL files in
    this directory, and accept POST /v1/feedback on them (rlvr/serve/capture.py, docs/flywheel.md)."""
    capture_rotate_mb: int = 64
    """--capture: start a new file once one holds this many MiB (or after an hour)."""
    feedback_token: str = ""
    """Bearer token of POST /v1/feedback (default: env RLVR_FEEDBACK_TOKEN, else the admin token)."""

    def __post_init__(self) -> None:
        check_choice("--device", self.device, ["auto", "cpu", "cuda"])
        check_choice("--batching", self.batching, ["continuous", "none"])
        check_choice("--quantize", self.quantize, ["", "int8"])
        if self.spec_tokens < 0:
            raise ConfigError(f"--spec-tokens must be >= 0, got {self.spec_tokens}")
        if (self.draft or self.quantize) and not self.fast:
            raise ConfigError("--draft and --quantize are the fast mode's: add --fast")
        if self.quantize and self.device == "cuda":
            raise ConfigError("--quantize int8 runs on the CPU only (dynamic int8 Linear layers); drop it or use --device cpu")
        for name in ("max_batch", "port"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_waiting < 0 or self.max_context < 0:
            raise ConfigError("--max-waiting and --max-context must be >= 0")
        ContentFilter.parse(self.filter)  # a bad rule or action: one line now, not at the first request
        self.admin_token = self.admin_token or os.environ.get("RLVR_ADMIN_TOKEN", "")
        self.api_key = self.api_key or os.environ.get("RLVR_API_KEY", "")
        self.feedback_token = self.feedback_token or os.environ.get("RLVR_FEEDBACK_TOKEN", "")
        if self.capture_rotate_mb < 1:
            raise ConfigError(f"--capture-rotate-mb must be >= 1, got {self.capture_rotate_mb}")
        if not self.api_key and not is_loopback(self.host):
            raise ConfigError(f"--host {self.host} is reachable from other machines; pass --api-key KEY (or set "
                              "RLVR_API_KEY) so that only clients with the key can generate")

    @property
    def engine_name(self) -> str:
        return "fast" if self.fast else self.batching


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@SERVING_ENGINES.register("continuous")
def _continuous(cfg: ServeConfig, model, tokenizer) -> ServingEngine:
    from rlvr.serve.batcher import Batcher

    return Batcher(model, tokenizer, max_batch=cfg.max_batch, max_waiting=cfg.max_waiting,
                   max_context=cfg.max_context or None, batching="continuous", seed=cfg.seed)


@SERVING_ENGINES.register("none")
def _one_at_a_time(cfg: ServeConfig, model, tokenizer) -> ServingEngine:
    from rlvr.serve.batcher import Batcher

    return Batcher(model, tokenizer, max_batch=1, max_waiting=cfg.max_waiting,
                   max_context=cfg.max_context or None, batching="none", seed=cfg.seed)


PREFIX_CACHE_BYTES = 256 << 20  # the fast mode's prefix cache bound


@SERVING_ENGINES.register("fast")
def _fast(cfg: ServeConfig, model, tokenizer) -> ServingEngine:
    """``--fast``: with ``--draft``, the speculative engine (waves); without, continuous batching
    with the prefix cache; ``--quantize int8`` on either."""
    if cfg.draft:
        from rlvr.serve.fast import from_serve_config

        return from_serve_config(cfg, model, tokenizer)
    from rlvr.serve.batcher import Batcher

    return Batcher(model, tokenizer, max_batch=cfg.max_batch, max_waiting=cfg.max_waiting,
                   max_context=cfg.max_context or None, batching="continuous", seed=cfg.seed,
                   prefix_cache_bytes=PREFIX_CACHE_BYTES, quantize=cfg.quantize or None)
