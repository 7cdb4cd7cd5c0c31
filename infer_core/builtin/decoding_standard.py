"""The ``standard`` decoding policy: every request that reached a sampling position keeps its token."""

from __future__ import annotations

from infer_core.interfaces import DecodingPolicy, RunnerOutput, SchedulerOutput


class StandardDecoding(DecodingPolicy):
    def accept(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> dict[str, list[int]]:
        return {rid: tokens for rid, tokens in zip(runner_output.request_ids, runner_output.sampled_token_ids) if tokens}
