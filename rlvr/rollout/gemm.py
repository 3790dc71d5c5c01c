"""The fast decoder's matrix multiplies: how its weight matrices are stored, and the GEMMs on them.

- ``WeightFormat`` turns a ``[out, in]`` parameter into what ``lin`` multiplies with: stored
  ``[in, out]`` (``x @ w``), a transposed view of the parameter or, for a small CPU model and
  for ``matmul_dtype``, a per-call copy; where this torch has oneDNN's packed linear (x86 CPU
  builds, probed once per dtype by ``onednn_linear_available``) those CPU copies are
  oneDNN-packed matrices instead. The fused ``[q; k; v]`` and ``[gate; up]`` weights are
  concatenated copies in the same format.
- ``lin`` / ``lin_res``: ``x @ w (+ b)`` and ``x + h @ w (+ b)`` on either storage, with a GEMM in
  the weights' dtype when it differs from the activations' (``matmul_dtype``).
- ``Int8Matrix``: the weights of ``model/quantize.py``'s ``Int8Linear`` layers as ``lin``
  multiplies with them: fused ``[q; k; v]`` / ``[gate; up]`` by putting the layers' int8 columns
  and per-column scales side by side (``int8_fused``), through the modules' own ``int8_linear``
  (per-token int8 activations, exact int32 accumulation), so the fused GEMM gives the separate
  layers' outputs bit for bit.

Why these formats (plain GEMM vs ``F.linear``, oneDNN vs MKL at decode shapes): docs/rollout.md,
"Weights".
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from rlvr.model.quantize import Int8Linear, int8_linear

PACK_ROWS = 64  # the batch size oneDNN's weight layout is chosen for (any batch size runs)
SMALL_CPU_PARAMS = 64_000_000  # up to this many parameters, a CPU model's matrices are copied


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
            y = torch.ops.mkldnn._linear_pointwise(x, pack(w, dtype), None, "none", [], "")
            return bool(torch.allclose(y.float(), F.linear(x.float(), w.float()), atol=0.05))
    except RuntimeError:
        return False


def pack(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A [out, in] weight as a oneDNN-packed copy in ``dtype`` (an opaque ``torch._mkldnn``
    tensor that only ``lin`` reads)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.to(dtype).contiguous(), PACK_ROWS)


class WeightFormat:
    """How one model's weight matrices are stored for ``lin`` (see the module docstring).
    ``matmul_dtype`` (None: the model's ``dtype``) is the GEMMs' dtype."""

    def __init__(self, device: torch.device, dtype: torch.dtype, matmul_dtype: torch.dtype | None,
                 num_params: int):
        self.matmul_dtype = matmul_dtype
        self.small_cpu = device.type == "cpu" and num_params <= SMALL_CPU_PARAMS
        self.gemm_dtype = matmul_dtype or dtype
        self.packed = (device.type == "cpu" and (self.small_cpu or matmul_dtype is not None)
                       and onednn_linear_available(self.gemm_dtype))

    def matrix(self, w: torch.Tensor) -> torch.Tensor:
        """One [out, in] parameter as an [in, out] matrix (or packed)."""
        if self.packed:
            return pack(w.detach(), self.gemm_dtype)
        w = w.detach().t()
        if self.matmul_dtype is not None:  # one copy: cast and made contiguous together
            return w.to(self.gemm_dtype, memory_format=torch.contiguous_format)
        return w.contiguous() if self.small_cpu else w

    def fused(self, *ws: torch.Tensor) -> torch.Tensor:
        """[W1; W2; ...] as one [in, out_total] matrix (or packed): a copy, made once per call."""
        if self.packed:
            return pack(torch.cat([w.detach() for w in ws]), self.gemm_dtype)
        cat = torch.cat([w.detach().t() for w in ws], dim=1)
        return cat.to(self.gemm_dtype)  # no copy when it is already the model's dtype


def is_int8_linear(m) -> bool:
    """Whether ``m`` is ``model/quantize.py``'s ``Int8Linear``."""
    return isinstance(m, Int8Linear)


class Int8Matrix:
    """int8 weights [out, in], their per-row scales and fp32 bias, for ``lin``
    (``model/quantize.py``'s ``int8_linear``: per-token int8 activations)."""

    __slots__ = ("weight", "scale", "bias")

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.scale, self.bias = weight, scale, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.weight, self.scale, self.bias)


def int8_fused(*linears) -> Int8Matrix:
    """``Int8Linear`` modules with one input as one ``Int8Matrix`` whose output is their outputs
    concatenated: their int8 rows, scales and biases stacked (zeros for a layer without
    a bias), so the fused GEMM gives each layer's output bit for bit."""
    if len(linears) == 1:
        m = linears[0]
        return Int8Matrix(m.weight_int8, m.scale, m.bias)
    bias = None
    if any(m.bias is not None for m in linears):
        bias = torch.cat([m.bias if m.bias is not None else m.scale.new_zeros(m.out_features) for m in linears])
    return Int8Matrix(torch.cat([m.weight_int8 for m in linears]),
                      torch.cat([m.scale for m in linears]), bias)


def fused_bias(*linears) -> torch.Tensor | None:
    """The biases of ``linears`` concatenated (zeros for one without), None when none has one."""
    if all(m.bias is None for m in linears):
        return None
    return torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.weight.shape[0])
                      for m in linears])


def bias(linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach()


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x @ w (+ b)`` in ``w``'s dtype, for ``x`` of that dtype (any leading dims)."""
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, w, None if b is None else b.to(w.dtype), "none", [], "")
    if b is None:
        return x @ w
    b = b.to(w.dtype)  # (a bias in the model's dtype next to bf16 GEMMs)
    return torch.addmm(b, x, w) if x.dim() == 2 else torch.addmm(b, x.flatten(0, -2), w).unflatten(0, x.shape[:-1])


def lin(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, keep: bool = False) -> torch.Tensor:
    """``x @ w (+ b)`` with ``w`` stored [in, out] (or oneDNN-packed). A ``w`` in another dtype
    (``matmul_dtype``) runs the GEMM in ``w``'s dtype and returns ``x``'s; ``keep=True`` leaves
    the result (bias included) in ``w``'s dtype, as autocast leaves a linear's output. An
    ``Int8Matrix`` carries its own bias (``b`` is None for it)."""
    if isinstance(w, Int8Matrix):
        return w(x)
    if w.dtype != x.dtype:
        if keep:
            return linear(x.to(w.dtype), w, b)
        y = linear(x.to(w.dtype), w, None).to(x.dtype)
        return y if b is None else y + b
    return linear(x, w, b)


def lin_res(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x + h @ w (+ b)`` for 2-D ``x``, the residual add fused into the GEMM when possible (a
    GEMM in another dtype is added to ``x`` in ``x``'s dtype)."""
    if isinstance(w, Int8Matrix):
        return x + w(h)
    if b is None and w.dtype == x.dtype == h.dtype:
        if w.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise.binary(h, x, w, None, "add")
        return torch.addmm(x, h, w)
    return x + lin(h, w, b, keep=True)
