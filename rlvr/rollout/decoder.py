"""A lean decoder for Llama-layout Hugging Face models: the fast path of ``rollout/engine.py``.

- ``fast_path_reason(config, longest)`` says from a config why a family does not fit, and
  ``unsupported_reason(model, longest)`` adds the checks of the loaded modules (the engine then
  runs the Hugging Face forward, ``rollout/hf_backend.py``): it takes ``LlamaForCausalLM`` and
  models of the same layout (Qwen2, q/k/v biases allowed; Qwen3, its per-head q/k RMSNorm
  before RoPE; Phi-3, its fused ``qkv_proj`` and ``gate_up_proj`` read as they are; Mistral, Qwen2 or Phi-3 whose sliding window is no shorter
  than the longest sequence of the call). Every other family falls back, with its reason in
  ``_FALLBACK`` (Gemma 2/3's soft-capping, windows and scaled embeddings, MoE
  MLPs); docs/architectures.md.
- ``FastLlama(model)`` reads the weights from the model's modules once per ``generate`` call
  (``rollout/gemm.py``: fused ``[q; k; v]`` and ``[gate; up]``, stored [in, out], oneDNN-packed
  on CPU where available, or, for a model from ``model/quantize.py``'s ``quantize_int8``, the
  int8 layers' own weights, fused; norms and embeddings are the parameters themselves), so an optimizer
  step between calls is always seen, and holds the layer math: RMSNorm (and Qwen3's q/k norm), RoPE from the model's
  ``inv_freq`` (cos/sin tables built once per call), SwiGLU, the logits in float32.
- ``FastLlama.start(...)`` returns a ``DecodeState`` (``rollout/kv_cache.py``): the KV cache, and
  prefill / decode step / compaction over it; ``kv_cache="int8"`` / ``"sink_window"`` one of the
  memory-bounded caches of ``rollout/kv_compress.py``.

Precision: it computes in the model's dtype (fp32 on CPU, bf16 on CUDA) like the Hugging Face
forward does; ``FastLlama(model, matmul_dtype=torch.bfloat16)`` runs the GEMMs in bf16 (the
weight matrices cast per call; norms stay in the model's dtype) and, as ``torch.autocast`` does,
SwiGLU's activations on their bf16 outputs; on CUDA attention and the KV cache run in bf16 too
(``kv_dtype``), on CPU they stay in the model's dtype (docs/rollout.md, "Precision").

What it does not do: sampling, stop handling and bookkeeping (``engine.generate``), training
(no autograd: it must run under ``torch.inference_mode``), sliding-window attention that cuts (a
window shorter than the call's longest sequence), or RoPE
variants whose frequencies change with the sequence length (``dynamic``, ``longrope``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.rollout.gemm import WeightFormat, bias, fused_bias, int8_fused, is_int8_linear, lin
from rlvr.rollout.kv_cache import DecodeState
from rlvr.rollout.kv_compress import make_state

# model_type values whose layers are Llama's (pre-norm, RMSNorm, RoPE, GQA, SwiGLU); the module
# checks in ``unsupported_reason`` still have to pass.
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "phi3", "qwen3"}


@dataclass
class Layer:
    """One decoder layer's weights as ``FastLlama`` reads them (matrices in ``WeightFormat``, or
    ``Int8Matrix`` with its bias inside)."""

    ln1: torch.Tensor
    ln2: torch.Tensor
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    wgu: torch.Tensor
    bgu: torch.Tensor | None
    wd: torch.Tensor
    bd: torch.Tensor | None
    qkn: torch.Tensor | None = None
    """Qwen3's q/k RMSNorm weights per head, [heads + kv_heads, head_dim] (None: no q/k norm)."""


