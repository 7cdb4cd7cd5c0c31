"""Per-step sampling tensors from the sampled requests' parameters and token histories."""

from __future__ import annotations

import torch

from infer_core.layers.sampler import SamplingBatch
from infer_core.runner.state import RequestState


def _column(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _output_positions(states: list[RequestState]) -> list[int]:
    """Index of the output token each row samples (a request verifying drafts has several rows)."""
    seen: dict[str, int] = {}
    positions = []
    for state in states:
        offset = seen.get(state.request_id, 0)
        positions.append(state.num_output_tokens + offset)
        seen[state.request_id] = offset + 1
    return positions


def build_sampling_batch(
    states: list[RequestState], vocab_size: int, eos_token_ids: tuple[int, ...], device: torch.device,
    generator: torch.Generator | None = None,
) -> SamplingBatch:
    """One row per sampled position; only the features some row uses are materialised."""
    params = [s.sampling_params for s in states]
    temperature = [0.0 if p.is_greedy else float(p.temperature) for p in params]
    batch = SamplingBatch(temperature=_column(temperature, torch.float32, device),
                          all_greedy=all(t == 0 for t in temperature), generator=generator)
    if not batch.all_greedy:
        if any(p.top_k > 0 for p in params):
            batch.top_k = _column([p.top_k for p in params], torch.int64, device)
        if any(p.top_p < 1 for p in params):
            batch.top_p = _column([p.top_p for p in params], torch.float32, device)
        if any(p.min_p > 0 for p in params):
            batch.min_p = _column([p.min_p for p in params], torch.float32, device)
        if any(p.seed is not None for p in params):
            batch.seeds = [p.seed for p in params]
            batch.positions = _output_positions(states)
    if any(p.has_penalties for p in params):
        counts = torch.zeros(len(states), vocab_size, dtype=torch.float32)
        seen = torch.zeros(len(states), vocab_size, dtype=torch.bool)
        for row, state in enumerate(states):
            outputs = torch.tensor(state.token_ids[state.num_prompt_tokens:], dtype=torch.int64)
            counts[row].scatter_add_(0, outputs, torch.ones_like(outputs, dtype=torch.float32))
            seen[row, torch.tensor(state.token_ids, dtype=torch.int64)] = True
        batch.output_counts = counts.to(device)
        batch.seen_mask = seen.to(device)
        batch.presence_penalty = _column([p.presence_penalty for p in params], torch.float32, device)
        batch.frequency_penalty = _column([p.frequency_penalty for p in params], torch.float32, device)
        batch.repetition_penalty = _column([p.repetition_penalty for p in params], torch.float32, device)
    banned_rows: list[int] = []
    banned_ids: list[int] = []
    for row, (state, p) in enumerate(zip(states, params)):
        if state.num_output_tokens < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            stops = [t for t in stops if t < vocab_size]
            banned_rows.extend([row] * len(stops))
            banned_ids.extend(stops)
    if banned_rows:
        batch.banned = (_column(banned_rows, torch.int64, device), _column(banned_ids, torch.int64, device))
    wanted = [p.logprobs for p in params if p.logprobs is not None]
    batch.max_num_logprobs = max(wanted) if wanted else None
    return batch
