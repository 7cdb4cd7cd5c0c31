"""Attention over the paged KV cache: RMSNorm of each q and k head (Qwen3), rotary, then the attention backend.

Where the q/k norms and the rotary were each built for our kernels, the three run as one launch
(``fused/qk_norm_rope.py``), chosen when the layer is built; that launch also stores k and v into the
cache where the backend's cache has the standard paged layout (``standard_kv_slot_mapping``), and the
backend is then told so (``kv_written=True``) and skips its own write. Into an FP8 cache that launch
writes k and v quantized by the layer's scales (``AttentionLayer.k_scale``/``v_scale``), which the
model sets from the checkpoint (``set_kv_scales``) before any step runs.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from infer_core.interfaces import AttentionBackend, AttentionLayer
from infer_core.layers import fused
from infer_core.layers.norm import RMSNorm
from infer_core.layers.rotary import RotaryEmbedding


def fuses_qk_norm_rope(q_norm: RMSNorm, k_norm: RMSNorm, rotary: RotaryEmbedding) -> bool:
    """Whether q-norm, k-norm and rotary run as one launch: where each of the three would run our kernel."""
    return (fused.runs_triton(fused.QK_NORM_ROPE, q_norm.weight.device)
            and q_norm.triton and k_norm.triton and rotary.triton and rotary.rot_dim > 0
            and q_norm.weight.dtype == k_norm.weight.dtype and q_norm.eps == k_norm.eps)


class Attention:
    """One decoder layer's attention step, from q, k, v (``[T, heads * head_dim]`` each, views into the qkv
    projection's output) to ``[T, heads * head_dim]``.

    It holds no weights of its own: ``q_norm``, ``k_norm`` and ``rotary`` are the attention module's (whose
    parameter names follow the checkpoint) and ``backend`` the engine's attention implementation.
    """

    def __init__(self, backend: AttentionBackend, layer: AttentionLayer, rotary: RotaryEmbedding,
                 qk_norm: tuple[RMSNorm, RMSNorm] | None = None) -> None:
        self.backend = backend
        self.layer = layer
        self.rotary = rotary
        self.qk_norm = qk_norm
        self.fused_qk_norm_rope = qk_norm is not None and fuses_qk_norm_rope(*qk_norm, rotary)

    def set_kv_scales(self, k_scale: float | None = None, v_scale: float | None = None) -> None:
        """An FP8 KV cache's scales of this layer (stored = value / scale); None keeps the one set."""
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is not None and not (scale > 0 and scale != float("inf")):
                raise ValueError(f"layer {self.layer.layer_idx}: a KV cache {name} must be positive and finite, "
                                 f"got {scale}")
        self.layer = replace(self.layer, k_scale=self.layer.k_scale if k_scale is None else k_scale,
                             v_scale=self.layer.v_scale if v_scale is None else v_scale)

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 kv_cache: torch.Tensor, metadata) -> torch.Tensor:
        num_tokens, head_dim = q.shape[0], self.layer.head_dim
        q_size = q.shape[-1]
        q = q.reshape(num_tokens, -1, head_dim)
        k = k.reshape(num_tokens, -1, head_dim)
        v = v.reshape(num_tokens, -1, head_dim)
        if self.fused_qk_norm_rope:
            out = self._fused(positions, q, k, v, kv_cache, metadata)
        else:
            if self.qk_norm is not None:
                q_norm, k_norm = self.qk_norm
                q, k = q_norm(q), k_norm(k)
            q, k = self.rotary(positions, q, k)
            out = self.backend.forward(self.layer, q, k, v, kv_cache, metadata)
        return out.reshape(num_tokens, q_size)

    def _fused(self, positions, q, k, v, kv_cache, metadata) -> torch.Tensor:
        """q and k normed and rotated in place (they stay views into qkv); k and v stored where the backend allows."""
        from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace

        q_norm, k_norm = self.qk_norm
        rotary = self.rotary
        slot_mapping = self.backend.standard_kv_slot_mapping(metadata)
        if slot_mapping is not None and (kv_cache.dtype == k.dtype or kv_cache.dtype == torch.float8_e4m3fn):
            q, k = qk_norm_rope_inplace(positions, q, k, q_norm.weight, k_norm.weight, q_norm.eps,
                                        rotary.cos_sin_cache, rotary.rot_dim, kv_cache=kv_cache, v=v,
                                        slot_mapping=slot_mapping, k_scale=self.layer.k_scale,
                                        v_scale=self.layer.v_scale)
            # said only to a backend that opted in (standard_kv_slot_mapping), so others never see it
            return self.backend.forward(self.layer, q, k, v, kv_cache, metadata, kv_written=True)
        q, k = qk_norm_rope_inplace(positions, q, k, q_norm.weight, k_norm.weight, q_norm.eps,
                                    rotary.cos_sin_cache, rotary.rot_dim)
        return self.backend.forward(self.layer, q, k, v, kv_cache, metadata)


def attention_layers(model: nn.Module) -> list[AttentionLayer]:
    """The descriptions of ``model``'s attention layers (its modules' ``attn``), in layer order."""
    found = [m.attn.layer for m in model.modules() if isinstance(getattr(m, "attn", None), Attention)]
    return sorted(found, key=lambda layer: layer.layer_idx)
