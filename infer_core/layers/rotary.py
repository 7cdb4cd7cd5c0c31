"""Rotary position embedding (neox layout), with the rope scalings Llama-family models use.

The cos/sin table is computed once in float32 for every position up to ``max_position``; each
step gathers rows by position id, so chunked prefill and decode need no special cases.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
from torch import nn

from infer_core.layers import cpu_elementwise, fused


class RopeParameters(Protocol):
    """The rope parameters the layer reads (``infer_core.models.config.RopeConfig`` is one)."""

    theta: float
    rope_type: str
    partial_rotary_factor: float

    def get(self, key: str, default: Any = None) -> Any:
        """A type-specific scaling parameter (factor, original_max_position_embeddings, ...)."""


def _default_inv_freq(theta: float, rot_dim: int) -> torch.Tensor:
    exponents = torch.arange(0, rot_dim, 2, dtype=torch.int64).float() / rot_dim
    return 1.0 / (theta**exponents)


def _llama3_inv_freq(inv_freq: torch.Tensor, rope: RopeParameters) -> torch.Tensor:
    factor = rope.get("factor")
    low_freq_factor = rope.get("low_freq_factor")
    high_freq_factor = rope.get("high_freq_factor")
    original = rope.get("original_max_position_embeddings")
    low_freq_wavelen = original / low_freq_factor
    high_freq_wavelen = original / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(theta: float, rot_dim: int, rope: RopeParameters, max_position: int) -> tuple[torch.Tensor, float]:
    factor = rope.get("factor")
    original = rope.get("original_max_position_embeddings") or max_position
    beta_fast = rope.get("beta_fast") or 32
    beta_slow = rope.get("beta_slow") or 1
    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return (rot_dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot_dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = theta ** (torch.arange(0, rot_dim, 2).float() / rot_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(rot_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, float(attention_factor)


def compute_inv_freq(rope: RopeParameters, rot_dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rot_dim/2], scale applied to cos and sin)."""
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(rope.theta, rot_dim, rope, max_position)
    inv_freq = _default_inv_freq(rope.theta, rot_dim)
    if rope.rope_type == "linear":
        inv_freq = inv_freq / rope.get("factor")
    elif rope.rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, rope)
    return inv_freq, 1.0


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, rope: RopeParameters, max_position: int, model_max_position: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rot_dim = int(head_dim * rope.partial_rotary_factor)
        inv_freq, scale = compute_inv_freq(rope, self.rot_dim, model_max_position)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        cache = torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)  # [max_position, rot_dim]
        self.triton = fused.runs_triton(fused.ROTARY, cache.device)
        self.cpu_kernels = cpu_elementwise.load() if not self.triton and cache.device.type == "cpu" else None

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot, rest = x[..., : self.rot_dim], x[..., self.rot_dim :]
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out if rest.shape[-1] == 0 else torch.cat([out, rest], dim=-1)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hk, D] rotated by the position of each of the T tokens.

        Built for our kernels, q and k are rotated in place (one Triton launch, or on the CPU one call of
        ``cpu_elementwise.py`` for int32 positions; views into the qkv buffer are written where they lie) and
        returned; elsewhere new tensors are returned.
        """
        if self.triton and q.dim() == 3 and k.dim() == 3 and q.dtype == k.dtype:
            from infer_core.layers.fused.rotary import rotary_inplace

            return rotary_inplace(positions, q, k, self.cos_sin_cache, self.rot_dim)
        if self.cpu_kernels is not None and self._cpu_takes(positions, q, k):
            return cpu_elementwise.rotary_inplace(self.cpu_kernels, positions, q, k, self.cos_sin_cache, self.rot_dim)
        return self.forward_torch(positions, q, k)

    def _cpu_takes(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> bool:
        return (q.dim() == 3 and k.dim() == 3 and q.dtype == k.dtype and positions.dtype == torch.int32
                and positions.is_contiguous() and cpu_elementwise.takes(q) and cpu_elementwise.takes(k)
                and q.stride(1) == self.head_dim and k.stride(1) == self.head_dim)

    def forward_torch(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """The reference (new tensors): what the kernels must reproduce.

        q and k of one dtype are rotated as one tensor (``[T, Hq + Hk, D]``, the same arithmetic per element):
        half the ops, which on the CPU cost more in dispatch than in arithmetic at decode sizes.
        """
        cos_sin = self.cos_sin_cache.index_select(0, positions)
        cos, sin = cos_sin.to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
        if q.dtype != k.dtype or q.dim() != 3 or k.dim() != 3:
            return self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        qk = self._rotate(torch.cat([q, k], dim=1), cos, sin)
        return qk[:, : q.shape[1]], qk[:, q.shape[1] :]
