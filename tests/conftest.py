"""Shared fixtures: a tiny tokenizer + random Llama saved as a Hugging Face directory."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Llama + a tokenizer trained on a small slice of the math corpus."""
    import rlvr.tasks  # noqa: F401  (registers the built-in domains)
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    docs = DOMAINS.get("math.arith").corpus(0, 200) + DOMAINS.get("math.word").corpus(0, 200)
    tokenizer = train_tokenizer(docs, vocab_size=320)
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64)
    model = build_tiny_model(cfg, tokenizer, seed=0)
    path = tmp_path_factory.mktemp("tiny") / "model"
    save_model_dir(path, model, tokenizer)
    return str(path)
