"""The path chat and completions share: context check, submission, merged streams, cleanup.

One HTTP request may carry several prompts (completions' list form); each becomes one engine
request of ``n`` completions. Whatever way the HTTP request ends — finished, error, client gone —
every engine request it started is finished or aborted, so no KV block outlives it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from infer_core.engine.request_stream import RequestStream
from infer_core.errors import EngineDeadError, RequestError
from infer_core.outputs import RequestOutput
from infer_core.sampling_params import SamplingParams
from infer_core.server.errors import OpenAIError, bad_request
from infer_core.server.state import ServerState


_ID_BITS = random.Random()  # seeded from the OS once; ids name requests, they guard nothing


def new_request_id(prefix: str) -> str:
    """``<prefix>-`` and 32 random hex digits, as ``uuid4().hex`` (which asks the OS for randomness every call)."""
    return f"{prefix}-{_ID_BITS.getrandbits(128):032x}"


@dataclass(frozen=True, slots=True)
class PromptInput:
    text: str | None  # the prompt as text (for echo), when known
    token_ids: list[int]


@dataclass(slots=True)
class Submitted:
    index: int  # which prompt of the HTTP request
    prompt: PromptInput
    stream: RequestStream
    final: RequestOutput | None = None


def completion_budget(state: ServerState, num_prompt_tokens: int, requested: int | None, param: str,
                      prompt_param: str) -> int:
    """max_tokens for a prompt; 400 context_length_exceeded when prompt + completion exceed the context."""
    limit = state.max_model_len
    completion = requested if requested is not None else max(1, limit - num_prompt_tokens)
    if requested is not None and requested < 1:
        raise bad_request(f"{param} must be at least 1, got {requested}", param=param)
    if num_prompt_tokens + completion > limit:
        raise OpenAIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                               f"{num_prompt_tokens + completion} tokens ({num_prompt_tokens} in the messages, "
                               f"{completion} in the completion). Please reduce the length of the messages or "
                               f"completion.", param=prompt_param, code="context_length_exceeded")
    return completion


def sampling_error(error: ValueError) -> OpenAIError:
    """SamplingParams' messages start with the field's name; that is the param."""
    message = str(error)
    field_name = message.split(" ", 1)[0]
    return bad_request(message, param=field_name if field_name.isidentifier() else None)


async def submit(state: ServerState, request_id: str, prompts: list[PromptInput],
                 params_for: Callable[[PromptInput], SamplingParams], priority: int = 0) -> list[Submitted]:
    """Queue every prompt (at ``priority``: lower runs first under the priority scheduler); on any failure,
    abort those already queued and raise the HTTP error."""
    state.require_ready()
    try:
        params = [params_for(p) for p in prompts]
    except ValueError as e:
        raise sampling_error(e) from None
    submitted: list[Submitted] = []
    try:
        for index, (prompt, sp) in enumerate(zip(prompts, params)):
            rid = request_id if len(prompts) == 1 else f"{request_id}-{index}"
            stream = await state.engine.add_request(rid, prompt.token_ids, sp, priority=priority)
            submitted.append(Submitted(index, prompt, stream))
    except BaseException as e:
        abort_unfinished(state, submitted)
        if isinstance(e, RequestError):
            raise OpenAIError(400, str(e), param=e.param, code=e.code) from None
        if isinstance(e, EngineDeadError):
            raise OpenAIError(503, str(e), headers={"Retry-After": "5"}) from None
        raise
    return submitted


def abort_unfinished(state: ServerState, submitted: list[Submitted]) -> None:
    for item in submitted:
        if not item.stream.finished:
            state.engine.abort(item.stream.request_id)


class SubmittedOutputs:
    """Outputs of every submitted request as they come: ``await next()`` gives (request, output), None once all
    have ended; ``close()`` aborts the unfinished ones (call it however the reading ends). One request (the
    common case) is read straight from its stream: no task, no queue, no async generator between."""

    def __init__(self, state: ServerState, submitted: list[Submitted]) -> None:
        self._state = state
        self._submitted = submitted
        self._queue: asyncio.Queue[tuple[Submitted, RequestOutput | BaseException | None]] | None = None
        self._tasks: list[asyncio.Future] = []
        self._remaining = len(submitted)
        if len(submitted) > 1:
            self._queue = asyncio.Queue()
            self._tasks = [asyncio.ensure_future(self._pump(item)) for item in submitted]

    async def _pump(self, item: Submitted) -> None:
        queue = self._queue
        try:
            async for output in item.stream:
                await queue.put((item, output))
        except BaseException as e:
            await queue.put((item, e))
        await queue.put((item, None))

    async def next(self) -> tuple[Submitted, RequestOutput] | None:
        if self._queue is None:
            item = self._submitted[0]
            output = await item.stream.next()
            if output is None:
                return None
            item.final = output
            return item, output
        while self._remaining:
            item, output = await self._queue.get()
            if output is None:
                self._remaining -= 1
            elif isinstance(output, BaseException):
                raise output
            else:
                item.final = output
                return item, output
        return None

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        abort_unfinished(self._state, self._submitted)


async def merged(state: ServerState, submitted: list[Submitted]) -> AsyncIterator[tuple[Submitted, RequestOutput]]:
    """``SubmittedOutputs`` as an async iterator; aborts the unfinished requests if left early."""
    outputs = SubmittedOutputs(state, submitted)
    try:
        while (got := await outputs.next()) is not None:
            yield got
    finally:
        outputs.close()


async def collect(state: ServerState, submitted: list[Submitted]) -> list[Submitted]:
    """Run every request to its end (non-streaming responses)."""
    async for _ in merged(state, submitted):
        pass
    return submitted
