"""Each expert-parallel rank's slice of a step's tokens, held from attention's output to the next attention's input.

Attention is tensor-parallel over the ranks (each rank its heads, over every token). Its output projection's
partial sums are reduce-scattered instead of all-reduced, so each rank leaves attention holding only its own slice
of the step's tokens; on that slice it adds the residual, normalises, routes, and sends each token to its experts'
ranks (``dispatch.py``), which send the results back. The next layer's input norm runs on the slice too, and only
its output is all-gathered, for the next attention. Parts that are tensor-parallel over every token (a dense
layer's MLP, Qwen2-MoE's shared expert) all-gather their input slice and reduce-scatter their output; the final
norm's slices are all-gathered for the LM head.

**Slices are padded to one size**: rank ``r`` holds tokens ``[r * rows, (r + 1) * rows)`` with
``rows = ceil(tokens / ranks)``, the last ranks' slices completed with zero rows (a slice may be all padding: one
token over two ranks). Reduce-scatter and all-gather then take equal chunks, NCCL's ``reduce_scatter_tensor`` and
``all_gather_into_tensor`` as they are, and the padding is at most ``ranks - 1`` rows a step; the padding rows
are never routed (the dispatch takes the slice's real rows) and their norms are of zeros.

Per MoE layer this moves an all-gather and a reduce-scatter around attention (one all-reduce's bytes, the cost of
the all-reduce it replaces) and the dispatch's two all-to-alls of the slice, where the all-reduce dispatch moves a
second all-reduce of every token.

**CUDA graphs capture the all-reduce path.** A step captured into a graph (decode, up to the largest captured
batch) cannot hold the dispatch, whose split sizes are read on the host; so while a graph is being captured every
part here runs the layer it wraps as built (attention's output all-reduced, each rank's experts on every token,
their partial sums all-reduced: ``expert_parallel_dispatch="all_reduce"``), and decode steps replay that; every
step that runs eagerly (prefill, mixed and larger steps) takes the slices and the all-to-all. The step's choice is
made once, by the first layer's input norm (``TokenSlices.begin``). Steps replayed from graphs are not in the load
counts.

The wiring (``slice_tokens``) follows the core's decoder layout: a decoder layer has ``input_layernorm``,
``self_attn`` (its ``o_proj`` row-parallel), ``post_attention_layernorm`` and ``mlp``; the stack of layers sits
beside the final ``norm``.
"""

from __future__ import annotations

import torch
from infer_core.layers.graph_capture import capturing
from infer_core.layers.linear import RowParallelLinear
from infer_core.layers.moe import FusedMoE
from infer_core.layers.norm import NormedInput, RMSNorm
from torch import nn

from infer_parallel_ep.communicator import ExpertParallelCommunicator


