"""The ``ep`` parallel strategy: a mixture of experts over ``expert_parallel_size`` ranks.

Each rank holds ``num_experts / N`` whole experts (the core's ``FusedMoE`` under ``ParallelContext.expert_parallel``);
everything else splits as tensor parallelism splits it (attention heads, dense MLPs, a shared expert, the
vocabulary), over the same ranks. With the default dispatch, ``all_reduce``, the layers run as built: every rank
routes every token and runs its own experts on those routed there, the partial sums all-reduced; rank 0 counts the
routing (``counted.py``). With ``all_to_all``, ``prepare_model`` reduce-scatters attention's output so each rank
holds its slice of the step's tokens up to the next attention (``slices.py``), and puts each experts layer behind
the all-to-all dispatch and combine of that slice (``dispatch.py``). The ranks are the core's
(``infer_core.distributed``): rank 0 in the engine's process, the others spawned, with the same death and shutdown
handling as ``tp``.
"""

from __future__ import annotations

import os
from typing import Any

from infer_core.interfaces import ParallelContext, ParallelStrategy, RuntimeContext, WorkerFactory

from infer_parallel_ep.settings import EPSettings


def _divisors(n: int, limit: int = 16) -> str:
    return ", ".join(str(d) for d in range(2, min(n, limit) + 1) if n % d == 0) or "none up to 16"


def split_problems(ctx: RuntimeContext, world: int) -> list[str]:
    """Why the model cannot be spread over ``world`` expert-parallel ranks (empty when it can)."""
    m, moe = ctx.model, ctx.model.moe
    if moe is None:
        return [f"expert_parallel_size={world} shards the experts of a mixture-of-experts model, and "
                f"{m.architecture} ({m.model_type!r}) is dense (no num_experts in its config.json): split it with "
                f"tensor parallelism instead (INFER_TENSOR_PARALLEL_SIZE={world}, the infer-parallel-tp plugin), "
                f"or unset INFER_EXPERT_PARALLEL_SIZE"]
    problems = []
    if world < 2:
        problems.append(f"expert_parallel_size={world}: the ep strategy needs at least 2 ranks; set "
                        f"INFER_EXPERT_PARALLEL_SIZE to one of {_divisors(moe.num_experts)}, or INFER_PARALLEL=single")
    elif moe.num_experts % world:
        problems.append(f"num_experts={moe.num_experts} is not divisible by expert_parallel_size={world} "
                        f"({moe.num_experts} % {world} = {moe.num_experts % world}; each rank holds whole experts): "
                        f"choose a size that divides {moe.num_experts} ({_divisors(moe.num_experts)})")
    if world < 2:
        return problems
    # attention and the dense parts are tensor-parallel over the same ranks
    if m.num_heads % world:
        problems.append(f"num_attention_heads={m.num_heads} is not divisible by expert_parallel_size={world} "
                        f"(attention is split over the expert-parallel ranks)")
    kv, bigger = sorted((m.num_kv_heads, world))
    if bigger % kv:
        problems.append(f"num_key_value_heads={m.num_kv_heads} and expert_parallel_size={world}: one must divide "
                        f"the other (KV heads are split, or replicated when fewer than ranks)")
    if not all(moe.sparse_layers) and m.intermediate_size % world:
        problems.append(f"intermediate_size={m.intermediate_size} (the dense layers' MLP) is not divisible by "
                        f"expert_parallel_size={world}")
    if moe.shared_expert_intermediate_size % world:
        problems.append(f"shared_expert_intermediate_size={moe.shared_expert_intermediate_size} is not divisible by "
                        f"expert_parallel_size={world} (the shared expert is split over the ranks)")
    return problems


class ExpertParallelStrategy(ParallelStrategy):
    """N ranks, one per device: rank 0 in the engine's process, the others spawned.

    With ``expert_parallel_dispatch="all_reduce"`` (the default) every step runs the core's layers as built
    (attention's output and each rank's experts' partial sums on every token all-reduced), prefill and mixed steps
    replaying piecewise CUDA graphs where the runner captured them. With ``"all_to_all"`` each rank holds its slice
    of the tokens between attentions in every eager step, and the dispatch reads each layer's split sizes on the host; a step captured into a CUDA graph runs the layers as built instead. Either way
    decode steps replay CUDA graphs of the all-reduce path.
    """

    @property
    def dispatch(self) -> str:
        return EPSettings.of(self.ctx.settings).expert_parallel_dispatch

    supports_cuda_graphs = True  # a captured step runs the layers as built (slices.py, counted.py)

    @property
    def supports_piecewise_cuda_graphs(self) -> bool:
        """The all-reduce dispatch's prefill and mixed steps replay piecewise graphs (their all-reduces captured in
        the pieces, their load counted there: ``counted.py``); the all-to-all dispatch's run eagerly, on slices."""
        return self.dispatch == "all_reduce"

    @classmethod
    def validate(cls, ctx: RuntimeContext) -> list[str]:
        import torch.distributed as dist

        world = EPSettings.of(ctx.settings).expert_parallel_size
        reasons = split_problems(ctx, world)
        tp = ctx.settings.tensor_parallel_size
        if tp > 1:
            reasons.append(f"tensor_parallel_size={tp} with expert_parallel_size={world}: attention is already split "
                           f"over the {world} expert-parallel ranks; leave INFER_TENSOR_PARALLEL_SIZE at 1")
        if not dist.is_available():
            reasons.append("this torch build has no torch.distributed")
        if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
            reasons.append("expert parallelism spawns its workers on one host; it does not run under torchrun")
        if ctx.is_cuda:
            if ctx.num_gpus < world:
                reasons.append(f"expert_parallel_size={world} needs {world} GPUs and this host has {ctx.num_gpus}; "
                               f"lower it to one that divides the experts and fits")
        elif not dist.is_gloo_available():
            reasons.append("expert parallelism on the CPU needs torch.distributed's gloo backend")
        return reasons

    @property
    def world_size(self) -> int:
        return EPSettings.of(self.ctx.settings).expert_parallel_size

    def create_executor(self, engine_config: Any, worker_factory: WorkerFactory):
        from infer_parallel_ep.executor import ExpertParallelExecutor
        from infer_parallel_ep.group import EP_GROUP

        return ExpertParallelExecutor(engine_config, self.world_size, worker_factory, EP_GROUP)

    def prepare_model(self, model: Any, parallel: ParallelContext) -> None:
        """With ``expert_parallel_dispatch="all_reduce"``, the layers as built, their routing counted on rank 0
        (``counted.count_routing``); with ``"all_to_all"``, each rank's slice of the step's tokens held between
        attentions, the experts behind the all-to-all dispatch and combine (``slices.slice_tokens``)."""
        if self.dispatch == "all_reduce":
            from infer_parallel_ep.counted import count_routing

            count_routing(model, parallel.communicator)
            return
        from infer_parallel_ep.slices import slice_tokens

        slice_tokens(model, parallel.communicator)
