"""Reading weights: sharded safetensors (one tensor in memory at a time), GGUF, or dummy values."""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from infer_core.errors import ModelError
from infer_core.models.config import ModelConfig
from infer_core.models.source import ModelSource

logger = logging.getLogger(__name__)


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no *.safetensors files in {folder}; use INFER_LOAD_FORMAT=dummy for random weights")
    return files


def iterate_safetensors(folder: Path, show_progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from every shard; the files are memory-mapped, one tensor read at a time."""
    from safetensors import safe_open

    files = safetensors_files(folder)
    for path in tqdm(files, desc="Loading safetensors shards", disable=not show_progress or len(files) < 2):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def iterate_gguf(source: ModelSource, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantized GGUF tensors under HF names, through transformers' GGUF reader.

    ``config`` is the one ``read_model_config`` read from the same file: its ``raw`` transformers
    config builds the (meta-device) model whose parameter names the GGUF names map to, so the
    file's metadata is not parsed a second time for it.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    hf_config = AutoConfig.for_model(**config.raw)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config)  # names only: maps GGUF -> HF names
    parsed = load_gguf_checkpoint(str(source.gguf_path), return_tensors=True, model_to_load=skeleton)
    yield from parsed["tensors"].items()


def _dummy_values(shape: tuple[int, ...], seed: int, device: torch.device, std: float) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.empty(shape, dtype=torch.float32, device=device).normal_(0, std, generator=generator)


# Projections that write into the residual stream: scaled down by 1/sqrt(2 x layers) (GPT-2's init).
_RESIDUAL_OUTPUTS = ("o_proj.weight", "down_proj.weight", "experts.down_proj")


def _dummy_std(name: str, shape: tuple[int, ...], num_layers: int) -> float:
    """The standard deviation of a dummy tensor drawn at its full checkpoint ``shape``.

    Chosen so the network is well conditioned at any width, as a trained one is: the token
    embedding at std 1 (the residual stream starts at unit RMS), every other matrix at
    1/sqrt(fan_in) (a unit gain per projection), the residual-stream writers further by
    1/sqrt(2 x num_layers). A flat N(0, 0.02) gives projections a gain of 0.02 * sqrt(fan_in),
    above 1 at large widths, and bfloat16 rounding then grows with the width
    (``benchmarks/tp_accuracy_cpu.py`` compares the two inits).
    """
    if "embed_tokens" in name:
        return 1.0
    if len(shape) < 2:
        return 0.02
    std = shape[-1] ** -0.5
    if name.endswith(_RESIDUAL_OUTPUTS) and num_layers:
        std /= (2 * num_layers) ** 0.5
    return std


def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """Random values at the real shapes (see ``_dummy_std``), 1 for norm weights, 0 for biases.

    A sharded parameter is filled through its layer's ``weight_loader`` from the full checkpoint
    tensor drawn on its device (seeded by name and shard), so every tensor-parallel size runs the
    same model and TP=N can be checked against TP=1. A quantized method's 8-bit weight gets the drawn
    values as it would a checkpoint's and quantizes its rank's part: the same model up to the scales of
    rows split over ranks (each rank scales its columns of a row-parallel weight).
    """
    seen: set[int] = set()
    num_layers = sum(1 for name, _ in model.named_modules() if name.endswith(".self_attn"))
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue  # tied weights are filled once
            seen.add(id(param))
            name = f"{module_name}.{param_name}" if module_name else param_name
            if name.endswith("norm.weight"):
                param.data.fill_(1.0)
                continue
            if name.endswith(".bias"):
                param.data.zero_()
                continue
            shard_seed = seed * 1_000_003 + zlib.crc32(name.encode())
            shapes = getattr(module, "checkpoint_shapes", None)
            shapes = shapes(param) if shapes is not None and hasattr(param, "weight_loader") else None
            if shapes is None:
                if not param.is_floating_point():
                    continue
                shape = tuple(param.shape)
                values = _dummy_values(shape, shard_seed, param.device, _dummy_std(name, shape, num_layers))
                param.data.copy_(values.to(param.dtype))
                continue
            for shard_id, shape in shapes:
                std = _dummy_std(name, shape, num_layers)
                full = _dummy_values(shape, shard_seed + zlib.crc32(str(shard_id).encode()), param.device, std)
                param.weight_loader(param, full, shard_id)
                del full


def load_model_weights(model: nn.Module, source: ModelSource, config: ModelConfig, load_format: str,
                       seed: int) -> None:
    """Fill every parameter of ``model``; a checkpoint that misses one is an error naming it."""
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        weights = iterate_gguf(source, config) if load_format == "gguf" else iterate_safetensors(source.path)
        loaded = model.load_weights(weights)
        missing = sorted(set(dict(model.named_parameters())) - loaded)
        if missing:
            raise ModelError(f"the checkpoint lacks {len(missing)} weights, e.g. {', '.join(missing[:5])}")
    for module in model.modules():
        method = getattr(module, "method", None)
        if method is not None:
            method.process_after_load(module)
        elif callable(getattr(module, "process_after_load", None)):  # a layer that repacks its own weight
            module.process_after_load()
