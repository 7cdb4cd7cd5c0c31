"""Sampling the positions of a step that verifies draft tokens (speculative decoding).

Each row is one position; ``draft_ids[row]`` is the draft token it verifies (-1: none, e.g. the
position after a request's last draft token, or a request that drafted nothing). For every row the
target's distribution p is built as ``sample`` builds it (logit bias, banned tokens, penalties, temperature,
top-k, top-p, min-p; a greedy row's p is a point mass at its argmax), and two things come out:

- ``draft_probs[row]`` = p(draft token), 0 where the row verifies none;
- ``token_ids[row]``: a draw from the residual, p with the draft token removed and renormalised
  (from p itself where the row verifies none; a greedy row's argmax).

That is what modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023) needs for a draft
distribution that is a point mass: keep the draft token with probability p(draft), else the
residual's draw. The decision is the decoding policy's (on the host). Drawing from the residual
uses the sampler's Exp(1) race, with seeded rows' counter-based noise, so a seeded request's draws
do not depend on the batch. This is the torch path on every device: the fused sampling kernel takes
no residual.
"""

from __future__ import annotations

import torch

from infer_core.layers.sampler import (
    SamplerOutput,
    SamplingBatch,
    apply_penalties,
    exponential_noise,
    temperature_column,
    transformed_probs,
)
from infer_core.sampling_params import MIN_SAMPLING_TEMPERATURE


def sample_verified(logits: torch.Tensor, batch: SamplingBatch,
                    draft_ids: torch.Tensor) -> tuple[SamplerOutput, torch.Tensor]:
    """(one token per row of ``logits`` [R, V], drawn as above; ``draft_probs`` [R] float32)."""
    logits = logits.float()
    raw_logprobs = logits.log_softmax(dim=-1) if batch.max_num_logprobs is not None else None
    if batch.logit_bias is not None:
        rows, cols, biases = batch.logit_bias
        logits = logits.index_put((rows, cols), biases, accumulate=True)
    if batch.banned is not None:
        rows, cols = batch.banned
        logits = logits.index_put((rows, cols), logits.new_full((), float("-inf")))
    logits = apply_penalties(logits, batch)
    has_draft = draft_ids >= 0
    drafts = draft_ids.clamp(min=0).unsqueeze(1)
    greedy_ids = logits.argmax(dim=-1)
    greedy_hits = (greedy_ids == draft_ids).float()  # p(draft) of a greedy row: 1 at its argmax, else 0
    if batch.all_greedy:
        token_ids, draft_probs = greedy_ids, greedy_hits
    else:
        temperature = temperature_column(batch, logits.shape[0], logits.device)
        is_greedy = temperature < MIN_SAMPLING_TEMPERATURE
        probs = transformed_probs(logits, batch, temperature, is_greedy)
        sampled_probs = probs.gather(1, drafts).squeeze(1)
        draft_probs = torch.where(is_greedy, greedy_hits, torch.where(has_draft, sampled_probs, 0.0))
        residual = torch.where(has_draft.unsqueeze(1), probs.scatter(1, drafts, 0.0), probs)
        drawn = (residual / exponential_noise(residual, batch)).argmax(dim=-1)
        token_ids = torch.where(is_greedy, greedy_ids, drawn)
    out = SamplerOutput(token_ids=token_ids)
    if raw_logprobs is not None:
        out.logprob = raw_logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
        out.rank = (raw_logprobs > out.logprob.unsqueeze(1)).sum(dim=-1) + 1
        if batch.max_num_logprobs:
            out.top_logprobs, out.top_ids = raw_logprobs.topk(batch.max_num_logprobs, dim=-1)
    return out, draft_probs
