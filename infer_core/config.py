"""EngineConfig: the resolved, picklable description of one engine, sent to every worker."""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_core.interfaces import RuntimeContext
from infer_core.models.config import ModelConfig
from infer_core.models.source import ModelSource
from infer_core.settings import EngineSettings

__all__ = ["KINDS", "EngineConfig", "ModelSource"]

KINDS = ("attention", "kv_allocator", "scheduler", "quantization", "parallel", "decoding", "grammar")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything decided before the engine starts; no lookups by name happen after this."""

    context: RuntimeContext  # what every implementation was validated against
    source: ModelSource
    block_size: int
    max_model_len: int
    implementations: dict[str, str] = field(default_factory=dict)  # kind -> chosen name
    load_format: str = "safetensors"
    eos_token_ids: tuple[int, ...] = ()  # config.json, generation_config.json and the tokenizer's

    @property
    def settings(self) -> EngineSettings:
        return self.context.settings

    @property
    def model(self) -> ModelConfig:
        return self.context.model

    @property
    def device(self) -> str:
        return self.context.device

    @property
    def dtype(self) -> str:
        return self.context.dtype
