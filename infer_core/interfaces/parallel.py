"""Parallel strategies: how many ranks run the model, how they talk, and who drives them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infer_core.interfaces.context import RuntimeComponent

if TYPE_CHECKING:
    import torch

    from infer_core.interfaces.scheduling import PendingOutput, RunnerOutput, SchedulerOutput


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
    """This process's place among the ranks; layers shard themselves by it (Megatron layout)."""

    rank: int
    world_size: int
    communicator: Communicator

    @staticmethod
    def single() -> ParallelContext:
        return ParallelContext(0, 1, SingleRankCommunicator())


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

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every rank; leaves no child process behind."""


class ParallelStrategy(RuntimeComponent, ABC):
    """How the model is spread over devices, and the Executor that drives the ranks."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """Ranks per model replica."""

    @abstractmethod
    def create_executor(self, engine_config: Any) -> Executor:
        """Start the ranks for ``engine_config`` (an ``infer_core.config.EngineConfig``)."""

    def prepare_model(self, model: torch.nn.Module, parallel: ParallelContext) -> None:
        """Replace or wrap the implementation of the built model's layers on this rank (default: nothing).

        Called on every rank once the model's weights are loaded, before warm-up and CUDA graph capture,
        with the same ``parallel`` the layers were built with. This is how a strategy supplies a faster
        path of its own (a row-parallel layer's matmul and all-reduce in one kernel, say) without the
        model or the core layers knowing of it; a replacement must compute what the layer it replaces
        computes, from that layer's parameters.
        """
