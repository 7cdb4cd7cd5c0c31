"""The experts of one MoE layer over the expert-parallel ranks: each rank's slice of the step's tokens goes to
the ranks that hold its experts by all-to-all, and the experts' sums come back by all-to-all.

Every rank enters with its slice of the step's tokens (``slices.py``: attention's output reduce-scattered, the
residual and the norm on the slice), routes the slice's real rows (the layer's router), then:

1. **counts**: each rank all-gathers a row of ``ranks + experts`` counts, the token rows it sends to each rank
   and its entries for each expert, so every rank knows what it receives, and the load (``load.py``);
2. **dispatch**: the token rows, packed rank by rank with no padding, each sent once to every rank that holds one
   of its experts, with its ``top_k`` weights and its experts' ids local to that rank (another rank's expert:
   the local count, which the experts' method leaves out), in one ``all_to_all`` for the rows and one for the
   weights and ids;
3. the received rows run through the layer's own method (the same grouped GEMMs or torch path as one rank),
   each row giving the weighted sum over the receiving rank's experts;
4. **combine**: those sums go back by the reverse ``all_to_all`` and each token sums its ranks' parts (a
   deterministic reduction over a [ranks, rows, hidden] buffer, not atomic adds): this rank's slice of the
   layer's output, which stays a slice until the next layer's input norm all-gathers.

The split sizes are read on the host (the layer's one sync), so a CUDA graph cannot capture this: a step being
captured runs the layer as built instead (``slices.py``), and only eager steps dispatch.
"""

from __future__ import annotations

import torch
from infer_core.layers.moe import FusedMoE
from infer_core.layers.moe.routing import local_ids
from torch import nn

from infer_parallel_ep.communicator import ExpertParallelCommunicator
from infer_parallel_ep.slices import TokenSlices


class DispatchedExperts(nn.Module):
    """A ``FusedMoE`` built with whole experts per rank (``ParallelContext.expert_parallel``), run by all-to-all.

    It holds the layer (its parameters, router settings and method) and computes what the layer computes, the
    weighted sum over each token's ``top_k`` experts, for this rank's slice of the tokens [rows, hidden] (the
    padding rows of the slice are not routed and come out zero), with the expert-parallel ranks' collectives
    instead of every rank running its experts on every token and all-reducing.
    """

    def __init__(self, layer: FusedMoE, communicator: ExpertParallelCommunicator, slices: TokenSlices) -> None:
        super().__init__()
        if layer.num_local_experts * communicator.world_size != layer.num_experts:
            raise ValueError(f"{layer.prefix}: {layer.num_local_experts} experts per rank x {communicator.world_size} "
                             f"ranks != {layer.num_experts} experts: the layer was not built expert-parallel")
        self.layer = layer
        self.communicator = communicator
        self.slices = slices

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        layer, comm, slices = self.layer, self.communicator, self.slices
        if not slices.sliced:  # a step captured into a CUDA graph: the layer as built (partial sums all-reduced)
            return layer(x, router_logits)
        world, rank = comm.world_size, comm.rank
        rows, hidden = x.shape
        real = slices.num_mine
        weights, ids = layer.select_experts(router_logits[:real])
        mine = x[:real]

        # which ranks each token goes to, and the send order: rank by rank, tokens in order within a rank (a stable
        # sort of the (rank, token) pairs that are sent first; the counts' one host read says how many there are)
        per_rank = layer.num_local_experts
        dest = ids.long() // per_rank
        hits = torch.zeros((real, world), dtype=torch.bool, device=x.device)
        hits.scatter_(1, dest, True)
        order = torch.argsort(hits.t().reshape(-1).logical_not().to(torch.int8), stable=True)

        # 1. counts: token rows sent to each rank, entries for each expert; every rank's, on every rank
        sent_rows = hits.sum(0)
        flat_ids = ids.reshape(-1).long()
        entries = torch.zeros(layer.num_experts, dtype=torch.int64, device=x.device)
        entries.index_add_(0, flat_ids, torch.ones_like(flat_ids))
        counts = comm.gather_rows(torch.cat([sent_rows, entries]).unsqueeze(0)).cpu()  # the layer's one host sync
        comm.load.add(counts, slices.num_tokens)
        send_sizes = counts[rank, :world].tolist()
        recv_sizes = counts[:, rank].tolist()
        sent = order[: sum(send_sizes)]
        to_rank, token = sent // max(real, 1), sent % max(real, 1)

        # 2. dispatch: the rows, then their weights and local expert ids (float32 holds ids below 2**24 exactly)
        ids_there = local_ids(ids[token].long(), (to_rank * per_rank).unsqueeze(1), per_rank)
        meta = torch.cat([weights[token].float(), ids_there.float()], dim=1)
        recv_x = comm.all_to_all(mine[token], recv_sizes, send_sizes)
        recv_meta = comm.all_to_all(meta, recv_sizes, send_sizes)

        # 3. this rank's experts on what it received
        top_k = ids.shape[1]
        if recv_x.shape[0]:
            recv_weights = recv_meta[:, :top_k].contiguous()
            recv_ids = recv_meta[:, top_k:].to(ids.dtype).contiguous()
            partial = layer.method.apply(layer, recv_x, recv_weights, recv_ids)
        else:
            partial = recv_x

        # 4. combine: the sums back where they came from; each token sums its ranks' parts (no atomic adds)
        back = comm.all_to_all(partial, send_sizes, recv_sizes)
        parts = torch.zeros((world, rows, hidden), dtype=x.dtype, device=x.device)
        parts[to_rank, token] = back
        return parts.sum(0)  # [rows, hidden]: the slice's padding rows stay zero

    def extra_repr(self) -> str:
        return f"expert_parallel={self.communicator.world_size} ranks, all-to-all dispatch and combine"
