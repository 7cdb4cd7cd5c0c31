"""The ``none`` quantizer: every layer dense, in the model dtype (``layers/unquantized.py``)."""

from __future__ import annotations

from infer_core.interfaces import LinearMethod, Quantizer
from infer_core.layers.unquantized import UnquantizedLinearMethod

__all__ = ["NoQuantizer", "UnquantizedLinearMethod"]


class NoQuantizer(Quantizer):
    """Every layer dense."""

    def get_linear_method(self, prefix: str) -> LinearMethod:
        return UnquantizedLinearMethod()
