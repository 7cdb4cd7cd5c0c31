"""The experts' load under the all-reduce dispatch: every rank routes every token, so rank 0 alone sees the whole
routing of each MoE layer, and counts it (``load.py``) in every step that is not a whole-step graph's replay: eager
steps, and those replaying the piecewise graphs (the counting is captured into the pieces, and counts the step's
own rows, not its padding). A whole-step graph (decode) counts nothing, as under the all-to-all dispatch, whose
counts come from its eager steps' host-read split sizes: a second routing launch and its counting in every decode
step would cost each of them."""

from __future__ import annotations

import torch
from infer_core.layers.graph_capture import capturing, capturing_pieces
from infer_core.layers.moe import FusedMoE
from torch import nn

from infer_parallel_ep.communicator import ExpertParallelCommunicator


class CountedExperts(nn.Module):
    """A ``FusedMoE`` run as built (its partial sums all-reduced), its routing counted on rank 0 outside whole-step
    graphs: a second routing launch of global ids and a few counting launches on the device, none a host sync."""

    def __init__(self, layer: FusedMoE, communicator: ExpertParallelCommunicator) -> None:
        super().__init__()
        self.layer = layer
        self.communicator = communicator

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        pieces = capturing_pieces()
        if pieces or not capturing():
            _, ids = self.layer.select_experts(router_logits)
            self.communicator.load.add_routing(ids, padded=pieces)
        return self.layer(x, router_logits)

    def extra_repr(self) -> str:
        return "routing counted on rank 0 outside whole-step graphs"


def count_routing(model: nn.Module, communicator: ExpertParallelCommunicator) -> int:
    """Put every MoE block's experts of ``model`` behind :class:`CountedExperts` on rank 0 (other ranks count
    nothing); returns how many were wrapped."""
    if communicator.rank != 0:
        return 0
    blocks = [m for m in model.modules() if isinstance(getattr(m, "experts", None), FusedMoE)]
    for block in blocks:
        block.experts = CountedExperts(block.experts, communicator)
    return len(blocks)
