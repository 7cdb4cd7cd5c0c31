"""Pre-quantized checkpoints written by compressed-tensors itself (the library llm-compressor saves with), loaded
by the engine: auto-detected from config.json, the same weights as the format's own decompression, and, for
the schemes the online path also runs, the same weights and greedy tokens as ``INFER_QUANTIZATION``."""

from __future__ import annotations

import json

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.interfaces import PluginError
from infer_core.testing import make_tiny_checkpoint
from infer_quant_w8a8.quantize import dequantize_weight
from infer_quant_w8a8.schemes import QuantDtype

PROMPTS = [[5, 17, 99, 3, 250, 8, 41], [7] * 3 + list(range(30, 70))]
CALIBRATION = torch.arange(3, 300, 7).view(1, -1)  # tokens whose activations set the static input scales
PRESET_DTYPES = {"W8A8": QuantDtype.INT8, "FP8_DYNAMIC": QuantDtype.FP8, "FP8": QuantDtype.FP8,
                 "FP8_BLOCK": QuantDtype.FP8}


def write_compressed_tensors(source, folder, preset: str, online_scales: bool):
    """``source`` quantized by compressed-tensors with its ``preset`` scheme and saved to ``folder``; returns the
    weights compressed-tensors itself decompresses the saved tensors to, by module name.

    Scales are calibration's choice, not the format's: ``online_scales`` gives each weight row (or tensor) the
    scale the engine's online quantization computes (``max|w| / 127`` for int8), so both paths can hold the same
    values; else compressed-tensors' own ``calculate_qparams`` (``max|w| / 127.5`` for int8). Static input scales
    come from the largest input magnitude each layer sees on ``CALIBRATION``.
    """
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    seen: dict[str, float] = {}
    hooks = [m.register_forward_hook(lambda m, args, out, name=name: seen.__setitem__(name, float(args[0].abs().max())))
             for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        model(CALIBRATION)
    for hook in hooks:
        hook.remove()
    config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])}, ignore=["lm_head"])
    apply_quantization_config(model, config)
    for name, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        w, args = module.weight.data, scheme.weights
        if args.strategy == "block":
            n_blocks, k_blocks = module.weight_scale.shape
            reduce = w.unflatten(0, (n_blocks, -1)).unflatten(2, (k_blocks, -1))
            lo, hi = reduce.amin(dim=(1, 3)), reduce.amax(dim=(1, 3))
        elif args.strategy == "group":
            groups = w.unflatten(1, (-1, args.group_size))
            lo, hi = groups.amin(-1), groups.amax(-1)
        elif args.strategy == "tensor":
            lo, hi = w.min().reshape(1), w.max().reshape(1)
        else:
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        if online_scales:
            scale = torch.maximum(lo.abs(), hi.abs()) / PRESET_DTYPES[preset].max_value
        else:
            scale, _ = calculate_qparams(lo, hi, args)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if getattr(module, "input_scale", None) is not None:
            module.input_scale.data.fill_(seen[name] / PRESET_DTYPES[preset].max_value)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(folder)
    compressor.decompress_model(model)
    return {name: m.weight.data.clone() for name, m in model.named_modules() if hasattr(m, "quantization_scheme")}


BLOCKS = dict(hidden_size=128, intermediate_size=256)  # K of 128 and 256: whole 128-column groups


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = {}

    def get(kind: str, **overrides):
        key = (kind, tuple(sorted(overrides.items())))
        if key not in cache:
            cache[key] = make_tiny_checkpoint(kind, tmp_path_factory.mktemp(f"ct-src-{kind}"), **overrides)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def written(tiny, tmp_path_factory):
    """``written(kind, preset, online_scales, **overrides)`` -> (folder, compressed-tensors' decompressed weights),
    each checkpoint written once for the module."""
    cache = {}

    def get(kind: str, preset: str, online_scales: bool, **overrides):
        key = (kind, preset, online_scales, tuple(sorted(overrides.items())))
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"ct-{kind}-{preset}")
            cache[key] = folder, write_compressed_tensors(tiny(kind, **overrides), folder, preset, online_scales)
        return cache[key]

    return get


def run(folder, **settings):
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=16, **settings)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outputs]


def linear_layers(llm):
    model = llm.engine.executor.worker.runner.model
    for i, layer in enumerate(model.model.layers):
        for name, linear in (("self_attn.qkv_proj", layer.self_attn.qkv_proj), ("self_attn.o_proj", layer.self_attn.o_proj),
                             ("mlp.gate_up_proj", layer.mlp.gate_up_proj), ("mlp.down_proj", layer.mlp.down_proj)):
            yield f"model.layers.{i}.{name}", linear


@pytest.mark.parametrize("kind, preset", [("llama", "W8A8"), ("qwen3", "FP8_DYNAMIC")])
def test_checkpoint_loads_the_online_paths_weights_and_tokens(tiny, written, kind, preset):
    folder, _ = written(kind, preset, online_scales=True)
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["quant_method"] == "compressed-tensors"
    ct, ct_tokens = run(folder)  # no quantization setting: the checkpoint's
    online, online_tokens = run(tiny(kind), quantization=PRESET_DTYPES[preset].value)
    assert ct.engine.config.implementations["quantization"] == "compressed-tensors"
    for (name, a), (_, b) in zip(linear_layers(ct), linear_layers(online)):
        assert torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8)), name
        assert torch.equal(a.weight_scale, b.weight_scale), name
    assert ct_tokens == online_tokens


