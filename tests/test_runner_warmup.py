"""The dummy steps a rank runs before it serves (runner/warmup.py), on the CPU.

On CUDA every engine start runs them (the memory profile before the KV cache is sized); on the CPU
the KV cache is sized from ``kv_cache_gb`` without one, so the profiling step is called here directly:
it must be the largest step the scheduler may produce and leave the runner as it found it.
"""

from __future__ import annotations

import pytest

from infer_core import LLM, SamplingParams
from infer_core.interfaces import ParallelContext
from infer_core.runner.warmup import dummy_output, profile_num_blocks, profile_step
from infer_core.runner.worker import Worker


def test_dummy_output_puts_each_request_on_its_own_consecutive_blocks():
    params = SamplingParams(temperature=0.5)
    output, num_blocks = dummy_output([9, 1, 4], params, block_size=4)
    assert num_blocks == 3 + 1 + 1
    assert [new.block_ids for new in output.new_requests] == [[0, 1, 2], [3], [4]]
    assert [len(new.token_ids) for new in output.new_requests] == [9, 1, 4]
    assert all(new.num_computed_tokens == 0 and new.sampling_params is params for new in output.new_requests)
    assert output.num_scheduled_tokens == {"dummy-0": 9, "dummy-1": 1, "dummy-2": 4}


@pytest.fixture(scope="module")
def config(tiny_checkpoint):
    llm = LLM(str(tiny_checkpoint("qwen3")), max_num_seqs=6, max_num_batched_tokens=40, max_model_len=64,
              kv_cache_gb=0.01)
    try:
        yield llm.engine.config
    finally:
        llm.shutdown()


def test_the_profiling_step_is_the_largest_step_and_leaves_nothing_behind(config):
    worker = Worker(config, ParallelContext.single())
    worker.load_model()
    runner = worker.runner
    steps = []
    execute = runner.execute

    def recorded(output):
        steps.append((output, [t.shape for t in runner.kv_caches]))
        return execute(output)

    runner.execute = recorded
    profile_step(runner)
    assert len(steps) == 1
    output, kv_shapes = steps[0]
    # the longest chunk that fits next to max_num_seqs - 1 one-token requests, within max_num_batched_tokens
    assert list(output.num_scheduled_tokens.values()) == [40 - 5, 1, 1, 1, 1, 1]
    params = output.new_requests[0].sampling_params
    assert params.top_k > 0 and params.top_p < 1 and params.has_penalties and params.logprobs == 20
    num_blocks = sum(len(new.block_ids) for new in output.new_requests)
    assert kv_shapes and all(shape[1] == num_blocks for shape in kv_shapes)  # a KV cache of just those blocks
    assert runner.kv_caches == [] and len(runner.requests) == 0
    # on the CPU the configured GiB sizes the cache, no step runs
    block_bytes = runner.bytes_per_block()
    assert profile_num_blocks(runner) == min(int(0.01 * 2**30 // block_bytes), 6 * -(-64 // config.block_size))
    assert len(steps) == 1
