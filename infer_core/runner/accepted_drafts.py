"""A verify step's kept drafts, counted on the device, for the step planned before the host reads them.

Under overlapped scheduling step N+1 is planned while step N runs. When step N verifies k drafts of a
request, the scheduler plans as if all of them were kept: k+1 pending tokens, and step N+1's positions
start after them. How many were kept is known only on the device. ``AcceptedDrafts`` (made from step
N's sampled ids and draft ids) gives, per request, the last token step N keeps, which is step N+1's
first input, and the number of positions step N rejected; ``AcceptedDrafts.apply`` places that token
and moves step N+1's positions, KV slots and sequence lengths back by that number before its forward
(on CUDA in one launch: layers/sampling/kept_drafts.py). Step N+1's KV then
lands where the rejected drafts' did, and its attention stops at the kept tokens. When the host reads
step N the scheduler takes the same number back (``Scheduler.update``), so the next plan is exact again
up to the step then in flight.

The rule counted here is greedy's: a draft is kept while it equals the token the target sampled at
its position; the first position that differs keeps the target's token and ends the request's tokens.
A decoding policy overlaps only requests sampled greedily (``DecodingPolicy.overlaps``), whose host
decision on the same ids is the same.
"""

from __future__ import annotations

import numpy as np
import torch

from infer_core.interfaces import AttentionCapabilities
from infer_core.runner.inputs import StepInputs
from infer_core.runner.sampling_inputs import to_device


def may_plan_over_verify_steps(device: str, attention: AttentionCapabilities) -> bool:
    """Whether a step may be planned over a verify step still running: its lengths are moved back on the device
    only, so the attention must read them there (``reads_device_lengths``), or its host copies must be the device's
    own buffers (the CPU's)."""
    return device == "cpu" or attention.reads_device_lengths


class AcceptedDrafts:
    """One verify step's sampled ids and draft ids (one row per sampled position, a request's rows together):
    what the step planned after it needs to be made exact (``apply``)."""

    def __init__(self, sampled: torch.Tensor, draft_ids: torch.Tensor, sample_rows: list[int],
                 kept_at_random: frozenset[str]) -> None:
        """``sample_rows``: the step's batch index of each sampled row; ``kept_at_random``: the requests
        that verified drafts and do not sample greedily (``check`` refuses to count theirs)."""
        self.sampled, self.draft_ids = sampled, draft_ids
        self.sample_rows = sample_rows
        self.kept_at_random = kept_at_random
        rows = np.asarray(sample_rows, dtype=np.int64)
        self.seg_start = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])  # each request's first sampled row
        self.seg_end = np.r_[self.seg_start[1:], len(rows)]

    def request_index(self, request_ids: list[str]) -> dict[str, int]:
        """Request id -> its index among the step's sampled requests (``pending_src`` of the next step)."""
        return {request_ids[self.sample_rows[first]]: i for i, first in enumerate(self.seg_start.tolist())}

    def segments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(first sampled row, end) of each sampled request, on the device."""
        both = to_device(np.concatenate([self.seg_start, self.seg_end]), self.sampled.device)
        return both[: len(self.seg_start)], both[len(self.seg_start):]

    def resolve(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(last kept token [R] of the sampled ids' dtype, rejected positions [R] int32), R sampled requests:
        the torch form of what ``apply`` does on CUDA."""
        num_rows, device = self.sampled.shape[0], self.sampled.device
        start, end = self.segments()
        segment = torch.repeat_interleave(torch.arange(len(self.seg_start), device=device), end - start,
                                          output_size=num_rows)
        missed = torch.where(self.draft_ids != self.sampled, torch.arange(num_rows, device=device), num_rows)
        first_missed = torch.full((len(self.seg_start),), num_rows, dtype=torch.int64, device=device)
        first_missed.scatter_reduce_(0, segment, missed, "amin")  # a request's last row verifies no draft
        return self.sampled.index_select(0, first_missed), (end - 1 - first_missed).to(torch.int32)

    def check(self, pending_ids: list[str]) -> None:
        """Refuse to plan over this step the requests ``pending_ids`` whose drafts were kept at random."""
        if not self.kept_at_random.isdisjoint(pending_ids):
            raise RuntimeError(f"requests {sorted(self.kept_at_random.intersection(pending_ids))} were planned over "
                               "a verify step that keeps their drafts at random, which cannot be counted on the "
                               "device (a decoding policy overlaps greedy requests only); this is a bug")

    def apply(self, inputs: StepInputs, block_tables: torch.Tensor, block_size: int) -> None:
        """Make ``inputs`` (planned as if every draft were kept) exact for its pending requests: each one's last
        kept token placed, its positions, KV slots and sequence length moved back."""
        metadata = inputs.metadata
        if inputs.input_ids.is_cuda:
            from infer_core.layers.sampling.kept_drafts import keep_drafts

            start, end = self.segments()
            keep_drafts(self.sampled, self.draft_ids, start, end, inputs.pending_src, inputs.pending_rows,
                        inputs.pending_dst, inputs.input_ids, inputs.positions, metadata.slot_mapping,
                        metadata.seq_lens, metadata.query_start_loc, block_tables, block_size,
                        int((self.seg_end - self.seg_start).max()), inputs.pending_max_query_len)
            return
        last_tokens, rejected = self.resolve()
        inputs.input_ids.index_put_((inputs.pending_dst.long(),),
                                    last_tokens.index_select(0, inputs.pending_src).to(inputs.input_ids.dtype))
        apply_rejections(inputs, rejected, block_tables, block_size)


def apply_rejections(inputs: StepInputs, rejected: torch.Tensor, block_tables: torch.Tensor, block_size: int) -> None:
    """Move each pending request's positions, KV slots and sequence length back by the positions the
    verify step before it rejected (``rejected[pending_src]``), in place."""
    metadata = inputs.metadata
    num_tokens = metadata.num_tokens
    per_request = torch.zeros(metadata.num_reqs, dtype=torch.int32, device=rejected.device)
    per_request.index_copy_(0, inputs.pending_rows.long(), rejected.index_select(0, inputs.pending_src))
    metadata.seq_lens.sub_(per_request)
    token_rows = torch.repeat_interleave(torch.arange(metadata.num_reqs, device=rejected.device),
                                         metadata.query_start_loc.diff(), output_size=num_tokens)
    positions = inputs.positions[:num_tokens]
    positions.sub_(per_request.index_select(0, token_rows))
    blocks = block_tables[token_rows, (positions // block_size).long()]
    torch.add(blocks * block_size, positions % block_size, out=metadata.slot_mapping[:num_tokens])
