"""int8 weight quantisation of a causal LM's decoder Linear layers, for serving on CPU.

``quantize_int8(model)`` returns a copy whose Linear layers inside the decoder layers (attention
q/k/v/o and the MLP) are ``Int8Linear``: W8A8 with int32 accumulation, the recipe of torchao's
int8 dynamic-activation / int8-weight configuration and of SmoothQuant's W8A8 (without the
smoothing):

- weights: int8, symmetric, one scale per output channel (``per_channel=False``: one scale for
  the whole matrix), quantised once;
- activations: int8, symmetric, one scale per token (row), quantised at each call;
- ``int8_linear``: ``_int_mm`` (exact int8 x int8 -> int32 GEMM, VNNI on this CPU), then
  ``acc * token_scale * channel_scale (+ bias)`` in float32.

Per-token activation scales make a row's output independent of the other rows in the batch and
of how many positions a forward runs (a prefill, a decode step, a speculative verify): the int8
model decodes the same tokens alone or batched. PyTorch's dynamic quantisation
(``torch.ao.quantization.quantize_dynamic``, deprecated in favour of torchao) quantises
activations with one scale per input tensor: at the evaluation's batch of 256 rows one outlier
row sets the scale for all, which cost the quickstart policy 2.5 points of held-out pass@1 where
per-token scales cost 0.25 (docs/fast_mode.md).

The LM head and the embeddings stay in full precision (the head, often tied to the embedding, is
the layer most sensitive to rounding). It returns a copy; the original model is untouched.

Where it runs: the Hugging Face forward calls the modules; rlvr's fast decoder reads their int8
weights and fuses ``[q; k; v]`` and ``[gate; up]`` (``rollout/gemm.py``, ``Int8Matrix``) through
the same ``int8_linear``, so both backends compute the same values. Training is not supported on
it (no autograd through the int8 GEMM); the serving engines keep the full-precision model for
weight updates and quantise it again. CPU only (``_int_mm`` on CUDA has shape constraints that
are not handled here).
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def int8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for ``W = weight * scale[:, None]`` (``weight`` int8 [out, in],
    ``scale`` float32 [out]), with ``x`` quantised to int8 per row (any leading dims)."""
    x2 = x.reshape(-1, x.shape[-1]).float()
    s = x2.abs().amax(-1, keepdim=True).clamp_(min=1e-12) / 127
    # (B as the transposed view of [out, in]: 2-3x faster than a contiguous [in, out] at 1 row)
    acc = torch._int_mm((x2 / s).round_().to(torch.int8), weight.t())  # exact int32
    y = acc.float().mul_(s).mul_(scale)
    if bias is not None:
        y.add_(bias)
    return y.to(x.dtype).unflatten(0, x.shape[:-1])


class Int8Linear(nn.Module):
    """A Linear layer with int8 weights (symmetric, per output channel or per matrix) and
    per-token int8 activations (``int8_linear``). Buffers: ``weight_int8`` [out, in], ``scale``
    [out] float32, ``bias`` [out] float32 or None."""

    def __init__(self, linear: nn.Linear, per_channel: bool = True):
        super().__init__()
        w = linear.weight.detach().float()
        amax = w.abs().amax(1) if per_channel else w.abs().amax().expand(w.shape[0])
        scale = (amax / 127).clamp(min=1e-12).contiguous()
        self.in_features, self.out_features, self.per_channel = linear.in_features, linear.out_features, per_channel
        self.register_buffer("weight_int8", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.weight_int8, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, per_channel={self.per_channel}"


def int8_layers(model: nn.Module) -> list[str]:
    """Names of the ``nn.Linear`` modules ``quantize_int8`` converts: those inside the decoder
    layers (not the LM head)."""
    head = model.get_output_embeddings()
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and m is not head and ".layers." in f".{name}"]


def quantize_int8(model: nn.Module, per_channel: bool = True) -> nn.Module:
    """A copy of ``model`` (on CPU, float32, in eval mode) with its decoder Linear layers as
    ``Int8Linear`` (one weight scale per output channel, or per matrix with ``per_channel=False``)."""
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 quantisation runs on CPU; move the model to CPU first")
    names = int8_layers(model)
    if not names:
        raise ValueError("the model has no Linear layers inside decoder layers to quantise")
    q = copy.deepcopy(model).float().eval()
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = q.get_submodule(parent)
        setattr(owner, child, Int8Linear(getattr(owner, child), per_channel))
    q.rlvr_quantized = "int8"
    return q


def is_quantized(model: nn.Module) -> bool:
    return getattr(model, "rlvr_quantized", None) is not None


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights: parameters plus the int8 layers' weights, scales and biases."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for m in model.modules():
        if isinstance(m, Int8Linear):
            total += sum(t.numel() * t.element_size() for t in (m.weight_int8, m.scale, m.bias) if t is not None)
    return total
