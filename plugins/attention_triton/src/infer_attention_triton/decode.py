"""Decode attention's launch: the arguments checked, the grid (a request, a KV head and a split of its context a
program), and the split merge's second launch where asked; ``decode_kernel.py`` holds the kernel and how it works.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infer_core.layers.fused import use_pdl

from infer_attention_triton.decode_kernel import LOG2E, _decode_kernel
from infer_attention_triton.split_merge import SplitScratch, _merge_splits_kernel
from infer_attention_triton.tiles import DecodeTiles, dot_precision, is_interpreted


def decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    num_splits: int,
    tiles: DecodeTiles,
    sliding_window: int | None = None,
    scratch: SplitScratch | None = None,
    merge_in_kernel: bool = True,
    req_order: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Attention of ``q[i]`` (``[num_seqs, num_heads, head_dim]``) over the first ``seq_lens[i]`` cached tokens.

    Writes ``out[:num_seqs]``. ``block_tables``/``seq_lens`` may be longer than ``q`` (their first
    ``num_seqs`` rows are used). With ``num_splits > 1`` the partials go to ``scratch``, which
    must hold at least ``[num_seqs, num_heads, num_splits, head_dim]``; they are merged in the
    same launch, or by a second one with ``merge_in_kernel=False`` (the same bits, one more launch).
    ``req_order`` (int32, a permutation of ``range(num_seqs)``): the order the requests' programs
    are launched in, longest context first (``BatchMetadata.decode_order``); it changes no bit of
    ``out``, only which programs end last. A float8 e4m3 ``kv_cache`` holds K / ``k_scale`` and
    V / ``v_scale``; other caches ignore the scales.
    """
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads, page_size = kv_cache.shape[3], kv_cache.shape[2]
    group = num_heads // num_kv_heads
    if num_seqs == 0:
        return
    is_split = num_splits > 1
    if is_split:
        if scratch is None or not scratch.fits(num_seqs, num_heads, num_splits, head_dim):
            raise ValueError(
                f"split-K decode with {num_splits} splits needs scratch for "
                f"[{num_seqs}, {num_heads}, {num_splits}, {head_dim}]"
            )
        part_out, part_lse, split_counts = scratch.part_out, scratch.part_lse, scratch.split_counts
    else:
        part_out = part_lse = split_counts = out  # unused by the kernel when not split
    po_strides = part_out.stride()[:3] if is_split else (0, 0, 0)
    pl_strides = part_lse.stride()[:2] if is_split else (0, 0)
    merge_in_kernel = merge_in_kernel and is_split
    block_h, block_s = triton.next_power_of_2(group), triton.next_power_of_2(num_splits)
    kv_fp8 = kv_cache.dtype == torch.float8_e4m3fn
    fp8_as = tl.float32 if q.dtype == torch.float32 else tl.float16  # an FP8 cache's dots (see decode_kernel.py)
    pdl = use_pdl(q)
    _decode_kernel[(num_kv_heads, num_seqs, num_splits)](
        q,
        kv_cache,
        block_tables,
        seq_lens,
        seq_lens if req_order is None else req_order,  # unread without an order
        out,
        part_out,
        part_lse,
        split_counts,
        scale * LOG2E * k_scale if kv_fp8 else scale * LOG2E,
        sliding_window or 0,
        num_splits,
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        *po_strides,
        *pl_strides,
        split_counts.stride(0) if is_split else 0,
        v_scale if kv_fp8 else None,
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_N=tiles.block_n,
        PAGE_SIZE=page_size,
        IS_SPLIT=is_split,
        MERGE=merge_in_kernel,
        BLOCK_H=block_h if merge_in_kernel else 1,  # unused otherwise: no kernel variant per split count
        BLOCK_S=block_s if merge_in_kernel else 1,
        USE_WINDOW=sliding_window is not None,
        DOT_PRECISION=dot_precision(q.dtype),
        UPCAST=is_interpreted(),
        HAS_ORDER=req_order is not None,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        USE_PDL=pdl, PREFETCH_LINES=max(1, head_dim * kv_cache.element_size() // 128) if pdl else 0,
        KV_FP8=kv_fp8, FP8_AS=fp8_as,
        CLAMP_Q=kv_fp8 and q.dtype == torch.bfloat16, launch_pdl=pdl,
    )
    if is_split and not merge_in_kernel:
        _merge_splits_kernel[(num_seqs, num_kv_heads)](
            part_out,
            part_lse,
            out,
            num_splits,
            *po_strides,
            *pl_strides,
            out.stride(0),
            out.stride(1),
            GROUP=group,
            BLOCK_H=block_h,
            HEAD_DIM=head_dim,
            BLOCK_S=block_s,
            num_warps=4 if head_dim >= 128 else 2,
            USE_PDL=pdl, launch_pdl=pdl,
        )
