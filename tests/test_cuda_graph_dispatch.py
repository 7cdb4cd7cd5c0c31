"""How a decode batch is padded for its graph, which captured graph a step replays (decode, prompt chunk, verify,
argmax) and what the dispatch takes from its output, with stand-ins for the graphs (none can be captured on the CPU;
the GPU replays themselves: test_cuda_graphs_gpu.py)."""

from __future__ import annotations

import logging

import torch

from infer_core import SamplingParams
from infer_core.interfaces import CachedRequestData, NewRequestData, SchedulerOutput
from infer_core.runner.cuda_graphs import (
    CudaGraphRunner,
    _Graph,
    capture_sizes,
    forward_step,
    graph_for,
    prefill_capture_sizes,
    verify_capture_sizes,
)
from infer_core.runner.inputs import StepBuffers, build_step_inputs
from infer_core.runner.state import RequestTable


def _decode_step(table: RequestTable, lengths: list[int], block_size: int) -> SchedulerOutput:
    """Requests already prefilled to ``lengths`` tokens, each now decoding one token."""
    output = SchedulerOutput()
    next_block = 0
    for i, n in enumerate(lengths):
        num_blocks = -(-(n + 1) // block_size)
        blocks = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        output.new_requests.append(NewRequestData(f"r{i}", [7 + i] * n + [100 + i], n, SamplingParams(), blocks, n))
        output.num_scheduled_tokens[f"r{i}"] = 1
    table.apply(output)
    return output


def test_padded_decode_batch_points_padding_at_the_pad_block():
    block_size, pad_block = 4, 50
    table = RequestTable()
    output = _decode_step(table, [3, 9, 4], block_size)
    buffers = StepBuffers(16, 8, 8, torch.device("cpu"), pad_block=pad_block)
    inputs = build_step_inputs(output, table, block_size, torch.device("cpu"), buffers, padded_num_reqs=8)
    assert inputs.padded_num_tokens == 8 and inputs.metadata.num_reqs == 3 and inputs.metadata.num_tokens == 3
    assert inputs.input_ids.tolist() == [100, 101, 102, 0, 0, 0, 0, 0]
    assert inputs.positions.tolist() == [3, 9, 4, 0, 0, 0, 0, 0]
    h = buffers.host
    # real rows: slot = block_table[pos // bs] * bs + pos % bs; padding: slot 0 of the pad block
    assert h["slot_mapping"][:8].tolist() == [0 * 4 + 3, 3 * 4 + 1, 5 * 4 + 0] + [pad_block * block_size] * 5
    assert h["seq_lens"][:8].tolist() == [4, 10, 5, 1, 1, 1, 1, 1]
    assert h["query_start_loc"][:9].tolist() == list(range(9))
    assert (buffers.block_tables_np[3:8] == pad_block).all()
    assert inputs.sample_rows == [0, 1, 2] and inputs.logits_indices.tolist() == [0, 1, 2]
    # longest context first, the padding rows (1 token) last, ties in batch order
    assert h["decode_order"][:8].tolist() == [1, 2, 0, 3, 4, 5, 6, 7]


class _Replayed:
    """A captured graph's stand-in on the CPU (no CUDA graph can be captured here): counts its replays.
    What the dispatch does with a graph's output is under test, not the graph."""

    def __init__(self, replays: list, name: str) -> None:
        self.replays, self.name = replays, name

    def replay(self) -> None:
        self.replays.append(self.name)


def _dispatch_setup(vocab: int = 11, verify: bool = False):
    """A CudaGraphRunner over CPU buffers with decode graphs 1, 2, 4, 8, prefill graphs 16, 32 and an
    argmax graph per decode size (with ``verify``, verify graphs of 2, 4, 8, 16 tokens), each graph's output a
    distinct tensor; and the replay log."""
    buffers = StepBuffers(64, 8, 8, torch.device("cpu"), pad_block=50)
    graphs = CudaGraphRunner(buffers, 4, 64, capture_sizes(8), prefill_capture_sizes(32), verify=verify)
    replays: list[str] = []
    for size in graphs.sizes:
        logits = torch.arange(size * vocab, dtype=torch.float32).view(size, vocab) + 1000 * size
        graphs.graphs[size] = _Graph(_Replayed(replays, f"decode {size}"), logits, None)
        graphs.argmax_graphs[size] = _Graph(_Replayed(replays, f"argmax {size}"), logits.argmax(-1), None)
    for size in graphs.prefill_sizes:
        graphs.prefill_graphs[size] = _Graph(_Replayed(replays, f"prefill {size}"), torch.full((1, vocab), size * 1.0),
                                             None)
    for size in graphs.verify_sizes:
        graphs.verify_graphs[size] = _Graph(_Replayed(replays, f"verify {size}"),
                                            torch.arange(size * vocab, dtype=torch.float32).view(size, vocab), None)
    return buffers, graphs, replays


def test_graph_for_picks_the_graph_a_step_is_padded_for():
    _, graphs, _ = _dispatch_setup()
    decodes = SchedulerOutput(num_scheduled_tokens={"a": 1, "b": 1, "c": 1})
    assert graph_for(graphs, decodes) == (4, None)
    assert graph_for(None, decodes) == (None, None)  # no graphs (CPU, enforce_eager): eager
    assert graph_for(graphs, SchedulerOutput(num_scheduled_tokens={f"r{i}": 1 for i in range(9)})) == (None, None)
    drafted = SchedulerOutput(num_scheduled_tokens={"a": 1, "b": 1}, spec_token_ids={"a": [5]})
    assert graph_for(graphs, drafted) == (None, None)  # no graph holds draft tokens
    assert graph_for(graphs, SchedulerOutput(num_scheduled_tokens={"p": 20})) == (None, 32)
    assert graph_for(graphs, SchedulerOutput(num_scheduled_tokens={"p": 33})) == (None, None)  # past the largest
    assert graph_for(graphs, SchedulerOutput(num_scheduled_tokens={"p": 5, "a": 1})) == (None, None)  # mixed
    _, graphs, _ = _dispatch_setup(verify=True)
    assert graph_for(graphs, drafted) == (None, None)  # two requests verifying: eager
    assert graphs.verify_sizes == [2, 4, 8, 16]
    for tokens, size in ((2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (9, 16), (16, 16)):
        one = SchedulerOutput(num_scheduled_tokens={"a": tokens}, spec_token_ids={"a": list(range(tokens - 1))})
        assert graph_for(graphs, one) == (None, size), tokens  # one request's k+1 tokens: the verify graph
    many = SchedulerOutput(num_scheduled_tokens={"a": 17}, spec_token_ids={"a": list(range(16))})
    assert graph_for(graphs, many) == (None, None)  # past the verify graph


def test_a_verify_step_replays_the_verify_graph_and_takes_its_sampled_rows():
    block_size = 4
    buffers, graphs, replays = _dispatch_setup(verify=True)
    table = RequestTable()
    first = SchedulerOutput(num_scheduled_tokens={"v": 5})
    first.new_requests.append(NewRequestData("v", [3, 4, 5, 6, 7], 5, SamplingParams(), [0, 1, 2], 0))
    table.apply(first)
    step = SchedulerOutput(cached_requests=[CachedRequestData("v", [8], [], 5)], num_scheduled_tokens={"v": 3},
                           spec_token_ids={"v": [9, 10]})
    table.apply(step)
    inputs = build_step_inputs(step, table, block_size, torch.device("cpu"), buffers,
                               padded_num_tokens=graph_for(graphs, step)[1])
    assert inputs.prefill_graph == 4 and inputs.sample_rows == [0, 0, 0]
    assert inputs.input_ids[:3].tolist() == [8, 9, 10] and inputs.logits_indices.tolist() == [0, 1, 2]
    logits = forward_step(inputs, graphs, None)
    assert replays == ["verify 4"] and torch.equal(logits, graphs.verify_graphs[4].logits[:3])


def test_verify_graph_sizes_and_the_warning_where_there_are_none(caplog):
    """Verify graphs of 2, 4, 8 tokens below the smallest prefill graph, then its size; none without prefill
    graphs (flash attention, several ranks), which the runner says, naming the way to get them."""
    assert verify_capture_sizes([16, 32]) == [2, 4, 8, 16]
    assert verify_capture_sizes([4, 8]) == [2, 4] and verify_capture_sizes([2]) == [2]
    assert verify_capture_sizes([]) == []
    buffers = StepBuffers(64, 8, 8, torch.device("cpu"), pad_block=50)
    with caplog.at_level(logging.WARNING, logger="infer_core.runner.cuda_graphs"):
        assert CudaGraphRunner(buffers, 4, 64, capture_sizes(8), [], verify=False).verify_sizes == []
        assert not caplog.records  # the standard policy verifies nothing: nothing to say
        assert CudaGraphRunner(buffers, 4, 64, capture_sizes(8), [], verify=True).verify_sizes == []
    assert "every verify step" in caplog.text and "attention=triton" in caplog.text


def test_forward_step_replays_the_chosen_graph_or_runs_eagerly():
    """One dispatch: a decode graph's first rows (or the sampled rows of its output), a prefill graph's
    one row (nothing when the chunk stops short of the prompt's end), else the eager forward."""
    block_size = 4
    buffers, graphs, replays = _dispatch_setup()
    eager_calls = []

    class Eager:
        def forward_eager(self, inputs):
            eager_calls.append(inputs)
            return torch.zeros(len(inputs.sample_rows), 11)

    eager = Eager()

    table = RequestTable()
    output = _decode_step(table, [3, 9, 4], block_size)
    size, _ = graph_for(graphs, output)
    inputs = build_step_inputs(output, table, block_size, torch.device("cpu"), buffers, size)
    assert (inputs.decode_graph, inputs.prefill_graph) == (4, None)
    logits = forward_step(inputs, graphs, eager)
    assert replays == ["decode 4"] and not eager_calls
    assert torch.equal(logits, graphs.graphs[4].logits[:3]) and logits.data_ptr() == graphs.graphs[4].logits.data_ptr()
    copied = forward_step(inputs, graphs, eager, copy_logits=True)  # outlives the next replay
    assert torch.equal(copied, logits) and copied.data_ptr() != logits.data_ptr()

    # a one-token prompt chunk that does not reach its prompt's end samples nothing: the other rows only
    replays.clear()
    step = SchedulerOutput(num_scheduled_tokens={"d": 1, "c": 1})
    step.new_requests.append(NewRequestData("d", [5, 6, 7], 2, SamplingParams(), [0], 2))
    step.new_requests.append(NewRequestData("c", [1, 2, 3, 4], 4, SamplingParams(), [1], 1))
    table = RequestTable()
    table.apply(step)
    inputs = build_step_inputs(step, table, block_size, torch.device("cpu"), buffers, graph_for(graphs, step)[0])
    assert inputs.decode_graph == 2 and inputs.sample_rows == [0]
    assert torch.equal(forward_step(inputs, graphs, eager), graphs.graphs[2].logits[:1]) and replays == ["decode 2"]

    replays.clear()
    table = RequestTable()
    chunk = SchedulerOutput(num_scheduled_tokens={"p": 6})
    chunk.new_requests.append(NewRequestData("p", list(range(10, 22)), 12, SamplingParams(), [7, 8, 9], 3))
    table.apply(chunk)
    _, tokens = graph_for(graphs, chunk)
    inputs = build_step_inputs(chunk, table, block_size, torch.device("cpu"), buffers, padded_num_tokens=tokens)
    assert (inputs.decode_graph, inputs.prefill_graph) == (None, 16) and inputs.sample_rows == []
    assert forward_step(inputs, graphs, eager) is None and replays == ["prefill 16"]  # KV written, nothing sampled
    last = SchedulerOutput(cached_requests=[CachedRequestData("p", [], [], 9)], num_scheduled_tokens={"p": 3})
    table.apply(last)
    inputs = build_step_inputs(last, table, block_size, torch.device("cpu"), buffers,
                               padded_num_tokens=graph_for(graphs, last)[1])
    assert inputs.sample_rows == [0]
    assert torch.equal(forward_step(inputs, graphs, eager), torch.full((1, 11), 16.0)) and not eager_calls

    replays.clear()
    mixed = SchedulerOutput(num_scheduled_tokens={"x": 3, "y": 1})
    mixed.new_requests.append(NewRequestData("x", [1, 2, 3], 3, SamplingParams(), [0], 0))
    mixed.new_requests.append(NewRequestData("y", [4, 5], 2, SamplingParams(), [1], 1))
    table = RequestTable()
    table.apply(mixed)
    assert graph_for(graphs, mixed) == (None, None)
    inputs = build_step_inputs(mixed, table, block_size, torch.device("cpu"), buffers)
    assert forward_step(inputs, graphs, eager).shape == (2, 11)
    assert eager_calls == [inputs] and not replays
    assert graphs.replay_argmax(4) is graphs.argmax_graphs[4].logits and replays == ["argmax 4"]


# --- on a GPU ----------------------------------------------------------------------------------


def _pending_step(table: RequestTable, order: list[str]) -> SchedulerOutput:
    """Each request of ``table`` decodes its pending token (sampled by the step before, not on the host yet)."""
    cached = [CachedRequestData(rid, [], [], table[rid].num_computed_tokens + 1, num_pending_tokens=1)
              for rid in order]
    step = SchedulerOutput(cached_requests=cached, num_scheduled_tokens={rid: 1 for rid in order})
    table.apply(step)
    return step


def test_pending_tokens_in_the_previous_order_are_one_prefix_copy():
    """Steady decode (the batch in the previous step's order, every row pending) says so with pending_prefix,
    which the runner turns into one copy; another order keeps the gather (dst, src) and no prefix."""
    block_size = 4
    table = RequestTable()
    _decode_step(table, [2, 9, 5], block_size)  # each has room in its blocks for one more token
    previous = {"r0": 0, "r1": 1, "r2": 2}
    step = _pending_step(table, ["r0", "r1", "r2"])
    inputs = build_step_inputs(step, table, block_size, torch.device("cpu"), previous_sample_rows=previous)
    assert inputs.pending_prefix == 3
    assert inputs.pending_dst.tolist() == [0, 1, 2] and inputs.pending_src.tolist() == [0, 1, 2]
    previous = {"r0": 1, "r1": 0, "r2": 2}  # the previous step sampled r1 first
    inputs = build_step_inputs(step, table, block_size, torch.device("cpu"), previous_sample_rows=previous)
    assert inputs.pending_prefix == 0
    assert inputs.pending_dst.tolist() == [0, 1, 2] and inputs.pending_src.tolist() == [1, 0, 2]
