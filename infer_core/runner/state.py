"""What a runner remembers about each request between steps."""

from __future__ import annotations

from dataclasses import dataclass

from infer_core.interfaces import SchedulerOutput
from infer_core.sampling_params import SamplingParams


@dataclass(slots=True)
class RequestState:
    request_id: str
    token_ids: list[int]  # prompt + every output token the runner has been sent
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def apply_scheduler_output(states: dict[str, RequestState], output: SchedulerOutput) -> None:
    """Bring the runner's copies up to date: drop finished, add new, extend cached requests."""
    for request_id in output.finished_request_ids:
        states.pop(request_id, None)
    for new in output.new_requests:
        states[new.request_id] = RequestState(
            new.request_id, list(new.token_ids), new.num_prompt_tokens, new.sampling_params,
            list(new.block_ids), new.num_computed_tokens,
        )
    for cached in output.cached_requests:
        state = states[cached.request_id]
        state.token_ids.extend(cached.new_token_ids)
        state.block_ids.extend(cached.new_block_ids)
        state.num_computed_tokens = cached.num_computed_tokens
