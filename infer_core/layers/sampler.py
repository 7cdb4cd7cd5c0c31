"""From logits to token ids: penalties, temperature, top-k, top-p, min-p, seeded sampling.

Sampling uses the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``), which draws from
``p`` exactly. A seeded request draws its ``q`` from its own generator, reseeded from
(seed, output position), so its tokens do not depend on what else is in the batch, nor on
whether it was preempted and resumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infer_core.sampling_params import MIN_SAMPLING_TEMPERATURE

_SEED_STRIDE = 1_000_003  # mixes a request's seed with the output position


@dataclass(slots=True)
class SamplingBatch:
    """Per-row sampling parameters of one step, as device tensors (None: not used this step)."""

    temperature: torch.Tensor  # [R] float32; 0 (below MIN_SAMPLING_TEMPERATURE) marks greedy rows
    all_greedy: bool
    top_k: torch.Tensor | None = None  # [R] int64, 0 = off
    top_p: torch.Tensor | None = None  # [R] float32, 1 = off
    min_p: torch.Tensor | None = None  # [R] float32, 0 = off
    presence_penalty: torch.Tensor | None = None  # [R]
    frequency_penalty: torch.Tensor | None = None  # [R]
    repetition_penalty: torch.Tensor | None = None  # [R]
    output_counts: torch.Tensor | None = None  # [R, V] float32 occurrences of each token in the output
    seen_mask: torch.Tensor | None = None  # [R, V] bool, token in prompt or output
    banned: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, token ids) masked (min_tokens)
    generator: torch.Generator | None = None  # unseeded rows draw from it (the runner's, not torch's global)
    seeds: list[int | None] | None = None  # per row; with ``positions`` selects a generator state
    positions: list[int] | None = None  # per row: index of the output token being sampled
    max_num_logprobs: int | None = None  # None: no row wants logprobs; 0: only the sampled token's


@dataclass(slots=True)
class SamplerOutput:
    token_ids: torch.Tensor  # [R] int64
    logprob: torch.Tensor | None = None  # [R] raw log-probability of the sampled token
    rank: torch.Tensor | None = None  # [R] 1-based rank of the sampled token
    top_ids: torch.Tensor | None = None  # [R, N]
    top_logprobs: torch.Tensor | None = None  # [R, N]


def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    if batch.repetition_penalty is not None and batch.seen_mask is not None:
        penalty = batch.repetition_penalty.unsqueeze(1)
        penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(batch.seen_mask, penalized, logits)
    if batch.output_counts is not None:
        if batch.frequency_penalty is not None:
            logits = logits - batch.frequency_penalty.unsqueeze(1) * batch.output_counts
        if batch.presence_penalty is not None:
            logits = logits - batch.presence_penalty.unsqueeze(1) * (batch.output_counts > 0).to(logits.dtype)
    return logits


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask everything outside each row's top-k, then outside its top-p nucleus."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device).unsqueeze(0)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        outside = (mass_before > top_p.unsqueeze(1)) & (rank > 0)
        sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def _exponential_noise(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    q = torch.empty_like(probs).exponential_(generator=batch.generator)
    if batch.seeds is not None:
        generator = torch.Generator(device=probs.device)
        for row, seed in enumerate(batch.seeds):
            if seed is None:
                continue
            generator.manual_seed((seed * _SEED_STRIDE + batch.positions[row]) & 0x7FFF_FFFF_FFFF_FFFF)
            q[row].exponential_(generator=generator)
    return q


def sample(logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
    """Sample one token per row of ``logits`` [R, V] (float32)."""
    logits = logits.float()
    out = SamplerOutput(token_ids=torch.empty(0))
    raw_logprobs = logits.log_softmax(dim=-1) if batch.max_num_logprobs is not None else None
    if batch.banned is not None:
        rows, cols = batch.banned
        logits = logits.index_put((rows, cols), torch.tensor(float("-inf"), device=logits.device))
    logits = apply_penalties(logits, batch)
    greedy = logits.argmax(dim=-1)
    if batch.all_greedy:
        token_ids = greedy
    else:
        is_greedy = batch.temperature < MIN_SAMPLING_TEMPERATURE
        temperature = torch.where(is_greedy, 1.0, batch.temperature).unsqueeze(1)
        scaled = logits / temperature
        if batch.top_k is not None or batch.top_p is not None:
            scaled = apply_top_k_top_p(scaled, batch.top_k, batch.top_p)
        if batch.min_p is not None:
            scaled = apply_min_p(scaled, batch.min_p)
        probs = scaled.softmax(dim=-1)
        sampled = (probs / _exponential_noise(probs, batch)).argmax(dim=-1)
        token_ids = torch.where(is_greedy, greedy, sampled)
    out.token_ids = token_ids
    if raw_logprobs is not None:
        out.logprob = raw_logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
        out.rank = (raw_logprobs > out.logprob.unsqueeze(1)).sum(dim=-1) + 1
        if batch.max_num_logprobs:
            out.top_logprobs, out.top_ids = raw_logprobs.topk(batch.max_num_logprobs, dim=-1)
    return out
