"""The contracts of every extension point. Plugins import from here; nothing here imports torch.

The errors an implementation raises or reports (``PluginError``, ``EngineDeadError``,
``RequestError``) are re-exported here from ``infer_core.errors``, so a plugin (or a builtin
implementation) needs no other core module for them.
"""

from infer_core.errors import EngineDeadError, PluginError, RequestError
from infer_core.interfaces.attention import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionLayer,
    BatchMetadata,
    kv_cache_dtype_reasons,
)
from infer_core.interfaces.constraints import Constraint, ConstraintMatcher, GrammarBackend
from infer_core.interfaces.context import RuntimeComponent, RuntimeContext
from infer_core.interfaces.decoding import DecodingPolicy, DraftRequest, SpecDecodingStats
from infer_core.interfaces.kv import KVAllocator, KVStats, PrefixHit
from infer_core.interfaces.parallel import (
    Communicator,
    Executor,
    ParallelContext,
    ParallelMetric,
    ParallelStrategy,
    RankWorker,
    SingleRankCommunicator,
    WorkerFactory,
)
from infer_core.interfaces.quant import LinearMethod, MoEMethod, Quantizer
from infer_core.interfaces.request import Request, RequestStatus
from infer_core.interfaces.scheduling import (
    CachedRequestData,
    NewRequestData,
    PendingOutput,
    ReadyOutput,
    RequestUpdate,
    RunnerOutput,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    SchedulerStats,
    TokenLogprobs,
)
from infer_core.interfaces.settings import PluginSettings

__all__ = [
    "AttentionBackend",
    "AttentionCapabilities",
    "AttentionLayer",
    "BatchMetadata",
    "CachedRequestData",
    "Communicator",
    "Constraint",
    "ConstraintMatcher",
    "DecodingPolicy",
    "DraftRequest",
    "EngineDeadError",
    "GrammarBackend",
    "Executor",
    "KVAllocator",
    "KVStats",
    "LinearMethod",
    "MoEMethod",
    "NewRequestData",
    "ParallelContext",
    "ParallelMetric",
    "ParallelStrategy",
    "PendingOutput",
    "PluginError",
    "PluginSettings",
    "PrefixHit",
    "Quantizer",
    "RankWorker",
    "ReadyOutput",
    "Request",
    "RequestError",
    "RequestStatus",
    "RequestUpdate",
    "RunnerOutput",
    "RuntimeComponent",
    "RuntimeContext",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SchedulerStats",
    "SingleRankCommunicator",
    "SpecDecodingStats",
    "TokenLogprobs",
    "WorkerFactory",
    "kv_cache_dtype_reasons",
]
