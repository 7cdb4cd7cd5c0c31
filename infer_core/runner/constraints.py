"""The runner's side of structured outputs: each sampled constrained row's grammar mask.

Each constrained request has a matcher (``RequestState.matcher``, made from the constraint its
``NewRequestData`` carried). Before a step samples, the matcher accepts the request's output tokens
it has not seen: those the runner has been sent, then the token the previous step sampled that the
host has not been sent yet (overlapped scheduling), read from that step's copy to the host. It then
writes the tokens the grammar allows next into the row's bitmask, which goes to the device without
blocking. ``ModelRunner._sample`` calls this after the step's forward is launched, so the host's
work here overlaps the device's; a batch without constrained requests never comes here.

A matcher that is handed a token its grammar does not allow (possible only where another rule, such
as ``min_tokens`` banning the end token, left a row no allowed token) is dropped with a warning: the
request goes on unconstrained rather than failing the step.
"""

from __future__ import annotations

import logging
import numpy as np
import torch

from infer_core.runner.sampling_inputs import to_device
from infer_core.runner.state import RequestState, RequestTable
from infer_core.runner.step_output import SampledStep

logger = logging.getLogger(__name__)



def _accept(table: RequestTable, state: RequestState, token_id: int) -> None:
    matcher = state.matcher
    if matcher.is_terminated or matcher.accept(token_id):
        state.num_matched += 1
        return
    logger.warning("request %s: token %d is outside its grammar (another rule masked every allowed token); "
                   "it continues unconstrained", state.request_id, token_id)
    table.release_matcher(state)


def catch_up(table: RequestTable, state: RequestState, last_step: SampledStep | None,
             last_sample_rows: dict[str, int]) -> None:
    """Advance the request's matcher over every output token up to the one this step samples after; a
    pending token is read from the previous step's ids (``last_step``, at ``last_sample_rows``; its copy to
    the host awaited)."""
    known = len(state.token_ids) - state.num_prompt_tokens
    while state.matcher is not None and state.num_matched < known:
        _accept(table, state, state.token_ids[state.num_prompt_tokens + state.num_matched])
    if state.matcher is not None and state.num_pending_tokens and state.num_matched < known + state.num_pending_tokens:
        _accept(table, state, int(last_step.host_token_ids()[last_sample_rows[state.request_id]]))


def grammar_masks(table: RequestTable, states: list[RequestState], vocab_size: int, device: torch.device,
                  last_step: SampledStep | None, last_sample_rows: dict[str, int]
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows, bitmask) of the constrained rows among ``states`` (one per sampled row), on ``device``;
    None when no row is constrained. A row whose grammar has ended allows every token (its token is
    one the request no longer keeps)."""
    rows = []
    for row, state in enumerate(states):
        if state.matcher is not None:
            catch_up(table, state, last_step, last_sample_rows)
            if state.matcher is not None:
                rows.append(row)
    if not rows:
        return None
    bitmask = torch.full((len(rows), -(-vocab_size // 32)), -1, dtype=torch.int32)
    for i, row in enumerate(rows):
        matcher = states[row].matcher
        if not matcher.is_terminated:
            matcher.fill_bitmask(bitmask, i)
    return to_device(np.asarray(rows, dtype=np.int64), device), to_device(bitmask.numpy(), device)
