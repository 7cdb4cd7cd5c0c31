"""Why flash cannot run somewhere, what the user is told, and how the block size is negotiated.

RuntimeContext is a plain value object: a context that describes a CUDA machine is built here
directly, so validate() is exercised for GPUs this CPU machine does not have.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from infer_core import LLM
from infer_core.errors import PluginError, SettingsError
from infer_core.interfaces import RuntimeContext
from infer_core.loader import load_catalog, negotiate_block_size
from infer_core.models.config import model_config_from_dict
from infer_core.settings import EngineSettings

from infer_attention_flash import capabilities, plugin
from infer_attention_flash.backend import FlashAttentionBackend

FLASH_ATTN_INSTALLED = importlib.util.find_spec("flash_attn") is not None
NOT_INSTALLED = "flash_attn is not installed (pip install flash-attn --no-build-isolation)"

TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 1024,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "eos_token_id": 2,
}


def context(device="cuda", dtype="bfloat16", capability=(9, 0), head_dim=128, **settings) -> RuntimeContext:
    model = model_config_from_dict({**TINY_QWEN3, "head_dim": head_dim})
    return RuntimeContext(
        device,
        dtype,
        model,
        EngineSettings(**settings),
        capability if device == "cuda" else None,
        1 if device == "cuda" else 0,
    )


def without_install_reason(reasons: list[str]) -> list[str]:
    """The reasons besides flash_attn's absence (present exactly when it is not installed)."""
    assert (NOT_INSTALLED in reasons) == (not FLASH_ATTN_INSTALLED)
    return [r for r in reasons if r != NOT_INSTALLED]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256, 96])
def test_supported_gpu_has_no_other_reason(dtype, head_dim):
    assert without_install_reason(FlashAttentionBackend.validate(context(dtype=dtype, head_dim=head_dim))) == []


def test_cpu_reasons():
    reasons = without_install_reason(FlashAttentionBackend.validate(context(device="cpu", dtype="float32")))
    assert reasons == [
        "CUDA is not available (flash-attn runs only on NVIDIA GPUs)",
        "dtype float32 is not supported (flash-attn needs float16 or bfloat16; set INFER_DTYPE)",
    ]


def test_gpu_older_than_ampere():
    reasons = without_install_reason(FlashAttentionBackend.validate(context(capability=(7, 5))))
    assert reasons == ["the GPU's compute capability 7.5 is below 8.0 (Ampere), which flash-attn 2 needs"]
    assert without_install_reason(FlashAttentionBackend.validate(context(capability=(8, 0)))) == []


@pytest.mark.parametrize("head_dim", [100, 4, 264, 512])
def test_unsupported_head_dim(head_dim):
    reasons = without_install_reason(FlashAttentionBackend.validate(context(head_dim=head_dim)))
    assert reasons == [f"head_dim {head_dim} is not supported (flash-attn takes multiples of 8 up to 256)"]


def test_float32_on_gpu():
    reasons = without_install_reason(FlashAttentionBackend.validate(context(dtype="float32")))
    assert reasons == ["dtype float32 is not supported (flash-attn needs float16 or bfloat16; set INFER_DTYPE)"]


def test_block_size_negotiated_to_a_multiple_of_256():
    ctx = context()
    assert negotiate_block_size(EngineSettings(), FlashAttentionBackend, ctx, "flash") == 256
    assert negotiate_block_size(EngineSettings(block_size=512), FlashAttentionBackend, ctx, "flash") == 512


@pytest.mark.parametrize("block_size", [16, 128, 300])
def test_incompatible_block_size_is_a_clear_error(block_size):
    with pytest.raises(SettingsError, match=rf"INFER_BLOCK_SIZE={block_size} .* 'flash': it needs a multiple of 256"):
        negotiate_block_size(EngineSettings(block_size=block_size), FlashAttentionBackend, context(), "flash")


def test_not_the_default_where_it_cannot_run():
    assert plugin.default_attention_backend(context(device="cpu", dtype="float32")) is None
    assert plugin.default_attention_backend(context(capability=(7, 5))) is None
    assert plugin.default_attention_backend(context(dtype="float32")) is None
    # A user-set block size flash cannot use: step aside rather than fail at start.
    assert plugin.default_attention_backend(context(block_size=16)) is None
    expected = "flash" if FLASH_ATTN_INSTALLED else None
    assert plugin.default_attention_backend(context()) == expected
    assert plugin.default_attention_backend(context(block_size=512)) == expected


@pytest.mark.parametrize("decoding", ["ngram", "draft"])
def test_steps_aside_for_speculative_decoding(decoding, monkeypatch):
    """Flash has no prefill (verify) CUDA graphs: a speculative policy's verify steps would all run eagerly."""
    monkeypatch.setattr(capabilities, "flash_attn_installed", lambda: True)  # the choice, not the install
    assert plugin.default_attention_backend(context()) == "flash"
    assert plugin.default_attention_backend(context(decoding="standard")) == "flash"
    assert plugin.default_attention_backend(context(decoding=decoding)) is None
    ctx = context(head_dim=96, decoding=decoding)  # a head dim triton does not take: flash would be next
    assert load_catalog().plugin_manager.hook.default_attention_backend(ctx=ctx) != "flash"


@pytest.fixture
def tiny_config_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN3))
    return tmp_path


def test_selecting_flash_on_a_cpu_fails_at_start_with_reasons(tiny_config_folder, monkeypatch):
    monkeypatch.setenv("INFER_ATTENTION", "flash")
    with pytest.raises(PluginError) as info:
        LLM(str(tiny_config_folder), device="cpu", load_format="dummy")
    message = str(info.value)
    assert message.startswith("attention 'flash' cannot run here: ")
    assert "CUDA is not available" in message
    assert "dtype float32 is not supported" in message
    assert (NOT_INSTALLED in message) == (not FLASH_ATTN_INSTALLED)
    runnable = message.split("Attention backends that can run here: ")[1].rstrip(".").split(", ")
    assert "torch" in runnable and "flash" not in runnable


def test_cpu_default_is_not_flash():
    ctx = context(device="cpu", dtype="float32")
    assert load_catalog().plugin_manager.hook.default_attention_backend(ctx=ctx) != "flash"
