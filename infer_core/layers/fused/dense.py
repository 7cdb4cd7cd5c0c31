"""Dense ``y = x W^T + b``: cuBLAS, or our Triton GEMV where it measured faster (decode batches of 1-2 rows).

Shared by the dense linear layers (``layers/unquantized.py``) and the LM head, so both pick the kernel by the
same rule: the layer decides when it is built whether it runs the GEMV at all (``fused.runs_triton(fused.GEMV,
device)``), and per call :func:`use_gemv` checks that x is a decode-sized batch the kernel takes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GEMV_DTYPES = (torch.bfloat16, torch.float16)
# Up to this many rows the GEMV is faster than cuBLAS (benchmarks/gemv.py: one decode step's projections, CUDA
# graph, L2 flushed); from 4 rows it is not. The kernel takes up to fused.gemv.MAX_ROWS (not imported here:
# that module imports triton).
GEMV_MAX_ROWS = 2


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x is a decode-sized batch of half-precision rows the GEMV takes (F.linear otherwise)."""
    return (x.dtype in GEMV_DTYPES and weight.dtype == x.dtype and x.dim() >= 1
            and 0 < x.numel() <= GEMV_MAX_ROWS * x.shape[-1] and weight.stride(-1) == 1)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gemv: bool, *,
                 after_rms_norm: bool = False, before_silu: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, by the GEMV kernel where the layer was built for it (``gemv``) and
    :func:`use_gemv` holds.

    ``after_rms_norm``: x is an RMSNorm's output; the GEMV then takes the tiles it has fused with that
    norm (``fused.gemv.config_after_rms_norm``; ``before_silu``: gate_up's, followed by SiLU-and-mul), so
    fused or not gives the same bits.
    """
    if gemv and use_gemv(x, weight):
        from infer_core.layers.fused.gemv import gemv as gemv_kernel

        return gemv_kernel(x, weight, bias, after_rms_norm=after_rms_norm, before_silu=before_silu)
    return F.linear(x, weight, bias)