def expected_rows(expected: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The checkpoint's weights of our (fused) layer ``name``, stacked as it stacks them."""
    parts = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    head, _, last = name.rpartition(".")
    return torch.cat([expected[f"{head}.{p}"] for p in parts.get(last, (last,))])


@pytest.mark.parametrize("preset", ["W8A8", "FP8", "FP8_BLOCK"])
def test_checkpoint_holds_what_compressed_tensors_decompresses(written, preset):
    """compressed-tensors' own scales (int8: max/127.5), per-tensor FP8 with static input scales, 128x128 blocks."""
    folder, expected = written("qwen3", preset, online_scales=False, **BLOCKS)
    llm, tokens = run(folder)
    for name, linear in linear_layers(llm):
        got = dequantize_weight(linear.weight, linear.weight_scale, linear.method.scheme.weight.group_k)
        torch.testing.assert_close(got, expected_rows(expected, name), rtol=0, atol=0, msg=name)
        if preset == "FP8":  # one input quantized once for q, k and v: with the largest of their scales
            assert float(linear.input_scale) > 0
    assert all(len(t) == 8 for t in tokens)
    if preset == "FP8_BLOCK":  # Qwen3's k and v have 64 rows: each keeps its own block scales inside qkv's rows
        qkv = llm.engine.executor.worker.runner.model.model.layers[0].self_attn.qkv_proj
        assert qkv.weight_scale.shape == (128 + 64 + 64, 1)
        q_rows, k_rows, _ = qkv.output_sizes
        k_scales = qkv.weight_scale[q_rows: q_rows + k_rows]
        assert bool((k_scales == k_scales[0]).all()) and not torch.equal(k_scales[0], qkv.weight_scale[0])


def test_unsupported_scheme_is_an_error_naming_it(written):
    folder, _ = written("qwen3", "W4A16", online_scales=False, **BLOCKS)
    with pytest.raises(PluginError, match=r"pack-quantized.*W4A16.*Supported: compressed-tensors"):
        LLM(str(folder), device="cpu", dtype="float32")


def test_online_quantization_of_a_quantized_checkpoint_is_refused(written):
    folder, _ = written("llama", "W8A8", online_scales=True)
    with pytest.raises(PluginError, match="already quantized with 'compressed-tensors'.*unset INFER_QUANTIZATION"):
        LLM(str(folder), device="cpu", dtype="float32", quantization="int8")

def write_hf_fp8(source, folder) -> dict[str, torch.Tensor]:
    """``source`` as an HF FP8 checkpoint (``quant_method: fp8``, 128x128 blocks), quantized by transformers' own
    FP8 conversion op and config; returns transformers' dequantization of each weight (float32), by name."""
    from safetensors.torch import load_file, save_file
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize, _dequantize_fp8_weight

    config = FineGrainedFP8Config(weight_block_size=[128, 128])
    quantize = Fp8Quantize(type("HfQuantizer", (), {"quantization_config": config})())
    tensors, dequantized = {}, {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        if not name.endswith("proj.weight"):  # embedding, norms, (tied) LM head: unquantized
            tensors[name] = tensor
            continue
        out = quantize.convert({name: tensor})
        scale_name = name.removesuffix("weight") + "weight_scale_inv"
        assert out[name].dtype == torch.float8_e4m3fn, f"{name} {tuple(tensor.shape)} is not whole blocks"
        tensors.update(out)
        dequantized[name.removesuffix(".weight")] = _dequantize_fp8_weight(out[name], out[scale_name], [128, 128],
                                                                           torch.float32)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((source / "config.json").read_text())
    raw["quantization_config"] = config.to_dict()
    (folder / "config.json").write_text(json.dumps(raw))
    return dequantized


def _transformers_has_fp8_ops() -> bool:
    try:
        from transformers.integrations.finegrained_fp8 import Fp8Quantize, _dequantize_fp8_weight  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _transformers_has_fp8_ops(), reason="this transformers has no FP8 conversion ops to write "
                    "the checkpoint with (the GPU image's 5.17; CI's has them)")
def test_hf_fp8_block_checkpoint_holds_what_transformers_dequantizes(tiny, tmp_path):
    # every projection whole 128x128 blocks: q and k/v 128 rows (4 KV heads of 32), hidden 128, intermediate 256
    expected = write_hf_fp8(tiny("qwen3", num_key_value_heads=4, **BLOCKS), tmp_path / "fp8")
    llm, tokens = run(tmp_path / "fp8")
    assert llm.engine.config.implementations["quantization"] == "fp8"
    for name, linear in linear_layers(llm):
        assert linear.weight.dtype == torch.float8_e4m3fn
        got = dequantize_weight(linear.weight, linear.weight_scale_inv, 128)
        torch.testing.assert_close(got, expected_rows(expected, name), rtol=0, atol=0, msg=name)
    assert all(len(t) == 8 for t in tokens)


def test_quantizers_refuse_what_they_cannot_load(tiny, written):
    with pytest.raises(PluginError, match="loads checkpoints quantized with 'compressed-tensors', and this one has no"):
        LLM(str(tiny("llama")), device="cpu", dtype="float32", quantization="compressed-tensors")
    folder, _ = written("llama", "W8A8", online_scales=True)
    with pytest.raises(PluginError, match="pre-quantized checkpoints load on one rank for now"):
        LLM(str(folder), device="cpu", dtype="float32", tensor_parallel_size=2)
