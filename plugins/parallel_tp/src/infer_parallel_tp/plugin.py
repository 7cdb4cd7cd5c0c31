"""Registers the ``tp`` parallel strategy and its settings; importing this module imports neither torch nor
the strategy (``settings`` needs pydantic only)."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl

from infer_parallel_tp.settings import TPSettings


@hookimpl
def register_settings(register):
    register(TPSettings)


@hookimpl
def register_parallel_strategies(register):
    register("tp", "infer_parallel_tp.strategy:TensorParallelStrategy", aliases=("tensor",))


@hookimpl
def default_parallel_strategy(ctx):
    """``tp`` whenever the model is split over more than one device."""
    return "tp" if ctx.settings.tensor_parallel_size > 1 else None
