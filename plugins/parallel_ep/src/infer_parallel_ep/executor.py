"""The core's ``RankExecutor``, with rank 0's load counters reset once start-up's dummy steps are done."""

from __future__ import annotations

from infer_core.distributed import RankExecutor


class ExpertParallelExecutor(RankExecutor):
    """Start-up runs the model on made-up batches (the KV-sizing profile step, graph warm-ups, odd step sizes):
    eager steps whose routing the load counters would otherwise keep."""

    def init_kv_cache(self, num_blocks: int) -> None:
        super().init_kv_cache(num_blocks)
        parallel = self.parallel
        if parallel is not None:
            parallel.communicator.load.reset()
