"""Prometheus metrics of ``rlvr serve`` (``GET /metrics``), in a registry of their own.

Counted by the HTTP layer: requests by endpoint and status, prompt and completion tokens, request
latency and time to first token, captured requests by outcome. Read from the engine at each scrape (``ServingEngine.stats``):
running rows (the batch size), waiting requests, decode steps, admitted requests, prefix-cache
hits and prompt tokens taken from the cache, speculative decoding's proposed and accepted draft
tokens (each 0 on an engine without it) and the weights version.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_ENGINE_GAUGES = {"running": "requests in the running batch (batch size)", "waiting": "requests waiting for a row",
                  "version": "weights version"}
_ENGINE_COUNTERS = {"steps": "decode steps", "admitted": "requests admitted to the batch",
                    "generated_tokens": "tokens generated", "prefix_cache_hits": "prefix-cache hits",
                    "cancelled": "requests cancelled before they finished (a client that disconnected)",
                    "prefix_cache_tokens_reused": "prompt tokens taken from the prefix cache",
                    "spec_proposed": "draft tokens proposed (speculative decoding)",
                    "spec_accepted": "draft tokens accepted (speculative decoding)"}


class _EngineCollector:
    """Engine gauges and counters, read at scrape time."""

    def __init__(self, stats: Callable[[], dict | None]):
        self.stats = stats

    def collect(self):
        s = self.stats() or {}
        for key, doc in _ENGINE_GAUGES.items():
            g = GaugeMetricFamily(f"rlvr_serve_{key}", doc)
            g.add_metric([], float(s.get(key, 0)))
            yield g
        for key, doc in _ENGINE_COUNTERS.items():
            c = CounterMetricFamily(f"rlvr_serve_{key}", doc)
            c.add_metric([], float(s.get(key, 0)))
            yield c


class ServeMetrics:
    """The server's metrics; ``stats`` returns the engine's ``stats()`` (None while loading)."""

    def __init__(self, stats: Callable[[], dict | None]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rlvr_serve_requests", "HTTP requests", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("rlvr_serve_prompt_tokens", "prompt tokens of completed requests", registry=r)
        self.completion_tokens = Counter("rlvr_serve_completion_tokens", "tokens returned to clients", registry=r)
        self.latency = Histogram("rlvr_serve_request_latency_seconds", "latency of completed generation requests (to the last token)", ["endpoint"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("rlvr_serve_time_to_first_token_seconds", "time to the first generated token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.captured = Counter("rlvr_serve_captured", "completed requests appended to the traffic log (--capture), "
                                "by outcome (ok, error: the write failed and the request was served anyway)",
                                ["outcome"], registry=r)
        r.register(_EngineCollector(stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)
