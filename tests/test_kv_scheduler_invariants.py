"""Invariants of the built-in KV allocator (``paged``) and scheduler (``fcfs``), driven as the engine drives them.

The real allocator and scheduler run step by step; only the model is replaced. The stand-in keeps
the real runner's per-request state (``apply_scheduler_output``), writes a shadow KV cache in which
each slot holds the token prefix whose K/V it would hold, checks that every position a request
attends to holds its own prefix (so a stale, shared or wrongly cached block shows up as a wrong
read), and samples tokens drawn by hypothesis (the EOS id among them). After every operation the
pool's accounting, the block tables, the prefix cache and the scheduler's queues are checked.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import chain, cycle

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from infer_core.builtin.kv_paged import PagedKVAllocator
from infer_core.builtin.scheduler_fcfs import FCFSScheduler
from infer_core.errors import RequestError
from infer_core.interfaces import Request, RequestStatus, RunnerOutput, SchedulerConfig, SchedulerOutput
from infer_core.runner.state import RequestTable, apply_scheduler_output
from infer_core.sampling_params import SamplingParams

EOS = 1
VOCAB = 5  # small, so different prefixes often share block contents (the chained keys must tell them apart)


def _age(request: Request) -> tuple[float, int]:
    return (request.arrival_time, request.priority)


def note(what: str) -> None:
    """Counts a scenario for ``--hypothesis-show-statistics`` (no-op in the plain tests)."""
    if currently_in_test_context():
        event(what)


def make_request(request_id: str, prompt: list[int], max_tokens: int, arrival_time: float = 0.0, *,
                 priority: int = 0, **params) -> Request:
    params = SamplingParams(max_tokens=max_tokens, **params)
    return Request(request_id, list(prompt), params, max_tokens, frozenset({EOS}), priority, arrival_time)


def _operation(method):
    """Marks the harness broken while an operation runs: after a failure, teardown must not drain."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        self.broken = True
        result = method(self, *args, **kwargs)
        self.broken = False
        return result

    return run


