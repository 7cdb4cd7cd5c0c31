"""Mixture-of-experts models (Qwen3-MoE, Mixtral, Qwen2-MoE): their configs, the experts' weights in either
checkpoint layout, the tensor-parallel split of the experts, dummy weights. Their generation against HF
transformers is in test_hf_parity.py (every tiny architecture); the grouped-GEMM kernels in fused/test_moe_gemm.py."""

from __future__ import annotations

import json

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.errors import ModelError
from infer_core.interfaces import ParallelContext, Quantizer, SingleRankCommunicator
from infer_core.layers.moe import FusedMoE, UnquantizedMoEMethod
from infer_core.layers.unquantized import UnquantizedLinearMethod
from infer_core.models.build import BuildContext
from infer_core.models.config import load_model_config, model_config_from_dict

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PROMPTS = [[5, 9, 33, 2, 71, 8, 100], [300, 4, 4, 17]]


@pytest.mark.parametrize("kind,expected", [
    ("mixtral", dict(num_experts=8, top_k=2, intermediate_size=64, renormalize=True, sparse_layers=(True, True),
                     shared_expert_intermediate_size=0)),
    ("qwen2_moe", dict(num_experts=8, top_k=2, intermediate_size=32, renormalize=False, sparse_layers=(True, False),
                       shared_expert_intermediate_size=96)),
    ("qwen3_moe", dict(num_experts=16, top_k=4, intermediate_size=32, renormalize=True, sparse_layers=(True, True),
                       shared_expert_intermediate_size=0)),
])
def test_configs_read_the_moe_block(kind, expected, tiny_checkpoint):
    config = load_model_config(tiny_checkpoint(kind))
    assert {name: getattr(config.moe, name) for name in expected} == expected
    assert config.qkv_bias == (kind == "qwen2_moe") and config.qk_norm == (kind == "qwen3_moe")


def test_dense_configs_have_no_moe_block(tiny_checkpoint):
    assert load_model_config(tiny_checkpoint("qwen3")).moe is None


def test_more_experts_per_token_than_experts_is_refused(tiny_checkpoint):
    d = json.loads((tiny_checkpoint("qwen3_moe") / "config.json").read_text())
    with pytest.raises(ModelError, match="num_experts_per_tok=17 exceeds num_experts=16"):
        model_config_from_dict({**d, "num_experts_per_tok": 17})


