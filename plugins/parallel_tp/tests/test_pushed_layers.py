"""The pushing layers the ``tp`` strategy swaps in (``pushed_layers.py``), ranks simulated in one process.

``prepare_model`` replaces nothing without push sites; with them it swaps the embedding and every row-parallel
layer for a pushing module holding the very layer (the same parameters), a site each in module order, and
leaves the LM head alone (its all-gather is the communicator's). A pushing row-parallel layer at decode
sizes pushes its partial sums and returns the sum in each mode (``gemv``, ``sum``, ``all_reduce``), the bits
every other rank's reader finds; at other sizes it is the core layer, all-reduce included.
"""

from __future__ import annotations

import pytest
import torch
from infer_core.builtin.attention_torch import TorchAttentionBackend
from infer_core.builtin.quant_none import NoQuantizer, UnquantizedLinearMethod
from infer_core.interfaces import Communicator, ParallelContext
from infer_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding, vocab_rows_per_rank
from infer_core.layers.fused.gemv import gemv
from infer_core.layers.linear import RowParallelLinear
from infer_core.models.build import BuildContext
from infer_core.models.llama import LlamaForCausalLM
from infer_core.models.source import read_model_config, resolve_model_source
from infer_core.platform import make_runtime_context
from infer_core.settings import load_settings

from infer_parallel_tp.communicator import DistributedCommunicator
from infer_parallel_tp.push_sites import PushLayout
from infer_parallel_tp.pushed_layers import PushedRowParallelLinear, PushedVocabEmbedding
from infer_parallel_tp.pushed_sums import sum_pushed
from infer_parallel_tp.pushing_gemv import gemv_push
from infer_parallel_tp.strategy import TensorParallelStrategy

N, K_IN = 40, 24  # the row-parallel layer's output (the hidden size), one rank's share of its input


