"""From logits to token ids: grammar masks, penalties, temperature, top-k, top-p, min-p, seeded sampling.

Sampling uses the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``, equivalently the
Gumbel-max ``argmax(z - log q)``), which draws from ``p`` exactly. A seeded request's ``q`` is
counter-based Philox noise keyed by (seed, output position, token id), so its tokens do not
depend on what else is in the batch, nor on whether it was preempted and resumed.

On CUDA (with triton) one kernel launch does temperature, the top-k/top-p cut, min-p, the noise
(unseeded rows' keys too, from the generator's seed and offset) and the argmax, and a greedy
batch is one launch of its argmax (``sampling/fused.py``); the torch functions here are the
reference they are tested against and the path on the CPU. Nothing here reads a device value on
the host.

The model's logits are often bfloat16. Every bf16/fp16 value is exactly a float32 value, so the
greedy argmax, the top-k/top-p cut (which selects in the logits' dtype and widens what it kept)
and the fused kernel (which widens in registers) read them as they are and pick the tokens that
converting first would pick, without writing an [R, V] float32 copy. Penalties, banned tokens,
logprobs and the torch path still convert to float32 first.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

import torch

from infer_core.layers.sampling.masks import apply_token_bitmask
from infer_core.layers.sampling.philox import seed_key, seeded_exponential
from infer_core.layers.sampling.thresholds import top_k_top_p_cut
from infer_core.sampling_params import MIN_SAMPLING_TEMPERATURE

# dtypes whose every value is a float32 value: argmax and the fused kernel need no float32 copy of them
_WIDENS_EXACTLY = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(slots=True)
class SamplingBatch:
    """Per-row sampling parameters of one step, as device tensors (None: not used this step)."""

    # [R] float32, 0 (< MIN_SAMPLING_TEMPERATURE) marks greedy rows; a float: every row's (no host-to-device
    # copy: the kernel takes it as an argument); None: every row is greedy
    temperature: torch.Tensor | float | None
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
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (rows, token ids, float32 biases) added
    # Grammar masks (structured outputs): (rows [M] int64, bitmask [M, ceil(V/32)] int32); a token a row's
    # bitmask does not allow is never sampled (interfaces/constraints.py has the layout)
    allowed: tuple[torch.Tensor, torch.Tensor] | None = None
    generator: torch.Generator | None = None  # unseeded rows draw from it (the runner's, not torch's global)
    # Seeded rows: ``seeds`` [R] int64 Philox keys (``seed_key(seed)``) with ``is_seeded`` [R] bool and
    # ``positions`` [R] int64 (index of the output token being sampled). Lists (None = unseeded)
    # are accepted too, for batches built by hand, and moved to the device in ``sample``.
    seeds: torch.Tensor | list[int | None] | None = None
    positions: torch.Tensor | list[int] | None = None
    is_seeded: torch.Tensor | None = None
    max_top_k: int | None = None  # host copy of the largest top_k, when every top-p row has a top_k
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
    """Mask everything outside each row's top-k, then outside its top-p nucleus.

    Ties are ranked by token id (a stable sort), so the kept set is defined even among equal logits.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device).unsqueeze(0)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        # top_p = 1 is off: a cumulative sum that rounds past 1 must not cut the tail
        outside = (mass_before > top_p.unsqueeze(1)) & (rank > 0) & (top_p < 1).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def _seed_columns(batch: SamplingBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keys int64, positions int64, is_seeded bool), each [R] on ``device``."""
    if isinstance(batch.seeds, torch.Tensor):
        return batch.seeds, batch.positions, batch.is_seeded
    keys = [0 if seed is None else seed_key(seed) for seed in batch.seeds]
    is_seeded = [seed is not None for seed in batch.seeds]
    return (torch.tensor(keys, dtype=torch.int64, device=device),
            torch.tensor(batch.positions, dtype=torch.int64, device=device),
            torch.tensor(is_seeded, dtype=torch.bool, device=device))


def exponential_noise(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Exp(1) noise shaped like ``probs``: counter-based (seed, position, token) on seeded rows, else the generator's;
    ``argmax(probs / noise)`` is then a draw from each row of ``probs`` (which need not sum to 1)."""
    q = torch.empty_like(probs).exponential_(generator=batch.generator)
    if batch.seeds is None:
        return q
    keys, positions, is_seeded = _seed_columns(batch, probs.device)
    if probs.device.type == "cpu":  # only the seeded rows: Philox in torch is ~100 ops per token
        rows = is_seeded.nonzero().squeeze(1)
        q[rows] = seeded_exponential(keys[rows], positions[rows], probs.shape[1])
        return q
    return torch.where(is_seeded.unsqueeze(1), seeded_exponential(keys, positions, probs.shape[1]), q)