# Why the fast decoder does not take a family, by ``model_type``: each is a piece of layer math
# that FastLlama does not have, so its logits would differ from the model's own forward. Those
# models run on the Hugging Face backend (``rollout/hf_backend.py``), exact by construction.
_FALLBACK = {
    "qwen3_moe": "q/k RMSNorm and a mixture-of-experts MLP",
    "gemma": "scaled embeddings, (1 + weight) RMSNorm and a GELU-tanh MLP",
    "gemma2": "attention and final-logit soft-capping, alternating sliding/global attention, scaled "
              "embeddings, (1 + weight) RMSNorm, extra norms around attention and MLP, GELU-tanh MLP",
    "gemma3_text": "alternating sliding/global attention with two RoPE bases, q/k RMSNorm, scaled "
                   "embeddings, (1 + weight) RMSNorm, extra norms around attention and MLP, GELU-tanh MLP",
    "mixtral": "mixture-of-experts MLP (top-k router over expert SwiGLUs)",
    "qwen2_moe": "mixture-of-experts MLP (top-k router, experts and a gated shared expert)",
}


def fast_path_reason(config, longest: int | None = None) -> str | None:
    """Why the fast decoder cannot run a model of this ``config`` on sequences of up to
    ``longest`` tokens (prompt + completion; None: of any length), from the config alone; None
    when the family is one it computes exactly (Llama; Qwen2, q/k/v biases included; Qwen3; Phi-3;
    Mistral, Qwen2 or Phi-3 whose sliding window is at least ``longest``: it never cuts anything).
    ``unsupported_reason`` checks the loaded model's modules on top."""
    model_type = getattr(config, "model_type", None)
    if model_type in _FALLBACK:
        return f"{model_type}: {_FALLBACK[model_type]}"
    if model_type not in _LLAMA_LIKE:
        return f"model_type {model_type!r} is not Llama-like"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return "RoPE frequencies depend on the sequence length"
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and (longest is None or longest > window):
        return f"sliding-window attention ({window} tokens{'' if longest is None else f', sequences of up to {longest}'})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not SiLU"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    return None


def unsupported_reason(model: torch.nn.Module, longest: int | None = None) -> str | None:
    """Why the fast decoder cannot run ``model`` on sequences of up to ``longest`` tokens (None:
    any length); None when it can."""
    cfg = getattr(model, "config", None)
    reason = fast_path_reason(cfg, longest) if cfg is not None else "model has no config"
    if reason is not None:
        return reason
    reason = _model_reason(model)
    if reason is not None:
        return reason
    for layer in model.model.layers:
        reason = _layer_reason(layer)
        if reason is not None:
            return reason
    inv_freq = model.model.rotary_emb.inv_freq
    if inv_freq is None or inv_freq.ndim != 1:
        return "no rotary inv_freq"
    if 2 * inv_freq.numel() != int(model.model.layers[0].self_attn.head_dim):
        return "partial rotary embedding (RoPE on part of each head)"
    return None


def _model_reason(model: torch.nn.Module) -> str | None:
    """What in the model's config, module layout or parameters does not fit (None: all fits)."""
    inner = getattr(model, "model", None)
    try:
        inner.layers, inner.rotary_emb  # noqa: B018
        inner.embed_tokens.weight, inner.norm.weight, model.lm_head.weight  # noqa: B018
        inner.rotary_emb.inv_freq  # noqa: B018
    except AttributeError as e:
        return f"module layout differs from Llama's ({e})"
    params = list(model.parameters())
    if len({p.device for p in params}) != 1 or len({p.dtype for p in params}) != 1:
        return "parameters spread over several devices or dtypes"
    if getattr(model.lm_head, "bias", None) is not None:
        return "lm_head has a bias"
    return None