class _Rank(Communicator):
    """One simulated rank: its all-reduces are counted and leave x as it is (the other rank adds nothing)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size, self.num_all_reduces = rank, world_size, 0

    def all_reduce(self, x):
        self.num_all_reduces += 1
        return x

    def all_gather(self, x, dim=-1):
        raise AssertionError("unexpected all_gather")

    def gather(self, x, dst=0, dim=-1):
        raise AssertionError("unexpected gather")


def _down_proj(rank: int, full_weight: torch.Tensor, communicator: Communicator) -> RowParallelLinear:
    """Rank ``rank``'s down_proj, built on the weight's device (on the CPU under ``triton_on_cpu`` it runs the GEMV
    in Triton's interpreter, as on CUDA)."""
    parallel = ParallelContext(rank, 2, communicator)
    with torch.device(full_weight.device):
        layer = RowParallelLinear(2 * K_IN, N, bias=False, method=UnquantizedLinearMethod(), parallel=parallel,
                                  dtype=full_weight.dtype, prefix="model.layers.0.mlp.down_proj")
    layer.weight_loader(layer.weight, full_weight)
    return layer


@pytest.mark.parametrize("mode", ["gemv", "sum", "all_reduce"])
def test_row_parallel_layer_pushes_and_returns_the_sum_in_each_mode(mode, device, simulated_sites, triton_on_cpu):
    """Rank 1 pushes its partial sums first (the ranks are not concurrent here); rank 0's pushing layer then pushes
    its own (its GEMV, or in mode ``all_reduce`` the all-reduce kernel) and adds both, as rank 1's reader does."""
    dtype = torch.bfloat16  # the GEMV runs in half precision only
    sites = simulated_sites(PushLayout(num_sites=1, hidden_size=N, world_size=2, dtype=dtype, mode=mode))
    gen = torch.Generator().manual_seed(9)
    full = (torch.randn(N, 2 * K_IN, generator=gen) / (2 * K_IN) ** 0.5).to(device, dtype)
    x = torch.randn(1, 2 * K_IN, generator=gen).to(device, dtype)
    parts = [x[:, :K_IN], x[:, K_IN:]]
    gemv_push(parts[1], full[:, K_IN:].contiguous(), sites[1].take()[1])  # rank 1's layer, pushed already
    communicator = _Rank(0, 2)
    site, target = sites[0].take()
    layer = PushedRowParallelLinear(_down_proj(0, full, communicator), target, sites[0], site)
    got = layer(parts[0])
    assert got.shape == (1, N) and got.dtype == dtype
    assert torch.equal(got, sum_pushed(sites[1]._targets[0], 1))  # rank 1 adds the same bits
    partials = [gemv(parts[r], full[:, r * K_IN:(r + 1) * K_IN].contiguous()).float() for r in range(2)]
    expected = (partials[0] + partials[1]).to(dtype)
    # one rounding of the float32 sum: the GPU rounds as torch, the interpreter truncates (one step off at most)
    floor = 2 ** -7 * float(expected.float().abs().mean()) / 256  # near zero, a step of the mean's 1/256
    assert torch.allclose(got.float(), expected.float(), rtol=2 ** -7, atol=floor), (got, expected)
    assert (sites[0].pushes, communicator.num_all_reduces) == ([1], 0)


def test_row_parallel_layer_is_the_core_layer_where_the_gemv_does_not_run(device, simulated_sites, triton_on_cpu,
                                                                        monkeypatch):
    """Three rows (the GEMV takes one or two), or a method without the GEMV on CPU tensors: no push, the core
    layer's matmul and all-reduce."""
    dtype = torch.bfloat16
    sites = simulated_sites(PushLayout(num_sites=1, hidden_size=N, world_size=2, dtype=dtype))
    gen = torch.Generator().manual_seed(4)
    full = (torch.randn(N, 2 * K_IN, generator=gen) / (2 * K_IN) ** 0.5).to(device, dtype)
    communicator = _Rank(0, 2)
    core = _down_proj(0, full, communicator)
    site, target = sites[0].take()
    layer = PushedRowParallelLinear(core, target, sites[0], site)
    x = torch.randn(3, K_IN, generator=gen).to(device, dtype)
    assert torch.equal(layer(x), core(x)) and communicator.num_all_reduces == 2
    if device == "cpu":  # a layer built on the CPU outside Triton's interpreter runs F.linear, never the GEMV
        from infer_core.layers import fused

        monkeypatch.setattr(fused, "TRITON_DEVICES", ("cuda",))
        core = _down_proj(0, full, communicator)
        layer = PushedRowParallelLinear(core, target, sites[0], site)
        assert torch.equal(layer(x[:1]), core(x[:1])) and communicator.num_all_reduces == 4
    assert sites[0].pushes == [0]


def _model(folder, parallel: ParallelContext) -> tuple[torch.nn.Module, TensorParallelStrategy]:
    """A tiny bfloat16 Qwen3 of rank ``parallel.rank``, built as the runner builds it (weights not loaded)."""
    settings = load_settings(model=str(folder), device="cpu", tensor_parallel_size=2)
    ctx = make_runtime_context(settings, read_model_config(resolve_model_source(str(folder))))
    build = BuildContext(ctx.model, parallel, NoQuantizer(ctx), TorchAttentionBackend(ctx), torch.bfloat16, 64)
    return LlamaForCausalLM(build), TensorParallelStrategy(ctx)


def _layout(folder, **kw) -> PushLayout:
    config = read_model_config(resolve_model_source(str(folder)))
    return PushLayout.for_model(config.num_layers, config.hidden_size, 2, torch.bfloat16,
                                vocab_rows=vocab_rows_per_rank(config.vocab_size, 2), **kw)


def _structure(model: torch.nn.Module) -> list[tuple[str, type]]:
    return [(name, type(module)) for name, module in model.named_modules()]


def test_prepare_model_replaces_nothing_without_push_sites(tiny_checkpoint):
    folder = tiny_checkpoint("qwen3")
    for communicator in (DistributedCommunicator(0, 2, "gloo"), _Rank(0, 2)):
        model, strategy = _model(folder, ParallelContext(0, 2, communicator))
        before = _structure(model)
        strategy.prepare_model(model, ParallelContext(0, 2, communicator))
        assert _structure(model) == before


def test_prepare_model_swaps_in_pushing_layers_that_share_the_parameters(tiny_checkpoint, simulated_sites):
    folder = tiny_checkpoint("qwen3")
    sites = simulated_sites(_layout(folder))
    for rank in (0, 1):
        parallel = ParallelContext(rank, 2, DistributedCommunicator(rank, 2, "gloo", push_sites=sites[rank]))
        model, strategy = _model(folder, parallel)
        parameters = dict(model.named_parameters())
        rows = {name: module for name, module in model.named_modules()
                if isinstance(module, (RowParallelLinear, VocabParallelEmbedding))}
        strategy.prepare_model(model, parallel)
        num_layers = len(model.model.layers)
        pushing = ["model.embed_tokens"] + [f"model.layers.{i}.{name}" for i in range(num_layers)
                                            for name in ("self_attn.o_proj", "mlp.down_proj")]
        for site, name in enumerate(pushing):  # a site each, in module order: the same on every rank
            module = model.get_submodule(name)
            kind = PushedVocabEmbedding if site == 0 else PushedRowParallelLinear
            held = module.embedding if site == 0 else module.layer
            assert type(module) is kind and held is rows[name] and module.site == site, name
            assert module.target is sites[rank]._targets[site] and module.target.rank == rank, name
        assert sites[rank].num_taken == len(pushing) == sites[rank].layout.num_sites
        assert type(model.lm_head) is ParallelLMHead and model.lm_head is rows["lm_head"]  # gathers: not replaced
        after = {name.replace(".layer.", ".").replace(".embedding.", "."): p for name, p in model.named_parameters()}
        assert after.keys() == parameters.keys()
        assert all(after[name] is p for name, p in parameters.items())  # the same tensors: nothing copied


def test_push_modes_refuse_fused_and_unknown_names():
    for mode, match in (("fused", "was dropped"), ("gemvv", "not one of gemv, sum, all_reduce")):
        with pytest.raises(ValueError, match=match):
            PushLayout(num_sites=1, hidden_size=N, world_size=2, dtype=torch.bfloat16, mode=mode)
