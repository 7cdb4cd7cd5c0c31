"""The ranks of a multi-rank engine, for any parallel strategy: processes, control channel, executor, collectives.

A strategy whose ranks each run the core's worker on a shard of the model (the ``tp`` and ``ep`` plugins)
starts them with :class:`RankExecutor`, naming itself and how a rank joins the group in a :class:`GroupSpec`:
rank 0 runs in the engine's process, ranks 1..N-1 are spawned interpreters (or torchrun's), each step's
``SchedulerOutput`` is pushed to every worker over a c10d store, a dead worker turns into an
``EngineDeadError`` within seconds, and shutdown (or the executor's collection) stops and reaps every rank.
Public to plugins (``.importlinter``); importing it imports ``torch.distributed``, so a plugin imports it only
where its strategy is chosen.
"""

from infer_core.distributed.communicator import ProcessGroupCommunicator
from infer_core.distributed.executor import RankExecutor
from infer_core.distributed.group import (
    COLLECTIVE_TIMEOUT,
    GroupJoin,
    GroupSpec,
    RankPlacement,
    backend_for,
    join_process_group,
    leave_group,
    release_worker,
    torchrun_placement,
    torchrun_store,
)
from infer_core.distributed.rank_loop import torchrun_entry

__all__ = [
    "COLLECTIVE_TIMEOUT",
    "GroupJoin",
    "GroupSpec",
    "ProcessGroupCommunicator",
    "RankExecutor",
    "RankPlacement",
    "backend_for",
    "join_process_group",
    "leave_group",
    "release_worker",
    "torchrun_entry",
    "torchrun_placement",
    "torchrun_store",
]
