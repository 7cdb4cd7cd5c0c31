"""RMSNorm, optionally fused with the residual add that precedes it; and the residual stream's norm before a
sublayer, which the sublayer's first linear layer computes (in one launch with its GEMV where it can)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from infer_core.layers import cpu_elementwise, fused


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` computed in float32, as HF transformers does.

    With ``residual`` given, returns ``(norm(x + residual), x + residual)``: the sum is the next
    residual, so the decoder layer never materialises it twice. Runs our Triton kernel where it was
    built for it (``fused.runs_triton``), on the CPU the fused C kernel (``cpu_elementwise.py``) where it builds,
    else the torch code below.
    """

    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.triton = fused.runs_triton(fused.RMS_NORM, self.weight.device)
        on_cpu = not self.triton and self.weight.device.type == "cpu" and dtype in cpu_elementwise.DTYPES
        self.cpu_kernels = cpu_elementwise.load() if on_cpu else None

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def _kernel_takes(self, x: torch.Tensor, residual: torch.Tensor | None) -> bool:
        return self.triton and 1 <= x.dim() <= 3 and (residual is None or residual.dtype == x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self._kernel_takes(x, residual):
            from infer_core.layers.fused.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps, residual)
        return self.forward_host(x, residual)

    def forward_host(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Off our Triton kernels: the CPU's fused kernel where it takes the rows, else the torch code."""
        if (self.cpu_kernels is not None and x.dim() == 2 and cpu_elementwise.takes(x)
                and (residual is None or (residual.dtype == x.dtype and cpu_elementwise.takes(residual)))):
            return cpu_elementwise.add_rms_norm(self.cpu_kernels, x, residual, self.weight, self.eps)
        return self.forward_torch(x, residual)

    def forward_torch(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """The reference: what the kernels must reproduce."""
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def normalize_into(self, x: torch.Tensor, residual: torch.Tensor | None,
                       residual_out: torch.Tensor | None) -> torch.Tensor:
        """``norm(x + residual)``, writing ``x + residual`` into ``residual_out`` (residual None: ``norm(x)``)."""
        if self._kernel_takes(x, residual):
            from infer_core.layers.fused.rms_norm import rms_norm

            out = rms_norm(x, self.weight, self.eps, residual, residual_out=residual_out)
            return out if residual is None else out[0]
        return self._norm(x if residual is None else torch.add(x, residual, out=residual_out))


@dataclass(frozen=True, slots=True)
class NormedInput:
    """``norm(x + residual)`` not computed yet: the linear layer it feeds computes it (``LinearBase.forward``).

    Whoever computes it writes ``x + residual`` into ``residual_out``, the residual the norm already handed on;
    with ``residual`` None (the first layer) x itself is that residual and nothing is written.
    """

    x: torch.Tensor
    residual: torch.Tensor | None
    residual_out: torch.Tensor | None
    norm: RMSNorm

    def materialize(self) -> torch.Tensor:
        """The norm, by the norm's own kernel (and the sum into ``residual_out``)."""
        return self.norm.normalize_into(self.x, self.residual, self.residual_out)


class ResidualRMSNorm(RMSNorm):
    """The RMSNorm before a sublayer (attention, MLP): ``(norm(x + residual), x + residual)``.

    With ``residual`` None (the first layer) x itself is the residual: ``(norm(x), x)``. The first output
    goes to the sublayer's input projection, built with this norm as its ``input_norm`` (``layers/linear.py``).
    Where the norm was built for our kernels that output is a :class:`NormedInput`, computed by the
    projection, at decode sizes in the same launch as its GEMV; the residual returned is then the tensor that
    computation fills. Elsewhere (the CPU) both are computed here, as ``RMSNorm`` does off Triton.
    """

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.triton:
            if residual is None:
                return NormedInput(x, None, None, self), x
            residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            return NormedInput(x, residual, residual_out, self), residual_out
        if residual is None:
            return self.forward_host(x), x
        return self.forward_host(x, residual)
