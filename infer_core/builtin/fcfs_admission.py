"""Admission to the ``fcfs`` scheduler: what a request can ever hold, what is refused, where it queues.

A request is checked once, when it is added: one that could never be served (an empty prompt, a
prompt that leaves no room to generate, more KV blocks than the whole pool) is refused there with
the arithmetic, instead of waiting in the queue forever. The rest queue in arrival order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from infer_core.interfaces import RequestError
from infer_core.interfaces import KVAllocator, Request, SchedulerConfig


def arrival_key(request: Request) -> tuple[float, int]:
    """The order requests are served in: arrival, then priority (lower first) among equal arrivals."""
    return (request.arrival_time, request.priority)


def max_slots(request: Request, config: SchedulerConfig) -> int:
    """The most KV slots the request can ever hold (its allocations are capped at this).

    The last sampled token ends the request before its K/V is written, so it needs no slot.
    """
    limit = min(request.num_prompt_tokens + request.max_tokens, config.max_model_len)
    return limit - 1 + config.num_lookahead_tokens


def check_admission(request: Request, config: SchedulerConfig, kv_allocator: KVAllocator) -> None:
    """Refuse what could never be served, with the arithmetic in the message."""
    max_len = config.max_model_len
    prompt = request.num_prompt_tokens
    if prompt == 0:
        raise RequestError("the prompt is empty; send at least one token", param="prompt")
    if prompt >= max_len:
        raise RequestError(
            f"the prompt has {prompt} tokens but max_model_len is {max_len}: it leaves no room to generate; "
            f"shorten the prompt or raise max_model_len",
            code="context_length_exceeded", param="prompt",
        )
    total = max_slots(request, config)
    blocks = kv_allocator.num_blocks_for(total)
    if blocks > kv_allocator.num_blocks:
        lookahead = ", speculative lookahead included" if config.num_lookahead_tokens else ""
        raise RequestError(
            f"the request needs {blocks} KV blocks ({prompt} prompt + {request.max_tokens} max_tokens tokens at "
            f"{kv_allocator.block_size} tokens per block) but the KV pool holds only "
            f"{kv_allocator.num_blocks} blocks ({total} tokens need a slot: the last token never does"
            f"{lookahead}); lower max_tokens, or give the KV cache more memory "
            f"(num_kv_blocks, kv_cache_gb, gpu_memory_utilization)",
            code="kv_cache_exceeded", param="max_tokens",
        )


def enqueue(waiting: deque[Request], request: Request, key: Callable[[Request], tuple] = arrival_key) -> None:
    """Insert ``request`` into the waiting queue at its place in ``key`` order (``arrival_key`` by default)."""
    index = len(waiting)
    while index and key(waiting[index - 1]) > key(request):
        index -= 1
    waiting.insert(index, request)
