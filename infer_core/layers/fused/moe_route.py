"""The router's top-k (``layers/moe/routing.py``'s ``route``) in one launch: softmax over each token's expert
logits in float32, its ``TOP_K`` largest probabilities and their experts, renormalised to sum to 1 where asked.

Each program takes ``ROWS`` tokens whole (every expert's logit in one tile) and picks the experts one at a time:
the largest probability (the lowest expert among equals), which is then struck out. The weights are those of
``route`` up to float32 rounding (the softmax's sum is taken in another order); the experts are the same where
no two probabilities are within that rounding of each other at the k-th place. An expert-parallel rank asks for
its own experts' ids (``local``): counted from its first expert, and another rank's expert as its expert count, the
id the grouping leaves out (``layers/moe/align.py``), so no launch of its own maps them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter

MAX_EXPERTS = 1024  # a token's logits in one tile; routers over more experts take route()'s torch ops


@triton.jit(do_not_specialize=["num_tokens", "first_expert", "num_local"])
def _moe_route_kernel(logits_ptr, weights_ptr, ids_ptr, num_tokens, num_experts, stride_t, first_expert, num_local,
                      TOP_K: tl.constexpr,
                      RENORMALIZE: tl.constexpr, EXPERTS: tl.constexpr, KS: tl.constexpr, ROWS: tl.constexpr,
                      USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    experts = tl.arange(0, EXPERTS)
    in_rows = rows < num_tokens
    read = tl.minimum(rows, num_tokens - 1).to(tl.int64)  # rows past the end repeat the last (stored nowhere)
    logits = tl.load(logits_ptr + read[:, None] * stride_t + experts[None, :], mask=(experts < num_experts)[None, :],
                     other=float("-inf")).to(tl.float32)
    shifted = tl.exp(logits - tl.max(logits, axis=1)[:, None])  # experts past num_experts: exp(-inf) = 0
    probs = shifted / tl.sum(shifted, axis=1)[:, None]
    ks = tl.arange(0, KS)
    top_weights = tl.zeros([ROWS, KS], dtype=tl.float32)
    top_ids = tl.zeros([ROWS, KS], dtype=tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.argmax(probs, axis=1, tie_break_left=True)
        weight = tl.max(probs, axis=1)
        top_weights = tl.where(ks[None, :] == k, weight[:, None], top_weights)
        top_ids = tl.where(ks[None, :] == k, best[:, None], top_ids)
        probs = tl.where(experts[None, :] == best[:, None], -1.0, probs)  # struck out: below every probability
    if RENORMALIZE:
        top_weights = top_weights / tl.sum(top_weights, axis=1)[:, None]
    local = top_ids - first_expert
    top_ids = tl.where((local >= 0) & (local < num_local), local, num_local)
    out = rows[:, None].to(tl.int64) * TOP_K + ks[None, :]
    out_mask = in_rows[:, None] & (ks < TOP_K)[None, :]
    tl.store(weights_ptr + out, top_weights, mask=out_mask)
    tl.store(ids_ptr + out, top_ids, mask=out_mask)


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool,
              local: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``route(router_logits, top_k, renormalize)`` in one launch: float32 weights and int32 expert ids
    [tokens, top_k]; the logits ``[tokens, experts]`` with contiguous experts, at most ``MAX_EXPERTS``.

    ``local=(first, count)``: the ids of experts ``first .. first + count - 1`` as ``0 .. count - 1``, every other
    expert's as ``count`` (:func:`~infer_core.layers.moe.routing.local_ids`)."""
    num_tokens, num_experts = router_logits.shape
    if num_experts > MAX_EXPERTS or router_logits.stride(1) != 1:
        raise ValueError(f"moe_route takes up to {MAX_EXPERTS} experts with contiguous logits, got "
                         f"{tuple(router_logits.shape)} of strides {router_logits.stride()}: use route()")
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be between 1 and the {num_experts} experts")
    first, count = local if local is not None else (0, num_experts)
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    if num_tokens == 0:
        return weights, ids
    experts, rows, warps = route_tiles(num_tokens, num_experts)
    pdl = use_pdl(router_logits)
    _moe_route_kernel[(triton.cdiv(num_tokens, rows),)](
        router_logits, weights, ids, num_tokens, num_experts, router_logits.stride(0), first, count, TOP_K=top_k,
        RENORMALIZE=renormalize, EXPERTS=experts, KS=triton.next_power_of_2(top_k), ROWS=rows, USE_PDL=pdl,
        launch_pdl=pdl, num_warps=warps)
    return weights, ids


def route_tiles(num_tokens: int, num_experts: int) -> tuple[int, int, int]:
    """``(EXPERTS, ROWS, warps)`` of a launch: up to 16 tokens a program (2,048 logits), no more rows than the
    step has, and one warp up to 16 logits a thread, so a decode step's reductions are warp shuffles, not trips
    through shared memory. The routing sits between the router GEMV and the experts' GEMVs, on every layer's
    critical path."""
    experts = triton.next_power_of_2(num_experts)
    rows = max(1, min(16, 2048 // experts, triton.next_power_of_2(num_tokens)))
    return experts, rows, max(1, min(4, rows * experts // 512))
