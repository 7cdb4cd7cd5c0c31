"""A streamed completion's response: its SSE events, from the engine's outputs to the bytes sent.

Every output token of every stream passes here, so the loop is kept flat: the request's outputs are read
by a plain coroutine (``SubmittedOutputs.next``), each output's choices are built by the route's
``chunks`` function, and each choice is encoded into the event's fixed frame (``ChunkFrame``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar.response import Stream

from infer_core.outputs import RequestOutput
from infer_core.server.errors import OpenAIError, envelope
from infer_core.server.generation import Submitted, SubmittedOutputs
from infer_core.server.response_schemas import Usage
from infer_core.server.responses import DONE, ChunkFrame, sse, usage
from infer_core.server.state import ServerState

Chunks = Callable[[Submitted, RequestOutput], list[dict[str, Any]]]  # an output's choices, as the route frames them


def submitted_usage(submitted: list[Submitted]) -> Usage:
    prompt = sum(len(s.prompt.token_ids) for s in submitted)
    completion = sum(len(c.token_ids) for s in submitted if s.final for c in s.final.outputs)
    cached = sum(s.final.num_cached_tokens for s in submitted if s.final)
    return usage(prompt, completion, cached)


# The handlers return Responses only: with a body type in their annotation, Litestar would give every
# response, the stream's too, that type's media type (application/json).
def stream_response(events: AsyncIterator[bytes]) -> Stream:
    return Stream(events, media_type="text/event-stream",
                  headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def sse_events(state: ServerState, submitted: list[Submitted], chunks: Chunks, include_usage: bool,
                     base: dict[str, Any]) -> AsyncIterator[bytes]:
    """The chunks of each output (one event per choice), an optional usage chunk, then [DONE]."""
    event = ChunkFrame(base, include_usage).event
    outputs = SubmittedOutputs(state, submitted)
    try:
        while (got := await outputs.next()) is not None:
            for choice in chunks(*got):
                yield event(choice)
        outputs.close()
        if include_usage:
            yield sse({**base, "choices": [], "usage": submitted_usage(submitted)})
    except OpenAIError as e:
        yield sse(envelope(e.status, e.message, e.param, e.code))
    except Exception as e:  # the engine died mid-stream: say so in-band, the status is already sent
        yield sse(envelope(503, str(e)))
    finally:
        outputs.close()  # whichever way it ends (the client gone: the generator is closed at a yield)
    yield DONE
