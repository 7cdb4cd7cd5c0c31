"""``INFER_QUANTIZATION=int8`` / ``fp8`` on tiny Llama and Qwen3 checkpoints (CPU, float32): what the engine
holds after loading and what it computes, against HF transformers whose linear layers run the same W8A8."""

from __future__ import annotations

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.interfaces import PluginError
from infer_core.testing import LogitsRecorder, make_tiny_checkpoint
from infer_quant_w8a8.quantize import quantize_weight, reference_linear
from infer_quant_w8a8.schemes import QuantDtype, online_scheme
from torch import nn

PROMPTS = [[5, 17, 99, 3, 250, 8, 41], [7] * 3 + list(range(30, 70)), [300, 301, 2, 9]]
ARCHITECTURES = ("llama", "qwen3")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {kind: make_tiny_checkpoint(kind, tmp_path_factory.mktemp(f"w8a8-{kind}")) for kind in ARCHITECTURES}


def run(folder, max_tokens=1, **settings):
    """(the engine, greedy tokens, the first sampled position's logits) of each prompt."""
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=16, **settings)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outputs], [recorder.logits[o.request_id][0] for o in outputs]


class W8A8Linear(nn.Module):
    """An HF ``nn.Linear`` computed as W8A8 (its own rows quantized per channel, its input per token)."""

    def __init__(self, linear: nn.Linear, dtype: QuantDtype) -> None:
        super().__init__()
        self.scheme = online_scheme(dtype)
        self.wq, self.scale = quantize_weight(linear.weight.data, self.scheme.weight)
        self.bias = linear.bias

    def forward(self, x):
        return reference_linear(x, self.wq, self.scale, self.scheme, self.bias)


@torch.no_grad()
def hf_w8a8_logits(folder, dtype: QuantDtype) -> list[torch.Tensor]:
    """The last position's logits of each prompt from transformers with every linear layer but the LM head
    W8A8 (q, k and v apart: per-channel scales make that the same as fused)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child_name != "lm_head":
                setattr(module, child_name, W8A8Linear(child, dtype))
    return [model(torch.tensor([p])).logits[0, -1] for p in PROMPTS]


@pytest.fixture(scope="module")
def unquantized(checkpoints):
    return {kind: run(folder)[2] for kind, folder in checkpoints.items()}


@pytest.mark.parametrize("kind", ARCHITECTURES)
@pytest.mark.parametrize("dtype", list(QuantDtype))
def test_online_quantization_holds_8_bit_weights_and_computes_w8a8(checkpoints, unquantized, kind, dtype):
    llm, _, logits = run(checkpoints[kind], quantization=dtype.value)
    assert llm.engine.config.implementations["quantization"] == dtype.value
    model = llm.engine.executor.worker.runner.model
    torch_dtype = torch.int8 if dtype is QuantDtype.INT8 else torch.float8_e4m3fn
    layer = model.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert linear.weight.dtype == torch_dtype and linear.weight_scale.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32  # embedding and LM head stay unquantized
    assert model.lm_head.weight.dtype == torch.float32
    # the fused q/k/v rows hold each projection's own per-channel quantization (the shards at their offsets)
    for got, expected in zip(hf_w8a8_logits(checkpoints[kind], dtype), logits):
        assert float((got - expected).norm() / expected.norm()) < 1e-3
    # and W8A8 stays near the unquantized model: rounding to e4m3 (3 mantissa bits) moves each weight and input
    # by about 3.6% rms, to int8 by about 0.2% of its row's largest; through two random layers the logits by
    # some 10% and 2%
    limit = 0.03 if dtype is QuantDtype.INT8 else 0.15
    for got, expected in zip(logits, unquantized[kind]):
        assert float((got - expected).norm() / expected.norm()) < limit


def test_online_dummy_weights_quantize_what_they_draw(checkpoints):
    """Dummy weights reach an int8 layer through its loader (quantized as a checkpoint's would be)."""
    llm, tokens, _ = run(checkpoints["qwen3"], max_tokens=4, quantization="int8", load_format="dummy")
    qkv = llm.engine.executor.worker.runner.model.model.layers[0].self_attn.qkv_proj
    assert int(qkv.weight.abs().amax(1).min()) == 127  # every row's largest value maps onto 127
    assert all(len(t) == 4 for t in tokens)


def test_a_misspelled_scheme_is_an_error_with_a_suggestion(checkpoints):
    with pytest.raises(PluginError, match="INFER_QUANTIZATION='int4' is not installed.*Did you mean 'int8'"):
        LLM(str(checkpoints["llama"]), device="cpu", dtype="float32", quantization="int4")
