"""The messages between the API server's process and the engine-core process: small and picklable.

Frontend -> core: ``AddRequest`` (one request's completions, as token ids), ``FinishRequests``
(client gone, stop string found, drain), ``SHUTDOWN``. Core -> frontend: ``CoreStarted`` (the
assembled configuration and the tokenizer, before the weights load), ``CoreReady``, ``CoreFailed``,
and one ``CoreStep`` per step: each progressed completion's new token ids in columns (lists of
strings and ints pickle an order of magnitude faster than one object per completion), finish
reasons, first-token facts and logprobs only where there are some, the acks of requests taken in,
the core's counters, and the prompt logprobs scored (``SamplingParams.prompt_logprobs``), if any. A
request's every field crosses in ``CoreRequest`` (its ``SamplingParams``: structured-output spec,
logit bias, stop token ids, ...; its priority): the grammar is compiled in the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from infer_core.engine.core import CoreRequest
from infer_core.engine.step_tally import StepTotals
from infer_core.interfaces import RequestStatus, RequestUpdate, SchedulerStats, TokenLogprobs

SHUTDOWN = "shutdown"
INTERNAL_ERROR = "internal_error"  # the code of a refusal that is the engine's fault, not the request's


class AddRequest(NamedTuple):
    request_id: str  # the request's own id, which its ack names
    completions: list[CoreRequest]  # its n completions; one prompt list shared (pickled once)


class FinishRequests(NamedTuple):
    request_ids: list[str]  # completion ids
    status: RequestStatus  # FINISHED_ABORTED, or FINISHED_STOPPED for a stop string the frontend found


class CoreStarted(NamedTuple):
    config: Any  # EngineConfig: max_model_len, the vocabulary, the model's folder, the device
    chosen: dict[str, Any]  # kind -> Implementation (for /v1/plugins)
    tokenizer: Any  # the model's tokenizer, loaded once (None: the model has none)


class CoreReady(NamedTuple):
    num_kv_blocks: int
    eos_token_ids: tuple[int, ...]


class CoreFailed(NamedTuple):
    reason: str  # "<Exception type>: <message>"


class CoreCounters(NamedTuple):
    """The core's side of ``EngineSnapshot``: what the scheduler reports, and tokens since start."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_preemptions: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: StepTotals = StepTotals()  # the core loop's step timeline (engine/step_tally.py)

    @classmethod
    def of(cls, stats: SchedulerStats, prompt_tokens: int, generation_tokens: int,
           steps: StepTotals = StepTotals()) -> CoreCounters:
        return cls(stats.num_running, stats.num_waiting, stats.kv_usage, stats.num_preemptions,
                   stats.prefix_queried_tokens, stats.prefix_hit_tokens, prompt_tokens, generation_tokens, steps)


class CoreStep(NamedTuple):
    request_ids: list[str]  # completions that progressed
    new_token_ids: list[list[int]]
    ended: list[tuple[int, str, int | str | None]]  # (row, finish reason, stop reason)
    first: list[tuple[int, int, float | None]]  # (row, prefix-cache hit, first scheduled time): first tokens
    logprobs: list[tuple[int, list[TokenLogprobs]]]  # (row, the new tokens' logprobs)
    admitted: list[str]  # request ids taken in since the last message
    refused: list[tuple[str, str, str | None, str | None]]  # (request id, message, param, code)
    counters: CoreCounters
    # SamplingParams.prompt_logprobs: completion id -> (index of the first prompt token scored, its and the
    # following tokens' logprobs); only where a step scored some (EngineCore.take_prompt_logprobs)
    prompt_logprobs: dict[str, tuple[int, list[TokenLogprobs]]] | None = None


def encode_updates(updates: list[RequestUpdate]) -> tuple[list, list, list, list, list]:
    """A step's updates as ``CoreStep``'s columns."""
    ids, tokens, ended, first, logprobs = [], [], [], [], []
    for row, update in enumerate(updates):
        request, new = update.request, update.new_token_ids
        ids.append(request.request_id)
        tokens.append(new)
        if update.finished:
            ended.append((row, request.status.value, request.stop_reason))
        if new and len(request.all_token_ids) - request.num_prompt_tokens == len(new):
            first.append((row, request.num_cached_tokens, request.first_scheduled_time))
        if update.new_logprobs:
            logprobs.append((row, update.new_logprobs))
    return ids, tokens, ended, first, logprobs


@dataclass(slots=True, eq=False)
class RemoteRequest:
    """The frontend's copy of a completion in the core: what the output processor reads of a Request."""

    request_id: str
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    num_cached_tokens: int = -1
    first_scheduled_time: float | None = None


def decode_updates(step: CoreStep, known: dict[str, RemoteRequest]) -> list[RequestUpdate]:
    """``CoreStep``'s columns as updates for the output processor; a completion the frontend no longer
    tracks (aborted, or ended by a stop string while the core ran on) gets a copy nobody reads."""
    updates = [RequestUpdate(known.get(rid) or RemoteRequest(rid), new, None, False)
               for rid, new in zip(step.request_ids, step.new_token_ids)]
    for row, num_cached, first_scheduled in step.first:
        request = updates[row].request
        request.num_cached_tokens, request.first_scheduled_time = num_cached, first_scheduled
    for row, entries in step.logprobs:
        updates[row].new_logprobs = entries
    for row, reason, stop_reason in step.ended:
        update = updates[row]
        update.finished = True
        update.request.status, update.request.stop_reason = RequestStatus(reason), stop_reason
    return updates
