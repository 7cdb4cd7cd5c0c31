"""Worker: one rank's process-level setup (device, seeds, plugins) around a ModelRunner.

It is what an Executor drives on every rank (``interfaces.RankWorker``); the engine passes the class
itself to ``ParallelStrategy.create_executor`` as the factory of a rank's worker, so a strategy that
starts processes sends it to them (a class pickles by name) and never imports this module.
"""

from __future__ import annotations

import torch

from infer_core.config import EngineConfig
from infer_core.interfaces import DraftRequest, ParallelContext, PendingOutput, RunnerOutput, SchedulerOutput
from infer_core.loader import load_catalog
from infer_core.runner.gc_policy import STEP_LOOP_GC
from infer_core.runner.model_runner import ModelRunner


class Worker:
    def __init__(self, config: EngineConfig, parallel: ParallelContext, local_device: int | None = None) -> None:
        if config.device == "cuda":
            self.device = torch.device("cuda", parallel.rank if local_device is None else local_device)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        catalog = load_catalog(config.settings.plugins)  # each process runs the loader itself
        self.runner = ModelRunner(config, parallel, self.device, catalog)

    def start(self) -> int:
        """Load the model; return the KV blocks this rank can hold."""
        self.load_model()
        return self.profile_num_blocks()

    def load_model(self) -> None:
        """Build this rank's shard of the model and load its weights (no collectives)."""
        self.runner.load_model()

    def profile_num_blocks(self) -> int:
        """KV blocks this rank can hold; on CUDA after a profiling step (collectives on every rank)."""
        return self.runner.profile_num_blocks()

    def init_kv_cache(self, num_blocks: int) -> None:
        self.runner.init_kv_cache(num_blocks)

    def execute(self, output: SchedulerOutput) -> RunnerOutput:
        return self.runner.execute(output)

    def execute_async(self, output: SchedulerOutput) -> PendingOutput:
        return self.runner.execute_async(output)

    def propose_drafts(self, requests: list[DraftRequest]) -> dict[str, list[int]]:
        """The draft model's proposals (``DecodingPolicy.draft_model``), from the requests' tokens and blocks."""
        return self.runner.draft.propose(requests, self.runner.requests)

    def set_return_logits(self, enabled: bool) -> None:
        """Attach the logits of sampled positions to every RunnerOutput (accuracy checks)."""
        self.runner.return_logits = enabled

    def hold_gc(self) -> None:
        """A worker rank's step loop starts: set the collector up for it (``runner/gc_policy.py``)."""
        STEP_LOOP_GC.hold()

    def release_gc(self) -> None:
        """The step loop that called ``hold_gc`` ends."""
        STEP_LOOP_GC.release()

    def shutdown(self) -> None:
        if self.runner.graphs is not None:
            # A graph that captured a NCCL collective keeps its communicator from being destroyed:
            # free the graphs first (CUDA releases one still running when it completes).
            for entry in self.runner.graphs.graphs.values():
                entry.graph.reset()
            self.runner.graphs = None
        self.runner.kv_caches = []
        self.runner.model = self.runner.draft = None
