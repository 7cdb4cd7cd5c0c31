"""The ``tp`` parallel strategy: the Megatron split over ``tensor_parallel_size`` ranks.

The layers shard themselves by the ParallelContext each rank gets (column-parallel qkv and
gate_up, row-parallel o_proj and down_proj, vocabulary-parallel embedding and LM head); this
strategy checks the model splits evenly, starts the ranks and, where the group set up push sites
(``enable_pushed_partial_sums``), swaps in the layers that push their partial sums (``pushed_layers.py``).
"""

from __future__ import annotations

import os
from typing import Any

from infer_core.interfaces import ParallelContext, ParallelStrategy, RuntimeContext, WorkerFactory


def split_problems(ctx: RuntimeContext, world_size: int) -> list[str]:
    """Why the model cannot be split evenly over ``world_size`` ranks (empty when it can)."""
    m = ctx.model
    problems = []
    if m.num_heads % world_size:
        problems.append(f"num_attention_heads={m.num_heads} is not divisible by tensor_parallel_size={world_size}")
    kv, bigger = sorted((m.num_kv_heads, world_size))
    if bigger % kv:
        problems.append(
            f"num_key_value_heads={m.num_kv_heads} and tensor_parallel_size={world_size}: one must "
            f"divide the other (KV heads are split, or replicated when fewer than ranks)"
        )
    moe = m.moe
    dense_layers = moe is None or not all(moe.sparse_layers)
    if dense_layers and m.intermediate_size % world_size:
        problems.append(
            f"intermediate_size={m.intermediate_size} is not divisible by tensor_parallel_size={world_size}"
        )
    if moe is not None:
        for name, size in (("moe_intermediate_size", moe.intermediate_size),
                           ("shared_expert_intermediate_size", moe.shared_expert_intermediate_size)):
            if size % world_size:
                problems.append(f"{name}={size} is not divisible by tensor_parallel_size={world_size} (each "
                                "expert's intermediate size is split over the ranks)")
    return problems


class TensorParallelStrategy(ParallelStrategy):
    """N ranks, one per device: rank 0 in the engine's process, the others spawned (or torchrun's)."""

    @classmethod
    def validate(cls, ctx: RuntimeContext) -> list[str]:
        import torch.distributed as dist

        world = ctx.settings.tensor_parallel_size
        reasons = split_problems(ctx, world)
        if not dist.is_available():
            reasons.append("this torch build has no torch.distributed")
        under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
        if ctx.is_cuda:
            if not under_torchrun and ctx.num_gpus < world:
                reasons.append(
                    f"tensor_parallel_size={world} needs {world} GPUs and this host has {ctx.num_gpus}; "
                    f"lower it, or run across hosts under torchrun (see the infer-parallel-tp README)"
                )
        elif not dist.is_gloo_available():
            reasons.append("tensor parallelism on the CPU needs torch.distributed's gloo backend")
        return reasons

    @property
    def world_size(self) -> int:
        return self.ctx.settings.tensor_parallel_size

    def create_executor(self, engine_config: Any, worker_factory: WorkerFactory):
        from infer_parallel_tp.executor import TensorParallelExecutor

        return TensorParallelExecutor(engine_config, self.world_size, worker_factory)

    def prepare_model(self, model: Any, parallel: ParallelContext) -> None:
        """Where the group set up push sites, replace the embedding and the row-parallel layers that can push
        with pushing ones (``pushed_layers.push_layers``: the same parameters, a site each, in module order);
        else leave the model as built."""
        from infer_parallel_tp.communicator import DistributedCommunicator

        communicator = parallel.communicator
        sites = communicator.push_sites if isinstance(communicator, DistributedCommunicator) else None
        if sites is None:
            return
        from infer_parallel_tp.pushed_layers import push_layers

        push_layers(model, sites)
