"""Linear layers with the Megatron split and a pluggable LinearMethod (quantization).

Every layer here works for any world size: with one rank the split is the identity. Weights are
loaded from full (unsharded, unfused) checkpoint tensors: each layer narrows out its rank's part
and places fused shards (q/k/v, gate/up) at their offsets.

A replicated or column-parallel layer may be built with the RMSNorm that feeds it (``input_norm``) and
the activation that follows it (``act``, SiLU-and-mul on gate_up): it then computes both, at decode sizes
in one launch with its GEMV where its method was built for that (``LinearMethod.apply_with_norm``,
``fused/gemv_fusion.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from infer_core.interfaces import LinearMethod, ParallelContext
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.fused.gemv_fusion import fuses_input_norm
from infer_core.layers.norm import NormedInput, RMSNorm


def _divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what}={numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


class LinearBase(nn.Module):
    """Owns the LinearMethod; subclasses decide the partition and how checkpoint tensors map.

    ``input_norm``: the norm whose output is this layer's input (a ``ResidualRMSNorm`` hands it on not
    computed yet, as a ``NormedInput``); the method learns it when it creates the weights (the dense GEMV
    takes the tiles it has fused with the norm). ``act``: applied to the output, which is ``[gate; up]``.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        *,
        bias: bool,
        method: LinearMethod,
        parallel: ParallelContext,
        dtype: torch.dtype,
        prefix: str,
        input_norm: RMSNorm | None = None,
        act: SiluAndMul | None = None,
    ) -> None:
        super().__init__()
        if (input_norm is not None or act is not None) and type(self).forward is not LinearBase.forward:
            raise ValueError(f"{type(self).__name__} does more than method.apply (row-parallel all-reduce?): only a "
                             "replicated or column-parallel layer takes the norm before it or an activation")
        if act is not None and (len(output_sizes) != 2 or output_sizes[0] != output_sizes[1]):
            raise ValueError(f"SiLU-and-mul needs [gate; up] halves of one size, got {output_sizes}")
        self.method = method
        self.parallel = parallel
        self.prefix = prefix
        self.input_size = input_size  # this rank's input features
        self.output_sizes = output_sizes  # this rank's rows of each fused shard
        self.after_rms_norm = input_norm is not None
        self.act = act
        method.create_weights(self, input_size, output_sizes, dtype)
        for param in self.parameters(recurse=False):
            param.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(sum(output_sizes), dtype=dtype), requires_grad=False)
            self.bias.output_dim = 0
            self.bias.input_dim = None
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        self.fuses_input_norm = input_norm is not None and fuses_input_norm(input_norm, self)

    def shard_offset(self, shard_id: int | str | None) -> int | None:
        """Where a fused shard starts in this rank's output rows (None: not fused)."""
        return None

    @property
    def full_input_size(self) -> int:
        """Input features of the whole (unsharded) matrix."""
        return self.input_size

    def full_shards(self) -> list[tuple[int | str | None, int]]:
        """(shard id, rows of the whole checkpoint tensor) of every fused shard."""
        return [(None, sum(self.output_sizes))]

    def checkpoint_shapes(self, param: nn.Parameter) -> list[tuple[int | str | None, tuple[int, ...]]] | None:
        """The full checkpoint tensors that ``weight_loader`` narrows into ``param``, by shard id.

        Dummy weights are drawn at these shapes, so every tensor-parallel size gets the same model.
        None when ``param`` does not follow the layer's shape (a packed quantized weight).
        """
        shape = list(param.shape)
        out_dim, in_dim = getattr(param, "output_dim", None), getattr(param, "input_dim", None)
        if in_dim is not None:
            if shape[in_dim] != self.input_size:
                return None
            shape[in_dim] = self.full_input_size
        if out_dim is None:
            return [(None, tuple(shape))]
        if shape[out_dim] != sum(self.output_sizes):
            return None
        return [(shard_id, tuple(shape[:out_dim] + [rows] + shape[out_dim + 1 :]))
                for shard_id, rows in self.full_shards()]

    def narrow_for_rank(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | str | None) -> torch.Tensor:
        """This rank's part of a full checkpoint tensor."""
        return loaded

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | str | None = None) -> None:
        """Hand the method this rank's part of a checkpoint tensor, in the checkpoint's dtype (the method converts
        it: a quantizing method reads the unquantized values)."""
        part = self.narrow_for_rank(param, loaded, shard_id)
        offset = self.shard_offset(shard_id) if getattr(param, "output_dim", None) is not None else None
        self.method.load_weight(self, param, part, offset)

    def forward(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        """``act(x @ W^T + b)``; x may be the input norm not computed yet, computed here."""
        if isinstance(x, NormedInput):
            out = self.method.apply_with_norm(self, x, self.bias) if self.fuses_input_norm else None
            if out is not None:
                return out
            x = x.materialize()
        if self.act is None:
            return self.method.apply(self, x, self.bias)
        out = self.method.apply_with_act(self, x, self.bias)
        return out if out is not None else self.act(self.method.apply(self, x, self.bias))

    def forward_and_input(self, x: torch.Tensor | NormedInput) -> tuple[torch.Tensor, torch.Tensor]:
        """``(forward(x), x as a tensor)``, for a block whose other layers read the same input after this one (an
        MoE block's experts after its router): a norm handed on is computed once, at decode sizes in this
        layer's GEMV launch, which also stores it."""
        if isinstance(x, NormedInput):
            both = self.method.apply_with_norm(self, x, self.bias, keep_normed=True) if self.fuses_input_norm else None
            if both is not None:
                return both
            x = x.materialize()
        return self.forward(x), x


class ReplicatedLinear(LinearBase):
    """The full matrix on every rank."""

    def __init__(self, input_size: int, output_size: int, **kw) -> None:
        super().__init__(input_size, [output_size], **kw)


class ColumnParallelLinear(LinearBase):
    """Output rows split over ranks; fused shards each split separately. No communication."""

    def __init__(self, input_size: int, output_sizes: list[int], **kw) -> None:
        world = kw["parallel"].world_size
        self.full_output_sizes = list(output_sizes)
        super().__init__(input_size, [_divide(s, world, "output size") for s in output_sizes], **kw)

    def shard_offset(self, shard_id):
        if shard_id is None:
            return None
        return sum(self.output_sizes[: int(shard_id)])

    def full_shards(self):
        if len(self.full_output_sizes) == 1:
            return [(None, self.full_output_sizes[0])]
        return list(enumerate(self.full_output_sizes))

    def shard_rows(self, shard_id) -> tuple[int, int]:
        """(start, size) of this rank's rows within the full checkpoint tensor of a shard."""
        index = 0 if shard_id is None else int(shard_id)
        size = self.output_sizes[index] if shard_id is not None else sum(self.output_sizes)
        return self.parallel.rank * size, size

    def narrow_for_rank(self, param, loaded, shard_id):
        out_dim = getattr(param, "output_dim", None)
        if out_dim is None or self.parallel.world_size == 1:
            return loaded
        start, size = self.shard_rows(shard_id)
        return loaded.narrow(out_dim, start, size)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several projections of the same input fused into one matmul (e.g. gate and up)."""


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v fused; query heads split over ranks, KV heads split or replicated.

    With fewer KV heads than ranks, each KV head is replicated on ``world // num_kv_heads``
    consecutive ranks.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, **kw) -> None:
        world = kw["parallel"].world_size
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, world, "num_attention_heads")
        if num_kv_heads >= world:
            self.num_kv_heads = _divide(num_kv_heads, world, "num_key_value_heads")
            self.kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.kv_replicas = _divide(world, num_kv_heads, "tensor-parallel size over num_key_value_heads")
        q_rows = self.num_heads * head_dim * world
        kv_rows = self.num_kv_heads * head_dim * world // self.kv_replicas
        # The base class divides by world; pass full-size rows so each rank gets its heads.
        LinearBase.__init__(
            self, hidden_size,
            [self.num_heads * head_dim, self.num_kv_heads * head_dim, self.num_kv_heads * head_dim], **kw,
        )
        self.full_output_sizes = [q_rows, kv_rows, kv_rows]

    _SHARD_INDEX = {"q": 0, "k": 1, "v": 2}

    def shard_offset(self, shard_id):
        return sum(self.output_sizes[: self._SHARD_INDEX[shard_id]])

    def full_shards(self):
        return list(zip(self._SHARD_INDEX, self.full_output_sizes))

    def shard_rows(self, shard_id):
        index = self._SHARD_INDEX[shard_id]
        size = self.output_sizes[index]
        rank = self.parallel.rank if index == 0 else self.parallel.rank // self.kv_replicas
        return rank * size, size


class RowParallelLinear(LinearBase):
    """Input features split over ranks; partial sums all-reduced, the (whole) bias added once after."""

    def __init__(self, input_size: int, output_size: int, **kw) -> None:
        world = kw["parallel"].world_size
        super().__init__(_divide(input_size, world, "input size"), [output_size], **kw)

    @property
    def full_input_size(self) -> int:
        return self.input_size * self.parallel.world_size

    def narrow_for_rank(self, param, loaded, shard_id):
        in_dim = getattr(param, "input_dim", None)
        if in_dim is None or self.parallel.world_size == 1:
            return loaded
        return loaded.narrow(in_dim, self.parallel.rank * self.input_size, self.input_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial sums, all-reduced by the communicator, then the bias."""
        out = self.method.apply(self, x, None)
        if self.parallel.world_size > 1:
            out = self.parallel.communicator.all_reduce(out)
        if self.bias is not None:
            out = out + self.bias
        return out
