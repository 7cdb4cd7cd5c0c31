"""The ``none`` quantizer: every layer dense, in the model dtype (``layers/unquantized.py``, ``layers/moe/unquantized.py``)."""

from __future__ import annotations

from infer_core.interfaces import LinearMethod, MoEMethod, Quantizer
from infer_core.layers.moe.unquantized import UnquantizedMoEMethod
from infer_core.layers.unquantized import UnquantizedLinearMethod

__all__ = ["NoQuantizer", "UnquantizedLinearMethod", "UnquantizedMoEMethod"]


class NoQuantizer(Quantizer):
    """Every layer dense, every expert too."""

    def get_linear_method(self, prefix: str) -> LinearMethod:
        return UnquantizedLinearMethod()

    def get_moe_method(self, prefix: str) -> MoEMethod:
        return UnquantizedMoEMethod()
