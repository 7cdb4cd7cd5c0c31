"""Model building and weights: sharded safetensors, dummy weights, rope variants, sliding windows."""

from __future__ import annotations

import json
import random

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.errors import ModelError
from infer_core.layers.rotary import compute_inv_freq
from infer_core.models.config import model_config_from_dict
from infer_core.testing import make_tiny_checkpoint

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _hf_greedy(folder, prompt, n):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_sliding_window_matches_hf(tmp_path):
    folder = make_tiny_checkpoint("mistral", tmp_path / "mistral-sw", sliding_window=48)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (5, 40, 120, 300)]
    outputs = LLM(str(folder), max_num_batched_tokens=64).generate(
        prompts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), use_tqdm=False)
    assert LLM(str(folder), load_format="dummy").engine.config.model.sliding_window(0) == 48
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == _hf_greedy(folder, prompt, 64), f"{len(prompt)}-token prompt"


def test_sharded_safetensors_load_like_one_file(tmp_path, tiny_checkpoint):
    from transformers import AutoModelForCausalLM

    single = tiny_checkpoint("qwen2")
    model = AutoModelForCausalLM.from_pretrained(single, dtype=torch.float32)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    prompt = [[9, 8, 7, 6, 5, 4]]
    a = LLM(str(single)).generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    b = LLM(str(sharded)).generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert a == b


def test_missing_weight_is_named(tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "broken"
    folder.mkdir()
    source = tiny_checkpoint("llama")
    (folder / "config.json").write_text((source / "config.json").read_text())
    tensors = load_file(source / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelError, match=r"lacks 1 weights, e.g. model.layers.1.mlp.down_proj.weight"):
        LLM(str(folder))


def test_dummy_weights_run_from_a_config_alone(tmp_path, tiny_checkpoint):
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_checkpoint("qwen3") / "config.json").read_text())
    llm = LLM(str(folder), load_format="dummy")
    assert llm.get_tokenizer() is None
    output = llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0]
    assert len(output.outputs[0].token_ids) == 24 and output.outputs[0].text == ""


def test_no_weights_says_what_to_do(tmp_path, tiny_checkpoint):
    (tmp_path / "config.json").write_text((tiny_checkpoint("qwen3") / "config.json").read_text())
    with pytest.raises(ModelError, match=r"no \*\.safetensors files .* use INFER_LOAD_FORMAT=dummy"):
        LLM(str(tmp_path))


@pytest.mark.parametrize("rope", [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
     "original_max_position_embeddings": 4096},
])
def test_rope_frequencies_match_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = LlamaConfig(hidden_size=1024, num_attention_heads=8, max_position_embeddings=131072,
                            rope_theta=500000.0, rope_scaling=None if rope["rope_type"] == "default" else rope)
    config = model_config_from_dict({**hf_config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    ours, scale = compute_inv_freq(config.rope, config.head_dim, config.max_position_embeddings)
    if rope["rope_type"] == "default":
        expected = 1.0 / (500000.0 ** (torch.arange(0, 128, 2).float() / 128))
        expected_scale = 1.0
    else:
        expected, expected_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_config, "cpu")
    torch.testing.assert_close(ours, expected.float(), rtol=1e-6, atol=0)
    assert scale == pytest.approx(expected_scale)


def test_rope_reads_old_and_new_config_layouts():
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 64, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 4}
    old = model_config_from_dict({**base, "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}})
    new = model_config_from_dict({**base, "rope_parameters": {"rope_theta": 5e5, "rope_type": "linear", "factor": 2.0}})
    assert old.rope == new.rope and old.rope.theta == 5e5 and old.rope.get("factor") == 2.0
    with pytest.raises(ModelError, match=r"rope_scaling type 'dynamic' is not supported; supported types: default, "
                                         r"linear, llama3, yarn"):
        model_config_from_dict({**base, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    with pytest.raises(ModelError, match=r"lacks the required key 'num_hidden_layers'"):
        model_config_from_dict({k: v for k, v in base.items() if k != "num_hidden_layers"})
    assert json.dumps(old.raw)  # the original dict is kept for plugins


def test_checkpoint_missing_a_fused_shard_or_with_a_stranger(tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file, save_file

    source = tiny_checkpoint("llama")
    tensors = load_file(source / "model.safetensors")
    for name, change in (("no-k", lambda t: t.pop("model.layers.0.self_attn.k_proj.weight")),
                         ("stranger", lambda t: t.__setitem__("model.layers.0.mlp.extra.weight", torch.zeros(2)))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text((source / "config.json").read_text())
        edited = dict(tensors)
        change(edited)
        save_file(edited, folder / "model.safetensors")
        expected = (r"lacks 1 weights, e.g. model.layers.0.self_attn.qkv_proj.weight" if name == "no-k" else
                    r"checkpoint tensor 'model.layers.0.mlp.extra.weight' matches no parameter")
        with pytest.raises(ModelError, match=expected):
            LLM(str(folder))


def test_quantized_checkpoint_without_a_quantizer(tmp_path, tiny_checkpoint):
    from infer_core.errors import PluginError

    config = json.loads((tiny_checkpoint("qwen3") / "config.json").read_text())
    for quantization, ok in (({"quant_method": "awq", "bits": 4}, False), (None, True)):
        folder = tmp_path / str(ok)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
        if ok:
            assert LLM(str(folder), load_format="dummy").engine.config.implementations["quantization"] == "none"
        else:
            with pytest.raises(PluginError, match=r"the checkpoint is quantized with 'awq' \(quantization_config"
                                                  r".quant_method\) and no installed quantizer handles it. Installed "
                                                  r"quantizers: none \(infer-core\)"):
                LLM(str(folder), load_format="dummy", plugins=[])  # the core alone: no plugin's quantizers
