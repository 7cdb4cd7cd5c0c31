"""The step's batch split the way the two flash-attn calls want it; built once per step.

Requests ``[0, num_decodes)`` have one query token and go to ``flash_attn_with_kvcache``; the rest
(prefills, prefill chunks after a cached prefix, multi-token verifies) go to one
``flash_attn_varlen_func`` call. Host values (maximum lengths) are read here, from the ``*_cpu``
twins, so ``forward`` never synchronises with the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from infer_core.interfaces import BatchMetadata


@dataclass(slots=True)
class DecodeMetadata:
    """The one-token requests; every tensor is a view of the common metadata (CUDA-graph friendly)."""

    num_decodes: int
    cache_seqlens: torch.Tensor  # int32 [num_decodes], tokens in the cache, this step's included
    block_table: torch.Tensor  # int32 [num_decodes, max_blocks_per_req]


@dataclass(slots=True)
class PrefillMetadata:
    """The multi-token requests, with cumulative lengths rebased to their own first query token."""

    num_tokens: int  # query tokens of these requests
    cu_seqlens_q: torch.Tensor  # int32 [num_prefills + 1]
    cu_seqlens_k: torch.Tensor  # int32 [num_prefills + 1], cumulative cached+new tokens
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor  # int32 [num_prefills, max_blocks_per_req]


@dataclass(slots=True)
class FlashMetadata:
    common: BatchMetadata
    decode: DecodeMetadata | None
    prefill: PrefillMetadata | None

    @property
    def num_tokens(self) -> int:
        return self.common.num_tokens


def build_flash_metadata(common: BatchMetadata) -> FlashMetadata:
    num_decodes = common.num_decode_only
    decode = None
    if num_decodes:
        decode = DecodeMetadata(num_decodes, common.seq_lens[:num_decodes], common.block_tables[:num_decodes])
    prefill = None
    if num_decodes < common.num_reqs:
        query_start_cpu = common.query_start_loc_cpu[num_decodes:]
        query_lens_cpu = query_start_cpu[1:] - query_start_cpu[:-1]
        seq_lens = common.seq_lens[num_decodes : common.num_reqs]
        cu_seqlens_k = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
        torch.cumsum(seq_lens, dim=0, dtype=torch.int32, out=cu_seqlens_k[1:])
        first_token = int(query_start_cpu[0])  # == num_decodes: each decode has one token
        prefill = PrefillMetadata(
            num_tokens=common.num_tokens - first_token,
            cu_seqlens_q=(common.query_start_loc[num_decodes : common.num_reqs + 1] - first_token).to(torch.int32),
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=int(query_lens_cpu.max()),
            max_seqlen_k=int(common.seq_lens_cpu[num_decodes : common.num_reqs].max()),
            block_table=common.block_tables[num_decodes : common.num_reqs],
        )
    return FlashMetadata(common, decode, prefill)
