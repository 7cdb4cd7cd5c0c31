"""The parts that hold each rank's slice of the tokens, in a step that does not run on slices (one captured into a
CUDA graph): each runs the layer it wraps as built, and calls no collective of its own (the communicator here
belongs to no process group, so any collective it were asked for would raise). The sliced path itself runs in
test_parity.py (gloo, EP=2 and 4) and, captured, in test_gpu.py."""

from __future__ import annotations

import torch
from infer_core.interfaces import ParallelContext, SingleRankCommunicator
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.graph_capture import capturing
from infer_core.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from infer_core.layers.moe import FusedMoE, UnquantizedMoEMethod
from infer_core.layers.norm import ResidualRMSNorm, RMSNorm
from infer_core.layers.unquantized import UnquantizedLinearMethod
from torch import nn

from infer_parallel_ep.communicator import ExpertParallelCommunicator
from infer_parallel_ep.dispatch import DispatchedExperts
from infer_parallel_ep.slices import (
    GatheredMLP,
    ReduceScatteredRows,
    SlicedFinalNorm,
    SlicedInputNorm,
    TokenSlices,
)

HIDDEN, INTER, EXPERTS, TOKENS = 16, 24, 4, 5


def _filled(module: nn.Module, seed: int) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
    return module


def test_a_step_not_on_slices_runs_every_wrapped_layer_as_built():
    assert not capturing()  # on this host every step runs on slices
    # as rank 0 of 2 would hold them; the layers' own collectives are the single rank's identities
    parallel = ParallelContext(0, 2, SingleRankCommunicator(), expert_parallel=True)
    linear = {"parallel": parallel, "dtype": torch.float32, "method": UnquantizedLinearMethod()}
    slices = TokenSlices(ExpertParallelCommunicator(0, 2, "gloo", EXPERTS))  # in no process group
    slices.begin(TOKENS, sliced=False)

    x, residual = torch.randn(TOKENS, HIDDEN), torch.randn(TOKENS, HIDDEN)
    norm = _filled(ResidualRMSNorm(HIDDEN, 1e-6, dtype=torch.float32), 1)
    for got, expected in zip(SlicedInputNorm(norm, slices)(x, residual), norm(x, residual)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    final = _filled(RMSNorm(HIDDEN, 1e-6, dtype=torch.float32), 2)
    torch.testing.assert_close(SlicedFinalNorm(final, slices)(x, residual)[0], final(x, residual)[0], rtol=0, atol=0)

    o_proj = _filled(RowParallelLinear(2 * HIDDEN, HIDDEN, bias=True, prefix="o_proj", **linear), 3)
    wide = torch.randn(TOKENS, HIDDEN)  # this rank's half of the input features
    torch.testing.assert_close(ReduceScatteredRows(o_proj, slices)(wide), o_proj(wide), rtol=0, atol=0)

    mlp = nn.Module()
    mlp.gate_up_proj = MergedColumnParallelLinear(HIDDEN, [INTER] * 2, bias=False, act=SiluAndMul(),
                                                  prefix="gate_up_proj", **linear)
    mlp.down_proj = RowParallelLinear(INTER, HIDDEN, bias=False, prefix="down_proj", **linear)
    mlp.forward = lambda h: mlp.down_proj(mlp.gate_up_proj(h))
    _filled(mlp, 4)
    torch.testing.assert_close(GatheredMLP(mlp, slices)(x), mlp(x), rtol=0, atol=0)

    experts = _filled(FusedMoE(EXPERTS, 2, HIDDEN, INTER, renormalize=True, method=UnquantizedMoEMethod(),
                               parallel=parallel, dtype=torch.float32, prefix="experts"), 5)
    logits = torch.randn(TOKENS, EXPERTS)
    dispatched = DispatchedExperts(experts, slices.communicator, slices)
    torch.testing.assert_close(dispatched(x, logits), experts(x, logits), rtol=0, atol=0)
    assert slices.communicator.load.num_dispatches == 0  # nothing dispatched, nothing counted
