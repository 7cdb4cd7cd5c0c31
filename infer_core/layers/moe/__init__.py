"""Mixture-of-experts layers: the router, the experts' layer (:class:`FusedMoE`) and its dense method."""

from infer_core.layers.moe.layer import FusedMoE
from infer_core.layers.moe.routing import route
from infer_core.layers.moe.unquantized import UnquantizedMoEMethod, experts_torch

__all__ = ["FusedMoE", "UnquantizedMoEMethod", "experts_torch", "route"]
