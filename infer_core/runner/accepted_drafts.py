"""A verify step's kept drafts, counted on the device, for the step planned before the host reads them.

Under overlapped scheduling step N+1 is planned while step N runs. When step N verifies k drafts of a
request, the scheduler plans as if all of them were kept: k+1 pending tokens, and step N+1's positions
start after them. How many were kept is known only on the device. ``AcceptedDrafts`` (made from step
N's sampled ids and draft ids) gives, per request, the last token step N keeps, which is step N+1's
first input, and the number of positions step N rejected; ``apply_rejections`` moves step N+1's
positions, KV slots and sequence lengths back by that number before its forward. Step N+1's KV then
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

from infer_core.runner.inputs import StepInputs
from infer_core.runner.sampling_inputs import to_device


class AcceptedDrafts:
    """One verify step's sampled ids and draft ids (one row per sampled position, a request's rows
    together), and what they keep per request: ``resolve`` is computed once, on the device."""

    def __init__(self, sampled: torch.Tensor, draft_ids: torch.Tensor, sample_rows: list[int],
                 kept_at_random: frozenset[str]) -> None:
        """``sample_rows``: the step's batch index of each sampled row; ``kept_at_random``: the requests
        that verified drafts and do not sample greedily (``resolve`` refuses to count theirs)."""
        self.sampled, self.draft_ids = sampled, draft_ids
        self.sample_rows = sample_rows
        self.kept_at_random = kept_at_random
        self._resolved: tuple[torch.Tensor, torch.Tensor] | None = None

    def request_index(self, request_ids: list[str]) -> dict[str, int]:
        """Request id -> its index in ``resolve``'s outputs (the step's sampled requests, in batch order)."""
        index: dict[str, int] = {}
        for row in self.sample_rows:
            index.setdefault(request_ids[row], len(index))
        return index

    def resolve(self, pending_ids: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(last kept token [R] of the sampled ids' dtype, rejected positions [R] int32), R sampled requests;
        ``pending_ids``: the requests the next step reads them for."""
        if self.kept_at_random and not self.kept_at_random.isdisjoint(pending_ids):
            raise RuntimeError(f"requests {sorted(self.kept_at_random.intersection(pending_ids))} were planned over "
                               "a verify step that keeps their drafts at random, which cannot be counted on the "
                               "device (a decoding policy overlaps greedy requests only); this is a bug")
        if self._resolved is not None:
            return self._resolved
        rows = np.asarray(self.sample_rows, dtype=np.int64)
        first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])  # each request's first sampled row
        segment = np.cumsum(np.r_[False, rows[1:] != rows[:-1]])
        ends = np.r_[first[1:], len(rows)]
        device = self.sampled.device
        segment_t, ends_t = to_device(np.concatenate([segment, ends]), device).split([len(rows), len(ends)])
        num_rows = len(rows)
        missed = torch.where(self.draft_ids != self.sampled, torch.arange(num_rows, device=device), num_rows)
        first_missed = torch.full((len(ends),), num_rows, dtype=torch.int64, device=device)
        first_missed.scatter_reduce_(0, segment_t, missed, "amin")  # a request's last row verifies no draft: < ends
        last_tokens = self.sampled.index_select(0, first_missed)
        rejected = (ends_t - 1 - first_missed).to(torch.int32)
        self._resolved = last_tokens, rejected
        return self._resolved


def apply_rejections(inputs: StepInputs, rejected: torch.Tensor, block_tables: torch.Tensor, block_size: int) -> None:
    """Move each pending request's positions, KV slots and sequence length back by the positions the
    verify step before it rejected (``rejected[pending_src]``), in place on the device."""
    metadata = inputs.metadata
    num_tokens = metadata.num_tokens
    per_request = torch.zeros(metadata.num_reqs, dtype=torch.int32, device=rejected.device)
    per_request.index_copy_(0, inputs.pending_rows.long(), rejected.index_select(0, inputs.pending_src))
    metadata.seq_lens.sub_(per_request)
    token_rows = inputs.token_rows.long()
    positions = inputs.positions[:num_tokens]
    positions.sub_(per_request.index_select(0, token_rows))
    blocks = block_tables[token_rows, (positions // block_size).long()]
    torch.add(blocks * block_size, positions % block_size, out=metadata.slot_mapping[:num_tokens])
