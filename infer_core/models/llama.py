"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) over a flat batch of tokens.

Differences between the family members are config flags: q/k/v bias (Qwen2), q/k RMSNorm
(Qwen3), sliding windows (Mistral), rope scaling (Llama 3.x), tied embeddings.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from infer_core.errors import ModelError
from infer_core.interfaces import AttentionLayer
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.attention import Attention
from infer_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from infer_core.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from infer_core.layers.norm import ResidualRMSNorm, RMSNorm
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.build import BuildContext
from infer_core.models.kv_scales import kv_scale_target, kv_scale_value


class LlamaAttention(nn.Module):
    """qkv projection, RMSNorm of each q and k head (Qwen3) and rotary, attention over the paged KV cache,
    output projection. ``input_norm`` is the norm whose output the qkv projection takes."""

    def __init__(self, ctx: BuildContext, layer_idx: int, rotary: RotaryEmbedding, prefix: str,
                 input_norm: RMSNorm) -> None:
        super().__init__()
        c = ctx.config
        self.qkv_proj = QKVParallelLinear(c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads, bias=c.qkv_bias,
                                          input_norm=input_norm, **ctx.linear_kw(f"{prefix}.qkv_proj"))
        self.o_proj = RowParallelLinear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias,
                                        **ctx.linear_kw(f"{prefix}.o_proj"))
        heads, kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = heads * c.head_dim, kv_heads * c.head_dim
        qk_norm = None
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype=ctx.dtype)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype=ctx.dtype)
            qk_norm = (self.q_norm, self.k_norm)
        self.rotary = rotary
        layer = AttentionLayer(layer_idx, heads, kv_heads, c.head_dim, c.head_dim**-0.5, c.sliding_window(layer_idx))
        self.attn = Attention(ctx.attention, layer, rotary, qk_norm)

    def forward(self, positions, hidden, kv_cache, attn_metadata):
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        out = self.attn(positions, q, k, v, kv_cache, attn_metadata)  # q/k norm and rotary, then attention
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``: gate_up_proj applies the SiLU-and-mul to its ``[gate; up]`` output.

    ``intermediate_size`` defaults to the config's (a mixture-of-experts model's shared expert has its own);
    ``input_norm`` None: the input is a tensor, not a norm's output handed on (see ``LinearBase``).
    """

    def __init__(self, ctx: BuildContext, prefix: str, input_norm: RMSNorm | None,
                 intermediate_size: int | None = None) -> None:
        super().__init__()
        c = ctx.config
        inter = intermediate_size or c.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(c.hidden_size, [inter] * 2, bias=c.mlp_bias,
                                                       input_norm=input_norm, act=SiluAndMul(),
                                                       **ctx.linear_kw(f"{prefix}.gate_up_proj"))
        self.down_proj = RowParallelLinear(inter, c.hidden_size, bias=c.mlp_bias,
                                           **ctx.linear_kw(f"{prefix}.down_proj"))

    def forward(self, x):
        return self.down_proj(self.gate_up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: ``h = x + attn(norm(x))``, ``out = h + mlp(norm(h))``.

    The residual stream travels beside the hidden state: each norm adds the two before normalising (so
    ``(hidden, residual)`` out of a layer sum to its output). Each norm feeds the first projection of
    its sublayer, built with it as ``input_norm``: the projection computes the norm, on the GPU at decode
    sizes in the same launch as its GEMV.
    """

    def __init__(self, ctx: BuildContext, layer_idx: int, rotary: RotaryEmbedding, prefix: str) -> None:
        super().__init__()
        c = ctx.config
        self.input_layernorm = ResidualRMSNorm(c.hidden_size, c.rms_norm_eps, dtype=ctx.dtype)
        self.self_attn = LlamaAttention(ctx, layer_idx, rotary, f"{prefix}.self_attn", self.input_layernorm)
        self.post_attention_layernorm = ResidualRMSNorm(c.hidden_size, c.rms_norm_eps, dtype=ctx.dtype)
        self.mlp = self.build_mlp(ctx, layer_idx, f"{prefix}.mlp")

    def build_mlp(self, ctx: BuildContext, layer_idx: int, prefix: str) -> nn.Module:
        """The feed-forward block (a mixture-of-experts model returns its MoE block here)."""
        return LlamaMLP(ctx, prefix, self.post_attention_layernorm)

    def forward(self, positions, hidden, residual, kv_cache, attn_metadata):
        """``(hidden, residual)`` of the next layer; ``residual`` None in the first layer."""
        hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, attn_metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        hidden = self.mlp(hidden)
        return hidden, residual


