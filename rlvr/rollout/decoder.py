"""A lean decoder for Llama-layout Hugging Face models: the fast path of ``rollout/engine.py``.

What it does:
- ``FastLlama(model)`` reads the weights of a ``LlamaForCausalLM`` (or a model of the same
  layout: Mistral or Qwen2 without sliding window, q/k/v biases allowed) from its modules, once
  per ``generate`` call: the fused ``[q; k; v]`` and ``[gate; up]`` weights are concatenated
  (stored [in, out]), and on CPU a small model's other matrices are transposed copies too (a
  plain GEMM is a few % faster than ``F.linear``); norms, embeddings and everything on GPU are
  the parameters themselves. So an optimizer step between calls is always seen. Where this
  torch has oneDNN (x86 CPU builds) those CPU copies are oneDNN-packed matrices instead, run by
  its linear kernel: at decode shapes (64 rows x a few hundred) it reaches 175-210 GFLOP/s in
  fp32 here where MKL's GEMM on plain matrices gets 85-160 (``ONEDNN_LINEAR``, probed once per
  dtype by ``onednn_linear_available``; without it, the plain matrices).
  ``unsupported_reason(model)`` says why a model does not fit (the engine then runs the Hugging
  Face forward).
- ``FastLlama.start(...)`` returns a ``DecodeState``: a preallocated KV cache (one tensor per
  layer for K and one for V, ``[rows, kv_heads, max_len, head_dim]``), the key-validity mask of
  the left-padded prompts and each row's next position. ``prefill`` runs each distinct prompt once
  and writes its K/V into all of its sample rows; ``step`` runs one token per row; ``compact``
  keeps only some rows (finished rows leave the batch); ``prefix(row, start)`` copies a row's
  K/V out as a ``KVPrefix``.
- Prefix reuse across calls: ``prefill(..., past=...)`` takes, per prompt, the ``KVPrefix`` of
  its first tokens (what the previous turn of a multi-turn episode computed) and runs only the
  rest; the prompts are still left-padded to a common width, the forward covers the last ``C``
  columns (``C`` = the longest uncached suffix), attending to the copied columns before them.
- The step is the model's own math, written out: RMSNorm, fused projections, RoPE from the
  model's ``inv_freq`` (cos/sin tables built once per call), grouped-query attention (queries
  of one KV head side by side, so K/V are never repeated; ``F.scaled_dot_product_attention`` on
  GPU and in prefill, two batched matmuls for a CPU decode step, ~10% faster there than the CPU
  flash kernel with one query), SwiGLU, and the logits in float32. It computes in the model's dtype (fp32 on CPU,
  bf16 on CUDA) like the Hugging Face forward does; ``FastLlama(model, matmul_dtype=torch.bfloat16)``
  runs the GEMMs in bf16 (the weight matrices cast per call; norms stay in the model's dtype)
  and, as ``torch.autocast`` does, SwiGLU's activations on their bf16 outputs (no cast between
  the MLP's GEMMs); on CUDA attention and the KV cache run in bf16 too, as autocast runs SDPA
  (``kv_dtype``), on CPU they stay in the model's dtype.
- Shared prompts (CPU decode steps, when a prompt has several sample rows): the prompt's K/V are
  kept once per prompt, and a step attends to them with the queries of all its rows stacked (one
  GEMM per prompt and KV head instead of one matrix-vector product per row), then to each row's
  own generated columns, in one softmax over both: a decode step is bound by reading the cache,
  and the prompt is most of it. The rows' own cache columns before the prompts' width are then
  never written (prefill does not copy the prompt to every row; compaction moves only generated
  columns; ``prefix`` takes the prompt's columns from the shared copy).
- On CUDA (``cuda_graphs=True``) the decode step is captured in a CUDA graph per batch-size
  bucket (powers of two, the last bucket being all rows); rows beyond those in use are padding.
  The captured step attends over the whole cache under the mask and writes K/V at a column held
  in a device tensor, so one graph serves every step. Capture failures fall back to eager steps.

What it does not do: sampling, stop handling and bookkeeping (``engine.generate``), training
(no autograd: it must run under ``torch.inference_mode``), sliding-window attention, or RoPE
variants whose frequencies change with the sequence length (``dynamic``, ``longrope``).
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# model_type values whose layers are Llama's (pre-norm, RMSNorm, RoPE, GQA, SwiGLU); the module
# check in ``from_model`` still has to pass.
_LLAMA_LIKE = {"llama", "mistral", "qwen2"}


@dataclass
class _Layer:
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


@dataclass
class KVPrefix:
    """The keys and values of a sequence's first ``length`` tokens, per layer
    ``[kv_heads, length, head_dim]``: what ``prefill(past=...)`` starts from instead of running
    those tokens again."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.k[0].shape[1]


