"""The attention backend an engine gets when none is named, on a CUDA machine: triton first, flash where triton
cannot run, torch last. Triton measured faster than flash at batch 1, offline and serving
(benchmarks/results/decode-graph-kernels-h100-2026-11-27, calls D4, D6, D9)."""

from __future__ import annotations

import pytest
from infer_core.interfaces import RuntimeContext
from infer_core.loader import load_catalog
from infer_core.models.config import model_config_from_dict
from infer_core.settings import EngineSettings

flash_capabilities = pytest.importorskip("infer_attention_flash.capabilities")
pytest.importorskip("infer_attention_triton")

TINY_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 384, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "max_position_embeddings": 1024, "tie_word_embeddings": True}


def context(device: str = "cuda", head_dim: int = 32, **settings) -> RuntimeContext:
    model = model_config_from_dict({**TINY_QWEN3, "head_dim": head_dim})
    cuda = device == "cuda"
    return RuntimeContext(device, "bfloat16", model, EngineSettings(**settings), (9, 0) if cuda else None,
                          1 if cuda else 0)


def test_triton_first_then_flash_then_torch(monkeypatch):
    monkeypatch.setattr(flash_capabilities, "flash_attn_installed", lambda: True)  # the choice, not the install
    default = load_catalog().plugin_manager.hook.default_attention_backend
    assert default(ctx=context()) == "triton"
    assert default(ctx=context(head_dim=96)) == "flash"  # triton's kernels take head dims 16-256, powers of two
    assert default(ctx=context(device="cpu")) == "torch"  # the core answers last
