"""Registers the ``ep`` parallel strategy and its setting; importing this module imports neither torch nor
the strategy (``settings`` needs pydantic only)."""

from __future__ import annotations

from infer_core.hookspecs import hookimpl

from infer_parallel_ep.settings import EPSettings


@hookimpl
def register_settings(register):
    register(EPSettings)


@hookimpl
def register_parallel_strategies(register):
    register("ep", "infer_parallel_ep.strategy:ExpertParallelStrategy", aliases=("expert",))


@hookimpl
def default_parallel_strategy(ctx):
    """``ep`` whenever the experts are sharded over more than one rank."""
    return "ep" if EPSettings.of(ctx.settings).expert_parallel_size > 1 else None
