"""Training precision: the contexts a training forward runs in, and the machine's native choice.

- ``training_attention(model, precision)``: the SDPA backend of the GRPO update's forward
  (``precision`` is ``"model"`` or ``"bf16"``, the names of ``rollout.engine.PRECISIONS``).
- ``hf_training_attention(model, precision)``: the attention implementation of a Hugging Face
  forward under bf16 autocast on CPU (pretraining's).
- ``native_precision(device)``: ``"bf16"`` where the device multiplies bf16 natively (a CPU with
  AVX512-BF16 or AMX, a CUDA GPU with bf16), else ``"model"``: the quickstart's default.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from rlvr.rollout.engine import PRECISIONS, precision_autocast


def training_attention(model, precision: str):
    """The SDPA backend of the training forward: under bf16 autocast on CPU, the math backend
    (attention as batched matmuls, differentiated op by op), because the CPU flash kernel's bf16
    backward is slow (profiled at the benchmark's packed shapes, 13-14 rows x 196 tokens: 28 ms
    per layer against 13 ms in fp32, 6x its forward). Forward + backward measured 8% faster on
    the small benchmark model, 2% on the medium one (``docs/training_step.md``). Elsewhere (fp32,
    GPU) torch's default choice."""
    if PRECISIONS[precision] is None or next(model.parameters()).device.type != "cpu":
        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


@contextlib.contextmanager
def hf_training_attention(model, precision: str):
    """Under bf16 on CPU, the model's ``eager`` attention (matmul, softmax in float32, matmul)
    instead of SDPA, restored on exit (it is not saved with the model either): the CPU flash
    kernel's bf16 backward is slow. A pretraining step of the quickstart's model (32 x 128 rows,
    docs/benchmarks.md): eager 171 ms, SDPA's math backend 197, its flash kernel 213, fp32 262.
    Elsewhere, and for a model without ``set_attn_implementation``, nothing changes."""
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    switch = (PRECISIONS[precision] is not None and next(model.parameters()).device.type == "cpu"
              and before not in (None, "eager") and hasattr(model, "set_attn_implementation"))
    if switch:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if switch:
            model.set_attn_implementation(before)


def native_precision(device: str | torch.device = "cpu") -> str:
    """``"bf16"`` where ``device`` runs bf16 matrix multiplies in hardware, else ``"model"``: on
    CPU, AVX512-BF16 or AMX (elsewhere torch emulates bf16 GEMMs, slower than fp32); on CUDA,
    ``torch.cuda.is_bf16_supported()``. Other devices: ``"model"``."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "model"
    if kind == "cpu":
        cpu = torch.cpu
        native = getattr(cpu, "_is_avx512_bf16_supported", lambda: False)() or \
            getattr(cpu, "_is_amx_tile_supported", lambda: False)()
        return "bf16" if native else "model"
    return "model"
