"""A compressed-tensors checkpoint's ``kv_cache_scheme``: which ones the engine's FP8 KV cache can use.

llm-compressor's FP8 KV preset calibrates one static scale per layer for K and one for V and saves them as
``model.layers.N.self_attn.k_scale`` / ``v_scale``. The engine reads those tensors itself (the core's
``models/kv_scales.py``) and uses them when ``INFER_KV_CACHE_DTYPE=fp8`` (float8 e4m3, stored = value /
scale); with the default (``auto``) the cache keeps the model's dtype and they are unused, as in vLLM. Any
other scheme (integer, other widths, a scale per head or channel, dynamic or asymmetric) is an error naming
it; a checkpoint's ``quantization_config`` reader calls :func:`check_kv_cache_scheme`.
"""

from __future__ import annotations

from typing import Any

from infer_core.interfaces import PluginError

SUPPORTED_KV = "8-bit float, symmetric, static, one scale per layer (strategy 'tensor'): llm-compressor's FP8 KV preset"
_EXPECTED = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def check_kv_cache_scheme(scheme: dict[str, Any] | None) -> None:
    """PluginError naming each field of ``scheme`` the FP8 KV cache cannot use; None (no scheme) passes."""
    if not scheme:
        return
    wrong = [f"{key}={scheme.get(key, default)!r} (needs {default!r})" for key, default in _EXPECTED.items()
             if scheme.get(key, default) != default]
    if wrong:
        raise PluginError(f"the checkpoint's kv_cache_scheme has {', '.join(wrong)}, which the FP8 KV cache does "
                          f"not run. Supported: {SUPPORTED_KV}; or load the checkpoint without its KV scales")
