"""The fast decoder's matrix multiplies: how its weight matrices are stored, and the GEMMs on them.

- ``WeightFormat`` turns a ``[out, in]`` parameter into what ``lin`` multiplies with: stored
  ``[in, out]`` (``x @ w``), a transposed view of the parameter or, for a small CPU model and
  for ``matmul_dtype``, a per-call copy; where this torch has oneDNN's packed linear (x86 CPU
  builds, probed once per dtype by ``onednn_linear_available``) those CPU copies are
  oneDNN-packed matrices instead. The fused ``[q; k; v]`` and ``[gate; up]`` weights are
  concatenated copies in the same format.
- ``lin`` / ``lin_res``: ``x @ w (+ b)`` and ``x + h @ w (+ b)`` on either storage, with a GEMM in
  the weights' dtype when it differs from the activations' (``matmul_dtype``).
- ``Int8Matrix``: the weights of dynamic int8 Linear layers (``model/quantize.py``) as ``lin``
  multiplies with them: torch's packed int8 weights (fbgemm), fused ``[q; k; v]`` / ``[gate; up]``
  by stacking the layers' int8 rows and per-row scales (``int8_fused``), so the fused GEMM uses
  the very int8 weights of the separate layers; activations are quantised per call, one scale per
  input tensor, exactly as the modules' own forward does it (``quantized.linear_dynamic`` with
  ``reduce_range``).

Why these formats (plain GEMM vs ``F.linear``, oneDNN vs MKL at decode shapes): docs/rollout.md,
"Weights".
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

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
    """Whether ``m`` is a dynamic int8 Linear (``torch.ao.nn.quantized.dynamic.Linear`` with
    qint8 weights, what ``quantize_int8`` makes)."""
    packed = getattr(m, "_packed_params", None)
    return packed is not None and getattr(packed, "dtype", None) == torch.qint8


class Int8Matrix:
    """Packed int8 weights (one scale per output row) and their fp32 bias, for ``lin``."""

    __slots__ = ("packed", "out_features")

    def __init__(self, packed, out_features: int):
        self.packed, self.out_features = packed, out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)  # as the module's forward


def int8_fused(*linears) -> Int8Matrix:
    """Dynamic int8 Linear modules with one input as one ``Int8Matrix`` whose output is their
    outputs concatenated: the same int8 rows and scales (a layer quantised per tensor gives its
    one scale to each of its rows), the biases concatenated."""
    if len(linears) == 1:
        m = linears[0]
        return Int8Matrix(m._packed_params._packed_params, m.out_features)
    reprs, scales, zeros, biases = [], [], [], []
    for m in linears:
        w, b = m._weight_bias()
        rows = w.shape[0]
        reprs.append(w.int_repr())
        if w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            scales.append(w.q_per_channel_scales().double())
            zeros.append(w.q_per_channel_zero_points().long())
        else:
            scales.append(torch.full((rows,), w.q_scale(), dtype=torch.float64))
            zeros.append(torch.full((rows,), w.q_zero_point(), dtype=torch.long))
        biases.append(b if b is not None else torch.zeros(rows))
    q = torch._make_per_channel_quantized_tensor(torch.cat(reprs), torch.cat(scales), torch.cat(zeros), 0)
    bias = None if all(m._weight_bias()[1] is None for m in linears) else torch.cat(biases).float()
    return Int8Matrix(torch.ops.quantized.linear_prepack(q, bias), q.shape[0])


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