class LlamaModel(nn.Module):
    """Embedding, the decoder layers (``layer_class``: a mixture-of-experts model brings its own), final norm."""

    def __init__(self, ctx: BuildContext, layer_class: type[nn.Module] = LlamaDecoderLayer) -> None:
        super().__init__()
        c = ctx.config
        self.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size, parallel=ctx.parallel, dtype=ctx.dtype)
        rotary = RotaryEmbedding(c.head_dim, c.rope, max(ctx.max_model_len, 1), c.max_position_embeddings)
        self.layers = nn.ModuleList(
            layer_class(ctx, i, rotary, f"model.layers.{i}") for i in range(c.num_layers)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype=ctx.dtype)

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(positions, hidden, residual, kv_cache, attn_metadata)
        hidden, _ = self.norm(hidden, residual)
        return hidden


# checkpoint name fragment -> (our fused parameter fragment, shard id)
_FUSED = {
    ".q_proj.": (".qkv_proj.", "q"),
    ".k_proj.": (".qkv_proj.", "k"),
    ".v_proj.": (".qkv_proj.", "v"),
    ".gate_proj.": (".gate_up_proj.", 0),
    ".up_proj.": (".gate_up_proj.", 1),
}


def _expected_shards(target: str) -> set:
    expected = {shard for fragment, (fused, shard) in _FUSED.items() if fused in target}
    return expected or {None}


class LlamaForCausalLM(nn.Module):
    """Entry point the runner uses: ``forward`` → hidden states, ``compute_logits``, ``load_weights``."""

    decoder_layer: type[nn.Module] = LlamaDecoderLayer

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.config = ctx.config
        self.model = LlamaModel(ctx, self.decoder_layer)
        tied = self.model.embed_tokens if ctx.config.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(ctx.config.vocab_size, ctx.config.hidden_size, parallel=ctx.parallel,
                                      dtype=ctx.dtype, tied_to=tied)

    def forward(self, input_ids, positions, kv_caches, attn_metadata) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits over the whole vocabulary (on every rank: tensor-parallel ranks all-gather their slices)."""
        return self.lm_head(hidden)

    def checkpoint_target(self, name: str) -> tuple[str, Any] | None:
        """(our parameter's name, shard id) of the checkpoint tensor ``name``; None: not a weight we keep."""
        if "rotary_emb.inv_freq" in name:
            return None
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return None
        for fragment, (fused, shard) in _FUSED.items():
            if fragment in name:
                return name.replace(fragment, fused), shard
        return name, None

    def fully_loaded(self, target: str, shards: set) -> bool:
        """Whether the parameter ``target`` has all its shards (q, k and v; gate and up) from ``shards``."""
        return shards >= _expected_shards(target)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (HF names) into the fused, sharded parameters.

        Returns the parameters fully loaded: a fused one counts only once all its shards (q, k and
        v; gate and up) arrived. A layer's FP8 KV cache scales (``models/kv_scales.py``) go to its attention.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        shards: dict[str, set] = {}
        for name, tensor in weights:
            scale = kv_scale_target(name)
            if scale is not None:
                attention, which = scale
                try:
                    module = self.get_submodule(attention)
                except AttributeError:
                    raise ModelError(f"checkpoint tensor {name!r} is a KV cache scale of no attention layer of "
                                     f"{type(self).__name__}; is config.json of the same model?") from None
                module.attn.set_kv_scales(*(kv_scale_value(name, tensor) if s in which else None for s in "kv"))
                continue
            found = self.checkpoint_target(name)
            if found is None:
                continue
            target, shard_id = found
            param = params.get(target)
            if param is None:
                raise ModelError(f"checkpoint tensor {name!r} matches no parameter of {type(self).__name__}; "
                                 f"is config.json of the same model?")
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor.to(param.dtype))
            else:
                loader(param, tensor, shard_id)
            shards.setdefault(target, set()).add(shard_id)
        return {target for target, got in shards.items() if self.fully_loaded(target, got)}
