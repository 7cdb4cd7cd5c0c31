"""CUDA graphs of decode steps and of one request's prompt chunks: which sizes are captured, how a prompt chunk is
padded and what a step's inputs hold (decode padding and which graph a step replays: test_cuda_graph_dispatch.py)."""

from __future__ import annotations

import numpy as np
import torch

from infer_core import SamplingParams
from infer_core.interfaces import CachedRequestData, NewRequestData, SchedulerOutput
from infer_core.runner.cuda_graphs import (
    capture_sizes,
    prefill_capture_sizes,
)
from infer_core.runner.inputs import StepBuffers, build_step_inputs
from infer_core.runner.state import RequestTable


def test_capture_sizes_are_powers_of_two_then_every_eight():
    assert capture_sizes(256) == [1, 2, 4, 8, *range(16, 257, 8)]
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]


def test_prefill_capture_sizes_double_from_16_up_to_the_setting():
    assert prefill_capture_sizes(512) == [16, 32, 64, 128, 256, 512]
    assert prefill_capture_sizes(100) == [16, 32, 64, 100]
    assert prefill_capture_sizes(16) == [16] and prefill_capture_sizes(10) == [10]
    assert prefill_capture_sizes(0) == [] and prefill_capture_sizes(1) == []


def test_padded_prompt_chunk_pads_tokens_of_no_request_at_the_pad_block():
    """A prefill graph's step: the request keeps its own lengths; the padding tokens belong to no
    request and write only the pad block's first slot."""
    block_size, pad_block = 4, 50
    table = RequestTable()
    output = SchedulerOutput()
    # 3 tokens cached (blocks 7), a chunk of 6 more (positions 3..8, blocks 7, 8, 9)
    output.new_requests.append(NewRequestData("p", list(range(10, 22)), 12, SamplingParams(), [7, 8, 9], 3))
    output.num_scheduled_tokens = {"p": 6}
    table.apply(output)
    buffers = StepBuffers(32, 8, 8, torch.device("cpu"), pad_block=pad_block)
    inputs = build_step_inputs(output, table, block_size, torch.device("cpu"), buffers, padded_num_tokens=16)
    assert inputs.padded_num_tokens == 16 and inputs.metadata.num_reqs == 1 and inputs.metadata.num_tokens == 6
    assert inputs.input_ids.tolist() == [13, 14, 15, 16, 17, 18] + [0] * 10
    assert inputs.positions.tolist() == [3, 4, 5, 6, 7, 8] + [0] * 10
    h = buffers.host
    assert h["slot_mapping"][:16].tolist() == [7 * 4 + 3, 8 * 4, 8 * 4 + 1, 8 * 4 + 2, 8 * 4 + 3, 9 * 4] + [200] * 10
    assert h["query_start_loc"][:2].tolist() == [0, 6] and h["seq_lens"][0] == 9
    assert buffers.block_tables_np[0, :3].tolist() == [7, 8, 9]
    assert inputs.sample_rows == [] and len(inputs.logits_indices) == 0  # the chunk stops short of the prompt's end


def test_step_inputs_of_a_mixed_batch_follow_the_table():
    """Decodes first, then a chunk after a cached prefix; a draft token extends a decode."""
    block_size = 4
    table = RequestTable(num_rows=1, max_tokens=2, max_blocks=1)  # forces the arrays to grow
    output = SchedulerOutput()
    output.new_requests.append(NewRequestData("chunk", list(range(20, 30)), 10, SamplingParams(), [5, 6, 7], 4))
    output.new_requests.append(NewRequestData("dec", [1, 2, 3, 4, 5], 4, SamplingParams(), [9, 10], 4))
    output.num_scheduled_tokens = {"chunk": 6, "dec": 2}
    output.spec_token_ids = {"dec": [77]}
    table.apply(output)
    inputs = build_step_inputs(output, table, block_size, torch.device("cpu"))
    assert inputs.request_ids == ["chunk", "dec"]  # neither is a one-token decode: schedule order
    assert inputs.input_ids.tolist() == [24, 25, 26, 27, 28, 29, 5, 77]
    assert inputs.positions.tolist() == [4, 5, 6, 7, 8, 9, 4, 5]
    slots = [6 * 4 + 0, 6 * 4 + 1, 6 * 4 + 2, 6 * 4 + 3, 7 * 4 + 0, 7 * 4 + 1, 10 * 4 + 0, 10 * 4 + 1]
    assert inputs.metadata.slot_mapping.tolist() == slots
    # the chunk reaches its end: samples its last token; the decode verifies 1 draft: 2 samples
    assert inputs.logits_indices.tolist() == [5, 6, 7] and inputs.sample_rows == [0, 1, 1]
    assert inputs.metadata.seq_lens.tolist() == [10, 6]
    # the next step: a cached update appends tokens and a block in place
    step = SchedulerOutput(cached_requests=[CachedRequestData("dec", [6], [11], 5)], num_scheduled_tokens={"dec": 1})
    table.apply(step)
    row = table["dec"].row
    assert table.token_ids[row, :6].tolist() == [1, 2, 3, 4, 5, 6]
    assert table.block_table[row, :3].tolist() == [9, 10, 11]
    inputs = build_step_inputs(step, table, block_size, torch.device("cpu"))
    assert inputs.input_ids.tolist() == [6] and inputs.positions.tolist() == [5] and inputs.sample_rows == [0]


def test_request_rows_are_reused_and_grow():
    table = RequestTable(num_rows=2)
    out = SchedulerOutput()
    for i in range(5):
        out.new_requests.append(NewRequestData(f"r{i}", [i] * 3, 3, SamplingParams(), [i], 0))
    table.apply(out)
    rows = sorted(table[f"r{i}"].row for i in range(5))
    assert rows == [0, 1, 2, 3, 4] and len(table.num_computed_tokens) >= 5
    table.apply(SchedulerOutput(finished_request_ids={"r1"}))
    table.apply(SchedulerOutput(new_requests=[NewRequestData("x", [9], 1, SamplingParams(), [3], 0)]))
    assert table["x"].row not in {table[f"r{i}"].row for i in (0, 2, 3, 4)}
    assert np.array_equal(table.token_ids[table["r4"].row, :3], [4, 4, 4])
