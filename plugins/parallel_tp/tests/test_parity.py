"""TP=N against TP=1 on the CPU (gloo, float32): identical greedy tokens, logits equal to rounding.

Each case runs one batch through both engines with the same schedule: mixed prompt lengths, a
shared prefix served from the prefix cache, prefill chunks of 32 tokens, and a KV pool small
enough that requests are preempted and recomputed. The models cover untied embeddings (llama,
qwen2), tied ones with q/k norms (qwen3), q/k/v biases (qwen2), fewer KV heads than ranks (KV
heads replicated: qwen2 with one KV head on 2 ranks, llama's 2 on 4 ranks), dummy weights, and mixtures of
experts (each expert's intermediate size split over the ranks: Qwen2-MoE's shared expert and dense layer,
Qwen3-MoE's stacked dummy experts).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.testing import LogitsRecorder

NUM_NEW_TOKENS = 12
PROMPT_LENGTHS = (5, 40, 97, 12, 64)
SHARED_PREFIX = 48
SETTINGS = {
    "dtype": "float32",
    "device": "cpu",
    "block_size": 16,
    "max_num_batched_tokens": 32,  # prefill in chunks
    "max_num_seqs": 4,
    "num_kv_blocks": 12,  # small enough that requests are preempted and recomputed
    "enable_prefix_caching": True,
}


@dataclass(frozen=True)
class Case:
    kind: str
    tensor_parallel_size: int
    overrides: dict = field(default_factory=dict)
    load_format: str = "safetensors"

    def __str__(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.overrides.items())
        return f"{self.kind}-tp{self.tensor_parallel_size}{'-' + extra if extra else ''}-{self.load_format}"


CASES = [
    Case("llama", 2),  # untied embeddings, llama3 rope scaling
    Case("qwen3", 2),  # tied embeddings, q/k RMSNorm
    Case("qwen2", 2, {"num_key_value_heads": 1}),  # one KV head replicated on both ranks; q/k/v biases
    Case("llama", 4),  # two KV heads on four ranks
    Case("mistral", 2, load_format="dummy"),  # dummy weights are the same model at every TP size
    Case("qwen2_moe", 2),  # experts split over ranks, a shared expert, a dense layer, q/k/v biases
    Case("qwen3_moe", 2, load_format="dummy"),  # the experts' dummy weights drawn whole at every TP size
]


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(7)
    prefix = [rng.randrange(3, vocab) for _ in range(SHARED_PREFIX)]
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]
    return prompts + [prefix + p for p in prompts[:2]]


def _run(folder, case: Case, tensor_parallel_size: int):
    llm = LLM(str(folder), tensor_parallel_size=tensor_parallel_size, load_format=case.load_format, **SETTINGS)
    try:
        prompts = _prompts(llm.engine.config.model.vocab_size)
        params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        logits = [torch.stack(recorder.logits[o.request_id]) for o in outputs]
        stats = llm.engine.stats()
        return [o.outputs[0].token_ids for o in outputs], logits, stats, llm.engine.config.implementations["parallel"]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("case", CASES, ids=str)
def test_tensor_parallel_matches_one_rank(tiny_checkpoint, assert_no_workers_left, case):
    folder = tiny_checkpoint(case.kind, **case.overrides)
    ref_tokens, ref_logits, _, ref_parallel = _run(folder, case, 1)
    tokens, logits, stats, parallel = _run(folder, case, case.tensor_parallel_size)
    assert (ref_parallel, parallel) == ("single", "tp")
    assert stats.num_preemptions > 0 and stats.prefix_hit_tokens >= SHARED_PREFIX  # the paths were exercised
    assert tokens == ref_tokens
    for got, expected in zip(logits, ref_logits):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert_no_workers_left()
