"""int8 weight quantisation of a causal LM's decoder Linear layers, for serving on CPU.

``quantize_int8(model)`` runs PyTorch's dynamic quantisation
(``torch.ao.quantization.quantize_dynamic``; int8 weights with one scale per output channel,
``per_channel_dynamic_qconfig``, the usual granularity for LLM weights; activations quantised per
forward at run time; fbgemm/oneDNN int8 GEMMs) on every ``nn.Linear`` inside the decoder layers:
attention q/k/v/o and the MLP. ``per_channel=False`` takes PyTorch's default qconfig instead (one
scale per weight matrix): on the quickstart policy it cost 1.25 points of held-out pass@1 where
per-channel cost none (docs/fast_mode.md). The LM head and the
embeddings stay in full precision, as PyTorch's dynamic-quantisation guide and the usual LLM recipe
do (``nn.Embedding`` is not a dynamic-quantisation target, and the head, often tied to the
embedding, is the layer most sensitive to rounding). It returns a copy; the original model is
untouched.

Where it runs: the quantised Linear modules have packed int8 weights, not tensors, so rlvr's fast
decoder (which reads and fuses the weight matrices) refuses the model
(``decoder.unsupported_reason``) and ``engine.generate`` / ``speculative_generate`` run it on
the Hugging Face backend. Training and ``load_weights`` are not supported on it (no autograd
through the int8 GEMM).

Why this API: it is the int8 path that ships inside this torch (2.13, no extra package). PyTorch
marks ``torch.ao.quantization`` deprecated in favour of ``torchao`` (its ``quantize_`` API); the
call still works here, and its DeprecationWarning is silenced for this call only. Accuracy cost:
measured by ``benchmarks/fast_decode.py`` (held-out pass@1 with and without int8; docs/serve.md,
"Fast mode").
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn


def int8_layers(model: nn.Module) -> list[str]:
    """Names of the ``nn.Linear`` modules ``quantize_int8`` converts: those inside the decoder
    layers (not the LM head)."""
    head = model.get_output_embeddings()
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and m is not head and ".layers." in f".{name}"]


def quantize_int8(model: nn.Module, per_channel: bool = True) -> nn.Module:
    """A copy of ``model`` (on CPU, in eval mode) with its decoder Linear layers in dynamic int8
    (one weight scale per output channel, or per matrix with ``per_channel=False``)."""
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 dynamic quantisation runs on CPU; move the model to CPU first")
    names = int8_layers(model)
    if not names:
        raise ValueError("the model has no Linear layers inside decoder layers to quantise")
    q = copy.deepcopy(model).float().eval()
    from torch.ao.quantization import (
        default_dynamic_qconfig,
        per_channel_dynamic_qconfig,
        quantize_dynamic,
    )

    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_(tensor|channel).*")
        quantize_dynamic(q, {name: qconfig for name in names}, dtype=torch.qint8, inplace=True)
    q.rlvr_quantized = "int8"
    return q


def is_quantized(model: nn.Module) -> bool:
    return getattr(model, "rlvr_quantized", None) is not None


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights: parameters plus the int8 packed weights and their biases
    (the per-channel scales, 8 bytes per output row, not counted)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for m in model.modules():
        if hasattr(m, "_weight_bias"):  # a dynamic int8 Linear: packed weight and fp32 bias
            w, b = m._weight_bias()
            total += w.numel() * w.element_size() + (0 if b is None else b.numel() * b.element_size())
    return total