def _cat_t(*ts: torch.Tensor) -> torch.Tensor:
    """[W1; W2; ...] transposed to [in, out_total], contiguous (a copy, made once per call)."""
    return torch.cat([t.detach().t() for t in ts], dim=1)


def _cat_bias(*linears) -> torch.Tensor | None:
    if all(m.bias is None for m in linears):
        return None
    return torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.weight.shape[0])
                      for m in linears])


def _bias(linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach()


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the fast decoder cannot run ``model`` (None when it can)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in _LLAMA_LIKE:
        return f"model_type {getattr(cfg, 'model_type', None)!r} is not Llama-like"
    inner = getattr(model, "model", None)
    try:
        layers = inner.layers
        rotary = inner.rotary_emb
        inner.embed_tokens.weight, inner.norm.weight, model.lm_head.weight  # noqa: B018
        inv_freq = rotary.inv_freq
    except AttributeError as e:
        return f"module layout differs from Llama's ({e})"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return "RoPE frequencies depend on the sequence length"
    if getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r} is not SiLU"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    params = list(model.parameters())
    if len({p.device for p in params}) != 1 or len({p.dtype for p in params}) != 1:
        return "parameters spread over several devices or dtypes"
    if getattr(model.lm_head, "bias", None) is not None:
        return "lm_head has a bias"
    for layer in layers:
        att, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if att is None or mlp is None:
            return "layer without self_attn/mlp"
        if any(hasattr(att, n) for n in ("q_norm", "k_norm")) or not all(
            hasattr(att, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")
        ):
            return "attention block differs from Llama's"
        if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            return "MLP differs from SwiGLU"
        if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm")):
            return "norms differ from Llama's"
        norm_name = type(layer.input_layernorm).__name__
        if norm_name.endswith("LayerNorm") and "RMS" not in norm_name:
            return "norm is not RMSNorm"
    if inv_freq is None or inv_freq.ndim != 1:
        return "no rotary inv_freq"
    return None


class FastLlama:
    """The weights of a Llama-layout model, read once per ``generate`` call (parameters, their
    transposed views, or per-call fused/transposed copies; see the module docstring), and its
    static shapes."""

    def __init__(self, model: torch.nn.Module, matmul_dtype: torch.dtype | None = None):
        cfg, inner = model.config, model.model
        att0 = inner.layers[0].self_attn
        self.dtype = inner.embed_tokens.weight.dtype
        self.device = inner.embed_tokens.weight.device
        self.num_heads = cfg.num_attention_heads
        self.num_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = int(att0.head_dim)
        self.rep = self.num_heads // self.num_kv
        self.inter = inner.layers[0].mlp.gate_proj.weight.shape[0]
        self.eps = float(getattr(inner.norm, "variance_epsilon", getattr(cfg, "rms_norm_eps", 1e-6)))
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach()
        # Weights as [in, out]: ``x @ w`` is a plain GEMM (a few % faster than F.linear on CPU).
        # Small CPU models get contiguous transposed copies (per call, like the fused ones);
        # elsewhere they are transposed views of the parameters.
        # ``matmul_dtype`` (e.g. bf16 for an fp32 model on a CPU with bf16 GEMMs): the weight
        # matrices are cast copies and every GEMM runs in that dtype; activations, norms,
        # attention, the KV cache and the logits stay in the model's dtype.
        # On CPU, where the matrices are copies anyway (small models, or cast to ``matmul_dtype``),
        # the copies are oneDNN-packed instead (``_packed``): a decode step's GEMMs (64 rows x
        # a few hundred) run up to 2x faster in fp32 there than MKL's on plain matrices.
        self.matmul_dtype = matmul_dtype if matmul_dtype not in (None, self.dtype) else None
        # On CUDA, attention and the KV cache run in the GEMMs' dtype, as autocast runs SDPA (the
        # trainer's forward under ``algo.precision``): fp32 attention has no flash kernel there
        # (decode 2.9x slower on an H200). On CPU they stay in the model's dtype: bf16 batched
        # matmuls at decode shapes are no faster there (docs/rollout.md, "Precision").
        self.kv_dtype = (self.matmul_dtype if self.device.type == "cuda" else None) or self.dtype
        small_cpu = self.device.type == "cpu" and sum(p.numel() for p in model.parameters()) <= 64_000_000
        gemm_dtype = self.matmul_dtype or self.dtype
        self.packed = (self.device.type == "cpu" and (small_cpu or self.matmul_dtype is not None)
                       and ONEDNN_LINEAR and onednn_linear_available(gemm_dtype))

        def t(w: torch.Tensor) -> torch.Tensor:
            if self.packed:
                return _packed(w.detach(), gemm_dtype)
            w = w.detach().t()
            if self.matmul_dtype is not None:  # one copy: cast and made contiguous together
                return w.to(gemm_dtype, memory_format=torch.contiguous_format)
            return w.contiguous() if small_cpu else w

        def cat(*ws: torch.Tensor) -> torch.Tensor:
            if self.packed:
                return _packed(torch.cat([w.detach() for w in ws]), gemm_dtype)
            return _cat_t(*ws).to(gemm_dtype)  # no copy when it is already the model's dtype
        self.lm_head = t(model.lm_head.weight)
        self.inv_freq = inner.rotary_emb.inv_freq.detach()
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                ln1=layer.input_layernorm.weight.detach(),
                ln2=layer.post_attention_layernorm.weight.detach(),
                wqkv=cat(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                bqkv=_cat_bias(a.q_proj, a.k_proj, a.v_proj),
                wo=t(a.o_proj.weight), bo=_bias(a.o_proj),
                wgu=cat(m.gate_proj.weight, m.up_proj.weight),
                bgu=_cat_bias(m.gate_proj, m.up_proj),
                wd=t(m.down_proj.weight), bd=_bias(m.down_proj),
            ))

    @classmethod
    def from_model(cls, model: torch.nn.Module, matmul_dtype: torch.dtype | None = None) -> FastLlama | None:
        return None if unsupported_reason(model) is not None else cls(model, matmul_dtype)

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin, [length, head_dim] in the model dtype, computed exactly as the
        model's rotary embedding does (so positions give bitwise the same values)."""
        pos = torch.arange(length, device=self.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq.to(device=self.device, dtype=torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale).to(self.dtype)
        sin = (emb.sin() * self.rope_scale).to(self.dtype)
        half = self.head_dim // 2
        sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # rotate_half's sign folded in
        return cos, sin

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * h.to(x.dtype)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [..., heads, head_dim] with cos/sin [..., head_dim] broadcast over heads."""
        shape = x.shape
        flipped = x.unflatten(-1, (2, self.head_dim // 2)).flip(-2).reshape(shape)
        if x.dtype == torch.float32:
            return torch.addcmul(x * cos.unsqueeze(-2), flipped, sin.unsqueeze(-2))
        return x * cos.unsqueeze(-2) + flipped * sin.unsqueeze(-2)  # bf16: round as the model does

    def mlp(self, x: torch.Tensor, L: _Layer) -> torch.Tensor:
        """The MLP's output (in the GEMMs' dtype: adding it to ``x`` promotes it back)."""
        return _lin(self.act(x, L), L.wd, L.bd, keep=True)

    def act(self, x: torch.Tensor, L: _Layer) -> torch.Tensor:
        """SwiGLU's activations ``silu(gate) * up``, computed where autocast computes them: in the
        GEMMs' dtype (bf16 with ``matmul_dtype``), so the down projection takes them as they are."""
        gu = _lin(self.rms(x, L.ln2), L.wgu, L.bgu, keep=True)
        return F.silu(gu[..., : self.inter]) * gu[..., self.inter :]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return _lin(self.rms(x, self.norm), self.lm_head).float()

    def start(self, rows: int, max_len: int, cuda_graphs: bool = False) -> DecodeState:
        return DecodeState(self, rows, max_len, cuda_graphs)