def temperature_column(batch: SamplingBatch, num_rows: int, device: torch.device) -> torch.Tensor:
    """``batch.temperature`` as an [R] tensor (a float is every row's)."""
    if isinstance(batch.temperature, torch.Tensor):
        return batch.temperature
    return torch.full((num_rows,), float(batch.temperature), dtype=torch.float32, device=device)


def transformed_probs(logits: torch.Tensor, batch: SamplingBatch, temperature: torch.Tensor,
                      is_greedy: torch.Tensor) -> torch.Tensor:
    """The distribution each row samples from (the torch path): scale, cut (sorting), renormalise. Greedy
    rows are scaled by 1 (the caller takes their argmax instead)."""
    temperature = torch.where(is_greedy, 1.0, temperature).unsqueeze(1)
    scaled = logits / temperature
    if batch.top_k is not None or batch.top_p is not None:
        scaled = apply_top_k_top_p(scaled, batch.top_k, batch.top_p)
    if batch.min_p is not None:
        scaled = apply_min_p(scaled, batch.min_p)
    return scaled.softmax(dim=-1)


def _sample_reference(logits: torch.Tensor, batch: SamplingBatch, temperature: torch.Tensor,
                      is_greedy: torch.Tensor) -> torch.Tensor:
    """The torch path: the transformed distribution, raced against Exp(1) noise."""
    probs = transformed_probs(logits, batch, temperature, is_greedy)
    return (probs / exponential_noise(probs, batch)).argmax(dim=-1)


@functools.cache
def fused_kernels() -> ModuleType | None:
    """The triton kernels module, or None where triton is not installed."""
    try:
        from infer_core.layers.sampling import fused
    except ImportError:
        return None
    return fused


def _sample_fused(logits: torch.Tensor, batch: SamplingBatch, kernels) -> torch.Tensor:
    threshold = num_ties = None
    temperature = batch.temperature.float() if isinstance(batch.temperature, torch.Tensor) else batch.temperature
    if batch.top_k is not None or batch.top_p is not None:
        temperature = temperature_column(batch, logits.shape[0], logits.device).float()
        cut_temperature = torch.where(temperature < MIN_SAMPLING_TEMPERATURE, 1.0, temperature)  # greedy: 1
        threshold, num_ties = top_k_top_p_cut(logits, cut_temperature, batch.top_k, batch.top_p, batch.max_top_k)
    seeds = positions = is_seeded = None
    if batch.seeds is not None:
        seeds, positions, is_seeded = _seed_columns(batch, logits.device)
    min_p = None if batch.min_p is None else batch.min_p.float()
    return kernels.fused_sample(_unit_stride(logits), temperature, batch.generator, seeds, positions, is_seeded,
                                min_p, threshold, num_ties)


@functools.cache
def _placement() -> ModuleType | None:
    try:
        from infer_core.layers.sampling import placement
    except ImportError:
        return None
    return placement


def place_sampled_tokens(input_ids: torch.Tensor, dst: torch.Tensor, sampled: torch.Tensor, src: torch.Tensor) -> None:
    """``input_ids[dst] = sampled[src]`` (the previous step's tokens into this step's inputs, on the device).

    On CUDA one kernel (``sampling/placement.py``) instead of torch's index_select, cast and
    index_put_; elsewhere those torch ops.
    """
    placement = _placement() if input_ids.is_cuda else None
    if placement is not None:
        placement.place_tokens(input_ids, dst, sampled, src)
    else:
        input_ids.index_put_((dst,), sampled.index_select(0, src).to(input_ids.dtype))


def _unit_stride(logits: torch.Tensor) -> torch.Tensor:
    """Rows may be strided (a slice of a padded vocabulary); tokens within a row may not."""
    return logits if logits.stride(1) == 1 else logits.contiguous()


