"""The runner's side of structured outputs: advancing each constrained request's matcher and writing its mask.

Each constrained request has a matcher (``RequestState.matcher``, made from the constraint its
``NewRequestData`` carried). Before a step samples, the matcher accepts the request's output tokens
it has not seen: those the runner has been sent, then the token the previous step sampled that the
host has not been sent yet (overlapped scheduling), read from that step's copy to the host. It then
writes the tokens the grammar allows next into the row's bitmask (runner/grammar_masks.py keeps the
buffers and sends them to the device).

The matchers of one class accept their tokens in one call and fill their rows in one call
(``ConstraintMatcher.accept_each`` and ``fill_bitmasks``: xgrammar's run over many matchers). A matcher
whose grammar has ended counts a token as seen without accepting it, and its row allows every token
(its token is one the request no longer keeps). A matcher that is handed a token its grammar does not
allow (possible only where another rule, such as ``min_tokens`` banning the end token, left a row no
allowed token) is dropped with a warning: the request goes on unconstrained rather than failing the step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from infer_core.interfaces import ConstraintMatcher
from infer_core.runner.state import RequestState, RequestTable
from infer_core.runner.step_output import SampledStep

logger = logging.getLogger(__name__)


def _by_class(matchers: Sequence[ConstraintMatcher | None]) -> tuple[list[int], dict[type, list[int]]]:
    """(the indices of terminated matchers, the others' indices by class); None entries are left out."""
    ended: list[int] = []
    groups: dict[type, list[int]] = {}
    for i, matcher in enumerate(matchers):
        if matcher is None:
            continue
        if matcher.is_terminated:
            ended.append(i)
            continue
        group = groups.get(type(matcher))
        if group is None:
            group = groups[type(matcher)] = []
        group.append(i)
    return ended, groups


def accept_tokens(matchers: Sequence[ConstraintMatcher], token_ids: Sequence[int]) -> list[bool]:
    """Each matcher accepts its token, those of one class in one call; what each did (a terminated one: True,
    the token counted as seen). Changes nothing but the matchers."""
    accepted = [True] * len(matchers)
    for cls, indices in _by_class(matchers)[1].items():
        outcomes = cls.accept_each([matchers[i] for i in indices], [token_ids[i] for i in indices])
        for i, outcome in zip(indices, outcomes):
            accepted[i] = bool(outcome)
    return accepted


def fill_rows(matchers: Sequence[ConstraintMatcher | None], bitmask: Any, rows: Sequence[int]) -> None:
    """Write each matcher's allowed tokens into its row (``rows``) of ``bitmask``, those of one class in one call;
    a terminated matcher's row allows every token, a None's is left alone."""
    ended, groups = _by_class(matchers)
    for i in ended:
        bitmask[rows[i]].fill_(-1)
    for cls, indices in groups.items():
        cls.fill_bitmasks([matchers[i] for i in indices], bitmask, [rows[i] for i in indices])


def drop(table: RequestTable, state: RequestState, token_id: int) -> None:
    """The request's matcher refused ``token_id``: it goes on unconstrained."""
    logger.warning("request %s: token %d is outside its grammar (another rule masked every allowed token); "
                   "it continues unconstrained", state.request_id, token_id)
    table.release_matcher(state)


def _unseen_tokens(state: RequestState, last_step: SampledStep | None, last_sample_rows: dict[str, int],
                   host_ids: list[list[int]]) -> list[int]:
    """The output tokens the request's matcher has not accepted yet, in order: those the runner has been sent,
    then the pending one (read from the previous step's ids; ``host_ids`` caches them, its copy awaited once)."""
    known = len(state.token_ids) - state.num_prompt_tokens
    start = state.num_prompt_tokens + state.num_matched
    tokens = state.token_ids[start: state.num_prompt_tokens + known] if state.num_matched < known else []
    if state.num_pending_tokens and max(state.num_matched, known) < known + state.num_pending_tokens:
        if not host_ids:
            host_ids.append(last_step.host_token_ids().tolist())
        tokens.append(int(host_ids[0][last_sample_rows[state.request_id]]))
    return tokens


def catch_up(table: RequestTable, states: list[RequestState], last_step: SampledStep | None,
             last_sample_rows: dict[str, int]) -> None:
    """Advance the matchers of ``states`` (each with one) over every output token up to the one this step samples
    after, a round of one token per request at a time (one round where each is one token behind); a pending
    token is read from the previous step's ids (``last_step``, at ``last_sample_rows``; its copy to the host
    awaited)."""
    host_ids: list[list[int]] = []
    todo = [(state, tokens) for state in states
            if (tokens := _unseen_tokens(state, last_step, last_sample_rows, host_ids))]
    depth = 0
    while todo:
        token_ids = [tokens[depth] for _, tokens in todo]
        for (state, _), token_id, accepted in zip(todo, token_ids,
                                                  accept_tokens([state.matcher for state, _ in todo], token_ids)):
            if accepted:
                state.num_matched += 1
            else:
                drop(table, state, token_id)
        depth += 1
        todo = [(state, tokens) for state, tokens in todo if state.matcher is not None and depth < len(tokens)]
