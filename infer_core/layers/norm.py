"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
from torch import nn

from infer_core.layers import fused


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` computed in float32, as HF transformers does.

    With ``residual`` given, returns ``(norm(x + residual), x + residual)``: the sum is the next
    residual, so the decoder layer never materialises it twice.
    """

    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.impl = fused.RMS_NORM
        self.force_triton = False  # tests: the kernel on CPU tensors too (Triton's interpreter)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def uses_triton(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> bool:
        """Whether ``forward`` runs the Triton kernel on these inputs (else the torch code)."""
        return (self.impl is fused.FusedImpl.TRITON and (x.is_cuda or self.force_triton) and fused.triton_available()
                and 1 <= x.dim() <= 3 and (residual is None or residual.dtype == x.dtype))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.uses_triton(x, residual):
            from infer_core.layers.fused.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps, residual)
        return self.forward_torch(x, residual)

    def forward_torch(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """The reference: what the CPU runs, and what the kernel must reproduce."""
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
