"""The per-layer scales of an FP8 KV cache, as quantized checkpoints carry them.

An FP8 cache stores ``k / k_scale`` and ``v / v_scale``. Checkpoints calibrated for one
(llm-compressor's ``kv_cache_scheme``, ModelOpt, HF FP8) carry one scalar per layer next to the
attention weights; without them every scale is 1.0, as in vLLM (a model's K and V rarely leave the
e4m3 range of +-448). A scale is a constant of its layer, so a step reads it with no host sync and a
CUDA graph keeps it. Scales a checkpoint carries are unused by a cache in the model's dtype.
"""

from __future__ import annotations

import torch

from infer_core.errors import ModelError

# checkpoint name suffix -> the scales it sets
_SUFFIXES = (
    (".self_attn.k_scale", ("k",)),  # compressed-tensors (kv_cache_scheme), ModelOpt
    (".self_attn.v_scale", ("v",)),
    (".self_attn.kv_scale", ("k", "v")),  # older FP8 checkpoints: one scale for K and V
    (".self_attn.k_proj.output_scale", ("k",)),  # compressed-tensors before k_scale / v_scale
    (".self_attn.v_proj.output_scale", ("v",)),
)


def kv_scale_target(name: str) -> tuple[str, tuple[str, ...]] | None:
    """(the attention module's name, the scales it sets: "k", "v") of the checkpoint tensor ``name``;
    None when it is not a KV cache scale."""
    for suffix, which in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".self_attn", which
    return None


def kv_scale_value(name: str, tensor: torch.Tensor) -> float:
    """The one scale ``tensor`` holds; ModelError for a scale per head or channel, or one not positive."""
    if tensor.numel() != 1:
        raise ModelError(f"checkpoint tensor {name!r} holds {tensor.numel()} KV cache scales (shape "
                         f"{tuple(tensor.shape)}); only one scale per layer (strategy 'tensor') is supported")
    value = float(tensor.float().item())
    if not (0 < value < float("inf")):
        raise ModelError(f"checkpoint tensor {name!r} is a KV cache scale of {value}; a scale must be positive "
                         f"and finite")
    return value
