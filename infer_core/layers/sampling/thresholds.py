"""Top-k / top-p as a per-row cut: a threshold value and how many tokens tied at it stay.

``apply_top_k_top_p`` (the reference) keeps a prefix of each row in stable descending order of
``logits / temperature``: the first ``n`` tokens, ties broken by the lower token id. The same set
is {z > t} plus the first ``e`` tokens (by id) with z == t, where t is the value at sorted position
``n - 1`` and ``e = n - #{z > t}``. Finding t and e needs only the sorted *values* of the first
``n`` positions (tied values have equal probability, so their order does not change the top-p
mass): ``topk`` of the batch's largest k when every top-p row also has a top-k, a sort otherwise.
For a small k, the top-k values are found among the ``k`` chunks of 64 tokens with the largest
maxima (every token above the k-th largest chunk maximum lies in those chunks), so ``topk`` runs
over [R, V/64] and [R, 64k] instead of [R, V].

The logits may be bfloat16 or float16: the leading values are selected (``topk``, sort) in the
logits' own dtype, which orders them as their exact float32 widening does, and only the selected
values are widened and divided by the temperature. Division by ``t > 0`` (rounded) never swaps two
values, so this is the prefix of the sorted scaled logits, as if the row had been scaled first.
"""

from __future__ import annotations

import torch

CHUNK = 64  # tokens per chunk of the two-stage top-k

def cut_from_sorted(sorted_z: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                    vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(threshold [R] float32, num_ties [R] int32) from the leading sorted scaled logits [R, W].

    ``W`` must be at least every row's top-k (or the whole vocabulary when a row has none).
    Rows without top-k and top-p get (-inf, vocab_size): every token stays.
    """
    width = sorted_z.shape[1]
    rank = torch.arange(width, device=sorted_z.device).unsqueeze(0)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, vocab_size).clamp(max=width).unsqueeze(1)
    else:
        k = torch.full((sorted_z.shape[0], 1), width, dtype=torch.int64, device=sorted_z.device)
    kept = rank < k
    if top_p is not None:
        masked = sorted_z.masked_fill(~kept, float("-inf"))
        probs = masked.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        kept &= (mass_before <= top_p.unsqueeze(1)) | (rank == 0) | (top_p >= 1).unsqueeze(1)
    num_kept = kept.sum(dim=1, keepdim=True)
    threshold = sorted_z.gather(1, num_kept - 1)
    num_above = (sorted_z > threshold).sum(dim=1, keepdim=True)
    num_ties = (num_kept - num_above).to(torch.int32).squeeze(1)
    threshold = threshold.squeeze(1)
    no_cut = torch.ones_like(num_ties, dtype=torch.bool)
    if top_k is not None:
        no_cut &= top_k <= 0
    if top_p is not None:
        no_cut &= top_p >= 1
    threshold = threshold.masked_fill(no_cut, float("-inf"))
    num_ties = num_ties.masked_fill(no_cut, vocab_size)
    return threshold, num_ties


def leading_values(logits: torch.Tensor, width: int) -> torch.Tensor:
    """The ``width`` largest values of each row of ``logits`` [R, V], sorted descending.

    Exact with ties: the ``width`` chunks with the largest maxima hold every token above the
    ``width``-th largest maximum M and at least ``width`` tokens >= M, and the ``width``-th largest
    value is >= M, so their tokens' top ``width`` values are the row's.
    """
    num_rows, vocab_size = logits.shape
    if width * CHUNK * 4 > vocab_size:  # too little to gain over one topk
        return logits.topk(width, dim=1, sorted=True).values
    whole = vocab_size // CHUNK * CHUNK
    maxima = logits[:, :whole].view(num_rows, -1, CHUNK).amax(dim=2)
    if whole < vocab_size:
        maxima = torch.cat([maxima, logits[:, whole:].amax(dim=1, keepdim=True)], dim=1)
    chunks = maxima.topk(width, dim=1, sorted=False).indices
    tokens = (chunks.unsqueeze(2) * CHUNK + torch.arange(CHUNK, device=logits.device)).view(num_rows, -1)
    candidates = logits.gather(1, tokens.clamp(max=vocab_size - 1)).masked_fill(tokens >= vocab_size, float("-inf"))
    return candidates.topk(width, dim=1, sorted=True).values


def top_k_top_p_cut(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                    top_p: torch.Tensor | None, max_top_k: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's cut for ``logits`` [R, V] (bf16, fp16 or fp32) scaled by float32 ``temperature`` [R] (greedy: 1).

    ``max_top_k``: the batch's largest top-k when every row with top-p also has a top-k (then
    only that many leading values are found, with ``topk``); None sorts whole rows.
    """
    vocab_size = logits.shape[1]
    if max_top_k is not None and 0 < max_top_k < vocab_size:
        values = leading_values(logits, max_top_k)
    else:
        values = logits.sort(dim=1, descending=True).values
    # select, then scale: division by t > 0 keeps the order, so these are the leading values of z
    sorted_z = values.float() / temperature.unsqueeze(1)
    return cut_from_sorted(sorted_z, top_k, top_p, vocab_size)


def cut_mask(z: torch.Tensor, threshold: torch.Tensor, num_ties: torch.Tensor) -> torch.Tensor:
    """The kept set [R, V] of a cut, in torch: z > t, or z == t among the first ``num_ties`` by id."""
    threshold = threshold.unsqueeze(1)
    is_tie = z == threshold
    return (z > threshold) | (is_tie & (is_tie.cumsum(dim=1) <= num_ties.unsqueeze(1)))
