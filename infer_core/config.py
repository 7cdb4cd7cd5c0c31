"""EngineConfig: the resolved, picklable description of one engine, sent to every worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from infer_core.interfaces import RuntimeContext
from infer_core.models.config import ModelConfig
from infer_core.settings import EngineSettings

KINDS = ("attention", "kv_allocator", "scheduler", "quantization", "parallel", "decoding")


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model's files are: a folder (HF checkpoint) or a GGUF file, or only a config (dummy)."""

    path: Path  # the folder holding config.json / tokenizer files, or the GGUF's folder
    gguf_file: str | None = None  # file name inside ``path`` when the weights are a GGUF
    name: str = ""  # what clients call the model (served name default)
    is_default: bool = False

    @property
    def gguf_path(self) -> Path | None:
        return self.path / self.gguf_file if self.gguf_file else None


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
