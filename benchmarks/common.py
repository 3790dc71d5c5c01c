"""Shared pieces of the throughput benchmarks: model sizes, the matmul-rate yardstick, tables, JSON.

- ``MODEL_SIZES``: the benchmark models by name. ``small`` is the 2.68M-parameter Llama of the
  issue's TRL measurement (hidden 256, 3 layers, SwiGLU 768, tied 512-token vocabulary);
  ``medium`` (about 25M) is where compute dominates; ``large`` (about 150M) is for a GPU.
- ``bench_model(size, tokenizer)``: a randomly initialised ``LlamaForCausalLM`` of that size
  (through rlvr's ``build_tiny_model``, so its special ids match the tokenizer).
- ``bench_tokenizer()``: rlvr's default 512-token tokenizer trained on its own corpora.
- ``matmul_rate()``: fp32 GEMM rate of this machine right now (GFLOP/s, median of repeats), the
  yardstick "fraction of the matmul rate" is measured against. Call it in the same run as the
  measurement it normalises, ideally before and after.
- ``model_flops_per_token(model)``: 2 x (non-embedding parameters + lm head) per token for a
  forward pass; x3 for forward + backward. Attention scores are added by the caller when they
  matter (``attention_flops``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from rlvr.monitor.cpu import idle_cpu  # noqa: E402  (re-exported for the benchmarks)

MODEL_SIZES = {
    "small": dict(hidden_size=256, num_layers=3, num_heads=4, num_kv_heads=4, intermediate_size=768,
                  max_positions=512),
    "medium": dict(hidden_size=512, num_layers=7, num_heads=8, num_kv_heads=8, intermediate_size=1536,
                   max_positions=512),
    "large": dict(hidden_size=1024, num_layers=12, num_heads=16, num_kv_heads=16, intermediate_size=2816,
                  max_positions=1024),
}


def bench_tokenizer():
    """rlvr's default byte-level BPE tokenizer (512 tokens) with its chat template."""
    import rlvr.tasks  # noqa: F401  (registers the domains)
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    texts = [doc for d in ("math.arith", "math.word", "code.gen") for doc in DOMAINS.get(d).corpus(0, 300)]
    return train_tokenizer(texts, vocab_size=512)


def bench_model(size: str, tokenizer, seed: int = 0, dtype: torch.dtype = torch.float32):
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model

    model = build_tiny_model(TinyModelConfig(**MODEL_SIZES[size]), tokenizer, seed)
    return model.to(dtype)


def num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def model_flops_per_token(model) -> float:
    """Forward FLOPs per token from the weight matmuls: 2 x (params - input embedding) plus the lm
    head (counted once even when tied)."""
    cfg = model.config
    emb = cfg.vocab_size * cfg.hidden_size
    body = num_params(model) - emb * (1 if cfg.tie_word_embeddings else 2)
    return 2.0 * (body + emb)


def attention_flops(model, context: float) -> float:
    """Forward FLOPs per token of attention scores and weighted values at average context length."""
    cfg = model.config
    return 4.0 * cfg.num_hidden_layers * cfg.hidden_size * context


def matmul_rate(n: int = 1024, repeats: int = 7, dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> float:
    """GFLOP/s of an n x n x n GEMM on this machine now (median of ``repeats``)."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / statistics.median(times) / 1e9


def machine_note() -> str:
    load = os.getloadavg()
    return (f"{os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"idle CPU {idle_cpu():.0%}, loadavg {load[0]:.2f}")


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def spread(values: list[float]) -> str:
    """``median [min-max]`` of per-round ratios, two decimals."""
    import statistics

    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "" if v is None else str(v)


def write_json(path: str | None, payload: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {path}")
