"""Per-step sampling tensors from the sampled requests' parameters and token histories.

The per-row parameters travel in two host arrays (float32 and int64), one copy each; the token
histories travel as one flat int64 array of ``row * vocab_size + token`` indices, from which the
penalties' counts and seen-masks are built on the device (no [R, V] tensor on the host). Every
copy is from pinned memory and does not block, so building a batch never waits for the device.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from infer_core.layers.sampler import SamplingBatch
from infer_core.layers.sampling.philox import seed_key
from infer_core.runner.state import RequestState

# () -> (rows, their pending token ids on the device) or None; a call, since only penalties read them
PendingTokens = Callable[[], "tuple[list[int], torch.Tensor] | None"]


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` on ``device`` without waiting for the device (a pinned staging copy on CUDA)."""
    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def _output_positions(states: list[RequestState]) -> list[int]:
    """Index of the output token each row samples (a request verifying drafts has several rows)."""
    seen: dict[str, int] = {}
    positions = []
    for state in states:
        offset = seen.get(state.request_id, 0)
        positions.append(state.num_output_tokens + offset)
        seen[state.request_id] = offset + 1
    return positions


def _history(state: RequestState, token_table: np.ndarray | None) -> np.ndarray:
    """The request's prompt + output ids as int64 (a view of the runner's table when it has one)."""
    row = getattr(state, "row", -1)
    if token_table is not None and row >= 0:
        return token_table[row, : len(state.token_ids)].astype(np.int64)
    return np.asarray(state.token_ids, dtype=np.int64)


def _penalty_tensors(batch: SamplingBatch, states: list[RequestState], vocab_size: int, device: torch.device,
                     token_table: np.ndarray | None, pending: PendingTokens | None) -> None:
    """``output_counts`` and ``seen_mask`` [R, V], scattered on the device from one index copy
    (plus the pending tokens, which are only on the device)."""
    num_rows = len(states)
    seen_parts, output_parts = [], []
    for row, state in enumerate(states):
        flat = _history(state, token_table) + row * vocab_size
        seen_parts.append(flat)
        output_parts.append(flat[state.num_prompt_tokens:])
    num_seen = sum(len(part) for part in seen_parts)
    indices = to_device(np.concatenate(seen_parts + output_parts), device)
    seen_ids, output_ids = indices[:num_seen], indices[num_seen:]
    pending = pending() if pending is not None else None
    if pending is not None:
        rows, token_ids = pending
        flat = to_device(np.asarray(rows, dtype=np.int64) * vocab_size, device) + token_ids
        seen_ids, output_ids = torch.cat([seen_ids, flat]), torch.cat([output_ids, flat])
    counts = torch.zeros(num_rows * vocab_size, dtype=torch.float32, device=device)
    counts.index_put_((output_ids,), torch.ones((), dtype=torch.float32, device=device), accumulate=True)
    seen = torch.zeros(num_rows * vocab_size, dtype=torch.bool, device=device)
    seen.index_fill_(0, seen_ids, True)
    batch.output_counts = counts.view(num_rows, vocab_size)
    batch.seen_mask = seen.view(num_rows, vocab_size)


def _bias_tensors(batch: SamplingBatch, params: list, device: torch.device) -> None:
    """``logit_bias`` as (rows, token ids, biases) on the device, one copy each."""
    rows, token_ids, biases = [], [], []
    for row, p in enumerate(params):
        for token_id, bias in (p.logit_bias or {}).items():
            rows.append(row)
            token_ids.append(token_id)
            biases.append(bias)
    index = to_device(np.array([rows, token_ids], dtype=np.int64), device)
    batch.logit_bias = (index[0], index[1], to_device(np.array(biases, dtype=np.float32), device))


