"""The physical floor of a workload: bytes that must be read over bandwidth, FLOPs over matmul rate.

A decode step must read every weight once (the embedding matrix only as the LM head; one
embedding row per token is negligible; of a mixture of experts' layer, the router and the top-k experts one
token routes to: a larger batch reads more experts, which the floor leaves out, so it stays a lower bound) and the K and V of every context token of every running
request, including the token it appends. A prefill must do its matmul FLOPs: ``2 x params`` per
prompt token, plus causal attention (``4 x heads x head_dim x context`` per token per layer),
plus the LM head once per request (logits only at the sampled position).

    decode_step_s = max((weight_bytes + kv_bytes_per_token x sum(context of running requests)) / bandwidth,
                        2 x params x running / matmul_rate)
    floor_s = sum(decode_step_s over the workload's decode steps) + prefill_flops / matmul_rate

Writes of the new K/V (one token per request per step) are left out: under 1% of the reads.
Both terms are lower bounds, so their max per step is one too; nothing overlaps prefill with
decode, which a real engine can, so the floor errs by at most the prefill time on the low side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(slots=True, frozen=True)
class ModelDims:
    """What the floor needs of a decoder: parameter counts and KV bytes, from its HF config.json."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    layer_params: int  # one decoder layer as one token reads it: projections, biases, norms, routed experts
    dtype_bytes: int

    @classmethod
    def from_config(cls, config: dict[str, Any], dtype: str) -> ModelDims:
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {dtype!r} has no floor; choose from {', '.join(DTYPE_BYTES)}")
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        q, kv = heads * head_dim, kv_heads * head_dim
        params = hidden * (q + 2 * kv) + q * hidden + _mlp_params(config, hidden) + 2 * hidden
        if config.get("model_type") == "qwen2" or config.get("attention_bias"):
            params += q + 2 * kv
        if config.get("model_type") in ("qwen3", "qwen3_moe"):
            params += 2 * head_dim  # q/k RMSNorm
        return cls(int(config["num_hidden_layers"]), hidden, heads, kv_heads, head_dim, int(config["vocab_size"]),
                   params, DTYPE_BYTES[dtype])

    @property
    def step_params(self) -> int:
        """Parameters every decode step reads: the layers, the final norm and the LM head."""
        return self.num_layers * self.layer_params + self.hidden_size + self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.step_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def prefill_flops(self, prompt_len: int) -> float:
        """Matmul FLOPs of one prompt's prefill, logits at its last position only."""
        layers = 2.0 * self.num_layers * self.layer_params * prompt_len
        attention = 4.0 * self.num_layers * self.num_heads * self.head_dim * prompt_len * (prompt_len + 1) / 2
        return layers + attention + 2.0 * self.vocab_size * self.hidden_size


def _mlp_params(config: dict[str, Any], hidden: int) -> int:
    """One layer's MLP as one token reads it: the dense MLP, or a mixture of experts' router, top-k experts and
    shared expert with its gate. Every layer must be alike (no ``mlp_only_layers``, ``decoder_sparse_step`` 1)."""
    num_experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    if not num_experts:
        return 3 * hidden * int(config["intermediate_size"])
    if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step") or 1) != 1:
        raise ValueError("the floor takes every layer alike: a config with dense layers among the experts' "
                         "(mlp_only_layers, decoder_sparse_step > 1) has none")
    expert = int(config.get("moe_intermediate_size") or config["intermediate_size"])
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    shared_params = 3 * hidden * shared + hidden if shared else 0
    return hidden * num_experts + int(config["num_experts_per_tok"]) * 3 * hidden * expert + shared_params


@dataclass(slots=True)
class Floor:
    """Seconds the workload cannot beat, and how they split."""

    output_tokens: int
    num_decode_steps: int
    decode_bytes: float
    decode_s: float
    prefill_flops: float
    prefill_s: float

    @property
    def total_s(self) -> float:
        return self.decode_s + self.prefill_s

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.total_s


def throughput_floor(dims: ModelDims, prompt_lens: Sequence[int], output_lens: Sequence[int], max_num_seqs: int,
                     bandwidth: float, matmul_rate: float) -> Floor:
    """Simulate the decode steps: up to ``max_num_seqs`` requests run at once, in arrival order.

    A request's first output token comes from its prefill; each further one costs a decode step
    that reads its context so far. A request leaves once it has its ``output_len`` tokens and the
    next waiting one takes its place.
    """
    if len(prompt_lens) != len(output_lens) or not prompt_lens:
        raise ValueError("prompt_lens and output_lens must be equally long and not empty")
    waiting = list(zip(prompt_lens, output_lens))[::-1]
    running: list[list[int]] = []  # [context tokens in the cache, decode steps left]
    steps, decode_bytes, decode_s = 0, 0.0, 0.0
    while waiting or running:
        while waiting and len(running) < max_num_seqs:
            prompt_len, output_len = waiting.pop()
            running.append([prompt_len, output_len - 1])
        running = [r for r in running if r[1] > 0]
        if not running:
            continue
        contexts = 0
        for request in running:
            request[0] += 1  # the token this step appends is read too
            request[1] -= 1
            contexts += request[0]
        step_bytes = dims.weight_bytes + dims.kv_bytes_per_token * contexts
        step_flops = 2.0 * dims.step_params * len(running)
        decode_bytes += step_bytes
        decode_s += max(step_bytes / bandwidth, step_flops / matmul_rate)
        steps += 1
    prefill = sum(dims.prefill_flops(n) for n in prompt_lens)
    return Floor(sum(output_lens), steps, decode_bytes, decode_s, prefill, prefill / matmul_rate)


def latency_floor(dims: ModelDims, prompt_len: int, new_tokens: int, bandwidth: float, matmul_rate: float) -> Floor:
    """Batch 1: the prefill, then ``new_tokens - 1`` decode steps, each reading all weights and the context."""
    return throughput_floor(dims, [prompt_len], [new_tokens], 1, bandwidth, matmul_rate)
