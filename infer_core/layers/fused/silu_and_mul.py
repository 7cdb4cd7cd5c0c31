"""SiLU-and-mul: ``silu(x[..., :I]) * x[..., I:]`` of the fused gate_up output, one read and one write.

Numerics are those of ``infer_core.layers.activation.SiluAndMul`` (torch eager): ``silu`` is
computed in float32 and rounded to the input dtype, then multiplied by ``up`` and rounded again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n_inter, stride_x_t, stride_x_c, stride_out_t, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_inter
    row = x_ptr + token * stride_x_t
    gate = tl.load(row + cols * stride_x_c, mask=mask, other=0.0)
    up = tl.load(row + (cols + n_inter) * stride_x_c, mask=mask, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(out_ptr + token * stride_out_t + cols, (silu * up.to(tl.float32)).to(dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2I] -> [..., I]``; the output is a new contiguous tensor."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dim (gate and up halves), got {tuple(x.shape)}")
    n_inter = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], n_inter), dtype=x.dtype, device=x.device)
    rows = x.reshape(-1, x.shape[-1])  # a view for the usual [T, 2I] (strided rows included)
    if rows.shape[0] == 0 or n_inter == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(n_inter))
    pdl = use_pdl(x)
    _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(n_inter, block))](
        rows, out, n_inter, rows.stride(0), rows.stride(1), n_inter, BLOCK=block, num_warps=4,
        USE_PDL=pdl, launch_pdl=pdl,
    )
    return out
