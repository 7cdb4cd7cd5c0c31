"""The published config.json of real models (as on the HF Hub), for dummy-weight runs on a GPU.

benchmarks/configs/<name>/config.json holds the same files; tests/test_bench_throughput.py keeps them equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_QWEN3_COMMON: dict[str, Any] = dict(
    architectures=["Qwen3ForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=151643,
    eos_token_id=151645, head_dim=128, hidden_act="silu", initializer_range=0.02, max_position_embeddings=40960,
    model_type="qwen3", rms_norm_eps=1e-6, rope_scaling=None, rope_theta=1000000, sliding_window=None,
    torch_dtype="bfloat16", transformers_version="4.51.0", use_cache=True, use_sliding_window=False,
    vocab_size=151936,
)
REAL_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": dict(_QWEN3_COMMON, hidden_size=1024, intermediate_size=3072, max_window_layers=28,
                       num_attention_heads=16, num_hidden_layers=28, num_key_value_heads=8, tie_word_embeddings=True),
    "Qwen3-1.7B": dict(_QWEN3_COMMON, hidden_size=2048, intermediate_size=6144, max_window_layers=28,
                       num_attention_heads=16, num_hidden_layers=28, num_key_value_heads=8, tie_word_embeddings=True),
    "Qwen3-8B": dict(_QWEN3_COMMON, hidden_size=4096, intermediate_size=12288, max_window_layers=36,
                     num_attention_heads=32, num_hidden_layers=36, num_key_value_heads=8, tie_word_embeddings=False),
    # meta-llama/Llama-3.1-8B (the base model: one eos id; the Instruct model lists 128001, 128008, 128009)
    "Llama-3.1-8B": dict(
        architectures=["LlamaForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=128000,
        eos_token_id=128001, hidden_act="silu", hidden_size=4096, initializer_range=0.02, intermediate_size=14336,
        max_position_embeddings=131072, mlp_bias=False, model_type="llama", num_attention_heads=32,
        num_hidden_layers=32, num_key_value_heads=8, pretraining_tp=1, rms_norm_eps=1e-5,
        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192,
                          rope_type="llama3"),
        rope_theta=500000.0, tie_word_embeddings=False, torch_dtype="bfloat16", transformers_version="4.43.0.dev0",
        use_cache=True, vocab_size=128256,
    ),
    # Qwen/Qwen3-30B-A3B: 128 experts of 768, top-8, renormalised; 30.5B parameters, 3.3B active per token
    "Qwen3-30B-A3B": dict(
        _QWEN3_COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", decoder_sparse_step=1,
        hidden_size=2048, intermediate_size=6144, max_window_layers=48, mlp_only_layers=[], moe_intermediate_size=768,
        norm_topk_prob=True, num_attention_heads=32, num_experts=128, num_experts_per_tok=8, num_hidden_layers=48,
        num_key_value_heads=4, output_router_logits=False, rope_theta=1000000.0, router_aux_loss_coef=0.001,
        tie_word_embeddings=False,
    ),
    # mistralai/Mixtral-8x7B-v0.1: 8 experts of 14336, top-2; 46.7B parameters, 12.9B active per token
    "Mixtral-8x7B": dict(
        architectures=["MixtralForCausalLM"], attention_dropout=0.0, bos_token_id=1, eos_token_id=2, hidden_act="silu",
        hidden_size=4096, initializer_range=0.02, intermediate_size=14336, max_position_embeddings=32768,
        model_type="mixtral", num_attention_heads=32, num_experts_per_tok=2, num_hidden_layers=32,
        num_key_value_heads=8, num_local_experts=8, output_router_logits=False, rms_norm_eps=1e-5,
        rope_theta=1000000.0, router_aux_loss_coef=0.02, sliding_window=None, tie_word_embeddings=False,
        torch_dtype="bfloat16", transformers_version="4.36.0", use_cache=True, vocab_size=32000,
    ),
}


def write_config_checkpoint(name: str, folder: str | Path, **overrides: Any) -> Path:
    """A folder holding only the config.json of a real model (``REAL_CONFIGS``), for ``load_format="dummy"``."""
    import json

    if name not in REAL_CONFIGS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(REAL_CONFIGS)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**REAL_CONFIGS[name], **overrides}, indent=2))
    return folder


