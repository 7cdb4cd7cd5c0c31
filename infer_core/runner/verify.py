"""Stage 3 of a step that verifies draft tokens (``SchedulerOutput.spec_token_ids``).

A request that verifies k drafts has k+1 sampled positions in the step, position j seeing the
drafts before it as its context. Each position is sampled by ``layers/draft_verification.py``: its
token drawn from the residual of the draft token it verifies (from the target's own distribution
after the last draft), and the target's probability of that draft token, which reaches the decoding
policy as ``RunnerOutput.draft_probs``. The penalties of position j count drafts 0..j-1 as output
tokens. Steps without drafts never come here (``ModelRunner._execute``).

Under overlapped scheduling the step after this one is planned before its tokens reach the host:
``VerifiedStep.accepted`` keeps what that step needs to count the kept drafts on the device
(runner/accepted_drafts.py). The decoding policy overlaps only greedy requests without penalties, so
a sampled row's penalties never miss a pending token.
"""

from __future__ import annotations

import numpy as np
import torch

from infer_core.interfaces import RunnerOutput
from infer_core.layers.draft_verification import sample_verified
from infer_core.layers.sampler import SamplingBatch
from infer_core.runner.accepted_drafts import AcceptedDrafts
from infer_core.runner.inputs import StepInputs
from infer_core.runner.sampling_inputs import build_sampling_batch, to_device
from infer_core.runner.state import RequestTable
from infer_core.runner.step_output import HostSlots, SampledStep


def _draft_columns(sampled_ids: list[str], spec_token_ids: dict[str, list[int]]) -> tuple[list[int], list[int]]:
    """Per sampled row: the draft token it verifies (-1: none) and how many of its request's rows precede it."""
    draft_ids, offsets = [], []
    previous, offset = None, 0
    for request_id in sampled_ids:
        offset = offset + 1 if request_id == previous else 0
        previous = request_id
        draft = spec_token_ids.get(request_id, ())
        draft_ids.append(draft[offset] if offset < len(draft) else -1)
        offsets.append(offset)
    return draft_ids, offsets


def _count_earlier_drafts(batch: SamplingBatch, sampled_ids: list[str], offsets: list[int],
                          spec_token_ids: dict[str, list[int]], vocab_size: int, device: torch.device) -> None:
    """Add drafts 0..j-1 to the output counts and seen tokens of each request's row j (the penalties' context)."""
    flat = [row * vocab_size + token for row, (request_id, offset) in enumerate(zip(sampled_ids, offsets))
            for token in spec_token_ids.get(request_id, ())[:offset]]
    if not flat:
        return
    index = to_device(np.asarray(flat, dtype=np.int64), device)
    if batch.output_counts is not None:
        counts = batch.output_counts.view(-1)
        counts.index_put_((index,), torch.ones((), dtype=counts.dtype, device=device), accumulate=True)
    if batch.seen_mask is not None:
        batch.seen_mask.view(-1).index_fill_(0, index, True)


class VerifiedStep(SampledStep):
    """A sampled step whose output also carries each position's draft-token probability (``draft_probs``)."""

    def __init__(self, request_ids, sample_rows, states, sampled, draft_probs: torch.Tensor | None,
                 draft_ids: list[int], accepted: AcceptedDrafts, logits=None, slot=None) -> None:
        """``draft_probs`` None: every row is greedy, and a draft's probability is 1 where it is the sampled
        token, else 0 (told on the host from the ids, without copying the probabilities)."""
        self.accepted = accepted
        if draft_probs is not None and draft_probs.is_cuda:  # queued before the ids' copy, whose event covers it
            host = torch.empty(draft_probs.shape, dtype=draft_probs.dtype, pin_memory=True)
            draft_probs = host.copy_(draft_probs, non_blocking=True)
        self.draft_probs, self.draft_ids = draft_probs, draft_ids
        super().__init__(request_ids, sample_rows, states, sampled, logits, slot)

    def _collect(self) -> RunnerOutput:
        output = super()._collect()
        if self.draft_probs is not None:
            probs = self.draft_probs.tolist()
        else:
            probs = [float(token == draft) for token, draft in zip(self.token_ids.tolist(), self.draft_ids)]
        per_request: list[list[float]] = [[] for _ in self.request_ids]
        for row, prob in zip(self.sample_rows, probs):
            per_request[row].append(prob)
        output.draft_probs = per_request
        return output


def verify_drafts(inputs: StepInputs, logits: torch.Tensor, spec_token_ids: dict[str, list[int]],
                  requests: RequestTable, vocab_size: int, eos_token_ids: tuple[int, ...], device: torch.device,
                  generator: torch.Generator, host_slots: HostSlots | None, return_logits: bool) -> VerifiedStep:
    """Sample every position of the step and report each draft token's probability (see the module's doc)."""
    sampled_ids = [inputs.request_ids[row] for row in inputs.sample_rows]
    states = [requests[request_id] for request_id in sampled_ids]
    draft_ids, offsets = _draft_columns(sampled_ids, spec_token_ids)
    batch = build_sampling_batch(states, vocab_size, eos_token_ids, device, generator, token_table=requests.token_ids)
    if batch.output_counts is not None or batch.seen_mask is not None:
        _count_earlier_drafts(batch, sampled_ids, offsets, spec_token_ids, vocab_size, device)
    drafts = to_device(np.asarray(draft_ids, dtype=np.int64), device)
    result, draft_probs = sample_verified(logits, batch, drafts)
    at_random = frozenset(rid for rid, state, draft in zip(sampled_ids, states, draft_ids)
                          if draft >= 0 and not state.sampling_params.is_greedy)
    accepted = AcceptedDrafts(result.token_ids, drafts, inputs.sample_rows, at_random)
    slot = host_slots.take(result.token_ids.shape[0]) if host_slots is not None else None
    return VerifiedStep(inputs.request_ids, inputs.sample_rows, states, result,
                        None if batch.all_greedy else draft_probs, draft_ids, accepted,
                        logits if return_logits else None, slot)
