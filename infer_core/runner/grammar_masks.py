"""The grammar masks of a step's constrained rows: kept buffers, sent to the device without blocking, filled ahead.

``ModelRunner._sample`` calls ``build`` after the step's forward is launched, so the host's work here
overlaps the device's; a batch without constrained requests never comes here. The bitmask is written
into host buffers kept across steps (pinned on CUDA) and copied without blocking into one kept on the
device; a host buffer is written again only once the copy out of it is done. Its width is the words of
the matchers' ``vocab_size`` (one grammar backend, one tokenizer: the same for all), or of the logits; the
bits past that size in the last word are cleared (xgrammar sets them where most tokens are allowed).

Ahead (off unless ``GrammarMasks.ahead`` is set: on the GPU the worker's xgrammar calls and the step loop
contended for the GIL, and the step loop doing the work itself was faster): once a step's sampler is launched,
``fill_ahead`` hands the step's constrained rows to a worker
thread, which waits for that step's tokens to reach the host, lets each row's matcher accept its token
and fills the next masks (runner/constraints.py), xgrammar's calls running outside the GIL: while the
step loop reads the previous step's tokens, schedules and launches the next forward. The next ``build``
takes what it did first: each matcher's accepted token (or its drop) counted on the request, and the
rows whose masks are ready; the rows it did not cover (new requests, resumed ones with a new matcher, a
matcher handed more tokens since) are caught up and filled then. A continuing request's sampled token is
always its next output token (a request that ends is dropped, a preempted one comes back with a new
matcher), so the worker accepts exactly what the next step would, and the masks are the same.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from infer_core.interfaces import ConstraintMatcher
from infer_core.runner.constraints import accept_tokens, catch_up, drop, fill_rows
from infer_core.runner.state import RequestState, RequestTable
from infer_core.runner.step_output import SampledStep

Entries = list[tuple[RequestState, ConstraintMatcher, int]]  # a step's constrained rows: state, matcher, row


def _advance(entries: Entries, step: SampledStep, bitmask: torch.Tensor) -> tuple[list[int], list[bool]]:
    """The worker's job: each matcher accepts the token ``step`` sampled at its row (the copy to the host
    awaited), and those that took it fill row i (their entry's index) of ``bitmask``. (tokens, accepted)."""
    host_ids = step.host_token_ids().tolist()
    matchers = [matcher for _, matcher, _ in entries]
    token_ids = [host_ids[row] for _, _, row in entries]
    accepted = accept_tokens(matchers, token_ids)
    fill_rows([m if ok else None for m, ok in zip(matchers, accepted)], bitmask, range(len(entries)))
    return token_ids, accepted


class GrammarMasks:
    """Each step's (rows, bitmask) of the constrained rows, in buffers kept across steps (grown when a step has
    more constrained rows than they hold)."""

    ahead = False  # True: ``fill_ahead`` starts the next step's work in the worker (it lost to the step loop doing it: GIL)

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.device = device
        self.vocab_size = vocab_size  # the logit columns: the width of a matcher that names none
        self.mask_vocab_size = self.num_words = 0  # the ids the buffers' rows cover, in words
        self.tail: int | None = None  # the last word's bits of ids below mask_vocab_size (None: all of them)
        self.capacity = 0
        self.host_rows = self.rows = self.bitmask = None
        self.host_bitmask = self.ahead_bitmask = None  # written by build / by the worker
        self._host_rows = None  # host_rows as numpy (a list is written into it without a tensor made of it)
        # CUDA: marks the last copy out of the host buffers; build writes its buffer again only after it
        self.copied = torch.cuda.Event() if device.type == "cuda" else None
        self._worker: ThreadPoolExecutor | None = None
        self._ahead: tuple[Entries, Future] | None = None

    def _reserve(self, num_rows: int, vocab_size: int) -> bool:
        """Buffers of at least ``num_rows`` rows covering ``vocab_size`` ids; whether new ones were made."""
        if num_rows <= self.capacity and vocab_size == self.mask_vocab_size:
            return False
        self.capacity = max(num_rows, 2 * self.capacity if vocab_size == self.mask_vocab_size else 0, 8)
        self.mask_vocab_size, self.num_words = vocab_size, -(-vocab_size // 32)
        self.tail = (1 << vocab_size % 32) - 1 if vocab_size % 32 else None
        with torch.inference_mode(False):  # plain tensors: the worker thread writes them outside inference mode
            self._allocate()
        return True

    def _allocate(self) -> None:
        pinned = self.device.type == "cuda"
        self.host_rows = torch.empty(self.capacity, dtype=torch.int64, pin_memory=pinned)
        self._host_rows = self.host_rows.numpy()
        self.host_bitmask, self.ahead_bitmask = (torch.empty((self.capacity, self.num_words), dtype=torch.int32,
                                                             pin_memory=pinned) for _ in range(2))
        if self.device.type != "cpu":
            self.rows = torch.empty(self.capacity, dtype=torch.int64, device=self.device)
            self.bitmask = torch.empty((self.capacity, self.num_words), dtype=torch.int32, device=self.device)

    def _mask_vocab_size(self, states: list[RequestState], rows: list[int]) -> int:
        """The ids these rows' matchers' masks cover."""
        sizes = {states[row].matcher.vocab_size for row in rows}
        if len(sizes) > 1:
            raise ValueError(f"constrained requests of one step have masks of {sorted(sizes, key=str)} ids: one "
                             "grammar backend with one tokenizer gives one size; this is a bug")
        size = sizes.pop()
        return size if size is not None else self.vocab_size

    def fill_ahead(self, step: SampledStep) -> None:
        """Start the next step's work on ``step``'s constrained rows in the worker (``step``'s sampler launched)."""
        if not self.ahead:
            return
        entries = [(state, state.matcher, i) for i, state in enumerate(step.states) if state.matcher is not None]
        if not entries:
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="infer-grammar-ahead")
        self._ahead = entries, self._worker.submit(_advance, entries, step, self.ahead_bitmask)

    def _take_ahead(self, table: RequestTable) -> dict[str, int]:
        """Count what the worker accepted on the requests still here with the same matcher; {request id: its row
        in ``ahead_bitmask``} of those whose mask it filled."""
        if self._ahead is None:
            return {}
        (entries, future), self._ahead = self._ahead, None
        token_ids, accepted = future.result()
        ready = {}
        for i, ((state, matcher, _), token_id, ok) in enumerate(zip(entries, token_ids, accepted)):
            if state.matcher is not matcher or table.get(state.request_id) is not state:
                continue  # finished, or back after preemption with a new matcher
            if ok:
                state.num_matched += 1
                ready[state.request_id] = i
            else:
                drop(table, state, token_id)
        return ready

    def build(self, table: RequestTable, states: list[RequestState], last_step: SampledStep | None,
              last_sample_rows: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows, bitmask) of the constrained rows among ``states`` (one per sampled row), on the device: views
        of the kept buffers, good until the next step's call; None when no row is constrained."""
        ready = self._take_ahead(table)
        touched = catch_up(table, [s for s in states if s.matcher is not None], last_step, last_sample_rows)
        rows = [row for row, state in enumerate(states) if state.matcher is not None]
        if not rows:
            return None
        num_rows = len(rows)
        if self._reserve(num_rows, self._mask_vocab_size(states, rows)):
            ready = {}  # the worker's rows were in the buffers just replaced: filled again here
        # each row's row in ahead_bitmask (-1: filled here): the worker's, unless its matcher took tokens since
        sources = [-1 if (rid := states[row].request_id) in touched else ready.get(rid, -1) for row in rows]
        if sources == list(range(num_rows)):  # the worker's rows, in this step's order: sent as they are
            host = self.ahead_bitmask
        else:
            host = self.host_bitmask
            if self.copied is not None:
                self.copied.synchronize()  # the previous copy out of it (long done where a step's ids were read)
            copied = [(i, src) for i, src in enumerate(sources) if src >= 0]
            if copied:
                dst, src = torch.tensor(copied, dtype=torch.int64).unbind(1)
                host.index_copy_(0, dst, self.ahead_bitmask.index_select(0, src))
            fill_rows([states[row].matcher if src < 0 else None for row, src in zip(rows, sources)], host,
                      range(num_rows))
        if self.tail is not None:
            host[:num_rows, -1] &= self.tail
        self._host_rows[:num_rows] = rows
        if self.device.type == "cpu":
            return self.host_rows[:num_rows], host[:num_rows]
        self.rows[:num_rows].copy_(self.host_rows[:num_rows], non_blocking=True)
        self.bitmask[:num_rows].copy_(host[:num_rows], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        return self.rows[:num_rows], self.bitmask[:num_rows]