def _stacked_copy(folder, dest):
    """The checkpoint with each layer's experts stacked as transformers 5 builds them (``experts.gate_up_proj``)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    stacked = {name: t for name, t in tensors.items() if ".experts." not in name}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts"
        if f"{prefix}.0.gate_proj.weight" not in tensors:
            continue
        experts = range(config["num_experts"])
        stacked[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([tensors[f"{prefix}.{e}.gate_proj.weight"],
                                                                    tensors[f"{prefix}.{e}.up_proj.weight"]]) for e in experts])
        stacked[f"{prefix}.down_proj"] = torch.stack([tensors[f"{prefix}.{e}.down_proj.weight"] for e in experts])
    dest.mkdir()
    save_file(stacked, str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def test_stacked_experts_load_like_one_tensor_per_expert(tmp_path, tiny_checkpoint):
    folder = tiny_checkpoint("qwen2_moe")
    stacked = _stacked_copy(folder, tmp_path / "stacked")
    a = LLM(str(folder)).generate(PROMPTS, GREEDY, use_tqdm=False)
    b = LLM(str(stacked)).generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]


def test_a_missing_expert_is_named(tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file, save_file

    folder = tiny_checkpoint("mixtral")
    tensors = load_file(str(folder / "model.safetensors"))
    assert "model.layers.1.block_sparse_moe.experts.5.w3.weight" in tensors  # Mixtral's names
    del tensors["model.layers.1.block_sparse_moe.experts.5.w3.weight"]
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file(tensors, str(broken / "model.safetensors"))
    (broken / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ModelError, match=r"model\.layers\.1\.mlp\.experts\.gate_up_proj"):
        LLM(str(broken))


def _moe(rank: int, world: int, seed: int = 0, expert_parallel: bool = False) -> FusedMoE:
    parallel = ParallelContext(rank, world, SingleRankCommunicator(), expert_parallel)
    layer = FusedMoE(4, 2, 32, 48, renormalize=True, method=UnquantizedMoEMethod(), parallel=parallel,
                     dtype=torch.float64, prefix="mlp.experts")  # splitting a sum reorders it: far below 1e-5
    generator = torch.Generator().manual_seed(seed)
    for e in range(4):
        for projection, shape in (("gate", (48, 32)), ("up", (48, 32)), ("down", (32, 48))):
            full = torch.randn(shape, generator=generator)
            param = layer.down_proj if projection == "down" else layer.gate_up_proj
            param.weight_loader(param, full, (e, projection))
    return layer


def test_tensor_parallel_ranks_each_hold_a_slice_of_every_expert_and_sum_to_the_whole():
    whole, halves = _moe(0, 1), [_moe(rank, 2) for rank in range(2)]
    assert halves[0].gate_up_proj.shape == (4, 48, 32) and halves[0].down_proj.shape == (4, 32, 24)
    generator = torch.Generator().manual_seed(1)
    x, logits = torch.randn(5, 32, generator=generator, dtype=torch.float64), torch.randn(5, 4, generator=generator)
    partial = [half(x, logits) for half in halves]  # a world of one's communicator: no all-reduce
    torch.testing.assert_close(partial[0] + partial[1], whole(x, logits), rtol=1e-5, atol=1e-5)


def test_expert_parallel_ranks_each_hold_whole_experts_and_sum_to_the_whole():
    whole, halves = _moe(0, 1), [_moe(rank, 2, expert_parallel=True) for rank in range(2)]
    assert [h.first_expert for h in halves] == [0, 2] and halves[1].gate_up_proj.shape == (2, 96, 32)
    assert torch.equal(halves[1].down_proj, whole.down_proj[2:])
    generator = torch.Generator().manual_seed(2)
    x, logits = torch.randn(6, 32, generator=generator, dtype=torch.float64), torch.randn(6, 4, generator=generator)
    partial = [half(x, logits) for half in halves]
    torch.testing.assert_close(partial[0] + partial[1], whole(x, logits), rtol=1e-5, atol=1e-5)


def test_experts_the_expert_parallel_ranks_do_not_divide_are_refused():
    with pytest.raises(ValueError, match=r"4 experts do not split over 3 expert-parallel ranks \(4 % 3 = 1\)"):
        FusedMoE(4, 2, 32, 48, renormalize=True, method=UnquantizedMoEMethod(),
                 parallel=ParallelContext(0, 3, SingleRankCommunicator(), True), dtype=torch.float32, prefix="e")


def test_stacked_and_per_expert_loads_agree():
    layer = _moe(1, 2, seed=3)
    stacked = FusedMoE(4, 2, 32, 48, renormalize=True, method=UnquantizedMoEMethod(),
                       parallel=ParallelContext(1, 2, SingleRankCommunicator()), dtype=torch.float32, prefix="e")
    generator = torch.Generator().manual_seed(3)
    gate_up, down = torch.empty(4, 96, 32), torch.empty(4, 32, 48)
    for e in range(4):
        gate_up[e, :48], gate_up[e, 48:] = torch.randn(48, 32, generator=generator), torch.randn(48, 32, generator=generator)
        down[e] = torch.randn(32, 48, generator=generator)
    stacked.gate_up_proj.weight_loader(stacked.gate_up_proj, gate_up, None)
    stacked.down_proj.weight_loader(stacked.down_proj, down, None)
    assert torch.equal(stacked.gate_up_proj, layer.gate_up_proj) and torch.equal(stacked.down_proj, layer.down_proj)


def test_an_intermediate_size_the_ranks_do_not_divide_is_refused():
    with pytest.raises(ValueError, match="intermediate size 48 is not divisible by the tensor-parallel size 5"):
        FusedMoE(4, 2, 32, 48, renormalize=True, method=UnquantizedMoEMethod(),
                 parallel=ParallelContext(0, 5, SingleRankCommunicator()), dtype=torch.float32, prefix="e")


class _DenseOnly(Quantizer):
    def get_linear_method(self, prefix):
        return UnquantizedLinearMethod()


def test_a_quantizer_without_an_experts_method_is_refused(tiny_checkpoint):
    config = load_model_config(tiny_checkpoint("qwen3_moe"))
    ctx = BuildContext(config, ParallelContext.single(), _DenseOnly(None), None, torch.float32, 64)
    with pytest.raises(ModelError, match="_DenseOnly has no method for the experts"):
        ctx.moe_kw("model.layers.0.mlp.experts")


def test_dummy_weights_draw_every_expert(tiny_checkpoint):
    llm = LLM(str(tiny_checkpoint("qwen3_moe")), load_format="dummy")
    experts = llm.engine.executor.worker.runner.model.model.layers[0].mlp.experts
    assert abs(float(experts.gate_up_proj.std()) - 64**-0.5) < 0.01  # 1/sqrt(hidden)
    assert abs(float(experts.down_proj.std()) - 32**-0.5 / 2) < 0.01  # 1/sqrt(intermediate) / sqrt(2 x layers)
    assert len(llm.generate(PROMPTS, GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 16
