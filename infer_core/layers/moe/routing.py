"""The router of a mixture-of-experts layer: which ``top_k`` experts each token goes to, with what weight."""

from __future__ import annotations

import torch


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, ids)`` [tokens, top_k] of the ``top_k`` largest softmax probabilities of each row of logits.

    The softmax is taken in float32 and the weights stay float32. ``renormalize`` divides each token's weights
    by their sum, so they sum to 1 (Mixtral always; Qwen-MoE where ``norm_topk_prob``); otherwise they are the
    probabilities themselves (Qwen-MoE's default). Device ops only: no host sync, so a CUDA graph captures it.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def local_ids(topk_ids: torch.Tensor, first: int | torch.Tensor, count: int) -> torch.Tensor:
    """The ids of experts ``first .. first + count - 1`` (one expert-parallel rank's) as ``0 .. count - 1``, every
    other expert's as ``count``: the id the grouping leaves out (``align.py``). ``first`` may be a tensor that
    broadcasts against ``topk_ids`` (each row its receiving rank's first expert)."""
    local = topk_ids - first
    return torch.where((local >= 0) & (local < count), local, count)
