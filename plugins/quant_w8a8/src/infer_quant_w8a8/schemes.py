"""What a quantized linear layer stores and computes, as plain values (no torch at import).

A ``LinearScheme`` is a weight format (int8 or FP8 e4m3, one scale per output row or per row and group of K
columns) and an activation format (each token's own scale computed per call, per token or per group of K
columns, or one static scale per tensor from the checkpoint). Every scheme this plugin runs is symmetric:
``w ~= q * scale`` with no zero point.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class QuantDtype(enum.Enum):
    """The 8-bit type of quantized values, with the largest magnitude a scale maps a row's maximum onto."""

    INT8 = "int8"
    FP8 = "fp8"  # float8 e4m3fn (NVIDIA's FP8 for weights and activations)

    @property
    def max_value(self) -> float:
        # int8: symmetric [-127, 127], so -x quantizes to -q(x); fp8 e4m3fn: its largest finite value
        return 127.0 if self is QuantDtype.INT8 else 448.0


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """Weights ``[N, K]`` of ``dtype`` and float32 scales ``[N, groups]``.

    ``group_k`` None: one scale per output row (per channel; a per-tensor checkpoint scale is repeated over
    its rows). Else one per row and group of ``group_k`` columns: a checkpoint's 128x128 blocks repeat each
    block's scale over its 128 rows, so a fused layer whose shards are not multiples of 128 rows keeps each
    shard's own blocks.
    """

    dtype: QuantDtype
    group_k: int | None = None

    def num_groups(self, k: int) -> int:
        return 1 if self.group_k is None else -(-k // self.group_k)


@dataclass(frozen=True, slots=True)
class ActivationFormat:
    """How the input rows are quantized per call.

    ``static`` False: each token's scale from its own largest magnitude (``group_k`` None), or one per group
    of ``group_k`` columns. ``static`` True: one scale for the whole tensor, read from the checkpoint
    (``input_scale``).
    """

    dtype: QuantDtype
    static: bool = False
    group_k: int | None = None

    def __post_init__(self) -> None:
        if self.static and self.group_k is not None:
            raise ValueError("a static activation scale is one per tensor: it has no groups")


@dataclass(frozen=True, slots=True)
class LinearScheme:
    """One linear layer's weight and activation formats, and whether its weights come quantized from the
    checkpoint (``prequantized``) or are quantized here while they load."""

    weight: WeightFormat
    activation: ActivationFormat
    prequantized: bool = False

    def __post_init__(self) -> None:
        if self.weight.dtype is not self.activation.dtype:
            raise ValueError(f"W8A8 multiplies like types: weights {self.weight.dtype.value}, activations "
                             f"{self.activation.dtype.value}")
        if self.activation.group_k is not None and self.activation.group_k != self.weight.group_k:
            raise ValueError(f"activation groups of {self.activation.group_k} columns need weight groups of the same "
                             f"size, got {self.weight.group_k}")

    def describe(self) -> str:
        w = "per-channel" if self.weight.group_k is None else f"{self.weight.group_k}-column groups"
        a = ("static per-tensor" if self.activation.static else
             "dynamic per-token" if self.activation.group_k is None else f"dynamic {self.activation.group_k}-column groups")
        return f"{self.weight.dtype.value} weights ({w}), {a} activations"


def online_scheme(dtype: QuantDtype) -> LinearScheme:
    """``INFER_QUANTIZATION=int8`` / ``fp8`` on an unquantized checkpoint: per-channel weights quantized while
    loading, per-token dynamic activations."""
    return LinearScheme(WeightFormat(dtype), ActivationFormat(dtype))
