"""What an implementation is told about the place it would run in, before it is chosen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infer_core.models.config import ModelConfig
    from infer_core.settings import EngineSettings


@dataclass(frozen=True, slots=True)
class RuntimeContext:
    """The device, dtype and model an engine is being assembled for.

    ``validate(ctx)`` of every implementation reads this; it holds plain values only, so reading
    it imports neither torch nor any kernel library.
    """

    device: str  # "cpu" or "cuda"
    dtype: str  # "float32", "bfloat16" or "float16"
    model: ModelConfig
    settings: EngineSettings
    cuda_capability: tuple[int, int] | None = None
    num_gpus: int = 0
    triton_interpret: bool = False

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"


class RuntimeComponent:
    """An implementation chosen for a RuntimeContext: it first says whether it can run there
    (``validate``, a class method that must not import heavy dependencies), then is built for it."""

    @classmethod
    def validate(cls, ctx: RuntimeContext) -> list[str]:
        """Reasons this implementation cannot run for ``ctx``; empty when it can."""
        return []

    def __init__(self, ctx: RuntimeContext) -> None:
        self.ctx = ctx
