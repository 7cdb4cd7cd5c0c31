"""Load balance of expert parallelism: entries (token, expert pairs) per expert and per rank.

Every MoE layer's all-to-all dispatch exchanges, on every rank, each rank's counts per expert (``dispatch.py``), so
every rank, rank 0 included, sees the whole step's routing, read on the host: :meth:`ExpertLoad.add` folds one
layer's counts in. With the all-reduce dispatch every rank routes every token, and rank 0 counts the routing of each
step that is not a whole-step graph's replay (eager, or replaying the piecewise graphs) on the device
(:meth:`ExpertLoad.add_routing`, ``counted.py``), with no host sync in the step; the device's counts are moved into
the host totals when the counters are read. The host totals only grow (``reset`` aside); the engine's metrics read
them (``describe``).
"""

from __future__ import annotations

from typing import Any

import torch
from infer_core.interfaces import ParallelMetric
from infer_core.layers.graph_capture import capturing

from infer_parallel_ep.device_load import DeviceLoad


class ExpertLoad:
    """Cumulative counts over every MoE layer and step since the engine started.

    ``entries_per_expert`` [num_experts]: entries routed to each expert; ``entries_per_rank`` [ranks]: to each
    rank's experts; ``tokens_per_rank`` [ranks]: token rows each rank received (a token that picked several of a
    rank's experts travels once); ``max_rank_entries`` / ``mean_rank_entries``: per dispatch, the busiest rank's
    entries and the ranks' mean, summed, so their ratio is the imbalance (1 = even; the busiest rank sets a
    layer's time).
    """

    def __init__(self, num_experts: int, world_size: int) -> None:
        self.num_experts = num_experts
        self.world_size = world_size
        self.reset()

    def reset(self) -> None:
        """Every counter back to zero (start-up's dummy steps are not the load: the executor resets after them); the
        device's counters are zeroed in place, since the graphs captured by then add to them."""
        device = getattr(self, "_device", None)
        self.entries_per_expert = torch.zeros(self.num_experts, dtype=torch.int64)
        self.entries_per_rank = torch.zeros(self.world_size, dtype=torch.int64)
        self.tokens_per_rank = torch.zeros(self.world_size, dtype=torch.int64)
        self.num_dispatches = 0
        self.num_tokens = 0  # tokens routed, over every dispatch
        self.max_rank_entries = 0
        self.mean_rank_entries = 0.0
        self._device: DeviceLoad | None = device
        if device is not None:
            device.zero()

    def add(self, counts: torch.Tensor, num_tokens: int) -> None:
        """One layer's exchanged counts (host, int64 [ranks, ranks + experts]): row ``r`` holds the token rows
        rank ``r`` sends to each rank, then its entries for each expert; ``num_tokens``: the step's tokens."""
        world = self.world_size
        tokens, entries = counts[:, :world], counts[:, world:]
        per_expert = entries.sum(0)
        per_rank = per_expert.view(world, -1).sum(1)  # experts are laid out rank by rank
        self.entries_per_expert += per_expert
        self.entries_per_rank += per_rank
        self.tokens_per_rank += tokens.sum(0)
        self.num_dispatches += 1
        self.num_tokens += num_tokens
        self.max_rank_entries += int(per_rank.max())
        self.mean_rank_entries += float(per_rank.sum()) / world

    def add_routing(self, topk_ids: torch.Tensor, padded: bool = False) -> None:
        """One layer's routing [rows, top_k] (global expert ids, on the device), counted there: no host sync;
        ``padded``: a piecewise graph's rows, of which the step's own are the first (``set_step_rows``)."""
        if self._device is None:
            if capturing():  # the counters' zero fills would be captured too, and replayed
                raise RuntimeError("the expert load's first count came inside a CUDA graph capture: the counters "
                                   "must be made by an eager forward first (the KV-sizing profile step)")
            self._device = DeviceLoad(self.num_experts, self.world_size, topk_ids.device)
        self._device.add(topk_ids, padded)

    def set_step_rows(self, rows: int) -> None:
        """The real rows of the step about to run (rank 0's executor, before each step; nothing before the
        routing was first counted: the counters are made then, before any graph is captured)."""
        if self._device is not None:
            self._device.set_step_rows(rows)

    def _fold(self, wait: bool) -> None:
        """The device's counts into the host counters: with ``wait`` all of them (a sync), else those already
        copied to the host (none of the step in flight is waited for; the rest come at the next read)."""
        if self._device is None:
            return
        for entries, tokens, busiest, dispatches, routed in self._device.take(wait):
            self.num_dispatches += dispatches
            self.num_tokens += routed
            per_rank = entries.view(self.world_size, -1).sum(1)
            self.entries_per_expert += entries
            self.entries_per_rank += per_rank
            self.tokens_per_rank += tokens
            self.max_rank_entries += busiest
            self.mean_rank_entries += float(per_rank.sum()) / self.world_size

    @property
    def imbalance(self) -> float:
        """Summed busiest-rank entries over summed mean entries (1.0 before any dispatch)."""
        return self.max_rank_entries / self.mean_rank_entries if self.mean_rank_entries else 1.0

    def describe(self) -> dict[str, Any]:
        """Every counter, the device's included (waits for the step in flight to count)."""
        self._fold(wait=True)
        return {
            "num_dispatches": self.num_dispatches,
            "num_tokens": self.num_tokens,
            "entries_per_expert": self.entries_per_expert.tolist(),
            "entries_per_rank": self.entries_per_rank.tolist(),
            "tokens_per_rank": self.tokens_per_rank.tolist(),
            "imbalance": self.imbalance,
        }

    def metrics(self) -> list[ParallelMetric]:
        """The counters as ``/metrics`` series: entries per expert, entries and token rows per rank, imbalance;
        none before the first dispatch."""
        self._fold(wait=False)  # read by the engine's loop between steps: it must not wait for the one in flight
        if not self.num_dispatches:
            return []
        experts = tuple((str(e), float(n)) for e, n in enumerate(self.entries_per_expert.tolist()))
        ranks = tuple((str(r), float(n)) for r, n in enumerate(self.entries_per_rank.tolist()))
        rows = tuple((str(r), float(n)) for r, n in enumerate(self.tokens_per_rank.tolist()))
        return [
            ParallelMetric("moe_expert_entries", "Tokens routed to each expert, over every MoE layer (a token "
                           "counts once per expert it picked).", "counter", "expert", experts),
            ParallelMetric("moe_rank_entries", "Token-expert entries each expert-parallel rank computed, over every "
                           "MoE layer.", "counter", "rank", ranks),
            ParallelMetric("moe_rank_tokens", "Token rows dispatched to each expert-parallel rank (once per token "
                           "and rank), over every MoE layer.", "counter", "rank", rows),
            ParallelMetric("moe_load_imbalance", "Busiest rank's entries over the ranks' mean, summed over every "
                           "dispatch (1 = even).", "gauge", "layers", (("all", self.imbalance),)),
        ]
