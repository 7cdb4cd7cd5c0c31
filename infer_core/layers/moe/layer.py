"""FusedMoE: the experts of a mixture-of-experts block, with their routing, sharded over ranks.

Each token's router logits pick its ``top_k`` experts (``routing.route``); the layer's ``MoEMethod`` runs those
experts and sums their weighted outputs. Over ranks, by default the experts are split the Megatron way (each
expert's intermediate size split, as the dense MLP's is; every rank holds every expert); with
``ParallelContext.expert_parallel`` each rank holds whole experts, ``num_experts / world_size`` of them, and the
entries routed to another rank's experts count as zero here. Either way each rank's sum is partial, and the
partial sums are all-reduced, like a row-parallel layer's. Weights load from HF checkpoints of either layout:
one tensor per expert and projection (``experts.{e}.gate_proj.weight``, Mixtral's ``w1``/``w3``/``w2``), or the
stacked ``experts.gate_up_proj`` / ``experts.down_proj`` transformers 5 builds.
"""

from __future__ import annotations

import torch
from torch import nn

from infer_core.interfaces import MoEMethod, ParallelContext
from infer_core.layers import fused
from infer_core.layers.moe.routing import local_ids, route

MOE_ROUTE_MAX_EXPERTS = 1024  # fused/moe_route.py's MAX_EXPERTS (not imported: that module imports triton)

class FusedMoE(nn.Module):
    """``sum_k w[t, k] * expert_{id[t, k]}(x[t])`` over each token's ``top_k`` experts, from its router logits.

    Parameters (from ``method.create_weights``): ``gate_up_proj`` [experts, 2 x intermediate, hidden] and
    ``down_proj`` [experts, hidden, intermediate] in the dense method, ``intermediate`` this rank's part.
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, *,
                 renormalize: bool, method: MoEMethod, parallel: ParallelContext, dtype: torch.dtype,
                 prefix: str) -> None:
        super().__init__()
        world = parallel.world_size
        if parallel.expert_parallel:
            if num_experts % world:
                raise ValueError(f"{prefix}: {num_experts} experts do not split over {world} expert-parallel ranks "
                                 f"({num_experts} % {world} = {num_experts % world}); choose a size that divides "
                                 f"{num_experts}")
            self.num_local_experts = num_experts // world
            self.first_expert = parallel.rank * self.num_local_experts
            self.intermediate_split, self.intermediate_rank = 1, 0
        else:
            if intermediate_size % world:
                raise ValueError(f"{prefix}: the experts' intermediate size {intermediate_size} is not divisible by "
                                 f"the tensor-parallel size {world}; choose a size that divides it")
            self.num_local_experts, self.first_expert = num_experts, 0  # every expert, a slice of each
            self.intermediate_split, self.intermediate_rank = world, parallel.rank
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size // self.intermediate_split  # this rank's
        self.method = method
        self.parallel = parallel
        self.prefix = prefix
        method.create_weights(self, self.num_local_experts, hidden_size, self.intermediate_size, dtype)
        for param in self.parameters(recurse=False):
            param.weight_loader = self.weight_loader
        # the router's top-k in one launch (fused/moe_route.py) where built for our kernels, else route()'s torch ops
        self.triton_routing = (fused.runs_triton(fused.MOE, torch.get_default_device())
                               and num_experts <= MOE_ROUTE_MAX_EXPERTS)

    def select_experts(self, router_logits: torch.Tensor, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights, ids)`` [tokens, top_k] of each token's experts, from its router logits: global ids, or with
        ``local`` this rank's experts counted from its first and another rank's as ``num_local_experts``."""
        span = (self.first_expert, self.num_local_experts) if local else None
        if self.triton_routing and router_logits.stride(-1) == 1:
            from infer_core.layers.fused.moe_route import moe_route

            return moe_route(router_logits, self.top_k, self.renormalize, span)
        weights, ids = route(router_logits, self.top_k, self.renormalize)
        return (weights, local_ids(ids, *span)) if local else (weights, ids)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """The experts' weighted sum for ``x`` [tokens, hidden], all-reduced over ranks."""
        topk_weights, topk_ids = self.select_experts(router_logits, local=self.num_local_experts < self.num_experts)
        out = self.method.apply(self, x, topk_weights, topk_ids)
        if self.parallel.world_size > 1:
            out = self.parallel.communicator.all_reduce(out)
        return out

    # -- weights ---------------------------------------------------------------------------------------------

    def _rank_rows(self, full_rows: int) -> tuple[int, int]:
        """(start, size) of this rank's slice of an expert's ``full_rows`` intermediate rows."""
        size = full_rows // self.intermediate_split
        return self.intermediate_rank * size, size

    def checkpoint_shapes(self, param: nn.Parameter) -> list[tuple[None, tuple[int, ...]]] | None:
        """The stacked checkpoint tensor ``weight_loader`` narrows into ``param`` (dummy weights are drawn at it);
        None for a parameter that does not follow that layout (a quantized method's scales)."""
        full = self.intermediate_size * self.intermediate_split
        if param is getattr(self, "gate_up_proj", None):
            return [(None, (self.num_experts, 2 * full, self.hidden_size))]
        if param is getattr(self, "down_proj", None):
            return [(None, (self.num_experts, self.hidden_size, full))]
        return None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: tuple[int, str] | None = None) -> None:
        """Load one expert's ``shard_id = (expert, "gate" | "up" | "down")`` tensor, or (``shard_id`` None) the
        stacked tensor of every expert; each narrowed to this rank's experts and intermediate slice."""
        if shard_id is None:
            is_down = param is self.down_proj
            for local in range(self.num_local_experts):
                expert = loaded[self.first_expert + local]
                if is_down:
                    self._load_expert(param, expert, local, "down")
                else:
                    gate, up = expert.chunk(2, dim=0)
                    self._load_expert(param, gate, local, "gate")
                    self._load_expert(param, up, local, "up")
            return
        expert, projection = shard_id
        local = expert - self.first_expert
        if 0 <= local < self.num_local_experts:
            self._load_expert(param, loaded, local, projection)

    def _load_expert(self, param: nn.Parameter, loaded: torch.Tensor, local: int, projection: str) -> None:
        if projection == "down":  # [hidden, intermediate]: this rank's columns
            start, size = self._rank_rows(loaded.shape[1])
            part, row_offset = loaded.narrow(1, start, size), 0
        else:  # [intermediate, hidden]: this rank's rows, at the gate's or the up's offset
            start, size = self._rank_rows(loaded.shape[0])
            part, row_offset = loaded.narrow(0, start, size), (size if projection == "up" else 0)
        self.method.load_weight(self, param, part, local, row_offset)  # in the checkpoint's dtype: the method casts

    def extra_repr(self) -> str:
        return (f"experts={self.num_local_experts}/{self.num_experts}, top_k={self.top_k}, hidden={self.hidden_size}, "
                f"intermediate={self.intermediate_size}, renormalize={self.renormalize}")
