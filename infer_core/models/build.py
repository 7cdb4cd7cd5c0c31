"""BuildContext: what every model class receives to build its layers for one rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from infer_core.errors import ModelError
from infer_core.interfaces import AttentionBackend, ParallelContext, Quantizer
from infer_core.models.config import ModelConfig


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What a model needs to build its layers for this rank."""

    config: ModelConfig
    parallel: ParallelContext
    quantizer: Quantizer
    attention: AttentionBackend
    dtype: torch.dtype
    max_model_len: int

    def linear_kw(self, prefix: str) -> dict[str, Any]:
        return dict(method=self.quantizer.get_linear_method(prefix), parallel=self.parallel, dtype=self.dtype,
                    prefix=prefix)

    def moe_kw(self, prefix: str) -> dict[str, Any]:
        """The keywords of a ``FusedMoE`` named ``prefix``: its quantizer's MoEMethod, this rank, the dtype."""
        method = self.quantizer.get_moe_method(prefix)
        if method is None:
            raise ModelError(f"the quantizer {type(self.quantizer).__name__} has no method for the experts of a "
                             f"mixture-of-experts model ({prefix}); choose a quantization that supports them "
                             "(none: dense weights)")
        return dict(method=method, parallel=self.parallel, dtype=self.dtype, prefix=prefix)
