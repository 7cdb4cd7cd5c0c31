"""Prompt logprobs: how likely each prompt token was, given the tokens before it (``SamplingParams.prompt_logprobs``).

Position ``p`` of a prompt's chunk predicts token ``p + 1``, so the hidden state of every computed
prompt position but the last scores the next prompt token; the LM head runs on those rows as well as
on the sampled ones. A step that carries such a chunk runs eagerly (a CUDA graph computes the
sampled rows' logits only), and a request that wants them is computed from its first token (the
scheduler skips its prefix-cache hit: cached positions would have no logits). A request preempted
mid-prompt scores its recomputed positions again, with the same values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from infer_core.interfaces import SchedulerOutput, TokenLogprobs
from infer_core.runner.sampling_inputs import to_device
from infer_core.runner.state import RequestTable

if TYPE_CHECKING:  # runner/inputs.py imports this module for PromptLogprobPlan
    from infer_core.runner.inputs import StepInputs

# request id -> (index of its first scored prompt token, that token's and the following ones' logprobs)
PromptLogprobs = dict[str, tuple[int, list[TokenLogprobs]]]


@dataclass(slots=True)
class PromptLogprobPlan:
    """The step's scored positions: rows of the flat batch and the prompt tokens they predict."""

    request_ids: list[str]
    first_tokens: list[int]  # per request: the index of the first prompt token it scores this step
    counts: list[int]  # per request: how many it scores
    rows: torch.Tensor  # int64 [K] flat-batch rows, on the device
    target_ids: torch.Tensor  # int64 [K] the prompt token each row predicts, on the device
    num_top: int  # the most alternatives any of them wants
    logits: torch.Tensor | None = None  # [K, V] set by the forward


def wanting_prompt_logprobs(output: SchedulerOutput, table: RequestTable) -> list[str]:
    """The scheduled requests that want prompt logprobs and compute prompt positions this step."""
    wanted = []
    for request_id in output.num_scheduled_tokens:
        state = table[request_id]
        if state.sampling_params.prompt_logprobs is not None and state.num_computed_tokens < state.num_prompt_tokens - 1:
            wanted.append(request_id)
    return wanted


def plan_prompt_logprobs(request_ids: list[str], inputs: StepInputs, scheduled: dict[str, int],
                         table: RequestTable) -> PromptLogprobPlan:
    """Which rows of the step's flat batch (``inputs``) score which prompt tokens, for ``request_ids`` (from
    ``wanting_prompt_logprobs``)."""
    index = {rid: i for i, rid in enumerate(inputs.request_ids)}
    query_start_loc, device = inputs.metadata.query_start_loc_cpu.numpy(), inputs.input_ids.device
    rows, targets, firsts, counts = [], [], [], []
    for request_id in request_ids:
        state = table[request_id]
        computed = state.num_computed_tokens
        end = min(computed + scheduled[request_id], state.num_prompt_tokens - 1)  # the last position predicts none
        positions = np.arange(computed, end, dtype=np.int64)
        rows.append(int(query_start_loc[index[request_id]]) + positions - computed)
        targets.append(table.token_ids[state.row, computed + 1: end + 1].astype(np.int64))
        firsts.append(computed + 1)
        counts.append(len(positions))
    num_top = max(table[rid].sampling_params.prompt_logprobs for rid in request_ids)
    return PromptLogprobPlan(request_ids, firsts, counts, to_device(np.concatenate(rows), device),
                             to_device(np.concatenate(targets), device), num_top)


def score(plan: PromptLogprobPlan, table: RequestTable) -> PromptLogprobs | None:
    """Each scored token's logprob, rank and top alternatives, on the host (waits for the device); None where
    the forward computed no logits for the plan."""
    if plan.logits is None:
        return None
    logprobs = plan.logits.float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, plan.target_ids.unsqueeze(1)).squeeze(1)
    ranks = (logprobs > chosen.unsqueeze(1)).sum(dim=-1) + 1
    top_lp, top_ids = logprobs.topk(plan.num_top, dim=-1) if plan.num_top else (None, None)
    chosen, ranks, targets = chosen.tolist(), ranks.tolist(), plan.target_ids.tolist()
    top_lp = top_lp.tolist() if top_lp is not None else None
    top_ids = top_ids.tolist() if top_ids is not None else None
    scored: PromptLogprobs = {}
    start = 0
    for request_id, first, count in zip(plan.request_ids, plan.first_tokens, plan.counts):
        wanted = table[request_id].sampling_params.prompt_logprobs
        entries = [TokenLogprobs(targets[k], chosen[k], ranks[k], top_ids[k][:wanted] if top_ids else [],
                                 top_lp[k][:wanted] if top_lp else []) for k in range(start, start + count)]
        scored[request_id] = (first, entries)
        start += count
    return scored
