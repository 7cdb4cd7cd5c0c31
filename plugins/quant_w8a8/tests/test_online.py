"""``INFER_QUANTIZATION=int8`` / ``fp8`` on tiny Llama, Qwen3 and mixture-of-experts checkpoints (CPU, float32):
what the engine holds after loading and what it computes, against HF transformers whose linear layers run the
same W8A8 and whose experts hold the same 8-bit weights."""

from __future__ import annotations

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.interfaces import PluginError
from infer_core.testing import LogitsRecorder, make_tiny_checkpoint
from infer_quant_w8a8.quantize import dequantize_weight, quantize_weight, reference_linear
from infer_quant_w8a8.schemes import QuantDtype, online_scheme
from torch import nn

PROMPTS = [[5, 17, 99, 3, 250, 8, 41], [7] * 3 + list(range(30, 70)), [300, 301, 2, 9]]
ARCHITECTURES = ("llama", "qwen3", "qwen3_moe", "mixtral")


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


def dequantized_experts(experts: nn.Module, dtype: QuantDtype) -> None:
    """transformers' stacked experts (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]) replaced in place by
    their 8-bit rows times their scales: the weights the engine's experts hold."""
    fmt = online_scheme(dtype).weight
    for name in ("gate_up_proj", "down_proj"):
        param = getattr(experts, name)
        param.data = torch.stack([dequantize_weight(*quantize_weight(w, fmt)) for w in param.data])


@torch.no_grad()
def hf_w8a8_logits(folder, dtype: QuantDtype) -> list[torch.Tensor]:
    """The last position's logits of each prompt from transformers with every linear layer but the LM head
    W8A8 (q, k and v apart: per-channel scales make that the same as fused), the experts' weights 8-bit and
    the routers dense."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for name, module in list(model.named_modules()):
        if name.endswith(".experts"):
            dequantized_experts(module, dtype)
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child_name != "lm_head" and not name.endswith(".experts"):
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
    experts = getattr(layer.mlp, "experts", None)
    dense = (layer.mlp.gate_up_proj, layer.mlp.down_proj) if experts is None else ()
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, *dense):
        assert linear.weight.dtype == torch_dtype and linear.weight_scale.dtype == torch.float32
    if experts is not None:  # 8-bit experts, one scale a row; the router dense
        assert experts.gate_up_proj.dtype == experts.down_proj.dtype == torch_dtype
        assert experts.gate_up_scale.shape == experts.gate_up_proj.shape[:2]
        assert experts.down_scale.shape == experts.down_proj.shape[:2]
        assert layer.mlp.gate.weight.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32  # embedding and LM head stay unquantized
    assert model.lm_head.weight.dtype == torch.float32
    # the fused q/k/v rows hold each projection's own per-channel quantization (the shards at their offsets)
    for got, expected in zip(hf_w8a8_logits(checkpoints[kind], dtype), logits):
        assert float((got - expected).norm() / expected.norm()) < 1e-3
    # and W8A8 stays near the unquantized model: rounding to e4m3 (3 mantissa bits) moves each weight and input
    # by about 3.6% rms, to int8 by about 0.2% of its row's largest; through two random layers the logits by
    # some 10% and 2%; a mixture of experts' routers, dense but fed W8A8 layers' outputs, may swap an expert for
    # a token whose top-k were near a tie (Mixtral's tiny checkpoint: int8 1.4-3.8%)
    limit = (0.03 if experts is None else 0.05) if dtype is QuantDtype.INT8 else 0.15
    for got, expected in zip(logits, unquantized[kind]):
        assert float((got - expected).norm() / expected.norm()) < limit


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_online_dummy_weights_quantize_what_they_draw(checkpoints, kind):
    """Dummy weights reach an int8 layer, and int8 experts, through their loaders (quantized as a checkpoint's
    would be)."""
    llm, tokens, _ = run(checkpoints[kind], max_tokens=4, quantization="int8", load_format="dummy")
    layer = llm.engine.executor.worker.runner.model.model.layers[0]
    assert int(layer.self_attn.qkv_proj.weight.abs().amax(1).min()) == 127  # every row's largest maps onto 127
    if kind == "qwen3_moe":
        for weight in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
            assert int(weight.abs().amax(-1).min()) == 127
    assert all(len(t) == 4 for t in tokens)


def test_a_misspelled_scheme_is_an_error_with_a_suggestion(checkpoints):
    with pytest.raises(PluginError, match="INFER_QUANTIZATION='int4' is not installed.*Did you mean 'int8'"):
        LLM(str(checkpoints["llama"]), device="cpu", dtype="float32", quantization="int4")


def test_a_pre_quantized_mixture_of_experts_checkpoint_is_refused_naming_the_online_way(checkpoints, tmp_path):
    """Its experts' 8-bit tensors have nowhere to go yet: refused at start, before any weight loads."""
    import json
    import shutil

    folder = tmp_path / "fp8-moe"
    shutil.copytree(checkpoints["qwen3_moe"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128],
                                     "activation_scheme": "dynamic"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(PluginError, match="experts of a pre-quantized mixture-of-experts checkpoint .* INFER_QUANTIZ"):
        LLM(str(folder), device="cpu", dtype="float32")
