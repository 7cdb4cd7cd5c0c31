"""The tensor-parallel plugin's own settings: how the ranks add their partial sums on CUDA.

Declared through ``register_settings`` (``plugin.py``), so each is a setting like the core's:
``INFER_ENABLE_SYMM_MEM_ALL_REDUCE``, ``--enable-symm-mem-all-reduce``, ``LLM(enable_symm_mem_all_reduce=True)``.
Read as ``TPSettings.of(engine_settings)``. This module imports pydantic and ``infer_core.interfaces`` only.
"""

from __future__ import annotations

from typing import Literal

from infer_core.interfaces import PluginSettings
from pydantic import Field


class TPSettings(PluginSettings):
    """Symmetric-memory all-reduce and pushed partial sums; both off by default, NCCL then does every collective."""

    section = "tensor parallelism"

    enable_symm_mem_all_reduce: bool = Field(
        False,
        title="all-reduce small messages over symmetric memory",
        description="on CUDA, all-reduce small messages (decode steps) with one kernel that reads every rank's "
                    "buffer in symmetric memory over NVLink (no multicast), instead of NCCL; off = NCCL for every "
                    "all-reduce. A worker that dies mid-step can leave the engine waiting with it on",
    )
    enable_pushed_partial_sums: bool = Field(
        False,
        title="GEMVs push partial sums to every rank at decode",
        description="with enable_symm_mem_all_reduce, at decode sizes: each row-parallel layer's GEMV pushes its "
                    "partial sums into every rank's memory and pushed_partial_sums_mode says who adds them, instead "
                    "of an all-reduce launch; the vocabulary-parallel embedding and the LM head's all-gather push "
                    "too, so a batch-1 decode graph holds no NCCL launch",
    )
    pushed_partial_sums_mode: Literal["gemv", "sum", "all_reduce"] = Field(
        "gemv",
        title="who adds pushed partial sums: gemv, sum, all_reduce",
        description="who adds the pushed partial sums: gemv = the pushing GEMV's own last programs (no launch of "
                    "their own); sum = a small kernel right after the pushing GEMV; all_reduce = the GEMV stores as "
                    "usual and one small kernel pushes its output to every rank and adds every rank's",
    )
