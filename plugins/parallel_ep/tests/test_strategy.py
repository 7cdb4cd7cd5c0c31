"""The ep strategy's choice and refusals (before any worker starts), and the dispatch's pure parts."""

from __future__ import annotations

import pytest
import torch
from infer_core.errors import PluginError
from infer_core.loader import assemble
from infer_core.settings import load_settings

from infer_parallel_ep.load import ExpertLoad
from infer_parallel_ep.slices import token_share


def _parallel(folder, **settings) -> str:
    return assemble(load_settings(model=str(folder), device="cpu", **settings)).config.implementations["parallel"]


def test_expert_parallel_size_above_one_selects_ep(tiny_checkpoint):
    folder = tiny_checkpoint("mixtral")
    assert _parallel(folder) == "single"
    assert _parallel(folder, expert_parallel_size=2) == "ep"


def test_a_dense_model_is_refused_with_the_fix(tiny_checkpoint, assert_no_workers_left):
    with pytest.raises(PluginError, match=r"(?s)expert_parallel_size=2 shards the experts.*is dense.*"
                                          r"INFER_TENSOR_PARALLEL_SIZE=2"):
        _parallel(tiny_checkpoint("qwen3"), expert_parallel_size=2)
    assert_no_workers_left()


def test_a_size_that_does_not_divide_the_experts_is_refused_with_the_numbers(tiny_checkpoint):
    folder = tiny_checkpoint("qwen3_moe", num_experts=6)
    with pytest.raises(PluginError, match=r"num_experts=6 is not divisible by expert_parallel_size=4 \(6 % 4 = 2;"
                                          r".*choose a size that divides 6 \(2, 3, 6\)"):
        _parallel(folder, expert_parallel_size=4)


def test_tensor_parallel_size_beside_it_is_refused(tiny_checkpoint):
    with pytest.raises(PluginError, match="leave INFER_TENSOR_PARALLEL_SIZE at 1"):
        _parallel(tiny_checkpoint("mixtral"), expert_parallel_size=2, tensor_parallel_size=2, parallel="ep")


@pytest.mark.parametrize("num_tokens,world", [(1, 4), (5, 2), (7, 4), (8, 4), (3, 4)])
def test_token_shares_cover_every_token_once_in_order(num_tokens, world):
    shares = [token_share(num_tokens, rank, world) for rank in range(world)]
    rows = {r for _, _, r in shares}
    assert rows == {-(-num_tokens // world)}
    covered = [t for start, end, _ in shares for t in range(start, end)]
    assert covered == list(range(num_tokens))


def test_load_counts_entries_per_expert_and_rank():
    load = ExpertLoad(num_experts=4, world_size=2)
    # rank 0 sends 3 rows to rank 0 and 1 to rank 1, entries 2, 1 | 0, 1; rank 1: 0 and 2 rows, entries 0, 0 | 2, 2
    load.add(torch.tensor([[3, 1, 2, 1, 0, 1], [0, 2, 0, 0, 2, 2]]), num_tokens=4)
    got = load.describe()
    assert got["entries_per_expert"] == [2, 1, 2, 3]
    assert got["entries_per_rank"] == [3, 5]
    assert got["tokens_per_rank"] == [3, 3]
    assert got["imbalance"] == pytest.approx(5 / 4)
    assert got["num_tokens"] == 4


def test_routing_counted_on_the_device_reads_as_the_exchanged_counts():
    """``add_routing`` (the all-reduce dispatch's rank 0) counts what ``add`` counts from the exchanged rows."""
    load = ExpertLoad(num_experts=4, world_size=2)
    # tokens' experts: {0, 2}, {1, 3}, {3, 2}, {0, 1}: rank 0 holds experts 0-1, rank 1 experts 2-3
    load.add_routing(torch.tensor([[0, 2], [1, 3], [3, 2], [0, 1]]))
    got = load.describe()
    assert got["entries_per_expert"] == [2, 2, 2, 2]
    assert got["entries_per_rank"] == [4, 4]
    assert got["tokens_per_rank"] == [3, 3]  # the third token meets no expert of rank 0, the fourth none of rank 1
    assert got["num_tokens"] == 4 and got["num_dispatches"] == 1 and got["imbalance"] == 1.0
    load.add_routing(torch.tensor([[2, 3]]))  # one more layer: both entries on rank 1
    series = {m.name: m for m in load.metrics()}  # the engine loop's read, which waits for nothing (here: the CPU)
    assert dict(series["moe_rank_entries"].values) == {"0": 4.0, "1": 6.0}
    got = load.describe()
    assert got["entries_per_rank"] == [4, 6] and got["tokens_per_rank"] == [3, 4]
    assert got["imbalance"] == pytest.approx((4 + 2) / (4 + 1))
    counters = [t.data_ptr() for t in load._device.counters]
    load.reset()  # what the executor does once start-up's dummy steps are done
    got = load.describe()
    assert got["num_dispatches"] == 0 and got["entries_per_expert"] == [0] * 4 and got["imbalance"] == 1.0
    assert [t.data_ptr() for t in load._device.counters] == counters  # zeroed in place: captured graphs add to them


def test_the_first_count_inside_a_capture_is_refused(monkeypatch):
    """The counters' zero fills would be captured and replayed: an eager forward must make them first."""
    import infer_parallel_ep.load as load_module

    monkeypatch.setattr(load_module, "capturing", lambda: True)
    with pytest.raises(RuntimeError, match="eager forward first"):
        ExpertLoad(num_experts=4, world_size=2).add_routing(torch.tensor([[0, 1]]))


def test_a_padded_step_counts_only_its_own_rows():
    """A step replaying a piecewise graph is padded to the captured size: only the first ``step_rows`` rows count."""
    load = ExpertLoad(num_experts=4, world_size=2)
    load.set_step_rows(3)  # before the counters exist: nothing to tell (they are made by the first count)
    load.add_routing(torch.tensor([[0, 1]]))
    load.reset()
    load.set_step_rows(2)
    padded = torch.tensor([[0, 2], [1, 3], [3, 2], [3, 3]])  # two real rows, then padding rows' routing
    load.add_routing(padded, padded=True)
    got = load.describe()
    assert got["entries_per_expert"] == [1, 1, 1, 1] and got["entries_per_rank"] == [2, 2]
    assert got["tokens_per_rank"] == [2, 2] and got["num_tokens"] == 2 and got["num_dispatches"] == 1
    load.add_routing(padded)  # an eager step: every row is its own
    got = load.describe()
    assert got["entries_per_expert"] == [2, 2, 3, 5] and got["num_tokens"] == 6 and got["num_dispatches"] == 2


@pytest.mark.parametrize("dispatch", ["all_to_all", "all_reduce"])
def test_both_dispatches_let_decode_steps_replay_cuda_graphs(tiny_checkpoint, dispatch):
    """The all-to-all's split sizes are read on the host, so a captured step runs the all-reduce path."""
    from infer_core.models.source import read_model_config, resolve_model_source
    from infer_core.platform import make_runtime_context

    from infer_parallel_ep.strategy import ExpertParallelStrategy

    settings = load_settings(model=str(tiny_checkpoint("mixtral")), device="cpu", expert_parallel_size=2,
                             expert_parallel_dispatch=dispatch)
    ctx = make_runtime_context(settings, read_model_config(resolve_model_source(settings.model)))
    assert ExpertParallelStrategy(ctx).supports_cuda_graphs is True
    # prefill and mixed steps: piecewise graphs under all_reduce; all_to_all's run eagerly, on slices
    assert ExpertParallelStrategy(ctx).supports_piecewise_cuda_graphs is (dispatch == "all_reduce")
