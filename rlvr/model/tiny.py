"""The embedded default model: a ~1M-parameter Llama built from scratch for CPU runs.

What it does: ``build_tiny_model`` turns a ``TinyModelConfig`` and a tokenizer into a randomly
initialised ``LlamaForCausalLM`` whose vocabulary and bos/eos/pad ids match the tokenizer, and
whose generation config stops on the tokenizer's EOS (``<|end|>`` for the default tokenizer).
Because it is a stock ``transformers`` architecture, a saved tiny model loads anywhere a Hugging
Face model does (``AutoModelForCausalLM``, vLLM).

RoPE scaling (``TinyModelConfig.rope_scaling``, also ``ModelLoadConfig.rope_scaling`` through
``check_rope_scaling`` / ``hf_rope_parameters``): ``linear`` (``factor``: positions divided by it),
``yarn`` (``factor``, ``original_max_positions``, optional ``beta_fast``, ``beta_slow``,
``attention_factor``) and ``dynamic`` (``factor``; its frequencies change with the sequence
length, so the rollout engine runs it on the Hugging Face forward). They go to ``LlamaConfig`` as
``rope_parameters`` on transformers 5 and as ``rope_theta`` + ``rope_scaling`` before
(``rope_config_kwargs``). ``max_positions`` is written as ``max_position_embeddings`` as given:
with scaling it may be the extended length (for YaRN, ``original_max_positions`` is the length
the model is trained at, at most ``max_positions``).

What it does not do: training (see ``rlvr/train/pretrain.py``) or loading user models (see
``rlvr/model/load.py``).
"""

from __future__ import annotations

import inspect
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
    rope_scaling: dict | None = None
    """RoPE scaling (None: plain RoPE): {type: linear, factor: F} | {type: yarn, factor: F,
    original_max_positions: N, [beta_fast, beta_slow, attention_factor]} | {type: dynamic, factor: F}."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model.num_heads ({self.num_heads}) must be divisible by model.num_kv_heads ({self.num_kv_heads})")
        for name in ("hidden_size", "num_layers", "intermediate_size", "max_positions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.rope_scaling is not None:
            self.rope_scaling = check_rope_scaling("model.rope_scaling", self.rope_scaling, require_original=True)
            original = self.rope_scaling.get("original_max_positions")
            if original is not None and original > self.max_positions:
                raise ConfigError(f"model.rope_scaling.original_max_positions ({original}) must be at most "
                                  f"model.max_positions ({self.max_positions}), the extended length")


# type -> (required fields, optional fields) besides `type`
ROPE_SCALING_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("factor",), ()),
    "yarn": (("factor", "original_max_positions"), ("beta_fast", "beta_slow", "attention_factor")),
    "dynamic": (("factor",), ()),
}


def _number(key: str, value, lo: float, *, strict: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value > lo if strict else value >= lo)
    if not ok:
        raise ConfigError(f"config key '{key}' = {value!r} must be a number {'>' if strict else '>='} {lo:g}")
    return float(value)


def check_rope_scaling(key: str, scaling, *, require_original: bool) -> dict:
    """The checked RoPE scaling mapping under config key ``key``: ``type`` one of
    ``ROPE_SCALING_FIELDS`` and exactly its fields (numbers become floats, lengths ints).
    ``require_original``: whether YaRN must name ``original_max_positions`` (the tiny model must;
    a loaded model defaults it to its own ``max_position_embeddings``)."""
    if not isinstance(scaling, dict):
        raise ConfigError(f"config key '{key}' must be a mapping like {{type: linear, factor: 4}}, got {scaling!r}")
    kind = scaling.get("type")
    if kind not in ROPE_SCALING_FIELDS:
        raise ConfigError(f"config key '{key}.type' = {kind!r} is not allowed; choose one of: "
                          f"{list(ROPE_SCALING_FIELDS)}")
    required, optional = ROPE_SCALING_FIELDS[kind]
    if not require_original:
        required, optional = tuple(f for f in required if f != "original_max_positions"), (
            *optional, *(("original_max_positions",) if kind == "yarn" else ()))
    allowed = ("type", *required, *optional)
    unknown = [k for k in scaling if k not in allowed]
    if unknown:
        raise ConfigError(f"config key '{key}' has unknown field(s) {unknown} for type {kind}; "
                          f"allowed: {list(allowed)}")
    missing = [k for k in required if k not in scaling]
    if missing:
        raise ConfigError(f"config key '{key}' (type {kind}) needs field(s) {missing}; allowed: {list(allowed)}")
    out: dict = {"type": kind, "factor": _number(f"{key}.factor", scaling["factor"], 1.0)}
    if "original_max_positions" in scaling:
        n = scaling["original_max_positions"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"config key '{key}.original_max_positions' = {n!r} must be a positive integer")
        out["original_max_positions"] = n
    for name in ("beta_fast", "beta_slow", "attention_factor"):
        if name in scaling:
            out[name] = _number(f"{key}.{name}", scaling[name], 0.0, strict=True)
    if out.get("beta_fast", 32.0) <= out.get("beta_slow", 1.0):
        raise ConfigError(f"config key '{key}': beta_fast ({out.get('beta_fast', 32.0):g}) must be greater than "
                          f"beta_slow ({out.get('beta_slow', 1.0):g}) (defaults 32 and 1)")
    return out


def hf_rope_parameters(scaling: dict | None, rope_theta: float, original: int | None = None) -> dict:
    """The transformers ``rope_parameters`` dict for a checked ``scaling`` (None: plain RoPE);
    ``original``: YaRN's pre-extension length when ``scaling`` does not name it."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": rope_theta}
    params = {"rope_type": scaling["type"], "rope_theta": rope_theta, "factor": scaling["factor"]}
    if scaling["type"] == "yarn":
        params["original_max_position_embeddings"] = int(scaling.get("original_max_positions") or original)
        params.update({k: scaling[k] for k in ("beta_fast", "beta_slow", "attention_factor") if k in scaling})
    return params


def rope_config_kwargs(params: dict) -> dict:
    """``LlamaConfig`` keyword arguments for a ``rope_parameters`` dict: ``rope_parameters`` on
    transformers 5, ``rope_theta`` + ``rope_scaling`` (None for plain RoPE) before."""
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        return {"rope_parameters": dict(params)}
    rest = {k: v for k, v in params.items() if k != "rope_theta"}
    return {"rope_theta": params["rope_theta"], "rope_scaling": rest if rest["rope_type"] != "default" else None}


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
        **rope_config_kwargs(hf_rope_parameters(cfg.rope_scaling, cfg.rope_theta)),
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
