"""The model's shape, read from a Hugging Face ``config.json`` (or a GGUF's metadata).

Pure Python on purpose: plugins' ``validate`` reads it before torch or any kernel is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer_core.errors import ModelError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters; ``scaling`` holds the type-specific keys (factor, …)."""

    theta: float
    rope_type: str = "default"
    scaling: tuple[tuple[str, Any], ...] = ()
    partial_rotary_factor: float = 1.0

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.scaling).get(key, default)


@dataclass(frozen=True, slots=True)
class MoEConfig:
    """The mixture-of-experts block of Qwen2-MoE, Qwen3-MoE and Mixtral.

    Each token's router logits go through a softmax; its ``top_k`` experts' probabilities weigh their outputs,
    renormalised to sum to 1 where ``renormalize`` (Mixtral always; Qwen's ``norm_topk_prob``). ``sparse_layers``
    says per layer whether it is an MoE block or a dense MLP of ``ModelConfig.intermediate_size`` (Qwen's
    ``mlp_only_layers`` and ``decoder_sparse_step``). Qwen2-MoE adds a shared expert, a dense MLP of
    ``shared_expert_intermediate_size`` every token goes through, scaled by ``sigmoid(shared_expert_gate(x))``.
    """

    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    renormalize: bool
    sparse_layers: tuple[bool, ...]
    shared_expert_intermediate_size: int = 0  # 0: no shared expert

    def is_sparse(self, layer_idx: int) -> bool:
        return self.sparse_layers[layer_idx]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything the engine needs to know about an architecture instance."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    hidden_act: str = "silu"
    sliding_windows: tuple[int | None, ...] = ()
    torch_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    moe: MoEConfig | None = None  # None: every layer a dense MLP
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def sliding_window(self, layer_idx: int) -> int | None:
        """Attention window of one layer (None = full causal attention)."""
        if not self.sliding_windows:
            return None
        return self.sliding_windows[layer_idx]


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope_from_dict(d: dict[str, Any]) -> RopeConfig:
    # transformers 5 writes "rope_parameters"; older files carry rope_theta + rope_scaling.
    params = d.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = float(d.get("rope_theta", 10000.0))
        scaling = dict(d.get("rope_scaling") or {})
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    partial = float(scaling.pop("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelError(
            f"rope_scaling type {rope_type!r} is not supported; supported types: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    return RopeConfig(theta, rope_type, tuple(sorted(scaling.items())), partial)


def _sliding_windows(d: dict[str, Any], num_layers: int) -> tuple[int | None, ...]:
    window = d.get("sliding_window")
    layer_types = d.get("layer_types")
    if d.get("use_sliding_window") is False or not window:
        return ()
    if layer_types:
        return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
    if "max_window_layers" in d:  # Qwen2-style: the layers from max_window_layers on slide
        first = int(d["max_window_layers"])
        return tuple(int(window) if i >= first else None for i in range(num_layers))
    return (int(window),) * num_layers


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from a HF config dictionary; missing required keys raise ModelError."""
    archs = d.get("architectures") or []
    if not archs:
        raise ModelError("config.json has no 'architectures' entry; cannot tell which model to build")
    try:
        hidden = int(d["hidden_size"])
        num_heads = int(d["num_attention_heads"])
        num_layers = int(d["num_hidden_layers"])
        config = ModelConfig(
            architecture=archs[0],
            model_type=d.get("model_type", ""),
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(d.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_dict(d),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=_qkv_bias(d),
            o_bias=bool(d.get("attention_bias", False)) and d.get("model_type") != "qwen2",
            mlp_bias=bool(d.get("mlp_bias", False)),
            qk_norm=d.get("model_type") in ("qwen3", "qwen3_moe"),
            hidden_act=d.get("hidden_act", "silu"),
            sliding_windows=_sliding_windows(d, num_layers),
            torch_dtype=_dtype_name(d.get("torch_dtype") or d.get("dtype")),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_eos_ids(d.get("eos_token_id")),
            moe=_moe_from_dict(d, num_layers),
            raw=d,
        )
    except KeyError as e:
        raise ModelError(f"config.json lacks the required key {e.args[0]!r}") from None
    if config.hidden_act not in ("silu", "swish"):
        raise ModelError(f"hidden_act {config.hidden_act!r} is not supported (only silu)")
    if config.num_heads % config.num_kv_heads:
        raise ModelError(
            f"num_attention_heads={config.num_heads} is not a multiple of "
            f"num_key_value_heads={config.num_kv_heads}"
        )
    return config


MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")


def _moe_from_dict(d: dict[str, Any], num_layers: int) -> MoEConfig | None:
    """The MoE block of a Mixtral or Qwen-MoE config (None for dense models); defaults are transformers'."""
    model_type = d.get("model_type")
    if model_type not in MOE_MODEL_TYPES:
        return None
    # Mixtral's name for the expert count; Qwen's is num_experts (transformers 5 writes either under the other)
    num_experts = int(d["num_local_experts"] if "num_local_experts" in d else d["num_experts"])
    if model_type == "mixtral":  # every layer sparse, experts of intermediate_size, always renormalised
        moe = MoEConfig(num_experts, int(d["num_experts_per_tok"]), int(d["intermediate_size"]),
                        True, (True,) * num_layers)
    else:
        step = int(d.get("decoder_sparse_step") or 1)
        dense = set(d.get("mlp_only_layers") or ())
        sparse = tuple(i not in dense and num_experts > 0 and (i + 1) % step == 0 for i in range(num_layers))
        shared = int(d.get("shared_expert_intermediate_size") or 0) if model_type == "qwen2_moe" else 0
        moe = MoEConfig(num_experts, int(d["num_experts_per_tok"]), int(d["moe_intermediate_size"]),
                        bool(d.get("norm_topk_prob", False)), sparse, shared)
    if moe.top_k > moe.num_experts:
        raise ModelError(f"num_experts_per_tok={moe.top_k} exceeds num_experts={moe.num_experts}")
    return moe


def _qkv_bias(d: dict[str, Any]) -> bool:
    if d.get("model_type") == "qwen2":
        return True  # Qwen2/2.5 always carry q/k/v biases
    if d.get("model_type") == "qwen2_moe":
        return bool(d.get("qkv_bias", True))  # Qwen1.5/2-MoE: q/k/v biases (transformers' default)
    return bool(d.get("attention_bias", False))


def _dtype_name(value: Any) -> str | None:
    if value is None:
        return None
    return str(value).removeprefix("torch.")


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read ``config.json`` from a model folder."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelError(f"no config.json in {model_dir}; pass a folder with a Hugging Face checkpoint")
    with open(path) as f:
        return model_config_from_dict(json.load(f))
