"""Quantizers: how each linear layer stores its weight and computes ``x @ W.T``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from infer_core.interfaces.context import RuntimeComponent

if TYPE_CHECKING:
    import torch


class LinearMethod(ABC):
    """Weights and matmul of one linear layer.

    ``create_weights`` registers parameters on the layer for this rank's partition. Each
    parameter carries ``output_dim`` / ``input_dim`` attributes (or None) saying along which axis
    the checkpoint tensor is split across ranks and fused shards (q/k/v, gate/up) are stacked.
    """

    @abstractmethod
    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size: int,
        output_sizes: list[int],
        params_dtype: torch.dtype,
    ) -> None:
        """Register the parameters; ``output_sizes`` lists each fused shard's rows on this rank."""

    def load_weight(
        self,
        layer: torch.nn.Module,
        param: torch.nn.Parameter,
        loaded: torch.Tensor,
        output_offset: int | None,
    ) -> None:
        """Copy an already rank-sliced checkpoint tensor into ``param``.

        ``output_offset`` is where a fused shard starts along ``param.output_dim`` (None: the
        whole parameter).
        """
        dst = param.data
        out_dim = getattr(param, "output_dim", None)
        if output_offset is not None and out_dim is not None:
            dst = dst.narrow(out_dim, output_offset, loaded.shape[out_dim])
        if dst.shape != loaded.shape:
            raise ValueError(f"weight shape {tuple(loaded.shape)} does not fit parameter slice {tuple(dst.shape)}")
        dst.copy_(loaded)

    def process_after_load(self, layer: torch.nn.Module) -> None:
        """Repack weights once all are loaded (transpose, quantize, …)."""

    @abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Return ``x @ W.T + bias`` for the flat batch ``x`` [num_tokens, input_size]."""


class Quantizer(RuntimeComponent, ABC):
    """Chooses the LinearMethod of every linear layer of the model."""

    @abstractmethod
    def get_linear_method(self, prefix: str) -> LinearMethod:
        """The method for the linear layer named ``prefix`` (e.g. ``model.layers.0.mlp.down_proj``)."""
