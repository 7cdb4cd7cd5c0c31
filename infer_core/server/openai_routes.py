"""POST /v1/chat/completions and POST /v1/completions: typed bodies in, typed completions or SSE chunks out."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post

from infer_core.outputs import RequestOutput
from infer_core.server.best_of import best_completions, with_candidates
from infer_core.server.errors import OpenAIError, bad_request
from infer_core.server.generation import (
    PromptInput,
    Submitted,
    collect,
    completion_budget,
    new_request_id,
    submit,
)
from infer_core.server.http import (
    DISCONNECTED,
    JSONBody,
    require_ready,
    unless_disconnected,
)
from infer_core.server.openapi import documented
from infer_core.server.prompt_bound import check_text, check_token_ids
from infer_core.server.prompt_logprobs import (
    echoed_logprobs,
    joined,
    vllm_prompt_logprobs,
)
from infer_core.server.response_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    Completion,
    CompletionChoice,
)
from infer_core.server.responses import chat_logprobs, completion_logprobs
from infer_core.server.sse_stream import sse_events, stream_response, submitted_usage
from infer_core.server.schemas import ChatCompletionRequest, CompletionRequest
from infer_core.server.state import ServerState
from infer_core.server.tool_chat import (
    chat_prompt,
    choice_delta,
    structured_spec,
    tool_plan,
)
from infer_core.server.tools import ToolPlan

CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the log does
_ERRORS = (400, 404, 413, 415, 503)


def _state(request: Request) -> ServerState:
    return request.app.state.server


def _check_common(state: ServerState, body: ChatCompletionRequest | CompletionRequest, num_prompts: int,
                  num_candidates: int) -> None:
    """Checks chat and completions share, before any tokenizing: model, readiness, priority, token ids, queue room."""
    state.check_model(body.model)
    state.require_ready()
    if body.priority and state.settings.scheduler != "priority":
        raise bad_request(f"priority={body.priority} needs the priority scheduler, and this server runs "
                          f"{state.settings.scheduler!r}: start it with --scheduler priority, or send priority 0",
                          param="priority")
    vocab_size = len(state.tokenizer) if state.tokenizer is not None else None
    if body.stop_token_ids:
        check_token_ids([body.stop_token_ids], vocab_size, "stop_token_ids")
    if body.logit_bias:
        check_token_ids([[int(token) for token in body.logit_bias]], vocab_size, "logit_bias")
    state.check_queue(num_prompts * num_candidates)


# chat ------------------------------------------------------------------------------------------

@post("/v1/chat/completions", status_code=200, dto=JSONBody, return_dto=None, guards=[require_ready],
      responses=documented(ChatCompletion, "the completion (application/json), or with stream=true its chunks "
                                           "(text/event-stream)", *_ERRORS))
async def chat_completions(request: Request, data: ChatCompletionRequest) -> Response:
    """Chat through the model's chat template (OpenAI's chat completions)."""
    state = _state(request)
    body = data
    _check_common(state, body, num_prompts=1, num_candidates=body.num_choices)
    num_logprobs = body.num_logprobs()
    tools = tool_plan(state, body)
    spec = structured_spec(body, tools)
    prompt = await state.tokenize(chat_prompt, state, body, tools)
    max_tokens = completion_budget(state, len(prompt.token_ids), body.requested_max_tokens(),
                                   "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens",
                                   prompt_param="messages")
    request_id = new_request_id("chatcmpl")
    submitted = await submit(state, request_id, [prompt],
                             lambda p: body.sampling_params(state.defaults, max_tokens, num_logprobs, spec),
                             priority=body.priority or 0)
    created = int(time.time())
    top = num_logprobs or 0
    if body.is_stream:
        base = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": state.model_name}
        return stream_response(_chat_events(state, submitted, body, base, top, tools))
    done = await unless_disconnected(request, collect(state, submitted))
    if done is DISCONNECTED:
        return Response(b"", status_code=CLIENT_CLOSED)
    final = submitted[0].final
    choices = []
    for c in final.outputs:
        message, finish_reason = (tools.message(c.text, c.finish_reason) if tools is not None
                                  else (AssistantMessage("assistant", c.text), c.finish_reason))
        choices.append(ChatChoice(c.index, message, chat_logprobs(c, top), finish_reason))
    return Response(ChatCompletion(request_id, "chat.completion", created, state.model_name, choices,
                                   submitted_usage(submitted)))


def _chat_events(state: ServerState, submitted: list[Submitted], body: ChatCompletionRequest, base: dict[str, Any],
                 top: int, tools: ToolPlan | None) -> AsyncIterator[bytes]:
    started: set[int] = set()
    streams = {}  # choice index -> its ToolCallStream (tool calls are split from the content)

    def chunks(_: Submitted, output: RequestOutput) -> list[dict[str, Any]]:
        choices = []
        for c in output.outputs:
            if tools is not None and c.index not in streams:
                streams[c.index] = tools.stream()
            text, calls, finish_reason = choice_delta(tools, streams.get(c.index), c)
            has_logprobs = bool(c.delta_token_ids) and c.logprobs is not None
            if not (text or calls or has_logprobs or c.finished) and c.index in started:
                continue  # tokens whose text is held back (part of a character, a stop string or a tool call)
            delta: dict[str, Any] = {}
            if c.index not in started:
                started.add(c.index)
                delta["role"] = "assistant"
            if text or "role" in delta:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = calls
            logprobs = chat_logprobs(c, top, delta_only=True) if c.delta_token_ids else None
            choices.append({"index": c.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason})
        return choices

    return sse_events(state, submitted, chunks, body.include_usage, base)


# completions -----------------------------------------------------------------------------------

def _bound_texts(state: ServerState, texts: list[str]) -> None:
    """400 for a prompt that cannot fit the context, before it waits for the tokenizer thread."""
    for index, text in enumerate(texts):
        what = f"prompt {index} is" if len(texts) > 1 else "your prompt is"
        check_text(state.tokenizer, text, state.max_model_len, what, "prompt")


def _text_prompts(state: ServerState, texts: list[str]) -> list[PromptInput]:
    """Tokenize the prompts given as text (runs on the tokenizer thread)."""
    return [PromptInput(text, state.tokenizer.encode(text)) for text in texts]


def _decoder(state: ServerState):
    tokenizer = state.tokenizer
    return (lambda token_id: tokenizer.decode([token_id])) if tokenizer is not None else (lambda t: f"<token {t}>")


def _echo_text(state: ServerState, prompt: PromptInput) -> str:
    if prompt.text is not None:
        return prompt.text
    return state.tokenizer.decode(prompt.token_ids) if state.tokenizer is not None else ""


@post("/v1/completions", status_code=200, dto=JSONBody, return_dto=None, guards=[require_ready],
      responses=documented(Completion, "the completion (application/json), or with stream=true its chunks "
                                       "(text/event-stream)", *_ERRORS))
async def completions(request: Request, data: CompletionRequest) -> Response:
    """Continue a prompt given as text or token ids, or a list of either (OpenAI's legacy completions)."""
    state = _state(request)
    body = data
    raw = body.prompts()
    _check_common(state, body, num_prompts=len(raw), num_candidates=body.num_candidates)
    scores_prompt = bool(body.echo) and body.logprobs is not None  # echo with logprobs scores the prompt's tokens
    prompt_logprobs = max(body.logprobs, body.prompt_logprobs or 0) if scores_prompt else body.prompt_logprobs
    spec = body.structured_spec()
    if isinstance(raw[0], str):
        if state.tokenizer is None:
            raise bad_request("this model has no tokenizer: send the prompt as token ids", param="prompt")
        _bound_texts(state, raw)
        prompts = await state.tokenize(_text_prompts, state, raw)
    else:
        check_token_ids(raw, len(state.tokenizer) if state.tokenizer is not None else None)
        prompts = [PromptInput(None, ids) for ids in raw]
    budgets = {id(p): completion_budget(state, len(p.token_ids), body.max_tokens, "max_tokens", prompt_param="prompt")
               for p in prompts}
    request_id = new_request_id("cmpl")
    submitted = await submit(state, request_id, prompts,
                             lambda p: with_candidates(body.sampling_params(state.defaults, budgets[id(p)],
                                                                            body.logprobs, spec, prompt_logprobs),
                                                       body.num_candidates),
                             priority=body.priority or 0)
    created = int(time.time())
    n = body.num_choices
    top = body.logprobs or 0
    if body.is_stream:
        base = {"id": request_id, "object": "text_completion", "created": created, "model": state.model_name}
        return stream_response(_completion_events(state, submitted, body, base, top))
    done = await unless_disconnected(request, collect(state, submitted))
    if done is DISCONNECTED:
        return Response(b"", status_code=CLIENT_CLOSED)
    choices = []
    for item in submitted:
        prefix = _echo_text(state, item.prompt) if body.echo else ""
        outputs = item.final.outputs
        if body.num_candidates > n:
            outputs = best_completions(outputs, n, keep_logprobs=body.logprobs is not None)
        for c in outputs:
            logprobs = completion_logprobs(c, top, len(prefix))
            if scores_prompt:
                logprobs = joined(echoed_logprobs(item.final, top, _decoder(state)), logprobs)
            scored = vllm_prompt_logprobs(item.final) if body.prompt_logprobs is not None else None
            choices.append(CompletionChoice(item.index * n + c.index, prefix + c.text, logprobs, c.finish_reason,
                                            scored))
    return Response(Completion(request_id, "text_completion", created, state.model_name, choices, submitted_usage(submitted)))


def _completion_events(state: ServerState, submitted: list[Submitted], body: CompletionRequest,
                       base: dict[str, Any], top: int) -> AsyncIterator[bytes]:
    first: set[int] = set()  # choices whose first chunk was sent (it carries the echo and the prompt's logprobs)
    offsets: dict[int, int] = {}
    echo, num_choices, wants_prompt_logprobs = bool(body.echo), body.num_choices, body.prompt_logprobs is not None
    scores_prompt = echo and body.logprobs is not None

    def chunks(item: Submitted, output: RequestOutput) -> list[dict[str, Any]]:
        choices = []
        for c in output.outputs:
            index = item.index * num_choices + c.index
            text = c.delta_text
            starts = index not in first
            if echo and starts:
                prompt_text = _echo_text(state, item.prompt)
                text = prompt_text + text
                offsets[index] = len(prompt_text)
            has_logprobs = c.logprobs is not None and bool(c.delta_token_ids)
            finished = c.finish_reason is not None
            if not (text or has_logprobs or finished):
                continue  # tokens whose text is held back (part of a character or of a stop string)
            logprobs = None
            if starts:
                first.add(index)
            if has_logprobs:
                logprobs = completion_logprobs(c, top, offsets.get(index, 0), delta_only=True)
                offsets[index] = offsets.get(index, 0) + sum(len(t) for t in logprobs.tokens)
            if scores_prompt and starts:
                logprobs = joined(echoed_logprobs(output, top, _decoder(state)), logprobs)
            choice = {"index": index, "text": text, "logprobs": logprobs,
                      "finish_reason": c.finish_reason if finished else None}
            if starts and wants_prompt_logprobs:
                choice["prompt_logprobs"] = vllm_prompt_logprobs(output)
            choices.append(choice)
        return choices

    return sse_events(state, submitted, chunks, body.include_usage, base)