def _has_penalties(batch: SamplingBatch) -> bool:
    """Whether ``apply_penalties`` may change this batch's logits (then they are converted first)."""
    return batch.output_counts is not None or (batch.repetition_penalty is not None and batch.seen_mask is not None)


def takes_argmax(batch: SamplingBatch, logits: torch.Tensor) -> bool:
    """Whether ``sample`` gives each row's argmax of ``logits`` as they are (greedy; no penalties, banned tokens
    or logprobs): then ``greedy_argmax`` of them, e.g. captured in a CUDA graph, gives the same tokens."""
    return (batch.all_greedy and batch.max_num_logprobs is None and batch.banned is None and batch.allowed is None
            and batch.logit_bias is None and not _has_penalties(batch) and logits.dtype in _WIDENS_EXACTLY)


def first_max(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum [R] int64 by torch ops: ``argmax``, on the CPU through ``max``, whose reduction
    is vectorized for every float dtype there (``argmax``'s is not for bfloat16) and which also gives the first
    maximal index of a row."""
    return logits.max(dim=-1).indices if logits.device.type == "cpu" else logits.argmax(dim=-1)


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum [R] int64, as ``sample`` takes it for a greedy batch (no host work: capturable)."""
    kernels = fused_kernels() if logits.is_cuda else None
    return kernels.fused_argmax(_unit_stride(logits)) if kernels is not None else first_max(logits)


def sample(logits: torch.Tensor, batch: SamplingBatch, use_fused: bool | None = None) -> SamplerOutput:
    """Sample one token per row of ``logits`` [R, V] (any float dtype; the model's, typically bfloat16).

    The tokens are those of ``logits.float()``. bf16/fp16/fp32 logits are read as they are by the
    greedy argmax and by the fused kernel when the batch has no penalties, banned tokens, logit bias or
    logprobs; otherwise (and on the torch path) they are converted to float32 first. Grammar masks
    (``batch.allowed``) set logits to -inf in any dtype; on CUDA in place, in the logits given.
    ``use_fused``: None picks the fused kernel on CUDA when triton is installed; False forces the
    torch path; True forces the kernel (on CPU tensors too, under ``TRITON_INTERPRET=1``).
    """
    kernels = None
    if use_fused or (use_fused is None and logits.is_cuda):
        kernels = fused_kernels()
        if kernels is None and use_fused:
            raise RuntimeError("sample(use_fused=True) needs triton: pip install triton")
    reads_as_is = (logits.dtype in _WIDENS_EXACTLY and (batch.all_greedy or kernels is not None)
                   and batch.max_num_logprobs is None and batch.banned is None and batch.logit_bias is None
                   and not _has_penalties(batch))
    if not reads_as_is:
        logits = logits.float()
    out = SamplerOutput(token_ids=torch.empty(0))
    raw_logprobs = logits.log_softmax(dim=-1) if batch.max_num_logprobs is not None else None
    if batch.logit_bias is not None:
        rows, cols, biases = batch.logit_bias
        logits = logits.index_put((rows, cols), biases, accumulate=True)
    if batch.banned is not None:
        rows, cols = batch.banned
        logits = logits.index_put((rows, cols), logits.new_full((), float("-inf")))  # a fill, not a host copy
    if batch.allowed is not None:
        logits = apply_token_bitmask(logits, *batch.allowed)
    logits = apply_penalties(logits, batch)
    if batch.all_greedy and kernels is not None and logits.dtype in _WIDENS_EXACTLY:
        token_ids = kernels.fused_argmax(_unit_stride(logits))
    elif batch.all_greedy:
        token_ids = first_max(logits)
    elif kernels is not None:
        token_ids = _sample_fused(logits, batch, kernels)
    else:
        temperature = temperature_column(batch, logits.shape[0], logits.device)
        is_greedy = temperature < MIN_SAMPLING_TEMPERATURE
        token_ids = torch.where(is_greedy, logits.argmax(dim=-1),
                                _sample_reference(logits, batch, temperature, is_greedy))
    out.token_ids = token_ids
    if raw_logprobs is not None:
        out.logprob = raw_logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
        out.rank = (raw_logprobs > out.logprob.unsqueeze(1)).sum(dim=-1) + 1
        if batch.max_num_logprobs:
            out.top_logprobs, out.top_ids = raw_logprobs.topk(batch.max_num_logprobs, dim=-1)
    return out
