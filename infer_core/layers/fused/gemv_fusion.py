"""RMSNorm -> linear layer (-> SiLU-and-mul) of a decoder layer: one launch at decode sizes, else the layers.

The decoder layer's input norm feeds qkv_proj, its post-attention norm feeds gate_up_proj and then
the activation. At 1-2 rows (where the dense layers run our GEMV) ``fused/norm_gemv.py`` does each
chain in one launch, with the same bits; everything else (prefill, a quantized layer, the CPU, the
torch impls) runs the layers one after the other, as they always ran. This module never imports
triton: the kernel module is imported on the first fused call.
"""

from __future__ import annotations

import torch

from infer_core.builtin.quant_none import UnquantizedLinearMethod
from infer_core.layers import fused
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.linear import LinearBase
from infer_core.layers.norm import RMSNorm

# What the decoder layers run on CUDA at decode sizes: TRITON fuses the chain where each layer would run
# Triton anyway (norm, dense GEMV, SiLU-and-mul), TORCH keeps the layers separate. Set per instance by ``impl``.
NORM_GEMV = fused.FusedImpl.TRITON
MAX_FUSED_K = 16384  # fused/rms_norm.py's MAX_SINGLE_PASS (not imported: it imports triton); longer rows unfused


class NormLinear:
    """``linear(norm(x + residual))`` (``act`` of it), and ``x + residual``: one launch where it can be.

    ``linear`` must compute ``method.apply(x, bias)`` and nothing more (replicated or column-parallel:
    the input is the same on every rank, so each rank fuses the same norm with its own shard). With
    ``act``, its output is ``[gate; up]`` halves of equal size, which a tensor-parallel shard keeps.
    """

    def __init__(self, norm: RMSNorm, linear: LinearBase, act: SiluAndMul | None = None) -> None:
        if type(linear).forward is not LinearBase.forward:
            raise ValueError(f"{type(linear).__name__} does more than method.apply (row-parallel all-reduce?): "
                             "only a replicated or column-parallel layer can be fused with the norm before it")
        if act is not None and (len(linear.output_sizes) != 2 or linear.output_sizes[0] != linear.output_sizes[1]):
            raise ValueError(f"SiLU-and-mul needs [gate; up] halves of one size, got {linear.output_sizes}")
        self.norm, self.linear, self.act = norm, linear, act
        self.impl = NORM_GEMV
        if isinstance(linear.method, UnquantizedLinearMethod):
            # unfused, the GEMV takes the tiles it has fused with the norm, so fusing changes no bit
            linear.method.after_rms_norm = True
            linear.method.before_silu = act is not None

    def fuses(self, x: torch.Tensor, residual: torch.Tensor | None) -> bool:
        """One launch where norm, dense GEMV (and SiLU-and-mul) would each run our Triton kernels on x."""
        method = self.linear.method
        return (self.impl is fused.FusedImpl.TRITON and isinstance(method, UnquantizedLinearMethod)
                and x.dim() == 2 and x.shape[-1] <= MAX_FUSED_K and self.norm.weight.dtype == x.dtype
                and self.norm.uses_triton(x, residual) and method.uses_gemv(self.linear, x)
                and (self.act is None or self.act.uses_triton(x)))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, next residual)``; with ``residual`` None (the first layer) x itself is the residual."""
        if not self.fuses(x, residual):
            return self._unfused(x, residual)
        from infer_core.layers.fused.norm_gemv import rms_norm_gemv

        out = rms_norm_gemv(x, self.norm.weight, self.norm.eps, self.linear.weight, self.linear.bias, residual,
                            silu=self.act is not None)
        return out if residual is not None else (out, x)

    def _unfused(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            normed, residual = self.norm(x), x
        else:
            normed, residual = self.norm(x, residual)
        out = self.linear(normed)
        return (out if self.act is None else self.act(out)), residual