class DecodeState:
    """KV cache and per-row state for one batch of rows (see the module docstring)."""

    def __init__(self, f: FastLlama, rows: int, max_len: int, cuda_graphs: bool):
        self.f, self.rows, self.max_len = f, rows, max_len
        shape = (rows, f.num_kv, max_len, f.head_dim)
        # Eager steps read only written columns; a captured step reads all of them (masked), and
        # 0 x NaN from uninitialised memory would still be NaN, so those caches start at zero.
        alloc = torch.zeros if cuda_graphs else torch.empty
        self.k = [alloc(shape, dtype=f.kv_dtype, device=f.device) for _ in f.layers]
        self.v = [alloc(shape, dtype=f.kv_dtype, device=f.device) for _ in f.layers]
        self.valid = torch.zeros((rows, max_len), dtype=torch.bool, device=f.device)
        self.pos = torch.zeros(rows, dtype=torch.long, device=f.device)
        self.cos, self.sin = f.rope_tables(max_len)
        self.n = rows  # rows in use (a prefix of the buffers)
        self.col = 0  # cache column the next step writes
        self.shared: _SharedPrompts | None = None  # set by prefill when prompts have several rows
        self.graphs = _Graphs(self) if cuda_graphs else None

    # -- prefill ---------------------------------------------------------------------------------
    def prefill(self, prompts: list, expand: torch.Tensor, pad_token_id: int,
                past: list[KVPrefix | None] | None = None) -> torch.Tensor:
        """Run the distinct ``prompts`` once (left-padded) and copy each one's K/V to its rows
        (``expand[r]`` = prompt of row r). ``past[k]``, when given, holds the K/V of prompt k's
        first tokens: only the columns after the shortest-covered suffix run (see the module
        docstring). Returns the last-position logits per row [rows, V]."""
        f = self.f
        dev = f.device
        lengths = [len(p) for p in prompts]
        U, W = len(prompts), max(lengths)
        cached = [min(c.length, n - 1) if c is not None else 0 for c, n in zip(past or [None] * U, lengths)]
        C = max(n - m for n, m in zip(lengths, cached))  # columns W - C .. W - 1 run
        ids = torch.full((U, W), pad_token_id, dtype=torch.long)
        mask = torch.zeros((U, W), dtype=torch.bool)
        for k, p in enumerate(prompts):
            ids[k, W - lengths[k]:] = torch.as_tensor(list(p), dtype=torch.long)
            mask[k, W - lengths[k]:] = True
        ids, mask = ids.to(dev), mask.to(dev)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cos, sin = self.cos[positions[:, W - C:]], self.sin[positions[:, W - C:]]  # [U, C, hd]
        causal = torch.ones((W, W), dtype=torch.bool, device=dev).tril()[W - C:]
        eye = torch.eye(W, dtype=torch.bool, device=dev)[W - C:]
        attn_mask = ((causal & mask[:, None, :]) | eye)[:, None]  # [U, 1, C, W]; pad queries see themselves
        direct = U == self.rows and bool((expand == torch.arange(U, device=dev)).all())
        nh, nkv, hd = f.num_heads, f.num_kv, f.head_dim
        shared = None
        if U < self.rows and self.graphs is None and f.device.type == "cpu" and CPU_MATMUL_ATTENTION \
                and SHARE_PROMPTS:
            shared = _SharedPrompts(U, W, mask, nkv, f.kv_dtype)
        x = F.embedding(ids[:, W - C:], f.embed)
        for li, L in enumerate(f.layers):
            qkv = _lin(f.rms(x, L.ln1), L.wqkv, L.bqkv)  # [U, C, (nh + 2 nkv) hd]
            qk = f.rope(qkv[..., : (nh + nkv) * hd].unflatten(-1, (nh + nkv, hd)), cos, sin).to(f.kv_dtype)
            q = qk[..., :nh, :].transpose(1, 2)
            k = qk[..., nh:, :].transpose(1, 2)  # [U, nkv, C, hd]
            v = qkv[..., (nh + nkv) * hd:].unflatten(-1, (nkv, hd)).transpose(1, 2).to(f.kv_dtype)
            if C < W:  # the whole width: copied prefixes, then the columns just computed
                K = self.k[li][:U, :, :W] if direct else k.new_empty((U, nkv, W, hd))
                V = self.v[li][:U, :, :W] if direct else v.new_empty((U, nkv, W, hd))
                for j, m in enumerate(cached):
                    s0 = W - lengths[j]
                    K[j, :, :min(s0, W - C)] = 0  # left padding: masked, but never garbage (0 x NaN)
                    V[j, :, :min(s0, W - C)] = 0
                    if m:
                        K[j, :, s0:s0 + m] = past[j].k[li][:, :m]
                        V[j, :, s0:s0 + m] = past[j].v[li][:, :m]
                K[:, :, W - C:], V[:, :, W - C:] = k, v
                k, v = K, V
            if shared is not None:  # the prompts' K/V once; the rows' cache columns < W stay unwritten
                shared.k.append(k.reshape(U * nkv, W, hd))  # (a copy when k is a strided view)
                shared.v.append(v.reshape(U * nkv, W, hd))
            elif not (direct and C < W):  # (direct with a prefix: K/V were written in place above)
                self.k[li][:, :, :W] = k.index_select(0, expand)
                self.v[li][:, :, :W] = v.index_select(0, expand)
            if f.rep > 1:
                k = k.repeat_interleave(f.rep, dim=1)
                v = v.repeat_interleave(f.rep, dim=1)
            am = attn_mask
            if li == len(f.layers) - 1:  # past the last K/V only the last position matters
                q, am, x = q[:, :, -1:], attn_mask[:, :, -1:], x[:, -1:]
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=am)
            x = x + _lin(a.transpose(1, 2).flatten(2), L.wo, L.bo, keep=True)
            x = x + f.mlp(x, L)
        self.valid[:, :W] = mask.index_select(0, expand)
        self.pos.copy_(positions[:, -1].index_select(0, expand) + 1)
        self.col = W
        self.shared = shared
        if shared is not None:
            shared.set_rows(expand.tolist())
        return f.logits(x[:, -1]).index_select(0, expand)

    def prefix(self, row: int, start: int) -> KVPrefix:
        """A copy of row ``row``'s K/V from column ``start`` (where its prompt begins) to the
        last column written: its prompt and every token fed since."""
        sh = self.shared
        if sh is None:
            return KVPrefix([K[row, :, start:self.col].clone() for K in self.k],
                            [V[row, :, start:self.col].clone() for V in self.v])
        u, W = sh.rows[row], sh.width  # the prompt's columns from the shared copy, then the row's own
        return KVPrefix([torch.cat([P.view(sh.prompts, sh.nkv, W, -1)[u, :, start:], K[row, :, W:self.col]], 1)
                         for P, K in zip(sh.k, self.k)],
                        [torch.cat([P.view(sh.prompts, sh.nkv, W, -1)[u, :, start:], V[row, :, W:self.col]], 1)
                         for P, V in zip(sh.v, self.v)])

    # -- decode ----------------------------------------------------------------------------------
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row in use ([n] long); returns the next logits [n, V] float32."""
        if self.col >= self.max_len:
            raise RuntimeError("KV cache full")
        if self.graphs is not None:
            out = self.graphs.step(tokens)
            if out is not None:
                self.col += 1
                return out
        f, n, col = self.f, self.n, self.col
        S = col + 1
        valid = self.valid[:n]
        valid[:, col] = True
        pos = self.pos[:n]
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)  # [n, hd]
        nh, nkv, hd, rep = f.num_heads, f.num_kv, f.head_dim, f.rep
        shared = self.shared  # (its prompt columns' mask is per prompt; generated columns are all valid)
        cpu = shared is None and f.device.type == "cpu" and CPU_MATMUL_ATTENTION
        if cpu:  # one additive mask for all layers, [n * kv, rep, S]
            bias = torch.zeros((n, S), dtype=f.kv_dtype).masked_fill_(~valid[:, :S], float("-inf"))
            bias = bias[:, None].expand(n, nh, S).reshape(n * nkv, rep, S)
        elif shared is None:
            mask = valid[:, None, None, :S]
        x = F.embedding(tokens, f.embed)
        for li, L in enumerate(f.layers):
            qkv = _lin(f.rms(x, L.ln1), L.wqkv, L.bqkv)
            qk = f.rope(qkv[:, : (nh + nkv) * hd].view(n, nh + nkv, hd), cos, sin).to(f.kv_dtype)
            K, V = self.k[li], self.v[li]
            K[:n, :, col] = qk[:, nh:]
            V[:n, :, col] = qkv[:, (nh + nkv) * hd:].view(n, nkv, hd)
            # The rep query heads of one KV head attend together as a rep-long query: no repeated
            # K/V. On CPU: scores + mask in one baddbmm, then one bmm (fewer ops than SDPA's
            # flash kernel, which is slower here with a single query).
            if shared is not None:
                a = shared.attend(li, qk[:, :nh], K[:n, :, shared.width:S], V[:n, :, shared.width:S])
            elif cpu:
                s = torch.baddbmm(bias, qk[:, :nh].reshape(n * nkv, rep, hd),
                                  K[:n, :, :S].view(n * nkv, S, hd).transpose(1, 2), alpha=hd ** -0.5)
                a = torch.bmm(s.softmax(-1), V[:n, :, :S].view(n * nkv, S, hd)).view(n, nh * hd)
            else:
                a = F.scaled_dot_product_attention(qk[:, :nh].view(n, nkv, rep, hd), K[:n, :, :S], V[:n, :, :S],
                                                   attn_mask=mask).reshape(n, nh * hd)
            x = _lin_res(x, a, L.wo, L.bo)
            x = _lin_res(x, f.act(x, L), L.wd, L.bd)
        pos += 1
        self.col += 1
        return f.logits(x)

    def step_static(self, tokens: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        """The capturable step for CUDA graphs: all buffer rows, whole-cache attention under the
        mask, K/V written at the column held by ``col`` (a 1-element long tensor)."""
        if self.shared is not None:
            raise RuntimeError("step_static reads every row's prompt columns: not with shared prompts")
        f = self.f
        n = tokens.shape[0]
        valid = self.valid[:n]
        valid.index_fill_(1, col, True)
        pos = self.pos[:n]
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        mask = valid[:, None, None, :]
        nh, nkv, hd = f.num_heads, f.num_kv, f.head_dim
        x = F.embedding(tokens, f.embed)
        for li, L in enumerate(f.layers):
            qkv = _lin(f.rms(x, L.ln1), L.wqkv, L.bqkv)
            qk = f.rope(qkv[:, : (nh + nkv) * hd].view(n, nh + nkv, hd), cos, sin).to(f.kv_dtype)
            K, V = self.k[li][:n], self.v[li][:n]
            K.index_copy_(2, col, qk[:, nh:, None, :])
            V.index_copy_(2, col, qkv[:, (nh + nkv) * hd:].view(n, nkv, 1, hd).to(f.kv_dtype))
            a = F.scaled_dot_product_attention(qk[:, :nh].view(n, nkv, f.rep, hd), K, V, attn_mask=mask)
            x = x + _lin(a.reshape(n, nh * hd), L.wo, L.bo, keep=True)
            x = x + f.mlp(x, L)
        pos += 1
        return f.logits(x)

    # -- compaction ------------------------------------------------------------------------------
    def compact(self, keep: torch.Tensor) -> None:
        """Keep only rows ``keep`` (ascending indices into the rows in use), moved to the front.
        Rows already in place (before the first dropped row) are not copied, and only the cache
        columns written so far are."""
        keep_l = keep.tolist()
        first = next((i for i, r in enumerate(keep_l) if r != i), len(keep_l))
        m, c = len(keep_l), self.col
        lo = 0 if self.shared is None else self.shared.width  # (shared prompts: no prompt columns)
        if first < m:
            tail = keep[first:]
            for buf in (*self.k, *self.v):
                buf[first:m, :, lo:c] = buf[:, :, lo:c].index_select(0, tail)
            self.valid[first:m, :c] = self.valid[:, :c].index_select(0, tail)
            self.pos[first:m] = self.pos.index_select(0, tail)
        self.n = m
        if self.shared is not None:
            self.shared.set_rows([self.shared.rows[r] for r in keep_l])

    def worth_compacting(self, alive: int, remaining: int) -> bool:
        """Compaction policy. With CUDA graphs: when the live rows fit a smaller bucket. Otherwise
        when the finished rows' share of the ``remaining`` steps costs more than moving the live
        rows: measured on CPU, copying one row's cache costs about one row-step (a compaction of
        56 of 64 rows at column 78: 9.4 ms; a 64-row step: 14 ms), so compact when
        finished x remaining >= alive."""
        if self.graphs is not None and self.graphs.enabled:
            return _bucket(alive, self.rows) < _bucket(self.n, self.rows)
        return (self.n - alive) * remaining >= alive


ONEDNN_LINEAR = True  # False: plain matrices and MKL GEMMs on CPU too (for A/B runs)
_PACK_ROWS = 64  # the batch size oneDNN's weight layout is chosen for (any batch size runs)


@functools.cache
def onednn_linear_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN's packed linear runs here in ``dtype`` (x86 CPU builds of torch have it; a
    CPU without bf16 support may refuse bf16): probed once on a small GEMM against ``F.linear``."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        with torch.inference_mode():
            w = torch.linspace(-1, 1, 64).reshape(8, 8).to(dtype)
            x = torch.linspace(1, -1, 16).reshape(2, 8).to(dtype)
            y = torch.ops.mkldnn._linear_pointwise(x, _packed(w, dtype), None, "none", [], "")
            return bool(torch.allclose(y.float(), F.linear(x.float(), w.float()), atol=0.05))
    except RuntimeError:
        return False


def _packed(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A [out, in] weight as a oneDNN-packed copy in ``dtype`` (an opaque ``torch._mkldnn``
    tensor that only ``_lin`` reads)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.to(dtype).contiguous(), _PACK_ROWS)


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x @ w (+ b)`` in ``w``'s dtype, for ``x`` of that dtype (any leading dims)."""
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, w, None if b is None else b.to(w.dtype), "none", [], "")
    if b is None:
        return x @ w
    b = b.to(w.dtype)  # (a bias in the model's dtype next to bf16 GEMMs)
    return torch.addmm(b, x, w) if x.dim() == 2 else torch.addmm(b, x.flatten(0, -2), w).unflatten(0, x.shape[:-1])