def token_share(num_tokens: int, rank: int, world_size: int) -> tuple[int, int, int]:
    """``(start, end, rows)``: this rank's contiguous share of the tokens, and the rows every share is padded
    to (``ceil(num_tokens / world_size)``)."""
    rows = -(-num_tokens // world_size)
    start = min(rank * rows, num_tokens)
    return start, min(start + rows, num_tokens), rows


class TokenSlices:
    """The step's token count, this rank's slice of it, and whether this step runs on slices (``sliced``; else
    every part runs the layer it wraps as built). The first layer's input norm sets them each step (``begin``),
    every other part of the model reads them."""

    def __init__(self, communicator: ExpertParallelCommunicator) -> None:
        self.communicator = communicator
        self.num_tokens = self.start = self.end = self.rows = 0
        self.sliced = True

    def begin(self, num_tokens: int, sliced: bool) -> None:
        comm = self.communicator
        self.num_tokens = num_tokens
        self.sliced = sliced
        self.start, self.end, self.rows = token_share(num_tokens, comm.rank, comm.world_size)

    @property
    def num_mine(self) -> int:
        """This rank's real rows (the rest of its slice is padding)."""
        return self.end - self.start

    def _padded(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        if x.shape[0] == rows:
            return x.contiguous()
        out = x.new_zeros((rows, *x.shape[1:]))
        out[: x.shape[0]] = x
        return out

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's slice [rows, ...] of every token's ``x`` [tokens, ...]."""
        return self._padded(x[self.start : self.end], self.rows)

    def gather(self, mine: torch.Tensor) -> torch.Tensor:
        """Every rank's slice [rows, ...], as every token's [tokens, ...]."""
        return self.communicator.gather_rows(mine)[: self.num_tokens]

    def reduce_scatter(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of every token's ``partial`` [tokens, ...], this rank's slice of it [rows, ...]."""
        return self.communicator.reduce_scatter(self._padded(partial, self.rows * self.communicator.world_size))


class SlicedInputNorm(nn.Module):
    """A decoder layer's input norm on this rank's slice, its output all-gathered for attention.

    Returns ``(norm(x + residual) of every token, x + residual of this rank's slice)``. In the first layer
    (``residual`` None) ``x`` is the embedding of every token, on every rank: the step's slices begin here.
    """

    def __init__(self, norm: RMSNorm, slices: TokenSlices) -> None:
        super().__init__()
        self.norm = norm
        self.slices = slices

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            self.slices.begin(x.shape[0], sliced=not capturing())
        if not self.slices.sliced:
            return self.norm(x, residual)
        if residual is None:
            residual = self.slices.take(x)
            normed = RMSNorm.forward(self.norm, residual)
        else:
            normed, residual = RMSNorm.forward(self.norm, x, residual)
        return self.slices.gather(normed), residual


class ReduceScatteredRows(nn.Module):
    """A row-parallel projection (attention's ``o_proj``, an MLP's ``down_proj``) whose partial sums are
    reduce-scattered: this rank's slice of the output, the bias added to it."""

    def __init__(self, linear: RowParallelLinear, slices: TokenSlices) -> None:
        super().__init__()
        if not isinstance(linear, RowParallelLinear):
            raise TypeError(f"{type(linear).__name__} is not row-parallel: its output cannot be reduce-scattered")
        self.linear = linear
        self.slices = slices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear = self.linear
        if not self.slices.sliced:
            return linear(x)
        out = self.slices.reduce_scatter(linear.method.apply(linear, x, None))
        return out if linear.bias is None else out + linear.bias


class GatheredMLP(nn.Module):
    """A tensor-parallel MLP (``gate_up_proj``, ``down_proj``) on slices: the input slices all-gathered, the
    output reduce-scattered."""

    def __init__(self, mlp: nn.Module, slices: TokenSlices) -> None:
        super().__init__()
        self.mlp = mlp
        self.slices = slices
        self.down = ReduceScatteredRows(mlp.down_proj, slices)

    def forward(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        if not self.slices.sliced:
            return self.mlp(x)
        if isinstance(x, NormedInput):
            x = x.materialize()
        return self.down(self.mlp.gate_up_proj(self.slices.gather(x)))


class SlicedFinalNorm(nn.Module):
    """The final norm on this rank's slice, every rank's all-gathered for the LM head: ``(hidden, None)``."""

    def __init__(self, norm: RMSNorm, slices: TokenSlices) -> None:
        super().__init__()
        self.norm = norm
        self.slices = slices

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if not self.slices.sliced:
            return self.norm(x, residual)
        normed, _ = self.norm(x, residual)
        return self.slices.gather(normed), None


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    parts = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    return [m for m in model.modules() if all(isinstance(getattr(m, p, None), nn.Module) for p in parts)]


def slice_tokens(model: nn.Module, communicator: ExpertParallelCommunicator) -> TokenSlices:
    """Rewire ``model`` so each rank holds its slice of the step's tokens between attentions (module docstring):
    every decoder layer's input norm, ``o_proj``, MoE block (experts dispatched by all-to-all, a shared expert
    gathered) or dense MLP (gathered), and the final norm."""
    from infer_parallel_ep.dispatch import DispatchedExperts

    slices = TokenSlices(communicator)
    layers = _decoder_layers(model)
    stacks = [m for m in model.modules()
              if isinstance(getattr(m, "layers", None), nn.ModuleList) and isinstance(getattr(m, "norm", None), RMSNorm)]
    if not layers or len(stacks) != 1:
        raise ValueError(f"{type(model).__name__} is not laid out as the core's decoders ({len(layers)} layers with "
                         f"input_layernorm, self_attn, post_attention_layernorm and mlp; {len(stacks)} stacks of "
                         "layers beside a final norm): use expert_parallel_dispatch=all_reduce")
    for layer in layers:
        layer.input_layernorm = SlicedInputNorm(layer.input_layernorm, slices)
        layer.self_attn.o_proj = ReduceScatteredRows(layer.self_attn.o_proj, slices)
        block = layer.mlp
        if isinstance(getattr(block, "experts", None), FusedMoE):
            block.experts = DispatchedExperts(block.experts, communicator, slices)
            if getattr(block, "shared_expert", None) is not None:
                block.shared_expert = GatheredMLP(block.shared_expert, slices)
        else:
            layer.mlp = GatheredMLP(block, slices)
    stacks[0].norm = SlicedFinalNorm(stacks[0].norm, slices)
    return slices
