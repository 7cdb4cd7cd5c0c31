"""``infer bench throughput``'s timed run on a KV cache too small for its batch: requests are preempted, and when
they resume they find their own freed blocks in the prefix cache. Those hits are the engine's work, not the
warm-up's; the check that the warm-up cached none of the timed prompts looks the prompts up before the run."""

from __future__ import annotations

import random

import pytest

from infer_core import LLM
from infer_core.bench.engine_runs import cached_prompt_tokens, measure_throughput
from infer_core.bench.workload import OfflineWorkload
from infer_core.testing import make_tiny_checkpoint

BLOCK_SIZE = 8
NUM_KV_BLOCKS = 5  # 40 tokens: two 15-token prompts fit, not their 12 new tokens each


@pytest.fixture(scope="module")
def small_cache_llm(tmp_path_factory):
    # a mixture of experts, as the model the failure was first seen on; token ids of the workload go up to 10000
    folder = make_tiny_checkpoint("qwen3_moe", tmp_path_factory.mktemp("tiny-qwen3-moe"), vocab_size=10240)
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=BLOCK_SIZE, num_kv_blocks=NUM_KV_BLOCKS,
              max_num_seqs=4, max_num_batched_tokens=64, max_model_len=40, enable_prefix_caching=True)
    yield llm
    llm.shutdown()


def test_preempted_requests_finding_their_own_blocks_do_not_fail_the_timed_run(small_cache_llm):
    rng = random.Random(0)
    workload = OfflineWorkload([[rng.randrange(10000) for _ in range(15)] for _ in range(3)], [12] * 3)
    row = measure_throughput(small_cache_llm, workload)
    assert row["output_tokens"] == workload.num_output_tokens
    assert row["num_preemptions"] > 0 and row["prefix_hit_tokens"] > 0  # the case: resumed requests hit the cache


def test_cached_prompt_tokens_counts_what_the_cache_would_serve_without_counting_a_hit(small_cache_llm):
    from infer_core import SamplingParams

    allocator = small_cache_llm.engine.scheduler.kv_allocator
    prompts = [list(range(3000, 3000 + 12)), list(range(4000, 4000 + 9))]
    assert cached_prompt_tokens(allocator, prompts) == 0
    small_cache_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    stats = small_cache_llm.engine.stats()
    # all but each prompt's last token, in whole blocks: 11 -> 8, 8 -> 8
    assert cached_prompt_tokens(allocator, prompts) == 8 + 8
    assert small_cache_llm.engine.stats() == stats
    assert allocator.block_ids("infer-bench-cache-probe") == []
