"""An RMSNorm and the linear layer it feeds (then SiLU-and-mul) in one launch at decode sizes.

A decoder layer's input norm feeds qkv_proj; its post-attention norm feeds gate_up_proj, which applies
SiLU-and-mul. The norm hands its output on uncomputed (``layers/norm.py``'s ``NormedInput``) and the layer's
LinearMethod may compute it in its own GEMV launch (``LinearMethod.apply_with_norm``, the seam a quantizer's
method implements too). For the dense method, at 1-2 rows (where the dense layers run our GEMV)
``fused/norm_gemv.py`` does each chain in one launch, with the same bits as the norm, GEMV and SiLU-and-mul
kernels one after the other. Whether a layer can is decided when it is built (:func:`fuses_input_norm`);
per call the method checks only the row count. Everything else (prefill, a method without such a kernel, the
CPU) runs the layers one after the other. This module never imports triton: the kernel module is imported
on the first fused call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from infer_core.layers import fused
from infer_core.layers.fused.dense import GEMV_MAX_ROWS

if TYPE_CHECKING:
    from infer_core.layers.linear import LinearBase
    from infer_core.layers.norm import NormedInput, RMSNorm

MAX_FUSED_K = 16384  # fused/rms_norm.py's MAX_SINGLE_PASS (not imported: it imports triton); longer rows unfused


def fuses_input_norm(norm: RMSNorm, linear: LinearBase) -> bool:
    """Whether ``linear`` runs ``norm`` (and its activation) in its method's own launch at decode sizes: asked of
    the method (``LinearMethod.fuses_input_norm``) only where the norm hands its output on uncomputed (it runs
    our Triton kernel) and the fusions are on (``fused.NORM_GEMV``)."""
    return (fused.runs_triton(fused.NORM_GEMV, norm.weight.device) and norm.triton
            and linear.method.fuses_input_norm(linear, norm))


def dense_fuses_input_norm(norm: RMSNorm, linear: LinearBase) -> bool:
    """The dense method's answer: where the norm, the dense GEMV and the activation would each run our Triton
    kernels anyway (``fused/norm_gemv.py`` gives their bits)."""
    method, act = linear.method, linear.act
    return (method.gemv and (act is None or act.triton) and linear.input_size <= MAX_FUSED_K
            and norm.weight.dtype == linear.weight.dtype)


def decode_sized(normed: NormedInput) -> bool:
    """The per-call check of the dense fused launch: 1 to ``GEMV_MAX_ROWS`` rows (where the GEMV would run)."""
    x = normed.x
    return len(x.shape) == 2 and 0 < x.shape[0] <= GEMV_MAX_ROWS


def norm_gemv(normed: NormedInput, linear: LinearBase, bias: torch.Tensor | None,
              normed_out: torch.Tensor | None = None) -> torch.Tensor:
    """``linear(norm(x + residual))`` (then SiLU-and-mul) in one launch on the dense weight, ``x + residual``
    into ``residual_out`` (and the norm's output into ``normed_out`` where given)."""
    from infer_core.layers.fused.norm_gemv import rms_norm_gemv

    norm = normed.norm
    out = rms_norm_gemv(normed.x, norm.weight, norm.eps, linear.weight, bias, normed.residual,
                        silu=linear.act is not None, residual_out=normed.residual_out, normed_out=normed_out)
    return out if normed.residual is None else out[0]
