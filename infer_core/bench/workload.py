"""The offline-throughput workload (nano-vllm's; docs/benchmarks.md), bit-exact, and the decode-latency prompt.

``random.seed(0)``; 256 prompts of ``randint(100, 1024)`` token ids drawn by ``randint(0, 10000)``;
then, in a second loop, 256 output lengths ``randint(100, 1024)`` (133,966 output tokens). A
private ``random.Random(0)`` draws the same numbers as the seeded module without touching the
caller's global random state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NUM_WORKLOAD_PROMPTS = 256
WORKLOAD_MAX_LEN = 1024
WORKLOAD_OUTPUT_TOKENS = 133_966  # sum of the 256 output lengths; checked by the tests
WORKLOAD_TEMPERATURE = 0.6
WARMUP_PROMPT = [1, 2, 3, 4]
WARMUP_MAX_TOKENS = 16


@dataclass(slots=True)
class OfflineWorkload:
    """Prompts (token ids), the number of output tokens each must produce (``ignore_eos``), and the
    sampling temperature (0: greedy)."""

    prompts: list[list[int]]
    output_lens: list[int]
    temperature: float = WORKLOAD_TEMPERATURE

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    def head(self, num_prompts: int) -> OfflineWorkload:
        """The first ``num_prompts`` requests (a subset for slow peers or small machines)."""
        return OfflineWorkload(self.prompts[:num_prompts], self.output_lens[:num_prompts], self.temperature)

    def to_json(self) -> dict:
        """What a child process of ``infer bench`` (or a peer's interpreter) rebuilds the workload from."""
        return {"prompts": self.prompts, "output_lens": self.output_lens, "temperature": self.temperature}

    @classmethod
    def from_json(cls, data: dict) -> OfflineWorkload:
        return cls(data["prompts"], data["output_lens"], data["temperature"])


def offline_workload(num_prompts: int = NUM_WORKLOAD_PROMPTS, max_len: int = WORKLOAD_MAX_LEN) -> OfflineWorkload:
    """The first ``num_prompts`` of the 256 requests; bit-exact with nano-vllm for ``max_len=1024``.

    A smaller ``max_len`` (CPU dry runs) shortens prompts and outputs but keeps the draw order.
    """
    if not 1 <= num_prompts <= NUM_WORKLOAD_PROMPTS:
        raise ValueError(f"num_prompts must be between 1 and {NUM_WORKLOAD_PROMPTS}, got {num_prompts}")
    if max_len < 100:
        raise ValueError(f"max_len must be at least 100 (the shortest prompt and output), got {max_len}")
    rng = random.Random(0)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, max_len))] for _ in range(NUM_WORKLOAD_PROMPTS)]
    output_lens = [rng.randint(100, max_len) for _ in range(NUM_WORKLOAD_PROMPTS)]
    return OfflineWorkload(prompts[:num_prompts], output_lens[:num_prompts])


def latency_prompt(prompt_len: int, vocab_size: int, seed: int = 2) -> list[int]:
    """A random prompt of ``prompt_len`` token ids below ``min(vocab_size, 10000)``, the same every run."""
    rng = random.Random(seed)
    return [rng.randrange(min(vocab_size, 10000)) for _ in range(prompt_len)]
