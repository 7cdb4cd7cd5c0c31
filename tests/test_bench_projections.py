"""``benchmarks.gemv``'s projection shapes are the ones the engine's layers hold on one rank.

The benchmark times the matrices of ``--tensor-parallel N`` from the model config alone; here the
engine's own Megatron layers are built (on the meta device: no memory) at the same split and their
weights' shapes compared, so the benchmark cannot drift from the sharding it stands for.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.gemv import CONFIGS, projections
from infer_core.interfaces import ParallelContext, SingleRankCommunicator
from infer_core.layers.embedding import ParallelLMHead
from infer_core.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from infer_core.layers.unquantized import UnquantizedLinearMethod
from infer_core.models.config import load_model_config


def engine_shapes(model: str, world_size: int) -> dict[str, tuple[int, int]]:
    c = load_model_config(CONFIGS / model)
    parallel = ParallelContext(0, world_size, SingleRankCommunicator())
    kw = dict(bias=False, parallel=parallel, dtype=torch.bfloat16, prefix="p")
    with torch.device("meta"):
        layers = {
            "qkv": QKVParallelLinear(c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads,
                                     method=UnquantizedLinearMethod(), **kw),
            "o": RowParallelLinear(c.num_heads * c.head_dim, c.hidden_size, method=UnquantizedLinearMethod(), **kw),
            "gate_up": MergedColumnParallelLinear(c.hidden_size, [c.intermediate_size] * 2,
                                                  method=UnquantizedLinearMethod(), **kw),
            "down": RowParallelLinear(c.intermediate_size, c.hidden_size, method=UnquantizedLinearMethod(), **kw),
            "lm_head": ParallelLMHead(c.vocab_size, c.hidden_size, parallel=parallel, dtype=torch.bfloat16),
        }
    return {name: tuple(layer.weight.shape) for name, layer in layers.items()}


@pytest.mark.parametrize("model", ["Qwen3-0.6B", "Qwen3-8B", "Llama-3.1-8B"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_benchmark_shapes_are_one_ranks_layers(model, world_size):
    expected = engine_shapes(model, world_size)
    got = {p.name: (p.n, p.k) for p in projections(model, world_size)}
    assert got == expected