def _layer_reason(layer: torch.nn.Module) -> str | None:
    """What in one decoder layer differs from Llama's (None: nothing)."""
    att, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if att is None or mlp is None:
        return "layer without self_attn/mlp"
    fused_qkv = hasattr(att, "qkv_proj")  # Phi-3: [q; k; v] in one projection
    if hasattr(att, "q_norm") != hasattr(att, "k_norm") or not all(
        hasattr(att, n) for n in (*(("qkv_proj",) if fused_qkv else ("q_proj", "k_proj", "v_proj")), "o_proj", "head_dim")
    ):
        return "attention block differs from Llama's"
    fused_gu = hasattr(mlp, "gate_up_proj")  # Phi-3: [gate; up] in one projection
    if not all(hasattr(mlp, n) for n in (*(("gate_up_proj",) if fused_gu else ("gate_proj", "up_proj")), "down_proj")):
        return "MLP differs from SwiGLU"
    linears = [*((att.qkv_proj,) if fused_qkv else (att.q_proj, att.k_proj, att.v_proj)), att.o_proj,
               *((mlp.gate_up_proj,) if fused_gu else (mlp.gate_proj, mlp.up_proj)), mlp.down_proj]
    int8 = [is_int8_linear(m) for m in linears]
    if any(int8) and not all(int8):
        return "some of a layer's Linear layers are int8 and some are not (model/quantize.py converts all of them)"
    if not any(int8) and not all(isinstance(getattr(m, "weight", None), torch.Tensor) for m in linears):
        return "Linear layers whose weights are not tensors (a quantisation other than model/quantize.py's int8)"
    for name in ("q_norm", "k_norm"):  # Qwen3: RMSNorm over each head's head_dim, before RoPE
        norm = getattr(att, name, None)
        if norm is not None and (not _is_rms(norm) or tuple(norm.weight.shape) != (int(att.head_dim),)):
            return f"{name} is not an RMSNorm over head_dim"
    if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm")):
        return "norms differ from Llama's"
    if not _is_rms(layer.input_layernorm):
        return "norm is not RMSNorm"
    return None


def _is_rms(norm: torch.nn.Module) -> bool:
    name = type(norm).__name__
    return not (name.endswith("LayerNorm") and "RMS" not in name)


class FastLlama:
    """The weights of a Llama-layout model, read once per ``generate`` call (see the module
    docstring), its static shapes, and the math of its layers."""

    def __init__(self, model: torch.nn.Module, matmul_dtype: torch.dtype | None = None):
        cfg, inner = model.config, model.model
        att0 = inner.layers[0].self_attn
        self.dtype = inner.embed_tokens.weight.dtype
        self.device = inner.embed_tokens.weight.device
        self.num_heads = cfg.num_attention_heads
        self.num_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = int(att0.head_dim)
        self.rep = self.num_heads // self.num_kv
        mlp0 = inner.layers[0].mlp
        self.inter = mlp0.gate_proj.out_features if hasattr(mlp0, "gate_proj") else mlp0.gate_up_proj.out_features // 2
        self.eps = float(getattr(inner.norm, "variance_epsilon", getattr(cfg, "rms_norm_eps", 1e-6)))
        # ``matmul_dtype``: every GEMM in that dtype; activations, norms and logits stay in the model's.
        self.matmul_dtype = matmul_dtype if matmul_dtype not in (None, self.dtype) else None
        # Attention and the KV cache: in the GEMMs' dtype on CUDA (as autocast runs SDPA), the
        # model's on CPU (docs/rollout.md, "Precision").
        self.kv_dtype = (self.matmul_dtype if self.device.type == "cuda" else None) or self.dtype
        fmt = WeightFormat(self.device, self.dtype, self.matmul_dtype, sum(p.numel() for p in model.parameters()))
        self.packed = fmt.packed
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach()
        self.lm_head = fmt.matrix(model.lm_head.weight)
        self.inv_freq = inner.rotary_emb.inv_freq.detach()
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        q_norm = getattr(att0, "q_norm", None)
        self.qk_eps = float(getattr(q_norm, "variance_epsilon", getattr(q_norm, "eps", self.eps)))
        self.layers = [_read_layer(layer, fmt, self.num_heads, self.num_kv) for layer in inner.layers]

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin, [length, head_dim] in the model dtype, computed exactly as the
        model's rotary embedding does (so positions give bitwise the same values)."""
        return self.rope_at(torch.arange(length, device=self.device))

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``rope_tables`` at ``positions`` (any shape) -> [..., head_dim]: the same values as the
        tables' rows (each entry is the same float product), without a table of every position."""
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq.to(device=self.device, dtype=torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale).to(self.dtype)
        sin = (emb.sin() * self.rope_scale).to(self.dtype)
        half = self.head_dim // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)  # rotate_half's sign folded in
        return cos, sin

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * h.to(x.dtype)

    def qk_norm(self, x: torch.Tensor, L: Layer) -> torch.Tensor:
        """Qwen3's q/k RMSNorm on x [..., heads + kv_heads, head_dim] (query heads first), each
        head over its head_dim, as the model's ``q_norm`` / ``k_norm`` compute it; x unchanged for
        models without."""
        if L.qkn is None:
            return x
        if x.dtype == torch.float32:
            return F.rms_norm(x, (self.head_dim,), None, self.qk_eps) * L.qkn
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.qk_eps)
        return L.qkn * h.to(x.dtype)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [..., heads, head_dim] with cos/sin [..., head_dim] broadcast over heads."""
        shape = x.shape
        flipped = x.unflatten(-1, (2, self.head_dim // 2)).flip(-2).reshape(shape)
        if x.dtype == torch.float32:
            return torch.addcmul(x * cos.unsqueeze(-2), flipped, sin.unsqueeze(-2))
        return x * cos.unsqueeze(-2) + flipped * sin.unsqueeze(-2)  # bf16: round as the model does

    def mlp(self, x: torch.Tensor, L: Layer) -> torch.Tensor:
        """The MLP's output (in the GEMMs' dtype: adding it to ``x`` promotes it back)."""
        return lin(self.act(x, L), L.wd, L.bd, keep=True)

    def act(self, x: torch.Tensor, L: Layer) -> torch.Tensor:
        """SwiGLU's activations ``silu(gate) * up``, computed where autocast computes them: in the
        GEMMs' dtype (bf16 with ``matmul_dtype``), so the down projection takes them as they are."""
        gu = lin(self.rms(x, L.ln2), L.wgu, L.bgu, keep=True)
        return F.silu(gu[..., : self.inter]) * gu[..., self.inter :]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return lin(self.rms(x, self.norm), self.lm_head).float()

    def start(self, rows: int, max_len: int, cuda_graphs: bool = False, share_prompts: bool = True,
              kv_cache: str = "full", kv_window: int = 0, kv_sinks: int = 0) -> DecodeState:
        """A ``DecodeState`` for ``rows`` rows of up to ``max_len`` columns (see its docstring);
        ``kv_cache`` ``int8`` / ``sink_window`` gives the memory-bounded caches of
        ``rollout/kv_compress.py`` (no CUDA graphs, no shared prompts there)."""
        return make_state(self, rows, max_len, cuda_graphs, kv_cache, kv_window, kv_sinks, share_prompts)


