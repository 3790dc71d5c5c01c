"""The embedded default model: a ~1M-parameter Llama built from scratch for CPU runs.

What it does: ``build_tiny_model`` turns a ``TinyModelConfig`` and a tokenizer into a randomly
initialised ``LlamaForCausalLM`` whose vocabulary and bos/eos/pad ids match the tokenizer, and
whose generation config stops on the tokenizer's EOS (``<|end|>`` for the default tokenizer).
Because it is a stock ``transformers`` architecture, a saved tiny model loads anywhere a Hugging
Face model does (``AutoModelForCausalLM``, vLLM).

What it does not do: training (see ``rlvr/train/pretrain.py``) or loading user models (see
``rlvr/model/load.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from rlvr.errors import ConfigError


@dataclass
class TinyModelConfig:
    """Shape of the default model. The defaults give about 0.9M parameters with a 512 vocab."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 4
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads (head dim = hidden_size / num_heads)."""
    num_kv_heads: int = 4
    """Key/value heads; fewer than num_heads gives grouped-query attention."""
    intermediate_size: int = 384
    """Hidden width of the SwiGLU MLP."""
    max_positions: int = 256
    """Longest sequence (prompt + completion) the model is meant for."""
    tie_embeddings: bool = True
    """Share the input embedding and the output projection (saves vocab x hidden parameters)."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rms_norm_eps: float = 1e-5
    """Epsilon of the RMSNorm layers."""
    initializer_range: float = 0.02
    """Std of the normal initialisation of weights."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model.num_heads ({self.num_heads}) must be divisible by model.num_kv_heads ({self.num_kv_heads})")
        for name in ("hidden_size", "num_layers", "intermediate_size", "max_positions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")


def tiny_llama_config(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    """The ``LlamaConfig`` for ``cfg`` with the tokenizer's vocabulary size and special ids."""
    return LlamaConfig(
        vocab_size=len(tokenizer),  # len() counts added tokens, unlike tokenizer.vocab_size
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        rms_norm_eps=cfg.rms_norm_eps,
        initializer_range=cfg.initializer_range,
        tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> LlamaForCausalLM:
    """A randomly initialised tiny Llama, identical for the same ``(cfg, tokenizer, seed)``.

    The global torch RNG is left untouched (initialisation runs in a forked RNG state).
    """
    config = tiny_llama_config(cfg, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.eval()
