"""The core's ``RankExecutor``, with rank 0's load counters told each step's real rows and reset once start-up's
dummy steps are done."""

from __future__ import annotations

from infer_core.distributed import RankExecutor
from infer_core.interfaces import PendingOutput, SchedulerOutput


class ExpertParallelExecutor(RankExecutor):
    """Start-up runs the model on made-up batches (the KV-sizing profile step, graph warm-ups, odd step sizes):
    steps whose routing the load counters would otherwise keep. Before each step, the counters learn its real rows
    (a step replaying the piecewise graphs is padded to the captured size: ``counted.py``)."""

    def init_kv_cache(self, num_blocks: int) -> None:
        super().init_kv_cache(num_blocks)
        parallel = self.parallel
        if parallel is not None:
            parallel.communicator.load.reset()

    def execute_async(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        parallel = self.parallel
        if parallel is not None:
            parallel.communicator.load.set_step_rows(scheduler_output.total_num_scheduled_tokens)
        return super().execute_async(scheduler_output)
