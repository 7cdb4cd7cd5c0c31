"""Decode: one query token per request against its paged context, split-K (flash-decoding).

Each program takes one request, one KV head and one contiguous slice (split) of the context; the
query heads that share that KV head ride along as the rows of one tile, so K and V are read from
memory once. With several splits, a second kernel merges the partial results by their
log-sum-exp. A split whose slice is empty writes a zero weight, so the launch grid depends only
on the batch size and the split count, never on the lengths of this step (CUDA graphs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter

from infer_attention_triton.tiles import DecodeTiles, dot_precision, is_interpreted

LOG2E = 1.4426950408889634


@triton.jit
def _decode_kernel(
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    scale_log2,
    sliding_window,
    num_splits,
    stride_q_t,
    stride_q_h,
    stride_cache_kv,
    stride_cache_block,
    stride_cache_tok,
    stride_cache_h,
    stride_bt_req,
    stride_out_t,
    stride_out_h,
    stride_po_req,
    stride_po_h,
    stride_po_split,
    stride_pl_req,
    stride_pl_h,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    first_key = 0
    if USE_WINDOW:
        first_key = tl.maximum(seq_len - sliding_window, 0)
    # Splits own whole tiles; tiles start at multiples of BLOCK_N so none straddles a page.
    tiles_lo = first_key // BLOCK_N
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N) - tiles_lo, num_splits)
    lo = (tiles_lo + split * tiles_per_split) * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, seq_len)

    groups = tl.arange(0, BLOCK_G)
    heads = kv_head * GROUP + groups
    group_mask = groups < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + req.to(tl.int64) * stride_q_t + heads[:, None] * stride_q_h + dims[None, :],
        mask=group_mask[:, None],
        other=0.0,
    )

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    block_table = block_tables_ptr + req.to(tl.int64) * stride_bt_req
    k_base = cache_ptr + kv_head * stride_cache_h
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_mask = keys < hi
        if PAGE_SIZE % BLOCK_N == 0:
            page = tl.load(block_table + start // PAGE_SIZE).to(tl.int64)
        else:
            page = tl.load(block_table + keys // PAGE_SIZE, mask=key_mask, other=0).to(tl.int64)
        rows = page * stride_cache_block + (keys % PAGE_SIZE) * stride_cache_tok
        k = tl.load(k_base + rows[:, None] + dims[None, :], mask=key_mask[:, None], other=0.0)
        v = tl.load(k_base + stride_cache_kv + rows[:, None] + dims[None, :], mask=key_mask[:, None], other=0.0)
        if UPCAST:  # the interpreter's dot reads bfloat16 operands as raw bits: multiply in float32
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = s * scale_log2
        if USE_WINDOW:
            key_mask = key_mask & (keys >= first_key)
        s = tl.where(key_mask[None, :], s, float("-inf"))
        # Every split's first tile holds a visible key, so m_new is finite from the first tile on.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if UPCAST:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if IS_SPLIT:
        is_empty = l_i == 0.0
        acc = acc / tl.where(is_empty, 1.0, l_i)[:, None]
        lse = tl.where(is_empty, float("-inf"), m_i + tl.log2(tl.where(is_empty, 1.0, l_i)))
        part = part_out_ptr + req.to(tl.int64) * stride_po_req + split * stride_po_split
        tl.store(part + heads[:, None] * stride_po_h + dims[None, :], acc, mask=group_mask[:, None])
        tl.store(part_lse_ptr + req.to(tl.int64) * stride_pl_req + heads * stride_pl_h + split, lse, mask=group_mask)
    else:
        acc = acc / l_i[:, None]
        out = out_ptr + req.to(tl.int64) * stride_out_t + heads[:, None] * stride_out_h + dims[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=group_mask[:, None])


@triton.jit
def _merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_splits,
    stride_po_req,
    stride_po_h,
    stride_po_split,
    stride_pl_req,
    stride_pl_h,
    stride_out_t,
    stride_out_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program per (request, query head): weights each split by exp2(lse - max lse)."""
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    req = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    split_mask = splits < num_splits
    lse = tl.load(
        part_lse_ptr + req * stride_pl_req + head * stride_pl_h + splits, mask=split_mask, other=float("-inf")
    )
    weight = tl.exp2(lse - tl.max(lse, 0))
    weight = weight / tl.sum(weight, 0)
    dims = tl.arange(0, HEAD_DIM)
    parts = tl.load(
        part_out_ptr + req * stride_po_req + head * stride_po_h + splits[:, None] * stride_po_split + dims[None, :],
        mask=split_mask[:, None],
        other=0.0,
    )
    out = tl.sum(parts * weight[:, None], 0)
    tl.store(out_ptr + req * stride_out_t + head * stride_out_h + dims, out.to(out_ptr.dtype.element_ty))


@dataclass(slots=True)
class SplitScratch:
    """Preallocated partial results of split-K decode: outputs and log2-sum-exp per split."""

    part_out: torch.Tensor  # float32 [num_seqs, num_heads, num_splits, head_dim]
    part_lse: torch.Tensor  # float32 [num_seqs, num_heads, num_splits]

    @classmethod
    def allocate(cls, num_seqs: int, num_heads: int, num_splits: int, head_dim: int, device) -> SplitScratch:
        return cls(
            torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=device),
            torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=device),
        )

    def fits(self, num_seqs: int, num_heads: int, num_splits: int, head_dim: int) -> bool:
        s, h, n, d = self.part_out.shape
        return s >= num_seqs and h >= num_heads and n >= num_splits and d == head_dim


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
) -> None:
    """Attention of ``q[i]`` (``[num_seqs, num_heads, head_dim]``) over the first ``seq_lens[i]`` cached tokens.

    Writes ``out[:num_seqs]``. ``block_tables``/``seq_lens`` may be longer than ``q`` (their first
    ``num_seqs`` rows are used). With ``num_splits > 1`` the partials go to ``scratch``, which
    must hold at least ``[num_seqs, num_heads, num_splits, head_dim]``.
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
        part_out, part_lse = scratch.part_out, scratch.part_lse
    else:
        part_out, part_lse = out, out  # unused by the kernel when not split
    po_strides = part_out.stride()[:3] if is_split else (0, 0, 0)
    pl_strides = part_lse.stride()[:2] if is_split else (0, 0)
    pdl = use_pdl(q)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        kv_cache,
        block_tables,
        seq_lens,
        out,
        part_out,
        part_lse,
        scale * LOG2E,
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
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_N=tiles.block_n,
        PAGE_SIZE=page_size,
        IS_SPLIT=is_split,
        USE_WINDOW=sliding_window is not None,
        DOT_PRECISION=dot_precision(q.dtype),
        UPCAST=is_interpreted(),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        USE_PDL=pdl, launch_pdl=pdl,
    )
    if is_split:
        _merge_splits_kernel[(num_seqs, num_heads)](
            part_out,
            part_lse,
            out,
            num_splits,
            *po_strides,
            *pl_strides,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_S=triton.next_power_of_2(num_splits),
            num_warps=4 if head_dim >= 128 else 2,
            USE_PDL=pdl, launch_pdl=pdl,
        )
