"""The ``fcfs`` scheduler: continuous batching with chunked prefill and preemption by recompute.

Each step spends a budget of ``max_num_batched_tokens``: first on running requests, oldest
first (a decode costs one token, an unfinished prompt a chunk), then on waiting requests in
arrival order. When the pool runs out of blocks the newest running request is preempted: its
blocks are freed and it goes back to the front of the queue to be recomputed later (cheaply,
when its blocks are still in the prefix cache).

The engine may plan step N+1 before step N's result is back (overlapped scheduling): a request
then counts step N's tokens as in flight, and the tokens step N samples for it as pending, whose
ids the runner reads on the device. A step that verifies k drafts counts k+1 pending tokens, as if
every draft were kept; ``update`` takes back the rejected ones, and the runner moves a step planned
in between back by as many on the device (runner/accepted_drafts.py). A request whose pending
tokens reach its last is not scheduled again.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterable

from infer_core.builtin.fcfs_admission import arrival_key, check_admission, enqueue
from infer_core.interfaces import RequestError
from infer_core.interfaces import (
    CachedRequestData,
    NewRequestData,
    Request,
    RequestStatus,
    RequestUpdate,
    RunnerOutput,
    Scheduler,
    SchedulerOutput,
    SchedulerStats,
)


class FCFSScheduler(Scheduler):
    supports_overlap = True
    # The order requests wait in and run in; the last running request is the one preempted.
    order = staticmethod(arrival_key)

    def __init__(self, config, kv_allocator) -> None:
        super().__init__(config, kv_allocator)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # oldest first
        self.requests: dict[str, Request] = {}
        self.finished_ids: set[str] = set()
        self.num_preemptions = 0
        # The Request objects each planned step ran, by id(SchedulerOutput): a step's result is read
        # after the next step is planned, when an id may already name a new request (abort + re-add).
        self._planned: dict[int, dict[str, Request]] = {}

    # admission (its checks and queue order: fcfs_admission) ------------------------------------

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise RequestError(f"request id {request.request_id!r} is already in use", param="request_id")
        check_admission(request, self.config, self.kv_allocator)
        self.requests[request.request_id] = request
        enqueue(self.waiting, request, self.order)

    # scheduling ----------------------------------------------------------------------------

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv_allocator.free(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_inflight_tokens = 0
        request.num_pending_tokens = 0  # a token still in flight is dropped; it is sampled again on resume
        request.num_synced_tokens = 0
        request.num_kv_slots = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.finished_ids.add(request.request_id)  # the runner drops its state; it is re-sent as new
        self._requeue(request)

    def _requeue(self, request: Request) -> None:
        """A preempted request waits again: first, to be resumed before anything newer starts."""
        self.waiting.appendleft(request)

    def _num_new_tokens(self, request: Request, budget: int) -> tuple[int, list[int]]:
        """Tokens to compute this step, and the draft tokens among them.

        Drafts ride along a decode step only, all of them or none, and never past max_model_len
        or max_tokens.
        """
        num_pending = request.num_pending_tokens
        pending = request.num_tokens + num_pending - request.num_computed_tokens - request.num_inflight_tokens
        drafts: list[int] = []
        if pending == 1 and request.spec_token_ids:
            room = min(self.config.max_model_len - request.num_tokens - num_pending,
                       request.max_tokens - request.num_output_tokens - num_pending - 1)
            drafts = request.spec_token_ids[: max(room, 0)]
            if pending + len(drafts) > budget:
                drafts = []
        return max(0, min(pending + len(drafts), budget)), drafts

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        allocator = self.kv_allocator
        block_size = allocator.block_size
        caches_prefixes = allocator.enable_prefix_caching
        max_model_len = self.config.max_model_len
        lookahead = self.config.num_lookahead_tokens
        cached_requests = out.cached_requests
        num_scheduled_tokens = out.num_scheduled_tokens
        running = RequestStatus.RUNNING
        preempted = False
        planned: dict[str, Request] = {}
        for request in list(self.running):
            if budget <= 0:
                break
            if request.status is not running:
                continue  # preempted earlier in this loop
            request_id = request.request_id
            all_token_ids = request.all_token_ids
            num_tokens = len(all_token_ids)
            num_pending = request.num_pending_tokens
            num_computed = request.num_computed_tokens + request.num_inflight_tokens
            decodes = num_tokens + num_pending - num_computed == 1
            if decodes and num_pending and (num_tokens + num_pending - request.num_prompt_tokens >= request.max_tokens
                                            or num_tokens + num_pending >= max_model_len):
                continue  # its last token is in flight: it ends when that step returns
            if decodes and not request.spec_token_ids:
                num_new, drafts = 1, None  # a plain decode step, the common case (budget > 0 here)
            else:
                num_new, drafts = self._num_new_tokens(request, budget)
                if num_new == 0:
                    continue
            # fcfs_admission.max_slots, min() written out: this loop runs once per running request every step.
            max_slots = request.num_prompt_tokens + request.max_tokens
            if max_slots > max_model_len:
                max_slots = max_model_len
            max_slots += lookahead - 1
            target = num_computed + num_new + lookahead
            if target > max_slots:
                target = max_slots
            if target <= request.num_kv_slots:
                new_blocks = []  # room in its last block: nothing to ask the allocator
            else:
                while (new_blocks := allocator.allocate(request_id, target)) is None:
                    # ``running`` is kept in age order (equal ages in arrival order), so its last is the
                    # newest, and never a request already placed in this step's batch, even when the
                    # n completions of one prompt share an age.
                    victim = self.running[-1]
                    self._preempt(victim)
                    preempted = True
                    if victim is request:
                        break
                if request.status is not running:
                    continue
                request.num_kv_slots = allocator.num_blocks_for(target) * block_size
            num_synced = request.num_synced_tokens
            new_token_ids = [all_token_ids[-1]] if num_synced == num_tokens - 1 else all_token_ids[num_synced:]
            cached_requests.append(CachedRequestData(request_id, new_token_ids, new_blocks, num_computed, num_pending))
            num_scheduled_tokens[request_id] = num_new
            planned[request_id] = request
            request.num_inflight_tokens += num_new
            if num_computed + num_new >= num_tokens + num_pending:  # this step samples for it
                request.num_pending_tokens = num_pending + 1 + (len(drafts) if drafts else 0)
            if drafts:
                out.spec_token_ids[request_id] = list(drafts)
            request.num_synced_tokens = num_tokens
            # Earlier calls offered the allocator at least the first min(num_computed, num_synced) tokens;
            # it is asked again only when a block became full since, else it would have nothing to do.
            if caches_prefixes:
                computed_after = num_computed + num_new
                if computed_after > num_tokens:
                    computed_after = num_tokens
                offered = num_computed if num_computed < num_synced else num_synced
                if computed_after // block_size > offered // block_size:
                    allocator.cache_blocks(request_id, all_token_ids, computed_after)
            budget -= num_new

        while self.waiting and budget > 0 and not preempted and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            # a request that wants prompt logprobs computes every position: cached ones would have no logits
            reusable = request.num_tokens - 1 if request.sampling_params.prompt_logprobs is None else 0
            prefix = allocator.lookup_prefix(request.request_id, request.all_token_ids, reusable)
            request.num_computed_tokens = prefix.num_tokens
            num_new, drafts = self._num_new_tokens(request, budget)
            if allocator.allocate(request.request_id, prefix.num_tokens + num_new, prefix) is None:
                request.num_computed_tokens = 0
                break
            request.num_kv_slots = allocator.num_blocks_for(prefix.num_tokens + num_new) * allocator.block_size
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = prefix.num_tokens
                request.first_scheduled_time = time.monotonic()
            bisect.insort(self.running, request, key=self.order)
            out.new_requests.append(NewRequestData(
                request.request_id, list(request.all_token_ids), request.num_prompt_tokens,
                request.sampling_params, allocator.block_ids(request.request_id), request.num_computed_tokens,
                request.constraint,
            ))
            self._scheduled(out, request, num_new, drafts)
            planned[request.request_id] = request
            budget -= num_new

        out.finished_request_ids = self.finished_ids
        if planned:
            self._planned[id(out)] = planned
        self.finished_ids = set()
        return out

    def _scheduled(self, out: SchedulerOutput, request: Request, num_new: int, drafts: list[int]) -> None:
        out.num_scheduled_tokens[request.request_id] = num_new
        if drafts:
            out.spec_token_ids[request.request_id] = list(drafts)
        request.num_inflight_tokens = num_new
        if request.num_computed_tokens + num_new >= request.num_tokens:
            request.num_pending_tokens = 1 + len(drafts)  # the whole prompt is in: this step samples
        request.num_synced_tokens = request.num_tokens
        self.kv_allocator.cache_blocks(request.request_id, request.all_token_ids,
                                       min(request.num_computed_tokens + num_new, request.num_tokens))

    # results -------------------------------------------------------------------------------

    def update(self, output: SchedulerOutput, runner_output: RunnerOutput, accepted: dict[str, list[int]]):
        updates: list[RequestUpdate] = []
        max_len = self.config.max_model_len
        requests, running = self.requests, RequestStatus.RUNNING
        spec_token_ids, num_scheduled_tokens = output.spec_token_ids, output.num_scheduled_tokens
        all_logprobs = runner_output.logprobs
        planned = self._planned.pop(id(output), requests)
        for index, request_id in enumerate(runner_output.request_ids):
            request = planned.get(request_id)
            if request is None or request.status is not running:
                continue  # finished or preempted while the step ran (the id may name a newer request now)
            tokens = accepted.get(request_id, ())
            num_computed = num_scheduled_tokens[request_id]
            request.num_inflight_tokens -= num_computed
            spec = spec_token_ids.get(request_id) if spec_token_ids else None
            if spec:
                num_computed -= len(spec) + 1 - len(tokens)  # the rejected drafts
            request.num_computed_tokens += num_computed
            if tokens:  # the step that sampled them is back
                request.num_pending_tokens -= 1 + (len(spec) if spec else 0)
            if len(tokens) == 1:  # a decode step
                new_tokens = [tokens[0]]
                finished = request.append_output_token(tokens[0], max_len)
            else:
                new_tokens = []
                finished = False
                for token in tokens:
                    new_tokens.append(token)
                    if request.append_output_token(token, max_len):
                        finished = True
                        break
            logprobs = all_logprobs[index] if all_logprobs else None
            if logprobs is not None:
                logprobs = logprobs[: len(new_tokens)]
            if finished:
                self._release(request)
            if new_tokens or finished:
                updates.append(RequestUpdate(request, new_tokens, logprobs, finished))
        return updates

    def _release(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        self.kv_allocator.free(request.request_id)
        self.requests.pop(request.request_id, None)
        self.finished_ids.add(request.request_id)

    def finish(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        ended = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            request.status = status
            self._release(request)
            ended.append(request)
        return ended

    def get(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def stats(self) -> SchedulerStats:
        kv = self.kv_allocator.stats()
        return SchedulerStats(len(self.running), len(self.waiting), self.num_preemptions, kv.usage,
                              kv.prefix_queried_tokens, kv.prefix_hit_tokens)

    @property
    def num_unfinished(self) -> int:
        return len(self.running) + len(self.waiting)
