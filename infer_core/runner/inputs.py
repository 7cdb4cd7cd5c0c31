"""Turning a SchedulerOutput into the flat batch of one forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from infer_core.interfaces import BatchMetadata, SchedulerOutput
from infer_core.runner.state import RequestState


@dataclass(slots=True)
class StepInputs:
    request_ids: list[str]  # batch order: decode-only requests first
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    metadata: BatchMetadata
    logits_indices: torch.Tensor  # flat-batch index of every position whose logits are sampled
    sample_rows: list[int]  # batch index of the request each sampled position belongs to


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def build_step_inputs(
    output: SchedulerOutput, states: dict[str, RequestState], block_size: int, device: torch.device
) -> StepInputs:
    scheduled = output.num_scheduled_tokens
    # Decode-only requests (one query token) first; stable, so schedule order is kept otherwise.
    request_ids = sorted(scheduled, key=lambda rid: scheduled[rid] != 1)
    num_reqs = len(request_ids)
    query_lens = np.array([scheduled[rid] for rid in request_ids], dtype=np.int32)
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(query_lens, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])

    input_ids = np.empty(num_tokens, dtype=np.int64)
    positions = np.empty(num_tokens, dtype=np.int64)
    seq_lens = np.empty(num_reqs, dtype=np.int32)
    max_blocks = max(len(states[rid].block_ids) for rid in request_ids)
    block_tables = np.zeros((num_reqs, max_blocks), dtype=np.int32)
    logits_indices: list[int] = []
    sample_rows: list[int] = []
    for i, rid in enumerate(request_ids):
        state = states[rid]
        start, end = query_start_loc[i], query_start_loc[i + 1]
        computed = state.num_computed_tokens
        fed = state.token_ids[computed : computed + query_lens[i]]
        spec = output.spec_token_ids.get(rid, [])
        input_ids[start:end] = fed + spec[: query_lens[i] - len(fed)]
        positions[start:end] = np.arange(computed, computed + query_lens[i])
        seq_lens[i] = computed + query_lens[i]
        if seq_lens[i] > len(state.block_ids) * block_size:  # would write into another request's block
            raise RuntimeError(f"request {rid}: {seq_lens[i]} tokens but blocks for "
                               f"{len(state.block_ids) * block_size}; scheduler and runner disagree")
        block_tables[i, : len(state.block_ids)] = state.block_ids
        if computed + query_lens[i] >= len(state.token_ids):  # reached the end of known tokens
            first = end - 1 - len(spec)
            logits_indices.extend(range(first, end))
            sample_rows.extend([i] * (end - first))

    block_index = positions // block_size
    rows = np.repeat(np.arange(num_reqs), query_lens)
    slot_mapping = (block_tables[rows, block_index].astype(np.int64) * block_size + positions % block_size)

    metadata = BatchMetadata(
        num_reqs=num_reqs,
        num_tokens=num_tokens,
        num_decode_only=int(np.sum(query_lens == 1)),
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()),
        block_size=block_size,
        query_start_loc=_to_device(query_start_loc, device),
        seq_lens=_to_device(seq_lens, device),
        block_tables=_to_device(block_tables, device),
        slot_mapping=_to_device(slot_mapping.astype(np.int32), device),
        query_start_loc_cpu=torch.from_numpy(query_start_loc),
        seq_lens_cpu=torch.from_numpy(seq_lens),
    )
    return StepInputs(
        request_ids=request_ids,
        input_ids=_to_device(input_ids, device),
        positions=_to_device(positions, device),
        metadata=metadata,
        logits_indices=_to_device(np.array(logits_indices, dtype=np.int64), device),
        sample_rows=sample_rows,
    )
