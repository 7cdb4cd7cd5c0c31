"""SiLU-and-mul: the gated activation of Llama-family MLPs on the fused gate_up output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infer_core.layers import fused


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` over ``[..., 2I]``: a Triton kernel on CUDA, the torch code below elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        self.impl = fused.SILU_AND_MUL
        self.force_triton = False  # tests: the kernel on CPU tensors too (Triton's interpreter)

    def uses_triton(self, x: torch.Tensor) -> bool:
        """Whether ``forward`` runs the Triton kernel on ``x`` (else the torch code)."""
        return self.impl is fused.FusedImpl.TRITON and (x.is_cuda or self.force_triton) and fused.triton_available()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.uses_triton(x):
            from infer_core.layers.fused.silu_and_mul import silu_and_mul

            return silu_and_mul(x)
        return self.forward_torch(x)

    def forward_torch(self, x: torch.Tensor) -> torch.Tensor:
        """The reference: what the CPU runs, and what the kernel must reproduce."""
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