def _lin(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, keep: bool = False) -> torch.Tensor:
    """``x @ w (+ b)`` with ``w`` stored [in, out] (or oneDNN-packed). A ``w`` in another dtype
    (``matmul_dtype``) runs the GEMM in ``w``'s dtype and returns ``x``'s; ``keep=True`` leaves
    the result (bias included) in ``w``'s dtype, as autocast leaves a linear's output."""
    if w.dtype != x.dtype:
        if keep:
            return _linear(x.to(w.dtype), w, b)
        y = _linear(x.to(w.dtype), w, None).to(x.dtype)
        return y if b is None else y + b
    return _linear(x, w, b)


def _lin_res(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x + h @ w (+ b)`` for 2-D ``x``, the residual add fused into the GEMM when possible (a
    GEMM in another dtype is added to ``x`` in ``x``'s dtype)."""
    if b is None and w.dtype == x.dtype == h.dtype:
        if w.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise.binary(h, x, w, None, "add")
        return torch.addmm(x, h, w)
    return x + _lin(h, w, b, keep=True)


CPU_MATMUL_ATTENTION = True  # False: F.scaled_dot_product_attention on CPU too (for A/B runs)
SHARE_PROMPTS = True  # False: CPU decode steps read each row's copy of its prompt (for A/B runs)


class _SharedPrompts:
    """The prompts' K/V once per prompt, and attention of a CPU decode step over them plus each
    row's generated columns (see the module docstring).

    Rows are grouped by prompt (each prompt's rows consecutive, as ``engine.generate`` orders
    them, and compaction keeps the order). A step lays the rows' queries on a grid of ``U`` prompts
    x ``G`` slots (``G`` = the most rows any prompt has): prompt ``u``'s queries form one
    ``[G x rep, hd]`` matrix per KV head, multiplied with the prompt's keys in one batched GEMM.
    When every prompt has ``G`` rows the grid is the rows themselves (``slots`` is None);
    otherwise ``slots[r]`` is row r's cell and empty cells compute zeros that are never read."""

    def __init__(self, U: int, W: int, mask: torch.Tensor, nkv: int, dtype: torch.dtype):
        self.prompts, self.width, self.nkv = U, W, nkv
        self.k: list[torch.Tensor] = []  # per layer [U * nkv, W, hd]
        self.v: list[torch.Tensor] = []
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        self.bias = bias[:, None, None].expand(U, nkv, 1, W).reshape(U * nkv, 1, W)  # left padding
        self.rows: list[int] = []

    def set_rows(self, rows: list[int]) -> None:
        """``rows[r]`` = the prompt of decoder row r (ascending)."""
        self.rows = rows
        self.G = max(Counter(rows).values())
        self.slots = None
        if len(rows) != self.prompts * self.G:  # cell = prompt x G + rank among the prompt's rows
            first: dict[int, int] = {}
            slots = [p * self.G + r - first.setdefault(p, r) for r, p in enumerate(rows)]
            self.slots = torch.tensor(slots, device=self.bias.device)

    def attend(self, li: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """q [n, nh, hd] (roped), k_new/v_new [n, nkv, t, hd] the rows' generated columns (the
        current one included) -> attention output [n, nh * hd]."""
        n, nh, hd = q.shape
        W, nkv = self.width, self.nkv
        rep, t = nh // nkv, k_new.shape[2]
        q = q * hd ** -0.5
        grid = self._to_grid(q.reshape(n, nkv, rep, hd))  # [U * nkv, G * rep, hd]
        s_prompt = torch.baddbmm(self.bias, grid, self.k[li].transpose(1, 2))  # [U * nkv, G * rep, W]
        s_new = torch.bmm(q.reshape(n * nkv, rep, hd), k_new.reshape(n * nkv, t, hd).transpose(1, 2))
        p = torch.cat([self._from_grid(s_prompt), s_new], dim=-1).softmax(-1)  # [n * nkv, rep, W + t]
        a_prompt = torch.bmm(self._to_grid(p[..., :W].reshape(n, nkv, rep, W)), self.v[li])
        a = torch.baddbmm(self._from_grid(a_prompt), p[..., W:], v_new.reshape(n * nkv, t, hd))
        return a.view(n, nh * hd)

    def _to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """[n, nkv, rep, d] per row -> [U * nkv, G * rep, d] per prompt and KV head."""
        _, nkv, rep, d = x.shape
        if self.slots is not None:
            x = x.new_zeros((self.prompts * self.G, nkv, rep, d)).index_copy_(0, self.slots, x)
        return x.view(self.prompts, self.G, nkv, rep, d).transpose(1, 2).reshape(-1, self.G * rep, d)

    def _from_grid(self, x: torch.Tensor) -> torch.Tensor:
        """[U * nkv, G * rep, d] -> [n * nkv, rep, d] in row order."""
        d = x.shape[-1]
        x = x.view(self.prompts, self.nkv, self.G, -1, d).transpose(1, 2)  # [U, G, nkv, rep, d]
        rep = x.shape[3]
        x = x.reshape(self.prompts * self.G, self.nkv, rep, d)
        if self.slots is not None:
            x = x.index_select(0, self.slots)
        return x.reshape(-1, rep, d)


def _bucket(n: int, cap: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return min(b, cap)


class _Graphs:
    """CUDA graphs of ``DecodeState.step_static``, one per batch-size bucket, captured on first use."""

    def __init__(self, state: DecodeState):
        self.state = state
        dev = state.f.device
        self.tokens = torch.zeros(state.rows, dtype=torch.long, device=dev)
        self.col = torch.zeros(1, dtype=torch.long, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.enabled = True

    def step(self, tokens: torch.Tensor) -> torch.Tensor | None:
        if not self.enabled:
            return None
        s = self.state
        n = tokens.shape[0]
        b = _bucket(n, s.rows)
        self.tokens[:n].copy_(tokens)
        self.col.fill_(s.col)
        if b not in self.graphs:
            try:
                self.graphs[b] = self._capture(b)
            except Exception as e:  # noqa: BLE001  (any capture failure: decode eagerly)
                warnings.warn(f"CUDA graph capture failed ({e}); decoding without graphs", stacklevel=2)
                self.enabled = False
                return None
        graph, out = self.graphs[b]
        graph.replay()
        return out[:n]

    def _capture(self, b: int):
        s = self.state
        n_saved = s.n
        # The warm-up runs compute the real step for the current inputs (idempotent writes), and
        # the replay after capture computes it again: the same values land in the same places.
        pos_saved = s.pos.clone()  # (before the side stream's wait: its clone is then done when read there)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):
                for _ in range(2):
                    s.pos.copy_(pos_saved)
                    s.step_static(self.tokens[:b], self.col)
            torch.cuda.current_stream().wait_stream(stream)
            s.pos.copy_(pos_saved)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = s.step_static(self.tokens[:b], self.col)
        finally:  # the replay (or the eager fallback) advances the positions, not the warm-up
            torch.cuda.current_stream().wait_stream(stream)
            s.pos.copy_(pos_saved)
            s.n = n_saved
        return graph, out
