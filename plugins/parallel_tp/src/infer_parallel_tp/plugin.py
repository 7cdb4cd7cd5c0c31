"""Registers the ``tp`` parallel strategy; importing this module imports neither torch nor the strategy."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl


@hookimpl
def register_parallel_strategies(register):
    register("tp", "infer_parallel_tp.strategy:TensorParallelStrategy", aliases=("tensor",))