def _read_layer(layer: torch.nn.Module, fmt: WeightFormat, heads: int, kv_heads: int) -> Layer:
    a, m = layer.self_attn, layer.mlp
    qkv = (a.qkv_proj,) if hasattr(a, "qkv_proj") else (a.q_proj, a.k_proj, a.v_proj)  # Phi-3 fuses them
    gu = (m.gate_up_proj,) if hasattr(m, "gate_up_proj") else (m.gate_proj, m.up_proj)  # [gate; up] either way
    if is_int8_linear(a.o_proj):  # model/quantize.py's int8 layers: their int8 weights, biases inside
        mats = dict(wqkv=int8_fused(*qkv), bqkv=None, wo=int8_fused(a.o_proj), bo=None,
                    wgu=int8_fused(*gu), bgu=None, wd=int8_fused(m.down_proj), bd=None)
    else:
        mats = dict(wqkv=fmt.fused(*(x.weight for x in qkv)), bqkv=fused_bias(*qkv),
                    wo=fmt.matrix(a.o_proj.weight), bo=bias(a.o_proj),
                    wgu=fmt.fused(*(x.weight for x in gu)), bgu=fused_bias(*gu),
                    wd=fmt.matrix(m.down_proj.weight), bd=bias(m.down_proj))
    return Layer(
        ln1=layer.input_layernorm.weight.detach(),
        ln2=layer.post_attention_layernorm.weight.detach(),
        **mats,
        qkn=torch.cat([a.q_norm.weight.detach().expand(heads, -1), a.k_norm.weight.detach().expand(kv_heads, -1)])
        if hasattr(a, "q_norm") else None,
    )
