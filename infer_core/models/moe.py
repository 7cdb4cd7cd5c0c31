"""Mixture-of-experts decoders: Qwen3-MoE, Mixtral and Qwen2-MoE, the Llama-family decoder with an MoE block.

A decoder layer reads norm, attention, norm, MoE block; the attention is the Llama/Qwen3 one (q/k norm for
Qwen3-MoE, q/k/v biases for Qwen2-MoE, from the config). The MoE block routes each token to its top-k experts
(``layers/moe``); Qwen2-MoE adds a shared expert every token goes through, scaled by a sigmoid gate. Layers the
config keeps dense (Qwen's ``mlp_only_layers``, ``decoder_sparse_step``) have the Llama MLP instead.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from infer_core.errors import ModelError
from infer_core.layers.linear import ReplicatedLinear
from infer_core.layers.moe import FusedMoE
from infer_core.layers.norm import NormedInput, RMSNorm
from infer_core.layers.unquantized import UnquantizedLinearMethod
from infer_core.models.build import BuildContext
from infer_core.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP


class SparseMoeBlock(nn.Module):
    """``experts(x, gate(x))`` (+ ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``, Qwen2-MoE).

    The router (``gate``) and the shared expert's gate stay dense whatever the quantizer: checkpoints keep them
    in the model dtype, and the routing is sensitive to them. ``input_norm``: the norm before the block, which
    the router's GEMV launch computes at decode sizes (``LinearBase.forward_and_input``).
    """

    def __init__(self, ctx: BuildContext, prefix: str, input_norm: RMSNorm | None = None) -> None:
        super().__init__()
        c, moe = ctx.config, ctx.config.moe
        dense = dict(parallel=ctx.parallel, dtype=ctx.dtype, bias=False)
        self.gate = ReplicatedLinear(c.hidden_size, moe.num_experts, method=UnquantizedLinearMethod(),
                                     prefix=f"{prefix}.gate", input_norm=input_norm, **dense)
        self.experts = FusedMoE(moe.num_experts, moe.top_k, c.hidden_size, moe.intermediate_size,
                                renormalize=moe.renormalize, **ctx.moe_kw(f"{prefix}.experts"))
        self.shared_expert = self.shared_expert_gate = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = LlamaMLP(ctx, f"{prefix}.shared_expert", None, moe.shared_expert_intermediate_size)
            self.shared_expert_gate = ReplicatedLinear(c.hidden_size, 1, method=UnquantizedLinearMethod(),
                                                       prefix=f"{prefix}.shared_expert_gate", **dense)

    def forward(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        router_logits, x = self.gate.forward_and_input(x)  # a norm handed on: computed once, with the router
        out = self.experts(x, router_logits)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


class MoEDecoderLayer(LlamaDecoderLayer):
    """``LlamaDecoderLayer`` with the MoE block where the config makes the layer sparse."""

    def build_mlp(self, ctx: BuildContext, layer_idx: int, prefix: str) -> nn.Module:
        if ctx.config.moe.is_sparse(layer_idx):
            return SparseMoeBlock(ctx, prefix, self.post_attention_layernorm)
        return super().build_mlp(ctx, layer_idx, prefix)


# one expert's checkpoint tensor: Qwen's gate_proj/up_proj/down_proj, Mixtral's w1 (gate), w3 (up), w2 (down)
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
_PROJECTION = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}
_STACKED = re.compile(r"^.*\.experts\.(gate_up_proj|down_proj)$")  # transformers 5's stacked experts


class MoEForCausalLM(LlamaForCausalLM):
    """Qwen3-MoE, Mixtral and Qwen2-MoE (``Qwen3MoeForCausalLM``, ``MixtralForCausalLM``, ``Qwen2MoeForCausalLM``)."""

    decoder_layer = MoEDecoderLayer

    def __init__(self, ctx: BuildContext) -> None:
        if ctx.config.moe is None:
            raise ModelError(f"{ctx.config.architecture} ({ctx.config.model_type!r}) has no mixture-of-experts "
                             "block in its config.json (num_experts, num_experts_per_tok)")
        super().__init__(ctx)

    def checkpoint_target(self, name: str) -> tuple[str, Any] | None:
        name = name.replace(".block_sparse_moe.", ".mlp.")  # Mixtral's name of the block
        expert = _EXPERT.match(name)
        if expert is not None:
            prefix, index, projection = expert.groups()
            projection = _PROJECTION[projection]
            param = "down_proj" if projection == "down" else "gate_up_proj"
            return f"{prefix}.{param}", (int(index), projection)
        if _STACKED.match(name):
            return name, None
        return super().checkpoint_target(name)

    def fully_loaded(self, target: str, shards: set) -> bool:
        stacked = _STACKED.match(target)
        if stacked is None:
            return super().fully_loaded(target, shards)
        projections = ("down",) if stacked.group(1) == "down_proj" else ("gate", "up")
        every = {(e, p) for e in range(self.config.moe.num_experts) for p in projections}
        return None in shards or shards >= every

