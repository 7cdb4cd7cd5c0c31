"""The ``priority`` scheduler: the ``fcfs`` scheduler ordered by request priority (lower runs first, as vLLM).

Requests wait and run in (priority, arrival) order, so the budget goes to the most important
first, and when KV blocks run out the least important running request (the newest among equals) is
preempted. A waiting request more important than the least important running one does not wait for
room: while the batch is full (``max_num_seqs``) or the pool lacks the blocks its first chunk needs,
the least important running requests are preempted for it. A preempted request waits at its place in
priority order, behind the more important ones. Equal priorities behave as ``fcfs``.
"""

from __future__ import annotations

from infer_core.builtin.fcfs_admission import enqueue
from infer_core.builtin.scheduler_fcfs import FCFSScheduler
from infer_core.interfaces import Request, SchedulerOutput


def priority_key(request: Request) -> tuple[int, float]:
    return (request.priority, request.arrival_time)


class PriorityScheduler(FCFSScheduler):
    order = staticmethod(priority_key)

    def _requeue(self, request: Request) -> None:
        enqueue(self.waiting, request, priority_key)

    def schedule(self) -> SchedulerOutput:
        self._make_room()
        return super().schedule()

    def _make_room(self) -> None:
        """Preempt less important running requests while the first waiting one cannot start."""
        allocator = self.kv_allocator
        while self.waiting and self.running:
            head, last = self.waiting[0], self.running[-1]
            if head.priority >= last.priority:
                return
            first_chunk = min(head.num_tokens, self.config.max_num_batched_tokens)
            fits = allocator.num_free_blocks >= allocator.num_blocks_for(first_chunk)
            if len(self.running) < self.config.max_num_seqs and fits:
                return
            self._preempt(last)
