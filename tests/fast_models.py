"""Tiny models for the fast-mode tests (speculative decoding, prefix cache, int8, fast serving):
a small arithmetic tokenizer, and random Llamas whose weights are large enough that greedy
decoding does not just repeat one token (the default init's near-uniform logits do)."""

from __future__ import annotations

import torch

from rlvr.model.tiny import TinyModelConfig, build_tiny_model
from rlvr.model.tokenizer import train_tokenizer

TARGET = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
DRAFT = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
PAD = 2


def arith_tokenizer():
    return train_tokenizer([f"Compute: {i} + {i * 7 % 13}\nThe answer is {i + i * 7 % 13}." for i in range(200)], 300)


def noisy_model(cfg: TinyModelConfig, tok, seed: int, scale: float = 0.3):
    """A random tiny Llama with every matrix drawn at std ``scale`` (seeded)."""
    m = build_tiny_model(cfg, tok, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in m.parameters():
            if w.dim() == 2:
                w.copy_(torch.randn(w.shape, generator=g) * scale)
    return m
