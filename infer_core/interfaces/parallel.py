"""Parallel strategies: how many ranks run the model, how they talk, and who drives them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from infer_core.interfaces.context import RuntimeComponent

if TYPE_CHECKING:
    import torch

    from infer_core.interfaces.scheduling import PendingOutput, RunnerOutput, SchedulerOutput


@dataclass(frozen=True, slots=True)
class ParallelMetric:
    """One labelled series a strategy counts (expert parallelism's tokens per expert, say), served by the
    server's ``/metrics`` as ``infer:<name>{model_name, <label>}``.

    ``kind``: "counter" (only grows) or "gauge"; ``values``: (label value, value) pairs.
    """

    name: str
    documentation: str
    kind: str
    label: str
    values: tuple[tuple[str, float], ...]


class Communicator(ABC):
    """Collectives among the ranks of one model replica."""

    world_size: int = 1
    rank: int = 0

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (in place where possible); returns the result."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim``."""

    @abstractmethod
    def gather(self, x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Concatenate along ``dim`` on rank ``dst``; other ranks get None."""

    def all_to_all(self, x: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int]) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no all_to_all")

    def metrics(self) -> list[ParallelMetric]:
        """What this rank's collectives counted, for ``/metrics`` (default: nothing). Read from the server's
        thread while steps run: plain host values, no device work."""
        return []


class SingleRankCommunicator(Communicator):
    """The collectives of a world of one: identities."""

    def all_reduce(self, x):
        return x

    def all_gather(self, x, dim=-1):
        return x

    def gather(self, x, dst=0, dim=-1):
        return x

    def all_to_all(self, x, output_split_sizes, input_split_sizes):
        return x


@dataclass(frozen=True, slots=True)
class ParallelContext:
    """This process's place among the ranks; layers shard themselves by it (Megatron layout).

    ``expert_parallel``: mixture-of-experts layers give each rank whole experts (``num_experts / world_size``
    of them) instead of a slice of every expert's intermediate size; every other layer splits as before.
    """

    rank: int
    world_size: int
    communicator: Communicator
    expert_parallel: bool = False

    @staticmethod
    def single() -> ParallelContext:
        return ParallelContext(0, 1, SingleRankCommunicator())


class RankWorker(Protocol):
    """One rank's model runner in its process: what an Executor calls on every rank.

    The core's implementation is ``infer_core.runner.worker.Worker``; a strategy gets it only as the
    ``worker_factory`` of :meth:`ParallelStrategy.create_executor`. ``collective_rpc`` may call any
    other public method of it by name.
    """

    def start(self) -> int:
        """``load_model`` then ``profile_num_blocks`` (for an executor of one rank)."""

    def load_model(self) -> None:
        """Build this rank's shard of the model and load its weights (no collectives)."""

    def profile_num_blocks(self) -> int:
        """KV blocks this rank can hold (on CUDA after a profiling step: collectives on every rank)."""

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` KV blocks on this rank."""

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        """Run one step on this rank and return its sampled tokens."""

    def execute_async(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        """Launch one step; its tokens are read from the result (or, on a rank > 0, never)."""

    def set_return_logits(self, enabled: bool) -> None:
        """Attach the logits of sampled positions to every RunnerOutput (tests, accuracy checks)."""

    def hold_gc(self) -> None:
        """A rank's step loop in a process of its own starts: the garbage collector is set up for a
        step loop (the start-up heap frozen, young passes rarer) until ``release_gc``, as the engine's
        process is while it has requests. Not called for a worker in the engine's process."""

    def release_gc(self) -> None:
        """The step loop that called ``hold_gc`` ends: the collector is given back as it was."""

    def shutdown(self) -> None:
        """Free this rank's model, KV cache and CUDA graphs (before its process group is left)."""


class WorkerFactory(Protocol):
    """Builds one rank's worker: ``factory(engine_config, parallel, local_device)``.

    Picklable (a class or a module-level function), since an executor that starts processes sends
    it to them. ``local_device`` is the CUDA device index on the rank's host (None: ``parallel.rank``).
    """

    def __call__(self, engine_config: Any, parallel: ParallelContext, local_device: int | None = None) -> RankWorker:
        ...


class Executor(ABC):
    """Runs the model runner on every rank; the engine talks only to this.

    ``supports_overlap``: ``execute_async`` returns while the step runs, and a step may be started
    before the previous one's result is read (its pending tokens are taken from the device), so the
    engine can plan step N+1 while step N computes.
    """

    supports_overlap: bool = False

    @abstractmethod
    def start(self) -> int:
        """Load the model on every rank; return the KV blocks every rank can hold."""

    @abstractmethod
    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` KV blocks on every rank."""

    @abstractmethod
    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        """Run one step on every rank; rank 0's sampled tokens come back."""

    def execute_async(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        """Start one step and return before its result is on the host (default: run it now)."""
        from infer_core.interfaces.scheduling import ReadyOutput

        return ReadyOutput(self.execute(scheduler_output))

    def check_health(self) -> None:
        """Raise EngineDeadError when a rank has died."""

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        """Call a worker method on every rank (for tests, profiling and benchmarks)."""
        raise NotImplementedError

    def metrics(self) -> list[ParallelMetric]:
        """Rank 0's communicator's ``metrics()`` (default: nothing); called from the server's thread."""
        return []

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every rank; leaves no child process behind."""


class ParallelStrategy(RuntimeComponent, ABC):
    """How the model is spread over devices, and the Executor that drives the ranks.

    ``supports_cuda_graphs``: the forward its layers run can be captured into a CUDA graph and replayed (no host
    sync, the same shapes every replay); False makes every step eager on every rank.
    ``supports_piecewise_cuda_graphs``: with several ranks, the steps no whole-step graph holds (prefills, mixed
    steps) may replay piecewise graphs too, the collectives between two attentions captured inside the pieces
    (every rank gets the same step, so every rank replays the same sizes in the same order). One rank always may.
    """

    supports_cuda_graphs: bool = True
    supports_piecewise_cuda_graphs: bool = False

    @property
    @abstractmethod
    def world_size(self) -> int:
        """Ranks per model replica."""

    @abstractmethod
    def create_executor(self, engine_config: Any, worker_factory: WorkerFactory) -> Executor:
        """Start the ranks for ``engine_config`` (an ``infer_core.config.EngineConfig``); each rank
        runs the worker ``worker_factory`` builds for it."""

    def prepare_model(self, model: torch.nn.Module, parallel: ParallelContext) -> None:
        """Replace or wrap the implementation of the built model's layers on this rank (default: nothing).

        Called on every rank once the model's weights are loaded, before warm-up and CUDA graph capture,
        with the same ``parallel`` the layers were built with. This is how a strategy supplies a faster
        path of its own (a row-parallel layer's matmul and all-reduce in one kernel, say) without the
        model or the core layers knowing of it; a replacement must compute what the layer it replaces
        computes, from that layer's parameters.
        """
