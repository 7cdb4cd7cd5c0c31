"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) over a flat batch of tokens.

Differences between the family members are config flags: q/k/v bias (Qwen2), q/k RMSNorm
(Qwen3), sliding windows (Mistral), rope scaling (Llama 3.x), tied embeddings.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from infer_core.errors import ModelError
from infer_core.interfaces import AttentionLayer
from infer_core.layers import fused as fused_ops
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from infer_core.layers.fused.gemv_fusion import NormLinear
from infer_core.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from infer_core.layers.norm import RMSNorm
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.build import BuildContext


class LlamaAttention(nn.Module):
    def __init__(self, ctx: BuildContext, layer_idx: int, rotary: RotaryEmbedding, prefix: str) -> None:
        super().__init__()
        c = ctx.config
        self.qkv_proj = QKVParallelLinear(c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads, bias=c.qkv_bias,
                                          **ctx.linear_kw(f"{prefix}.qkv_proj"))
        self.o_proj = RowParallelLinear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias,
                                        **ctx.linear_kw(f"{prefix}.o_proj"))
        heads, kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = heads * c.head_dim, kv_heads * c.head_dim
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype=ctx.dtype)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype=ctx.dtype)
        self.qk_norm = c.qk_norm
        self.rotary = rotary
        # q-norm, k-norm and rotary in one launch where the three layers would each run Triton (CUDA);
        # force_fused_qk_norm_rope also takes it off CUDA (tests run it in Triton's interpreter on the CPU)
        self.qk_norm_rope_impl = fused_ops.QK_NORM_ROPE
        self.force_fused_qk_norm_rope = False
        self.backend = ctx.attention
        self.layer = AttentionLayer(layer_idx, heads, kv_heads, c.head_dim, c.head_dim**-0.5,
                                    c.sliding_window(layer_idx))

    def forward(self, positions, hidden, kv_cache, attn_metadata):
        return self.forward_qkv(positions, self.qkv_proj(hidden), kv_cache, attn_metadata)

    def forward_qkv(self, positions, qkv, kv_cache, attn_metadata):
        """The layer from its qkv projection on (the decoder layer fuses that with its input norm where it can)."""
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        head_dim = self.layer.head_dim
        q = q.reshape(num_tokens, -1, head_dim)
        k = k.reshape(num_tokens, -1, head_dim)
        v = v.reshape(num_tokens, -1, head_dim)
        kv_written = False
        if self.qk_norm and self._fuses_qk_norm_rope(q, k):
            from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace

            # q and k stay views into qkv (rewritten in place), as the rotary alone leaves them without qk-norm.
            # Where the backend's cache has the standard paged layout, the same launch stores k and v at their
            # slots and the backend skips its own KV write (one launch less per layer).
            slot_mapping = self.backend.standard_kv_slot_mapping(attn_metadata)
            kv_written = slot_mapping is not None and kv_cache.dtype == k.dtype
            kv = {"kv_cache": kv_cache, "v": v, "slot_mapping": slot_mapping} if kv_written else {}
            q, k = qk_norm_rope_inplace(positions, q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps,
                                        self.rotary.cos_sin_cache, self.rotary.rot_dim, **kv)
        else:
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rotary(positions, q, k)
        if kv_written:  # only said to a backend that opted in (standard_kv_slot_mapping), so others never see it
            out = self.backend.forward(self.layer, q, k, v, kv_cache, attn_metadata, kv_written=True)
        else:
            out = self.backend.forward(self.layer, q, k, v, kv_cache, attn_metadata)
        return self.o_proj(out.reshape(num_tokens, self.q_size))

    def _fuses_qk_norm_rope(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether q-norm, k-norm and rotary run as one Triton launch (else as the three layers)."""
        impls = (self.qk_norm_rope_impl, self.q_norm.impl, self.k_norm.impl, self.rotary.impl)
        return (all(impl is fused_ops.FusedImpl.TRITON for impl in impls)
                and (q.is_cuda or self.force_fused_qk_norm_rope) and fused_ops.triton_available()
                and q.dtype == k.dtype == self.q_norm.weight.dtype == self.k_norm.weight.dtype
                and self.q_norm.eps == self.k_norm.eps and self.rotary.rot_dim > 0)


class LlamaMLP(nn.Module):
    def __init__(self, ctx: BuildContext, prefix: str) -> None:
        super().__init__()
        c = ctx.config
        self.gate_up_proj = MergedColumnParallelLinear(c.hidden_size, [c.intermediate_size] * 2, bias=c.mlp_bias,
                                                       **ctx.linear_kw(f"{prefix}.gate_up_proj"))
        self.down_proj = RowParallelLinear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias,
                                           **ctx.linear_kw(f"{prefix}.down_proj"))
        self.act = SiluAndMul()

    def forward(self, x):
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, ctx: BuildContext, layer_idx: int, rotary: RotaryEmbedding, prefix: str) -> None:
        super().__init__()
        c = ctx.config
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype=ctx.dtype)
        self.self_attn = LlamaAttention(ctx, layer_idx, rotary, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype=ctx.dtype)
        self.mlp = LlamaMLP(ctx, f"{prefix}.mlp")
        # input norm -> qkv_proj and post-attention norm -> gate_up_proj -> SiLU: one launch each at decode sizes
        self.norm_qkv = NormLinear(self.input_layernorm, self.self_attn.qkv_proj)
        self.norm_gate_up = NormLinear(self.post_attention_layernorm, self.mlp.gate_up_proj, self.mlp.act)

    def forward(self, positions, hidden, residual, kv_cache, attn_metadata):
        """``(hidden, residual)`` of the next layer."""
        qkv, residual = self.norm_qkv(hidden, residual)  # residual None (first layer): hidden is the residual
        hidden = self.self_attn.forward_qkv(positions, qkv, kv_cache, attn_metadata)
        activated, residual = self.norm_gate_up(hidden, residual)
        return self.mlp.down_proj(activated), residual


class LlamaModel(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        c = ctx.config
        self.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size, parallel=ctx.parallel, dtype=ctx.dtype)
        rotary = RotaryEmbedding(c.head_dim, c.rope, max(ctx.max_model_len, 1), c.max_position_embeddings)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(ctx, i, rotary, f"model.layers.{i}") for i in range(c.num_layers)
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

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.config = ctx.config
        self.model = LlamaModel(ctx)
        tied = self.model.embed_tokens if ctx.config.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(ctx.config.vocab_size, ctx.config.hidden_size, parallel=ctx.parallel,
                                      dtype=ctx.dtype, tied_to=tied)

    def forward(self, input_ids, positions, kv_caches, attn_metadata) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits over the whole vocabulary (on every rank: tensor-parallel ranks all-gather their slices)."""
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (HF names) into the fused, sharded parameters.

        Returns the parameters fully loaded: a fused one counts only once all its shards (q, k and
        v; gate and up) arrived.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        shards: dict[str, set] = {}
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            target, shard_id = name, None
            for fragment, (fused, shard) in _FUSED.items():
                if fragment in name:
                    target, shard_id = name.replace(fragment, fused), shard
                    break
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
        return {target for target, got in shards.items() if got >= _expected_shards(target)}
