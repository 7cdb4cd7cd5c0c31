"""The expert-parallel plugin's setting: over how many ranks the experts are sharded.

Declared through ``register_settings`` (``plugin.py``), so it is a setting like the core's:
``INFER_EXPERT_PARALLEL_SIZE``, ``--expert-parallel-size``, ``LLM(expert_parallel_size=2)``. Read as
``EPSettings.of(engine_settings)``. This module imports pydantic and ``infer_core.interfaces`` only.
"""

from __future__ import annotations

from typing import Literal

from infer_core.interfaces import PluginSettings
from pydantic import Field


class EPSettings(PluginSettings):
    """``expert_parallel_size`` above 1 selects the ``ep`` strategy (unless ``parallel`` names another)."""

    section = "expert parallelism"

    expert_parallel_size: int = Field(
        1,
        ge=1,
        title="ranks the experts are sharded over",
        description="GPUs (or CPU processes) a mixture-of-experts model runs on: each holds num_experts / N whole "
                    "experts, attention is split over the same ranks as tensor parallelism splits it (see "
                    "expert_parallel_dispatch for how tokens reach the experts); must divide num_experts. 1 = off",
    )
    expert_parallel_dispatch: Literal["all_reduce", "all_to_all"] = Field(
        "all_reduce",
        title="how tokens meet their experts: all_reduce, all_to_all",
        description="all_reduce = attention's output is all-reduced, every rank routes every token and runs its "
                    "experts on those routed there, and the partial sums are all-reduced, in every step; prefill and "
                    "mixed steps replay piecewise CUDA graphs where captured, and rank 0 counts the load of every "
                    "step but the whole-step graphs' (decode). all_to_all = attention's output is reduce-scattered, so each "
                    "rank holds its slice of the step's tokens until the next attention all-gathers them; each rank "
                    "routes its slice and sends each token to the ranks holding its experts (counts exchanged "
                    "first, packed rows), and the results come back the same way; the split sizes are read on the "
                    "host, a sync per layer, so its prefill runs eagerly and is slower, and steps captured into CUDA "
                    "graphs (decode) run the all_reduce path",
    )