def build_sampling_batch(
    states: list[RequestState], vocab_size: int, eos_token_ids: tuple[int, ...], device: torch.device,
    generator: torch.Generator | None = None, token_table: np.ndarray | None = None,
    pending: PendingTokens | None = None,
) -> SamplingBatch:
    """One row per sampled position; only the features some row uses are materialised.

    ``token_table``: the runner's [num_rows, max_tokens] host array of token ids, indexed by
    ``RequestState.row``; given, the penalties read histories from it instead of the lists.
    ``pending``: called only when a row has penalties; gives (rows, their pending token ids on the
    device), the last output token of rows whose previous step has not reported back yet (overlapped
    scheduling), or None.
    """
    params = [s.sampling_params for s in states]
    # Requests usually share a few SamplingParams objects (LLM.generate: one for all), so each
    # feature is read once per distinct object and spread over the rows by ``index``.
    by_id = {id(p): p for p in params}
    distinct = list(by_id.values())
    if len(distinct) == len(params):
        index = slice(None)  # every row its own object, in row order
    elif len(distinct) == 1:
        index = np.zeros(len(params), dtype=np.intp)
    else:
        position = {key: i for i, key in enumerate(by_id)}
        index = np.fromiter((position[id(p)] for p in params), dtype=np.intp, count=len(params))
    greedy = [p.is_greedy for p in distinct]
    all_greedy = all(greedy)
    if all_greedy and not any(p.has_penalties or p.logprobs is not None or p.min_tokens or p.logit_bias
                              for p in distinct):
        return SamplingBatch(temperature=None, all_greedy=True, generator=generator)  # argmax needs nothing
    floats = np.array([[0.0 if g else float(p.temperature) for p, g in zip(distinct, greedy)],
                       [p.top_p for p in distinct], [p.min_p for p in distinct],
                       [p.presence_penalty for p in distinct], [p.frequency_penalty for p in distinct],
                       [p.repetition_penalty for p in distinct]], dtype=np.float32)[:, index]
    seeded = not all_greedy and any(p.seed is not None for p in distinct)
    int_columns = [np.array([p.top_k for p in distinct], dtype=np.int64)[index]]
    if seeded:
        seeds = np.array([[0 if p.seed is None else seed_key(p.seed) for p in distinct],
                          [p.seed is not None for p in distinct]], dtype=np.int64)[:, index]
        int_columns += [seeds[0], np.array(_output_positions(states), dtype=np.int64), seeds[1]]
    ints = np.stack(int_columns)
    only = distinct[0]
    if len(distinct) == 1 and not (all_greedy or only.top_k > 0 or only.top_p < 1 or only.min_p > 0
                                   or only.has_penalties):
        # every row samples at one temperature and nothing else needs per-row floats: no copy at all
        batch = SamplingBatch(temperature=float(floats[0, 0]), all_greedy=False, generator=generator)
    else:
        floats_d = to_device(floats, device)
        batch = SamplingBatch(temperature=floats_d[0], all_greedy=all_greedy, generator=generator)
    if not all_greedy:
        use_top_k, use_top_p = any(p.top_k > 0 for p in distinct), any(p.top_p < 1 for p in distinct)
        if use_top_k or seeded:
            ints_d = to_device(ints, device)
        if use_top_k:
            batch.top_k = ints_d[0]
        if use_top_p:
            batch.top_p = floats_d[1]
        if use_top_k and all(p.top_k > 0 for p in distinct if p.top_p < 1):
            batch.max_top_k = max(p.top_k for p in distinct)
        if any(p.min_p > 0 for p in distinct):
            batch.min_p = floats_d[2]
        if seeded:
            batch.seeds, batch.positions, batch.is_seeded = ints_d[1], ints_d[2], ints_d[3].bool()
    if any(p.has_penalties for p in distinct):
        _penalty_tensors(batch, states, vocab_size, device, token_table, pending)
        batch.presence_penalty, batch.frequency_penalty, batch.repetition_penalty = floats_d[3:6].unbind(0)
    banned_rows: list[int] = []
    banned_ids: list[int] = []
    for row, (state, p) in enumerate(zip(states, params) if any(p.min_tokens for p in distinct) else ()):
        if state.num_output_tokens < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            stops = [t for t in stops if t < vocab_size]
            banned_rows.extend([row] * len(stops))
            banned_ids.extend(stops)
    if banned_rows:
        banned = to_device(np.array([banned_rows, banned_ids], dtype=np.int64), device)
        batch.banned = (banned[0], banned[1])
    if any(p.logit_bias for p in distinct):
        _bias_tensors(batch, params, device)
    wanted = [p.logprobs for p in distinct if p.logprobs is not None]
    batch.max_num_logprobs = max(wanted) if wanted else None
    return batch
