"""Split-K decode's merge: the splits' partial outputs weighted by their log-sum-exp, and the scratch they live in.

The decode kernel (decode_kernel.py) runs the merge in the program of the last split to finish (one launch), or
``_merge_splits_kernel`` runs it as a second launch; both call ``_merge_splits``, so their outputs are
bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from infer_core.layers.fused.pdl import pdl_enter


@triton.jit
def _merge_splits(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    req,
    kv_head,
    num_splits,
    stride_po_req,
    stride_po_h,
    stride_po_split,
    stride_pl_req,
    stride_pl_h,
    stride_out_t,
    stride_out_h,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """The query heads of one (request, KV head): the splits' partials weighted by exp2(lse - max lse).

    The sums run over the splits in order, element by element, so no bit depends on how Triton
    spreads a tile over threads (it differs between kernels, and a tree reduction's order with
    it): the one-launch and the two-launch merge agree exactly. Loads skip L1 (``.cg``): in the
    one-launch merge, other SMs wrote the partials.
    """
    rows = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + tl.where(rows < GROUP, rows, 0)  # padding rows redo the first head, unstored
    dims = tl.arange(0, HEAD_DIM)
    lse_ptrs = part_lse_ptr + req * stride_pl_req + heads * stride_pl_h
    part_ptrs = part_out_ptr + req * stride_po_req + heads[:, None] * stride_po_h + dims[None, :]
    splits = tl.arange(0, BLOCK_S)
    lse_all = tl.load(
        lse_ptrs[:, None] + splits[None, :],
        mask=splits[None, :] < num_splits,
        other=float("-inf"),
        cache_modifier=".cg",
    )
    lse_max = tl.max(lse_all, 1)  # a maximum is exact in any order
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for split in tl.static_range(BLOCK_S):  # unrolled: the loads are independent, ptxas issues them early
        in_range = tl.full([BLOCK_H], split, tl.int32) < num_splits
        lse = tl.load(lse_ptrs + split, mask=in_range, other=float("-inf"), cache_modifier=".cg")
        part = tl.load(part_ptrs + split * stride_po_split, mask=in_range[:, None], other=0.0, cache_modifier=".cg")
        weight = tl.exp2(lse - lse_max)  # 0 for an empty split (lse -inf)
        total += weight
        acc += part * weight[:, None]
    out = out_ptr + req * stride_out_t + heads[:, None] * stride_out_h + dims[None, :]
    tl.store(out, (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=(rows < GROUP)[:, None])


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
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The two-launch merge: one program per (request, KV head)."""
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    _merge_splits(
        part_out_ptr, part_lse_ptr, out_ptr, tl.program_id(0).to(tl.int64), tl.program_id(1), num_splits,
        stride_po_req, stride_po_h, stride_po_split, stride_pl_req, stride_pl_h, stride_out_t, stride_out_h,
        GROUP, BLOCK_H, HEAD_DIM, BLOCK_S,
    )  # fmt: skip


@dataclass(slots=True)
class SplitScratch:
    """Preallocated state of split-K decode: partial outputs and log2-sum-exp per split, and split counters.

    The counters start at zero and every one-launch merge leaves them at zero, so one scratch
    serves every layer, step and CUDA-graph replay; they are indexed (request, KV head), sized
    by query heads (an upper bound for KV heads).
    """

    part_out: torch.Tensor  # float32 [num_seqs, num_heads, num_splits, head_dim]
    part_lse: torch.Tensor  # float32 [num_seqs, num_heads, num_splits]
    split_counts: torch.Tensor  # int32 [num_seqs, num_heads]: splits finished per (request, KV head)

    @classmethod
    def allocate(cls, num_seqs: int, num_heads: int, num_splits: int, head_dim: int, device) -> SplitScratch:
        return cls(
            torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=device),
            torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=device),
            torch.zeros(num_seqs, num_heads, dtype=torch.int32, device=device),
        )

    def fits(self, num_seqs: int, num_heads: int, num_splits: int, head_dim: int) -> bool:
        s, h, n, d = self.part_out.shape
        return s >= num_seqs and h >= num_heads and n >= num_splits and d == head_dim
