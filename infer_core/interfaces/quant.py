"""Quantizers: how each linear layer stores its weight and computes ``x @ W.T``, and how a mixture-of-experts
layer stores its experts' weights and runs them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from infer_core.interfaces.context import RuntimeComponent

if TYPE_CHECKING:
    import torch

    from infer_core.layers.norm import NormedInput, RMSNorm


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
        """Copy an already rank-sliced checkpoint tensor into ``param``, converted to its dtype.

        ``loaded`` is in the checkpoint's dtype (a quantizing method quantizes it here). ``output_offset`` is
        where a fused shard starts along ``param.output_dim`` (None: the whole parameter).
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

    def apply_with_act(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """``layer.act(apply(layer, x, bias))`` in one launch, where this method has a kernel for it at ``x``'s size
        (a gate_up layer's SiLU-and-mul in its GEMV's epilogue); None where it has not: the layer then runs
        ``apply`` and the activation one after the other. Only asked of layers built with an ``act``."""
        return None

    def fuses_input_norm(self, layer: torch.nn.Module, norm: RMSNorm) -> bool:
        """Whether :meth:`apply_with_norm` may compute ``layer``'s input norm in this method's own launch. Asked
        once, when a layer built with an ``input_norm`` is built (its weights created), and only where that norm
        hands its output on uncomputed (a ``NormedInput``: it runs our Triton kernels) and the core's fusions are
        on (``fused.NORM_GEMV``). False (the default): the layer computes the norm by the norm's kernel and
        calls ``apply`` / ``apply_with_act`` on it."""
        return False

    def apply_with_norm(self, layer: torch.nn.Module, normed: NormedInput, bias: torch.Tensor | None,
                        keep_normed: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
        """``layer``'s output on the norm it was built with, computed in one launch with that norm, where this
        method has a kernel for it at ``normed.x``'s size; None where it has not, having written nothing: the
        layer then computes the norm (``normed.materialize()``) and runs ``apply`` / ``apply_with_act`` on it.
        Only asked of layers for which :meth:`fuses_input_norm` said True.

        The invariant, what the layer's two launches would give: the output is ``apply(layer, norm(x +
        residual), bias)``, with ``layer.act`` applied where the layer has one (a method whose kernel cannot
        apply it declines that layer in ``fuses_input_norm``), equal to the unfused launches' up to the order of
        its float32 sums; ``x + residual`` is written into ``normed.residual_out`` (nothing with ``residual``
        None); with ``keep_normed`` (``LinearBase.forward_and_input``, for an MoE block's experts that read the
        router's input) it returns ``(output, the norm's output)``, the latter a new contiguous tensor, allocated
        only once the method takes the call; the residual sum and the norm's output bit for bit what the norm's
        own kernel stores. A method that cannot keep the norm's output returns None for such a call.
        """
        return None


class MoEMethod(ABC):
    """Expert weights and the experts' computation of one mixture-of-experts layer (``layers/moe``).

    ``create_weights`` registers this rank's experts on the layer: ``gate_up_proj`` ``[experts, 2 x intermediate,
    hidden]`` (each expert's gate rows, then its up rows) and ``down_proj`` ``[experts, hidden, intermediate]`` in
    the dense method, or whatever a quantized one stores (scales beside them). The layer's weight loader hands
    ``load_weight`` one expert's checkpoint tensor, already narrowed to this rank's part.
    """

    @abstractmethod
    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int, intermediate_size: int,
                       params_dtype: torch.dtype) -> None:
        """Register the parameters of ``num_experts`` experts, each of ``intermediate_size`` on this rank."""

    def load_weight(self, layer: torch.nn.Module, param: torch.nn.Parameter, loaded: torch.Tensor, expert: int,
                    row_offset: int) -> None:
        """Copy one expert's (rank-sliced) checkpoint tensor, in the checkpoint's dtype, into ``param[expert]`` from
        row ``row_offset`` (cast to the parameter's dtype); a quantizing method overrides this."""
        dst = param.data[expert].narrow(0, row_offset, loaded.shape[0])
        if dst.shape != loaded.shape:
            raise ValueError(f"expert weight shape {tuple(loaded.shape)} does not fit parameter slice {tuple(dst.shape)}")
        dst.copy_(loaded)

    def process_after_load(self, layer: torch.nn.Module) -> None:
        """Repack weights once all are loaded (transpose, quantize, …)."""

    @abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        """``sum_k topk_weights[t, k] x expert_{topk_ids[t, k]}(x[t])`` for ``x`` [tokens, hidden].

        ``topk_ids`` [tokens, top_k] are indices of this rank's experts (``layer.num_local_experts``: an entry
        equal to it or above is an expert of another rank, and contributes nothing here); ``topk_weights``
        float32. The sum is this rank's partial sum when the intermediate size is split over ranks.
        """


class Quantizer(RuntimeComponent, ABC):
    """Chooses the LinearMethod of every linear layer of the model, and the MoEMethod of every expert layer."""

    @abstractmethod
    def get_linear_method(self, prefix: str) -> LinearMethod:
        """The method for the linear layer named ``prefix`` (e.g. ``model.layers.0.mlp.down_proj``)."""

    def get_moe_method(self, prefix: str) -> MoEMethod | None:
        """The method for the experts named ``prefix`` (e.g. ``model.layers.0.mlp.experts``); None: this
        quantizer has none, and a mixture-of-experts model is refused with it. The dense one is
        ``infer_core.layers.moe.UnquantizedMoEMethod``."""
        return None
