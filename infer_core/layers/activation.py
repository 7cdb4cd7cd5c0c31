"""SiLU-and-mul: the gated activation of Llama-family MLPs on the fused gate_up output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infer_core.layers import cpu_activation, fused


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` over ``[..., 2I]``: our Triton kernel where built for it, on the CPU the one-pass C
    kernel (``cpu_activation.py``) where it builds, else the torch code below.

    It has no tensors: the device it is built for is the default device when built (the runner builds the
    model under ``torch.device``).
    """

    def __init__(self) -> None:
        super().__init__()
        device = torch.get_default_device()
        self.triton = fused.runs_triton(fused.SILU_AND_MUL, device)
        self.cpu_kernel = cpu_activation.load() if not self.triton and device.type == "cpu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.triton:
            from infer_core.layers.fused.silu_and_mul import silu_and_mul

            return silu_and_mul(x)
        if self.cpu_kernel is not None and cpu_activation.takes(x):
            return cpu_activation.silu_and_mul(self.cpu_kernel, x)
        return self.forward_torch(x)

    def forward_torch(self, x: torch.Tensor) -> torch.Tensor:
        """The reference: what the CPU runs, and what the kernel must reproduce."""
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