class Harness:
    """The real allocator and scheduler, a stand-in model, and the checks of every step."""

    def __init__(self, *, block_size: int, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, enable_prefix_caching: bool, num_lookahead_tokens: int = 0,
                 probes: tuple[tuple[int, ...], ...] = ()) -> None:
        self.block_size = block_size
        self.allocator = PagedKVAllocator(num_blocks, block_size, enable_prefix_caching)
        self.config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len, num_lookahead_tokens)
        self.scheduler = FCFSScheduler(self.config, self.allocator)
        self.runner_states = RequestTable()
        # shadow[block][slot]: the token prefix whose K/V the slot holds (None: never written since handed out)
        self.shadow: list[list[tuple[int, ...] | None]] = [[None] * block_size for _ in range(num_blocks)]
        self.live: dict[str, Request] = {}
        self.ended: dict[str, Request] = {}
        self.sampled: dict[str, list[int]] = {}  # every token the stand-in sampled for a request, in order
        self.probes = probes
        self.num_steps = 0
        self.num_adopted_tokens = 0  # prefix-cache hits the scheduler acted on
        self.broken = False

    # operations -----------------------------------------------------------------------------

    def refusal(self, request: Request) -> str | None:
        """Why a request can never be served here (None: it can)."""
        prompt = request.num_prompt_tokens
        max_len = self.config.max_model_len
        if prompt == 0:
            return "empty"
        if prompt >= max_len:
            return "too long"
        if self.num_kv_blocks_needed(request) > self.allocator.num_blocks:
            return "kv"
        return None

    def num_kv_blocks_needed(self, request: Request) -> int:
        """The last sampled token ends the request before its K/V is ever written."""
        max_num_tokens = min(request.num_prompt_tokens + request.max_tokens, self.config.max_model_len)
        return self.allocator.num_blocks_for(max_num_tokens - 1 + self.config.num_lookahead_tokens)

    @_operation
    def add(self, request: Request) -> bool:
        rid = request.request_id
        reason = self.refusal(request)
        try:
            self.scheduler.add(request)
        except RequestError as e:
            message = str(e)
            assert reason is not None, f"{rid} refused although it fits: {message}"
            assert self.scheduler.get(rid) is None
            note(f"refused: {reason}")
            if reason == "too long":
                assert str(request.num_prompt_tokens) in message and str(self.config.max_model_len) in message, message
            if reason == "kv":
                assert f"needs {self.num_kv_blocks_needed(request)} KV blocks" in message, message
                assert f"holds only {self.allocator.num_blocks} blocks" in message, message
            return False
        assert reason is None, f"{rid} admitted although it can never be served ({reason})"
        assert self.scheduler.get(rid) is request and request.status is RequestStatus.WAITING
        self.live[rid] = request
        self.sampled[rid] = []
        self.ended.pop(rid, None)
        return True

    @_operation
    def abort(self, rid: str, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        was_live = rid in self.live
        status_before = self.live[rid].status if was_live else None
        ended = self.scheduler.finish([rid], status)
        assert [r.request_id for r in ended] == ([rid] if was_live else [])
        assert self.scheduler.get(rid) is None
        assert rid not in self.allocator.seq_blocks, f"{rid} ended but still holds blocks"
        if was_live:
            note(f"aborted while {status_before.value}")
            request = self.live.pop(rid)
            assert request.status is status
            self.ended[rid] = request

    @_operation
    def step(self, sample: Callable[[], int]) -> SchedulerOutput:
        scheduler, allocator, bs = self.scheduler, self.allocator, self.block_size
        unfinished = scheduler.num_unfinished
        evictable_before = set(allocator.evictable)
        running_before = list(scheduler.running)
        waiting_before = list(scheduler.waiting)
        computed_before = {r.request_id: r.num_computed_tokens for r in running_before}
        out = scheduler.schedule()
        self.num_steps += 1
        scheduled = out.num_scheduled_tokens

        # The plan: progress whenever work is pending, within the budget, each request once.
        assert bool(scheduled) == bool(unfinished), f"no progress with {unfinished} requests pending"
        assert out.total_num_scheduled_tokens <= self.config.max_num_batched_tokens
        assert len(scheduled) <= self.config.max_num_seqs
        assert all(n >= 1 for n in scheduled.values()), scheduled
        new_ids = [new.request_id for new in out.new_requests]
        cached_ids = [c.request_id for c in out.cached_requests]
        assert len(new_ids) + len(cached_ids) == len(scheduled)
        assert set(new_ids) | set(cached_ids) == set(scheduled)
        for rid in scheduled:
            assert rid not in out.finished_request_ids or rid in new_ids, f"{rid} is scheduled and dropped at once"

        # Preemption: only the newest running requests, never one this step runs; they go back to waiting.
        preempted = [r for r in running_before if r.status is RequestStatus.PREEMPTED]
        if preempted:
            note("preempted")
        for victim in preempted:
            assert victim.request_id not in scheduled
            assert victim.request_id in out.finished_request_ids  # the runner must drop its state
            assert victim.num_computed_tokens == 0 and victim in scheduler.waiting
            assert victim.request_id not in allocator.seq_blocks
            for other in scheduler.running:
                assert _age(other) <= _age(victim), f"preempted {victim.request_id} though {other.request_id} is newer"
        # First come, first served: the preempted go to the front of the queue, and admission takes its head.
        queue = [r.request_id for r in preempted + waiting_before]
        assert new_ids == queue[: len(new_ids)], f"admitted {new_ids} out of the queue's order {queue}"
        assert [r.request_id for r in scheduler.waiting] == queue[len(new_ids):]

        apply_scheduler_output(self.runner_states, out)
        assert set(self.runner_states) == {r.request_id for r in scheduler.running}

        for rid, n in scheduled.items():
            request = scheduler.get(rid)
            state = self.runner_states[rid]
            assert request is not None and request.status is RequestStatus.RUNNING
            assert state.token_ids == request.all_token_ids
            assert state.num_computed_tokens == request.num_computed_tokens
            assert state.block_ids == allocator.block_ids(rid)
            assert request.num_computed_tokens + n <= request.num_tokens, "scheduled past the known tokens"
            # The block table covers the tokens computed after this step (and the lookahead slots a decode
            # reserves), and no more.
            lookahead = 0 if rid in new_ids else self.config.num_lookahead_tokens
            assert len(state.block_ids) == allocator.num_blocks_for(request.num_computed_tokens + n + lookahead)
            if rid in computed_before and rid not in new_ids:
                assert request.num_computed_tokens == computed_before[rid]

        # Blocks handed out fresh hold garbage; adopted prefix blocks keep their contents.
        for new in out.new_requests:
            assert new.num_computed_tokens % bs == 0 and new.num_computed_tokens < len(new.token_ids)
            if new.num_computed_tokens:
                self.num_adopted_tokens += new.num_computed_tokens
                note("prefix hit")
            for block in new.block_ids[new.num_computed_tokens // bs:]:
                self.shadow[block] = [None] * bs
        for cached in out.cached_requests:
            for block in cached.new_block_ids:
                self.shadow[block] = [None] * bs
        fresh = {b for new in out.new_requests for b in new.block_ids[new.num_computed_tokens // bs:]}
        fresh |= {b for cached in out.cached_requests for b in cached.new_block_ids}
        if fresh & evictable_before:
            note("cached block evicted")

        # The forward pass: write the scheduled tokens' K/V (whole batch first), then attend.
        written: set[tuple[int, int]] = set()
        for rid, n in scheduled.items():
            state = self.runner_states[rid]
            for pos in range(state.num_computed_tokens, state.num_computed_tokens + n):
                slot = (state.block_ids[pos // bs], pos % bs)
                assert slot not in written, f"two requests write block {slot[0]} slot {slot[1]} in one step"
                written.add(slot)
                self.shadow[slot[0]][slot[1]] = tuple(state.token_ids[: pos + 1])
        for rid, n in scheduled.items():
            state = self.runner_states[rid]
            for pos in range(state.num_computed_tokens + n):
                held = self.shadow[state.block_ids[pos // bs]][pos % bs]
                assert held == tuple(state.token_ids[: pos + 1]), (
                    f"{rid} reads position {pos} from block {state.block_ids[pos // bs]}, which holds {held}"
                )

        # Sample where the runner would: at the end of the known tokens. Decodes first, as the runner orders them.
        order = sorted(scheduled, key=lambda rid: scheduled[rid] != 1)
        tokens: list[list[int]] = []
        for rid in order:
            state = self.runner_states[rid]
            tokens.append([sample()] if state.num_computed_tokens + scheduled[rid] == len(state.token_ids) else [])
        runner_output = RunnerOutput(order, tokens, [None] * len(order))
        accepted = {rid: t for rid, t in zip(order, tokens) if t}
        updates = scheduler.update(out, runner_output, accepted)

        by_id = {u.request.request_id: u for u in updates}
        assert len(by_id) == len(updates) and set(by_id) == set(accepted)
        for rid, n in scheduled.items():
            request = self.live[rid]
            assert request.num_computed_tokens == self.runner_states[rid].num_computed_tokens + n
            if rid in accepted:
                update = by_id[rid]
                self.sampled[rid] += accepted[rid]
                assert update.new_token_ids == accepted[rid]
                assert request.output_token_ids == self.sampled[rid]
                assert update.finished == request.is_finished
                if update.finished:
                    note(f"finished: {request.status.value}")
                    self._check_finish(request)
                    assert scheduler.get(rid) is None and rid not in allocator.seq_blocks
                    self.ended[rid] = self.live.pop(rid)
        return out

    def _check_finish(self, request: Request) -> None:
        outputs = request.output_token_ids
        if request.status is RequestStatus.FINISHED_STOPPED:
            assert outputs[-1] == EOS and not request.sampling_params.ignore_eos
            assert len(outputs) >= request.sampling_params.min_tokens
        else:
            assert request.status is RequestStatus.FINISHED_LENGTH, request.status
            assert len(outputs) == request.max_tokens or request.num_tokens >= self.config.max_model_len
        for i, token in enumerate(outputs[:-1]):  # an EOS that counted would have ended it
            assert token != EOS or request.sampling_params.ignore_eos or i + 1 < request.sampling_params.min_tokens

    def drain(self, sample: Callable[[], int]) -> None:
        """Step until idle: every admitted request must finish, in a bounded number of steps."""
        work = sum(min(r.num_prompt_tokens + r.max_tokens, self.config.max_model_len) for r in self.live.values())
        bound = self.num_steps + 4 * work * (len(self.live) + 1) + 10
        while self.scheduler.num_unfinished:
            assert self.num_steps < bound, f"livelock: {self.scheduler.num_unfinished} requests pending"
            self.step(sample)
            self.check()
        note(f"drain steps > 50: {self.num_steps > 50}")
        assert not self.live, f"admitted requests never finished: {sorted(self.live)}"
        allocator = self.allocator
        assert allocator.num_free_blocks == allocator.num_blocks
        assert all(count == 0 for count in allocator.ref_counts)
        assert not allocator.seq_blocks and not allocator.seq_keys
        out = self.scheduler.schedule()  # announces the last finished requests to the runner
        assert out.is_empty
        apply_scheduler_output(self.runner_states, out)
        assert not self.runner_states, f"the runner was never told these ended: {sorted(self.runner_states)}"

    # invariants -----------------------------------------------------------------------------

    @_operation
    def check(self) -> None:
        self._check_pool()
        self._check_queues()
        if self.allocator.enable_prefix_caching:
            self._check_prefix_lookups()

    def _check_pool(self) -> None:
        allocator, scheduler = self.allocator, self.scheduler
        running = {r.request_id for r in scheduler.running}
        assert set(allocator.seq_blocks) == running, "a sequence holds blocks but is not running"
        assert set(allocator.seq_keys) <= set(scheduler.requests), "memoised keys of an ended sequence"
        refs: Counter[int] = Counter()
        for rid in running:
            table = allocator.block_ids(rid)
            assert len(set(table)) == len(table), f"{rid} holds a block twice"
            assert len(table) >= allocator.num_blocks_for(scheduler.get(rid).num_computed_tokens)
            refs.update(table)
        free = list(allocator.free_blocks)
        evictable = list(allocator.evictable)
        assert len(set(free)) == len(free)
        assert not set(free) & set(evictable)
        unreferenced = set(free) | set(evictable)
        for block in range(allocator.num_blocks):
            assert allocator.ref_counts[block] == refs[block], (
                f"block {block}: ref count {allocator.ref_counts[block]}, held by {refs[block]} sequences"
            )
            assert (block in unreferenced) == (refs[block] == 0), f"block {block} is both free and held, or neither"
            if refs[block] > 1:
                assert allocator.block_keys[block] is not None, f"block {block} is shared but holds no cached prefix"
        assert all(allocator.block_keys[b] is None for b in free)
        assert all(allocator.block_keys[b] is not None for b in evictable)
        assert allocator.num_free_blocks == len(free) + len(evictable) == allocator.num_blocks - len(+refs)
        stats = allocator.stats()
        assert stats.num_free_blocks == allocator.num_free_blocks
        assert self.num_adopted_tokens <= stats.prefix_hit_tokens <= stats.prefix_queried_tokens
        # The prefix map and the blocks' keys are one bijection, and a cached block holds its key's tokens.
        keyed = {b: k for b, k in enumerate(allocator.block_keys) if k is not None}
        assert {b: k for k, b in allocator.cached.items()} == keyed
        for block, key in keyed.items():
            held = self.shadow[block]
            assert all(prefix is not None for prefix in held), f"cached block {block} was never fully written"
            assert tuple(prefix[-1] for prefix in held) == tuple(key[1]), f"cached block {block} holds other tokens"
            # ... and its key chains the whole prefix before it, as a lookup of that prefix computes it.
            prefix = held[-1]
            assert len(prefix) % self.block_size == 0
            assert allocator._keys(None, prefix, len(prefix) // self.block_size)[-1] == key

    def _check_queues(self) -> None:
        scheduler = self.scheduler
        running, waiting = scheduler.running, list(scheduler.waiting)
        assert len(running) <= self.config.max_num_seqs
        assert [_age(r) for r in running] == sorted(_age(r) for r in running), "running is not oldest first"
        ids = [r.request_id for r in running + waiting]
        assert len(set(ids)) == len(ids)
        assert set(ids) == set(scheduler.requests) == set(self.live)
        assert scheduler.num_unfinished == len(ids)
        assert all(r.status is RequestStatus.RUNNING for r in running)
        for request in waiting:
            assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert request.num_computed_tokens == 0
        for request in running:
            assert 0 < request.num_computed_tokens <= request.num_tokens

    def _check_prefix_lookups(self) -> None:
        """A prefix hit is a run of cached blocks whose contents are exactly the looked-up prefix."""
        allocator, bs = self.allocator, self.block_size
        candidates = list(self.probes) + [tuple(r.all_token_ids) for r in self.live.values()]
        counters = allocator.queried_tokens, allocator.hit_tokens
        for tokens in candidates:
            hit = allocator.lookup_prefix("probe", tokens, len(tokens))
            allocator.free("probe")  # drops the probe's memoised keys; it holds no blocks
            assert hit.num_tokens == len(hit.block_ids) * bs <= len(tokens)
            for i, block in enumerate(hit.block_ids):
                assert block not in allocator.free_blocks
                for j in range(bs):
                    assert self.shadow[block][j] == tokens[: i * bs + j + 1], (
                        f"prefix hit on block {block} for tokens {tokens}, which holds {self.shadow[block]}"
                    )
        assert (allocator.queried_tokens, allocator.hit_tokens) == counters, "a lookup alone changed the statistics"


# the state machine -----------------------------------------------------------------------------

tokens_st = st.integers(0, VOCAB - 1)


@st.composite
def engine_shapes(draw):
    """A block size, and pool, budget and context limits scaled to it (tiny pools are common)."""
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    max_prompt = max(3 * block_size, 8) + 2
    max_new = max(2 * block_size, 6)
    largest = max_prompt + block_size + 1 + max_new  # the longest request add_request makes
    blocks = -(-largest // block_size)
    pools = {"tiny": st.integers(1, blocks), "tight": st.integers(blocks // 2 + 1, blocks + blocks // 2),
             "roomy": st.integers(2 * blocks, 5 * blocks)}
    return dict(
        block_size=block_size,
        num_blocks=draw(pools[draw(st.sampled_from(["tight", "tiny", "roomy"]), label="pool")]),
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.one_of(st.integers(1, block_size + 2), st.integers(1, max_prompt + 4))),
        max_model_len=draw(st.one_of(st.just(largest + 4), st.integers(largest // 2, largest + 4))),
        enable_prefix_caching=draw(st.booleans()),
        num_lookahead_tokens=draw(st.sampled_from([0, 0, 1, 3])),  # KV slots a decode reserves ahead
    ), max_prompt, max_new


class AllocatorSchedulerMachine(RuleBasedStateMachine):
    """Random adds, steps and aborts; the harness checks each one, and teardown drains the engine."""

    @initialize(shape=engine_shapes(), data=st.data())
    def start(self, shape, data):
        kwargs, self.max_prompt, self.max_new = shape
        self.base_prompts = [tuple(data.draw(st.lists(tokens_st, min_size=self.max_prompt, max_size=self.max_prompt),
                                             label=f"base prompt {i}")) for i in range(3)]
        self.tape: Iterator[int] = cycle(data.draw(st.lists(tokens_st, min_size=1, max_size=12), label="tape"))
        self.h = Harness(**kwargs, probes=tuple(self.base_prompts))
        self.ids: list[str] = []
        self.num_prompts = 0
        self.clock = 0.0
        for _ in range(data.draw(st.integers(1, 4), label="prompts at start")):
            self._add_prompt(data)

    @rule(data=st.data())
    def add_request(self, data):
        self._add_prompt(data)

    @precondition(lambda self: self.h.ended)
    @rule(data=st.data())
    def reuse_ended_id(self, data):
        """An id is free again once its request ended, even before the runner has been told."""
        self._add_prompt(data, reuse=data.draw(st.sampled_from(sorted(self.h.ended)), label="reused id"))

    def _add_prompt(self, data, reuse: str | None = None) -> None:
        """One prompt as the engine adds it: n requests of one arrival time."""
        bs = self.h.block_size
        base = self.base_prompts[data.draw(st.integers(0, 2), label="base")]
        prompt = list(base[: data.draw(st.integers(0, self.max_prompt), label="shared")])
        prompt += data.draw(st.lists(tokens_st, min_size=0 if prompt else 1, max_size=bs + 1), label="own tokens")
        max_tokens = data.draw(st.integers(1, self.max_new), label="max_tokens")
        params = dict(ignore_eos=data.draw(st.booleans(), label="ignore_eos"),
                      min_tokens=data.draw(st.integers(0, min(2, max_tokens)), label="min_tokens"))
        resolved = max_tokens
        if data.draw(st.booleans(), label="resolve max_tokens like the engine"):
            remaining = self.h.config.max_model_len - len(prompt)
            resolved = min(max_tokens, max(remaining, 1))
        if not (self.ids and data.draw(st.booleans(), label="same arrival time")):
            self.clock += 1.0
        priority = data.draw(st.integers(0, 1), label="priority")
        n = 1 if reuse else data.draw(st.integers(1, 2), label="n")
        parent = reuse or f"r{self.num_prompts}"
        self.num_prompts += 1
        for child in range(n):
            rid = parent if n == 1 else f"{child}_{parent}"
            self.ids.append(rid)
            request = make_request(rid, prompt, max_tokens, self.clock, priority=priority, **params)
            request.max_tokens = resolved
            if not self.h.add(request):
                break  # its siblings would be refused alike

    @precondition(lambda self: self.h.live)
    @rule(data=st.data())
    def add_duplicate_id(self, data):
        rid = data.draw(st.sampled_from(sorted(self.h.live)), label="duplicate of")
        with pytest.raises(RequestError, match="already in use"):
            self.h.scheduler.add(make_request(rid, [0], 1))

    @rule(samples=st.lists(tokens_st, max_size=6))
    def step(self, samples):
        tokens = chain(samples, self.tape)  # the step's own draws, then the tape
        self.h.step(lambda: next(tokens))

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def abort(self, data):
        preempted = sorted(r.request_id for r in self.h.scheduler.waiting if r.status is RequestStatus.PREEMPTED)
        among = data.draw(st.sampled_from(["live", "preempted", "any"]), label="abort among")
        ids = {"live": sorted(self.h.live), "preempted": preempted, "any": self.ids}[among] or self.ids
        rid = data.draw(st.sampled_from(ids), label="abort")
        status = data.draw(st.sampled_from([RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_STOPPED]))
        self.h.abort(rid, status)

    @invariant()
    def consistent(self):
        if hasattr(self, "h"):
            self.h.check()

    def teardown(self):
        if hasattr(self, "h") and not self.h.broken:
            self.h.drain(lambda: next(self.tape))


AllocatorSchedulerMachine.TestCase.settings = settings(
    max_examples=1000, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
test_random_operations_keep_invariants = AllocatorSchedulerMachine.TestCase


# specific scenarios ----------------------------------------------------------------------------

def never_eos() -> int:
    return 0


def test_prefix_hit_is_counted_and_adopted_with_references():
    h = Harness(block_size=4, num_blocks=16, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                enable_prefix_caching=True)
    shared = [3, 1, 4, 1, 5, 9, 2, 6]  # two full blocks
    a = make_request("a", shared + [5, 3], max_tokens=8, arrival_time=1)
    assert h.add(a)
    h.step(never_eos)
    h.check()
    b = make_request("b", shared + [7], max_tokens=2, arrival_time=2)
    assert h.add(b)
    out = h.step(never_eos)
    h.check()

    [new] = out.new_requests
    assert (new.request_id, new.num_computed_tokens, out.num_scheduled_tokens["b"]) == ("b", 8, 1)
    assert b.num_cached_tokens == 8
    allocator = h.allocator
    a_blocks, b_blocks = allocator.block_ids("a"), allocator.block_ids("b")
    assert b_blocks[:2] == a_blocks[:2] and b_blocks[2] not in a_blocks
    assert [allocator.ref_counts[block] for block in b_blocks] == [2, 2, 1]
    stats = h.scheduler.stats()
    assert stats.prefix_queried_tokens == len(a.prompt_token_ids) + len(b.prompt_token_ids)
    assert stats.prefix_hit_tokens == 8

    h.drain(never_eos)
    assert a.status is b.status is RequestStatus.FINISHED_LENGTH
    assert {a_blocks[0], a_blocks[1]} <= set(allocator.evictable)  # unreferenced, still reusable
    assert allocator.lookup_prefix("c", shared + [0], 8).block_ids == tuple(a_blocks[:2])


def test_a_waiting_request_is_counted_once_however_often_it_is_retried():
    # 5 blocks of 4: "a" holds 3 or 4 of them while it runs, so "b" (19 tokens = 5 blocks, 2 of them
    # cached by "a") waits for "a" to finish; its prefix query and hit count once, when it is admitted.
    h = Harness(block_size=4, num_blocks=5, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                enable_prefix_caching=True)
    shared = [5, 6, 7, 8, 9, 10, 11, 12]
    a = make_request("a", shared + [1, 2, 3], max_tokens=6, arrival_time=1)
    assert h.add(a)
    h.step(never_eos)
    b = make_request("b", shared + [4] * 11, max_tokens=2, arrival_time=2)
    assert h.add(b)
    for _ in range(3):
        h.step(never_eos)
        h.check()
        assert b.status is RequestStatus.WAITING
    stats = h.scheduler.stats()
    assert (stats.prefix_queried_tokens, stats.prefix_hit_tokens) == (len(a.prompt_token_ids), 0)
    h.drain(never_eos)
    stats = h.scheduler.stats()
    assert stats.prefix_queried_tokens == len(a.prompt_token_ids) + len(b.prompt_token_ids)
    assert stats.prefix_hit_tokens == 8


def test_equal_arrival_times_are_ordered_by_priority():
    h = Harness(block_size=4, num_blocks=64, max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64,
                enable_prefix_caching=False)
    for rid, priority in (("late", 2), ("urgent", 0), ("middle", 1)):
        assert h.add(make_request(rid, [1, 2, 3], max_tokens=1, arrival_time=5.0, priority=priority))
    assert h.add(make_request("first", [1, 2, 3], max_tokens=1, arrival_time=1.0, priority=9))
    order = []
    for _ in range(8):
        out = h.step(never_eos)
        order += [new.request_id for new in out.new_requests]
    assert order == ["first", "urgent", "middle", "late"]


def test_eviction_takes_the_least_recently_freed_cached_block():
    allocator = PagedKVAllocator(num_blocks=4, block_size=2, enable_prefix_caching=True)

    def compute_and_end(seq_id: str, tokens: list[int], prefix=None) -> list[int]:
        allocator.allocate(seq_id, len(tokens), prefix)
        blocks = allocator.block_ids(seq_id)
        allocator.cache_blocks(seq_id, tokens, len(tokens))
        allocator.free(seq_id)
        return blocks

    old, new = [1, 2, 3, 4], [5, 6, 7, 8]
    old_blocks = compute_and_end("old", old)
    new_blocks = compute_and_end("new", new)
    assert not allocator.free_blocks and allocator.num_free_blocks == 4  # all cached, all reusable

    # A sequence's tail is freed before its head: the tail is the less likely to be shared again.
    assert allocator.allocate("x", 2) == [old_blocks[1]]
    assert allocator.lookup_prefix("q", old, 4).block_ids == (old_blocks[0],)
    allocator.free("q")

    # Reusing a cached block makes it recent: the next eviction takes the other sequence's tail.
    hit = allocator.lookup_prefix("again", old, 2)
    assert compute_and_end("again", old[:2], hit) == [old_blocks[0]]
    assert allocator.allocate("y", 2) == [new_blocks[1]]
    assert allocator.allocate("z", 2) == [new_blocks[0]]
    assert allocator.lookup_prefix("q", old, 4).block_ids == (old_blocks[0],)
    allocator.free("q")
    assert allocator.lookup_prefix("q", new, 4).block_ids == ()
    assert list(allocator.evictable) == [old_blocks[0]]
    held = allocator.block_ids("x") + allocator.block_ids("y") + allocator.block_ids("z")
    assert sorted(held) == sorted(set(range(4)) - {old_blocks[0]})
    assert [allocator.ref_counts[block] for block in held] == [1, 1, 1]


def test_preemption_takes_the_newest_request_which_resumes_and_finishes():
    h = Harness(block_size=2, num_blocks=5, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                enable_prefix_caching=False)
    older = make_request("older", [1, 2, 3, 4], max_tokens=4, arrival_time=1)
    newer = make_request("newer", [4, 3, 2, 1], max_tokens=4, arrival_time=2)
    assert h.add(older) and h.add(newer)
    h.step(never_eos)  # both prefill: 2 blocks each, 1 left
    out = h.step(never_eos)  # both need a third block: the newer gives its blocks up
    assert newer.status is RequestStatus.PREEMPTED and newer.num_preemptions == 1
    assert list(h.scheduler.waiting) == [newer] and "newer" in out.finished_request_ids
    assert list(out.num_scheduled_tokens) == ["older"] and h.allocator.block_ids("newer") == []
    assert h.scheduler.stats().num_preemptions == 1
    h.check()
    h.drain(never_eos)
    assert older.status is newer.status is RequestStatus.FINISHED_LENGTH
    assert len(older.output_token_ids) == len(newer.output_token_ids) == 4
    assert newer.output_token_ids == h.sampled["newer"]


def test_preemption_among_equal_ages_spares_the_request_already_in_the_batch():
    # Regression: the n children of one prompt share an arrival time; max() by age picked the first
    # child as the victim after it had been scheduled in the same step (its blocks freed under it).
    h = Harness(block_size=1, num_blocks=5, max_num_seqs=2, max_num_batched_tokens=2, max_model_len=4,
                enable_prefix_caching=False)
    first, second = (make_request(f"{i}_r", [0], max_tokens=3, arrival_time=1) for i in range(2))
    assert h.add(first) and h.add(second)
    h.step(never_eos)
    h.step(never_eos)
    out = h.step(never_eos)  # 4 of 5 blocks held; both need a third
    assert out.num_scheduled_tokens == {"0_r": 1}
    assert second.status is RequestStatus.PREEMPTED and first.status is not RequestStatus.PREEMPTED
    h.check()
    h.drain(never_eos)
    assert first.status is second.status is RequestStatus.FINISHED_LENGTH


def test_request_larger_than_the_pool_is_refused_with_the_numbers():
    h = Harness(block_size=4, num_blocks=3, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64,
                enable_prefix_caching=True)
    other = make_request("other", [9, 9], max_tokens=2, arrival_time=0)
    assert h.add(other)
    h.step(never_eos)
    prompt = list(range(10))
    with pytest.raises(RequestError) as refused:
        h.scheduler.add(make_request("too_big", prompt, max_tokens=4, arrival_time=1))  # K/V of 13 tokens
    message = str(refused.value)
    assert "needs 4 KV blocks (10 prompt + 4 max_tokens tokens at 4 tokens per block)" in message
    assert "holds only 3 blocks (13 tokens need a slot" in message
    assert refused.value.code == "kv_cache_exceeded" and h.scheduler.get("too_big") is None
    fits = make_request("fits", prompt, max_tokens=3, arrival_time=2)  # K/V of 12 tokens: the whole pool
    assert h.add(fits)
    h.check()
    h.drain(never_eos)
    assert other.status is fits.status is RequestStatus.FINISHED_LENGTH
    assert len(fits.output_token_ids) == 3


def test_empty_and_overlong_prompts_are_refused():
    h = Harness(block_size=4, num_blocks=8, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=8,
                enable_prefix_caching=False)
    with pytest.raises(RequestError, match="empty"):
        h.scheduler.add(make_request("empty", [], max_tokens=1))
    with pytest.raises(RequestError, match="8 tokens but max_model_len is 8"):
        h.scheduler.add(make_request("long", list(range(8)), max_tokens=1))
    assert h.scheduler.num_unfinished == 0 and h.allocator.num_free_blocks == 8
