"""What a runner remembers about each request between steps.

Each request gets a row in ``RequestTable``'s host arrays (token ids, block table, computed
count), so a step's inputs are gathered with numpy indexing instead of per-token Python loops.
``RequestState`` keeps the per-request Python view the sampler needs (parameters, history).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from infer_core.interfaces import ConstraintMatcher, SchedulerOutput
from infer_core.sampling_params import SamplingParams


@dataclass(slots=True)
class RequestState:
    request_id: str
    token_ids: list[int]  # prompt + every output token the runner has been sent
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    row: int = -1  # this request's row in the RequestTable's arrays
    # Sampled by the previous step and not sent back yet (overlapped scheduling): they follow
    # ``token_ids``, and the last one's id is read from that step's sampled ids on the device (a
    # verify step's k+1: as if every draft were kept, see runner/accepted_drafts.py).
    num_pending_tokens: int = 0
    # Structured output: the grammar's matcher, and how many output tokens it has accepted so far.
    matcher: ConstraintMatcher | None = None
    num_matched: int = 0

    @property
    def num_output_tokens(self) -> int:
        """Output tokens so far, pending ones included (what min_tokens and seeded positions count)."""
        return len(self.token_ids) + self.num_pending_tokens - self.num_prompt_tokens


def _grown(array: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``array`` copied into a zeroed array of at least (rows, cols), growing by doubling."""
    new_rows, new_cols = array.shape
    while new_rows < rows:
        new_rows *= 2
    while new_cols < cols:
        new_cols *= 2
    if (new_rows, new_cols) == array.shape:
        return array
    grown = np.zeros((new_rows, new_cols), dtype=array.dtype)
    grown[: array.shape[0], : array.shape[1]] = array
    return grown


class RequestTable(Mapping[str, RequestState]):
    """The runner's requests by id, with their tokens and block tables in row-indexed host arrays.

    Rows are reused as requests leave; the arrays grow (doubling) when more requests or longer
    sequences arrive than they were sized for, so no size has to be known up front.
    """

    def __init__(self, num_rows: int = 8, max_tokens: int = 256, max_blocks: int = 16) -> None:
        self._states: dict[str, RequestState] = {}
        self._free_rows: list[int] = list(range(num_rows - 1, -1, -1))
        self.token_ids = np.zeros((num_rows, max_tokens), dtype=np.int32)
        self.block_table = np.zeros((num_rows, max_blocks), dtype=np.int32)
        self.num_computed_tokens = np.zeros(num_rows, dtype=np.int32)
        self.num_constrained = 0  # requests with a grammar matcher: 0 keeps the sampler's path free of them
        self.num_prompt_logprobs = 0  # requests that want prompt logprobs: 0 keeps the step's path free of them

    # Mapping ---------------------------------------------------------------------------------
    def __getitem__(self, request_id: str) -> RequestState:
        return self._states[request_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    # updates ---------------------------------------------------------------------------------
    def _take_row(self) -> int:
        if not self._free_rows:
            old = len(self.num_computed_tokens)
            self.token_ids = _grown(self.token_ids, 2 * old, 1)
            self.block_table = _grown(self.block_table, 2 * old, 1)
            self.num_computed_tokens = np.concatenate([self.num_computed_tokens, np.zeros(old, np.int32)])
            self._free_rows = list(range(2 * old - 1, old - 1, -1))
        return self._free_rows.pop()

    def _write_tokens(self, row: int, start: int, tokens: list[int]) -> None:
        end = start + len(tokens)
        if end > self.token_ids.shape[1]:
            self.token_ids = _grown(self.token_ids, 1, end)
        self.token_ids[row, start:end] = tokens

    def _write_blocks(self, row: int, start: int, block_ids: list[int]) -> None:
        end = start + len(block_ids)
        if end > self.block_table.shape[1]:
            self.block_table = _grown(self.block_table, 1, end)
        self.block_table[row, start:end] = block_ids

    def remove(self, request_id: str) -> None:
        state = self._states.pop(request_id, None)
        if state is not None:
            self._free_rows.append(state.row)
            self.num_constrained -= state.matcher is not None
            self.num_prompt_logprobs -= state.sampling_params.prompt_logprobs is not None

    def release_matcher(self, state: RequestState) -> None:
        """Stop constraining a request (runner/constraints.py: its matcher was handed a token it does not allow)."""
        if state.matcher is not None:
            state.matcher = None
            self.num_constrained -= 1

    def clear(self) -> None:
        for request_id in list(self._states):
            self.remove(request_id)

    def apply(self, output: SchedulerOutput) -> None:
        """Bring the runner's copies up to date: drop finished, add new, extend cached requests."""
        for request_id in output.finished_request_ids:
            self.remove(request_id)
        for new in output.new_requests:
            self.remove(new.request_id)  # resumed after preemption: rebuilt from scratch
            state = RequestState(new.request_id, list(new.token_ids), new.num_prompt_tokens, new.sampling_params,
                                 list(new.block_ids), new.num_computed_tokens, self._take_row())
            if new.constraint is not None:  # resumed after preemption too: a new matcher catches up on the outputs
                state.matcher = new.constraint.matcher()
                self.num_constrained += 1
            self.num_prompt_logprobs += new.sampling_params.prompt_logprobs is not None
            self._states[new.request_id] = state
            self._write_tokens(state.row, 0, state.token_ids)
            self._write_blocks(state.row, 0, state.block_ids)
            self.num_computed_tokens[state.row] = state.num_computed_tokens
        for cached in output.cached_requests:
            state = self._states[cached.request_id]
            if cached.new_token_ids:
                self._write_tokens(state.row, len(state.token_ids), cached.new_token_ids)
                state.token_ids.extend(cached.new_token_ids)
            if cached.new_block_ids:
                self._write_blocks(state.row, len(state.block_ids), cached.new_block_ids)
                state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens
            self.num_computed_tokens[state.row] = cached.num_computed_tokens
            state.num_pending_tokens = cached.num_pending_tokens
            end = len(state.token_ids) + cached.num_pending_tokens
            if end > self.token_ids.shape[1]:
                self.token_ids = _grown(self.token_ids, 1, end)  # room for the placeholders

    def write_draft_tokens(self, row: int, start: int, draft: list[int]) -> None:
        """Place a step's speculative tokens after the known ones (overwritten once they are known)."""
        self._write_tokens(row, start, draft)


def apply_scheduler_output(states: RequestTable, output: SchedulerOutput) -> None:
    """Bring the runner's copies up to date (see ``RequestTable.apply``)."""
    states.apply(output)
