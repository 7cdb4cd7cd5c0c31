"""The ``single`` parallel strategy: one rank, the runner in the engine's own process."""

from __future__ import annotations

from typing import Any

from infer_core.interfaces import Executor, ParallelContext, ParallelStrategy, WorkerFactory


class SingleExecutor(Executor):
    supports_overlap = True  # the runner is in this process and reads pending tokens on its device

    def __init__(self, engine_config: Any, worker_factory: WorkerFactory) -> None:
        self.worker = worker_factory(engine_config, ParallelContext.single())

    def start(self) -> int:
        return self.worker.start()

    def init_kv_cache(self, num_blocks: int) -> None:
        self.worker.init_kv_cache(num_blocks)

    def execute(self, scheduler_output):
        return self.worker.execute(scheduler_output)

    def execute_async(self, scheduler_output):
        return self.worker.execute_async(scheduler_output)

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        return [getattr(self.worker, method)(*args)]

    def shutdown(self) -> None:
        self.worker.shutdown()


class SingleDeviceStrategy(ParallelStrategy):
    @classmethod
    def validate(cls, ctx):
        if ctx.settings.tensor_parallel_size > 1:
            return [f"tensor_parallel_size={ctx.settings.tensor_parallel_size} needs a multi-rank strategy (INFER_PARALLEL=tp)"]
        return []

    @property
    def world_size(self) -> int:
        return 1

    def create_executor(self, engine_config, worker_factory):
        return SingleExecutor(engine_config, worker_factory)
