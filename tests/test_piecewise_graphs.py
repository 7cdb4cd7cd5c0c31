"""Piecewise CUDA graphs, the parts that run on any machine: the captured sizes, the padding of a step for them
(tokens of no request, writing only the pad block) and where the model is cut (every Attention it calls).
Capture and replay are checked on a GPU (test_piecewise_graphs_gpu.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from infer_core.interfaces import NewRequestData, SchedulerOutput
from infer_core.runner.graph_plan import piecewise_graph_sizes
from infer_core.runner.inputs import StepBuffers, build_step_inputs
from infer_core.runner.piecewise_graphs import PiecewiseGraphs, attention_sites, piecewise_sizes
from infer_core.runner.state import RequestTable
from infer_core.sampling_params import SamplingParams


def test_sizes_double_to_256_then_step_by_256_to_2048_then_by_512_to_the_largest_step():
    assert piecewise_sizes(8192) == [16, 32, 64, 128, *range(256, 2048, 256), *range(2048, 8192, 512), 8192]
    assert piecewise_sizes(1000) == [16, 32, 64, 128, 256, 512, 768, 1000]
    assert piecewise_sizes(100) == [16, 32, 64, 100] and piecewise_sizes(16) == [16]
    sizes = piecewise_sizes(8192)
    gaps = np.diff(sizes)
    assert (gaps <= 512).all() and sizes == sorted(set(sizes))


def test_several_ranks_capture_pieces_only_where_their_strategy_supports_them():
    """Collectives sit between two attentions, inside the pieces: a strategy says whether its layers capture there."""
    settings = SimpleNamespace(piecewise_cuda_graphs=True, max_num_batched_tokens=512, max_num_seqs=8)

    def runner(world_size: int, supports: bool, graphs: bool = True):
        return SimpleNamespace(config=SimpleNamespace(settings=settings, max_model_len=1024),
                               uses_cuda_graphs=lambda: graphs, parallel=SimpleNamespace(world_size=world_size),
                               strategy=SimpleNamespace(supports_piecewise_cuda_graphs=supports))

    assert piecewise_graph_sizes(runner(1, False)) == piecewise_sizes(512)  # one rank always may
    assert piecewise_graph_sizes(runner(2, False)) == []
    assert piecewise_graph_sizes(runner(2, True)) == piecewise_sizes(512)
    assert piecewise_graph_sizes(runner(2, True, graphs=False)) == []
    settings.piecewise_cuda_graphs = False
    assert piecewise_graph_sizes(runner(2, True)) == []


def test_a_step_pads_to_the_smallest_captured_size_that_holds_it():
    graphs = PiecewiseGraphs([16, 32, 64])
    assert graphs.padded_size(20) is None  # nothing captured yet: eager
    graphs.captured = {16: None, 32: None, 64: None}
    assert graphs.padded_size(1) == 16 and graphs.padded_size(17) == 32 and graphs.padded_size(64) == 64
    assert graphs.padded_size(65) is None


def test_a_piecewise_step_is_padded_with_tokens_that_write_only_the_pad_block():
    """Two prompts (5 and 6 tokens) padded to 16: the metadata keeps the real 11 tokens and 2 requests, the
    padding rows write the pad block's first slot, and the step is neither a decode nor a prefill graph's."""
    block_size, pad_block = 4, 30
    buffers = StepBuffers(64, 8, 8, torch.device("cpu"), pad_block=pad_block)
    table = RequestTable()
    step = SchedulerOutput(num_scheduled_tokens={"a": 5, "b": 6})
    step.new_requests.append(NewRequestData("a", [1, 2, 3, 4, 5], 5, SamplingParams(), [0, 1], 0))
    step.new_requests.append(NewRequestData("b", [6, 7, 8, 9, 10, 11], 6, SamplingParams(), [2, 3], 0))
    table.apply(step)
    buffers.host["slot_mapping"][:] = 7  # stale slots of an earlier step: the padding must not keep them
    inputs = build_step_inputs(step, table, block_size, torch.device("cpu"), buffers, piecewise_graph=16)
    assert (inputs.piecewise_graph, inputs.prefill_graph, inputs.decode_graph) == (16, None, None)
    assert inputs.padded_num_tokens == 16 and inputs.input_ids.shape[0] == 16
    assert inputs.metadata.num_tokens == 11 and inputs.metadata.num_reqs == 2
    slots = buffers.host["slot_mapping"]
    assert slots[:11].tolist() == [0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13]
    assert (slots[11:16] == pad_block * block_size).all()
    assert inputs.logits_indices.tolist() == [4, 10] and inputs.sample_rows == [0, 1]


def test_the_cuts_are_every_attention_of_the_model(tmp_path):
    from infer_core import LLM
    from infer_core.testing import make_tiny_checkpoint

    folder = make_tiny_checkpoint("qwen3", tmp_path / "tiny")
    llm = LLM(str(folder), max_model_len=64, kv_cache_gb=0.01)
    try:
        model = llm.engine.executor.worker.runner.model
        sites = attention_sites(model)
        assert [s.layer.layer_idx for s in sites] == list(range(model.config.num_layers)) and len(sites) >= 2
    finally:
        llm.shutdown()


def test_the_capture_metadata_splits_a_size_into_requests_no_longer_than_the_context():
    """A piecewise graph of 20 tokens for a 8-token context is captured on requests of 8, 8 and 4 tokens, every
    token writing the pad block (one request of 20 would read past its block table)."""
    from infer_core.runner.cuda_graphs import CudaGraphRunner, capture_sizes

    block_size, pad_block = 4, 30
    buffers = StepBuffers(64, 8, 3, torch.device("cpu"), pad_block=pad_block)
    graphs = CudaGraphRunner(buffers, block_size, 8, capture_sizes(8))
    md = graphs.prefill_metadata(20, 8)
    assert (md.num_reqs, md.num_tokens, md.num_decode_only, md.max_query_len) == (3, 20, 0, 8)
    assert md.query_start_loc.tolist() == [0, 8, 16, 20] and md.seq_lens.tolist() == [8, 8, 4]
    assert (md.slot_mapping == pad_block * block_size).all() and (md.block_tables == pad_block).all()
    one = graphs.prefill_metadata(6)  # a prefill graph's: one request
    assert one.num_reqs == 1 and one.seq_lens.tolist() == [6] and one.query_start_loc.tolist() == [0, 6]
