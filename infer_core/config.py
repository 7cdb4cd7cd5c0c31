"""EngineConfig: the resolved, picklable description of one engine, sent to every worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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

    settings: EngineSettings
    source: ModelSource
    model: ModelConfig
    device: str
    dtype: str
    block_size: int
    max_model_len: int
    implementations: dict[str, str] = field(default_factory=dict)  # kind -> chosen name
    load_format: str = "safetensors"
    eos_token_ids: tuple[int, ...] = ()  # config.json and generation_config.json together
    generation_defaults: dict = field(default_factory=dict)  # sampling keys of generation_config.json

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name or self.source.name
