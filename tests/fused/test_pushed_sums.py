"""Partial sums pushed by the row-parallel GEMV and added by their reader, ranks simulated in one process.

Each rank's memory is a tensor here (``infer_core.testing.local_push_targets``); every rank's GEMV
pushes before any rank reads, as the ranks cannot run at once in the interpreter. What must hold:
the pushed sum is the all-reduce's (float32: exactly the torch sum of the plain GEMVs' outputs); the
norm + GEMV that adds the partial sums in its prologue gives the bits of the same launch on the summed
tensor; rounds repeat (each push writes its round into every word it stores, the reader waits for it); and a
raised ``abort`` lets a reader through when a rank never pushes. The all-reduce kernel (``all_reduce_pushed``)
pushes a tensor itself and adds every rank's: its sum is the readers' on every rank, round after round.
"""

from __future__ import annotations

import threading

import pytest
import torch

from infer_core.builtin.quant_none import UnquantizedLinearMethod
from infer_core.interfaces import Communicator, ParallelContext
from infer_core.layers.fused.gemv import GemvConfig, gemv, gemv_push
from infer_core.layers.fused.norm_gemv import rms_norm_gemv
from infer_core.layers.fused.pushed_sums import all_gather_pushed, all_reduce_pushed, lookup_all_reduce, sum_pushed
from infer_core.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from infer_core.layers.norm import RMSNorm
from infer_core.layers.partial_sums import PartialSums, reduced
from infer_core.testing import local_push_targets

EPS = 1e-6
MAX_ROWS = 8
N, K_IN, N_NEXT = 40, 24, 36  # the row-parallel layer's output (the hidden size), its input, the next GEMV's


def _rounds(target, num_rows: int) -> list[int]:
    """The rounds in the words of the first ``num_rows`` rows of every slot in ``target`` (this rank's memory)."""
    words = target.slots[:, :num_rows].cpu()
    return sorted({int(r) for r in ((words >> 32) & 0xFFFFFFFF).flatten()})


def _slot_rounds(target) -> list[list[int]]:
    return [sorted({int(r) for r in ((slot >> 32) & 0xFFFFFFFF).flatten()}) for slot in target.slots.cpu()]


def _rank_inputs(world: int, num_rows: int, dtype, device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(num_rows, K_IN, generator=gen).to(device, dtype) for _ in range(world)]
    ws = [(torch.randn(N, K_IN, generator=gen) / K_IN**0.5).to(device, dtype) for _ in range(world)]
    return xs, ws


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("num_rows", [1, 2])
def test_pushed_sum_is_the_sum_of_the_plain_gemvs(world, num_rows, device):
    dtype = torch.float32  # one rounding fewer than bfloat16: the torch sum is the exact reference
    targets = local_push_targets(world, MAX_ROWS, N, dtype, device)
    for round_ in (1, 2, 3):
        xs, ws = _rank_inputs(world, num_rows, dtype, device, seed=round_ * 10 + world)
        for rank, target in enumerate(targets):
            gemv_push(xs[rank], ws[rank], target)
        expected = sum(gemv(x, w) for x, w in zip(xs, ws))  # rank order, float32: the kernel's sum
        for target in targets:
            got = reduced(PartialSums(target, (num_rows, N)))
            assert torch.equal(got, expected), f"round {round_}, rank {target.rank}"
            assert _rounds(target, num_rows) == [round_]  # every word every rank pushed here is of this round
            assert _rounds(target, MAX_ROWS)[0] == 0 or num_rows == MAX_ROWS  # rows not pushed keep round 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("silu", [False, True], ids=["gemv", "gemv-silu"])
@pytest.mark.parametrize("num_rows", [1, 2])
def test_norm_gemv_adds_pushed_partial_sums_as_the_all_reduce_would(num_rows, silu, dtype, device):
    world = 2
    gen = torch.Generator().manual_seed(num_rows + 5 * silu)
    residual = torch.randn(num_rows, N, generator=gen).to(device, dtype)
    norm_weight = (1 + 0.2 * torch.randn(N, generator=gen)).to(device, dtype)
    weight = (torch.randn(2 * N_NEXT if silu else N_NEXT, N, generator=gen) / N**0.5).to(device, dtype)
    targets = local_push_targets(world, MAX_ROWS, N, dtype, device)
    for round_ in (1, 2):
        xs, ws = _rank_inputs(world, num_rows, dtype, device, seed=round_)
        for rank, target in enumerate(targets):
            gemv_push(xs[rank], ws[rank], target)
        summed = sum_pushed(targets[0], num_rows)  # the all-reduced tensor, as every rank has it
        expected, expected_residual = rms_norm_gemv(summed, norm_weight, EPS, weight, None, residual, silu=silu)
        for target in targets:
            got, got_residual = rms_norm_gemv(PartialSums(target, (num_rows, N)), norm_weight, EPS, weight, None,
                                              residual, silu=silu)
            assert torch.equal(got, expected) and torch.equal(got_residual, expected_residual), target.rank


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_pushing_gemv_adds_every_ranks_partial_sums_with_add(world, dtype, device):
    """Mode ``gemv``: one rank's pushing GEMV (the others pushed first: the ranks are not concurrent here) returns
    the sum over the ranks, the bits every other rank's reader finds; in float32 the torch sum of the plain GEMVs."""
    targets = local_push_targets(world, MAX_ROWS, N, dtype, device, mode="gemv")
    for round_, num_rows in enumerate((1, 2, 1, MAX_ROWS), start=1):
        xs, ws = _rank_inputs(world, num_rows, dtype, device, seed=round_ * 7 + world)
        runner = round_ % world
        for rank in range(world):
            if rank != runner:
                assert gemv_push(xs[rank], ws[rank], targets[rank]) is None
        got = gemv_push(xs[runner], ws[runner], targets[runner], add=True)
        assert got.shape == (num_rows, N) and got.dtype == dtype
        for rank in range(world):
            if rank != runner:
                assert torch.equal(sum_pushed(targets[rank], num_rows), got), (round_, rank)
        assert _rounds(targets[runner], num_rows) == [round_]
        if dtype == torch.float32:
            assert torch.equal(got, sum(gemv(x, w) for x, w in zip(xs, ws))), round_


@pytest.mark.parametrize("num_rows", [1, 3])
def test_several_adding_programs_cover_every_row(num_rows, device):
    """1280 values a row: five adding programs of ``ADD_BLOCK`` (256) at one row, fifteen at three rows.

    On a GPU only: the interpreter runs a launch's programs one after another, so there one program adds every
    value (``adding_block``); on a GPU an adding program waits for words that programs after it store."""
    if device == "cpu":
        pytest.skip("the interpreter runs programs one at a time: one program adds every value there")
    n, dtype = 1280, torch.bfloat16
    targets = local_push_targets(2, MAX_ROWS, n, dtype, device, mode="gemv")
    gen = torch.Generator().manual_seed(num_rows)
    xs = [torch.randn(num_rows, K_IN, generator=gen).to(device, dtype) for _ in range(2)]
    ws = [(torch.randn(n, K_IN, generator=gen) / K_IN**0.5).to(device, dtype) for _ in range(2)]
    gemv_push(xs[1], ws[1], targets[1])
    got = gemv_push(xs[0], ws[0], targets[0], add=True)
    assert torch.equal(got, sum_pushed(targets[1], num_rows))
    with pytest.raises(ValueError, match="narrow the tiles"):
        gemv_push(xs[0], ws[0], targets[0], add=True, config=GemvConfig(1024, 32, 4, 1))


def test_pushing_gemv_that_adds_lets_through_on_abort(device):
    targets = local_push_targets(2, MAX_ROWS, N, torch.float32, device, mode="gemv")
    xs, ws = _rank_inputs(2, 1, torch.float32, device, seed=8)
    targets[0].abort.fill_(1)
    gemv_push(xs[0], ws[0], targets[0], add=True)  # rank 1 never pushes: returns (garbage) instead of waiting
    assert _slot_rounds(targets[0]) == [[0, 1], [0]]


def test_a_raised_abort_lets_the_reader_through_when_a_rank_never_pushes(device):
    targets = local_push_targets(2, MAX_ROWS, N, torch.float32, device)
    xs, ws = _rank_inputs(2, 1, torch.float32, device, seed=7)
    gemv_push(xs[0], ws[0], targets[0])  # rank 1 is dead: it never pushes
    targets[0].abort.fill_(1)
    sum_pushed(targets[0], 1)  # returns (garbage) instead of waiting forever
    assert _slot_rounds(targets[0]) == [[0, 1], [0]]  # rank 0's row 0 is of round 1; rank 1 never pushed


def test_the_reader_waits_for_the_rank_that_has_not_pushed_yet(device):
    """A reader started before the last rank's push returns only after it, with the sum of this round."""
    if device != "cpu":
        pytest.skip("ranks simulated in one process run one after the other on a GPU stream")
    targets = local_push_targets(2, MAX_ROWS, N, torch.bfloat16, device)
    xs, ws = _rank_inputs(2, 1, torch.bfloat16, device, seed=11)
    for rank, target in enumerate(targets):  # round 1, read by nobody: rank 1's words there are stale next round
        gemv_push(xs[rank], ws[rank], target)
    xs, ws = _rank_inputs(2, 1, torch.bfloat16, device, seed=12)
    gemv_push(xs[0], ws[0], targets[0])
    result = {}
    reader = threading.Thread(target=lambda: result.setdefault("sum", sum_pushed(targets[0], 1)))
    reader.start()
    reader.join(timeout=1.0)
    assert reader.is_alive(), "the reader took rank 1's words of the last round for this one"
    gemv_push(xs[1], ws[1], targets[1])
    reader.join(timeout=60)
    assert not reader.is_alive(), "the reader did not see rank 1's push"
    assert torch.equal(result["sum"], sum_pushed(targets[0], 1))  # this round's words, as a later read finds them
    expected = gemv(xs[0], ws[0]).float() + gemv(xs[1], ws[1]).float()  # not round 1's: other inputs
    torch.testing.assert_close(result["sum"].float(), expected, rtol=2e-2, atol=2e-2)


def test_push_target_that_does_not_fit_is_refused(device):
    target = local_push_targets(2, 2, N, torch.float32, device)[0]  # slots of 2 rows
    x = torch.randn(3, K_IN, device=device)
    with pytest.raises(ValueError, match="cannot take 3 rows"):
        gemv_push(x, torch.randn(N, K_IN, device=device), target)
    with pytest.raises(ValueError, match="cannot take"):
        gemv_push(x[:1], torch.randn(N + 1, K_IN, device=device), target)
    with pytest.raises(ValueError, match="pass a norm weight"):
        rms_norm_gemv(PartialSums(target, (1, N)), None, EPS, torch.randn(4, N, device=device))


def _push_as_is(x, target):
    """Push ``x`` itself as a rank's partial sums: the GEMV of x by the identity, exact in every dtype."""
    gemv_push(x, torch.eye(x.shape[-1], dtype=x.dtype, device=x.device), target)


def _runner_rounds(targets, row_counts, n: int, dtype, gen, run):
    """Rounds of ``row_counts`` rows: every rank but the runner (the round's number modulo the ranks) pushes its x
    as is, then the runner calls ``run(x, target)`` (the ranks are not concurrent here).
    Yields ``(round, every rank's x, runner, run's result)``."""
    device = targets[0].slots.device
    for round_, num_rows in enumerate(row_counts, start=1):
        xs = [torch.randn(num_rows, n, generator=gen).to(device, dtype) for _ in targets]
        runner = round_ % len(targets)
        for rank, target in enumerate(targets):
            if rank != runner:
                _push_as_is(xs[rank], target)
        yield round_, xs, runner, run(xs[runner], targets[runner])


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_all_reduce_kernel_adds_every_ranks_values(world, dtype, device):
    """Each round one rank runs the all-reduce kernel (the others pushed first: the ranks are not concurrent
    here); its result is the sum the other ranks' readers find, and in float32 the exact torch sum."""
    targets = local_push_targets(world, MAX_ROWS, N, dtype, device)
    gen = torch.Generator().manual_seed(world)
    for round_, xs, runner, got in _runner_rounds(targets, (1, 3, 2, 1, MAX_ROWS), N, dtype, gen, all_reduce_pushed):
        num_rows = xs[0].shape[0]
        assert got.shape == xs[runner].shape and got.dtype == dtype
        for rank in range(world):
            if rank != runner:  # the runner's push reached every rank with this round
                assert torch.equal(sum_pushed(targets[rank], num_rows), got), (round_, rank)
        assert _rounds(targets[runner], num_rows) == [round_]
        if dtype == torch.float32:
            assert torch.equal(got, sum(xs)), round_  # rank order, float32, one rounding: torch's sum


def test_all_reduce_kernel_lets_through_on_abort_and_refuses_what_does_not_fit(device):
    targets = local_push_targets(2, 2, N, torch.float32, device)
    x = torch.randn(1, N, device=device)
    targets[0].abort.fill_(1)
    all_reduce_pushed(x, targets[0])  # rank 1 never pushes: returns (garbage) instead of waiting forever
    assert _slot_rounds(targets[0]) == [[0, 1], [0]]
    with pytest.raises(ValueError, match="cannot all-reduce 3 rows"):
        all_reduce_pushed(torch.randn(3, N, device=device), targets[0])
    with pytest.raises(ValueError, match="cannot all-reduce"):
        all_reduce_pushed(torch.randn(1, N, device=device, dtype=torch.bfloat16), targets[0])


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_all_gather_kernel_puts_every_ranks_values_side_by_side(world, dtype, device):
    """The LM head's all-gather: each round one rank runs the kernel (the others pushed first: the ranks are not
    concurrent here) and gets every rank's rows side by side in rank order, the bits each rank had."""
    n = 200  # the logits a rank holds: at 8 rows, 2 programs of 128 columns (the second's partly past n)
    targets = local_push_targets(world, MAX_ROWS, n, dtype, device)
    gen = torch.Generator().manual_seed(10 + world)
    for round_, xs, runner, got in _runner_rounds(targets, (1, MAX_ROWS, 3, 1), n, dtype, gen, all_gather_pushed):
        num_rows = xs[0].shape[0]
        assert got.shape == (num_rows, world * n) and torch.equal(got, torch.cat(xs, dim=-1)), round_
        assert _rounds(targets[runner], num_rows) == [round_]  # its own push reached every rank with the round
        for rank in range(world):
            if rank != runner:
                assert _rounds(targets[rank], num_rows) == [round_], (round_, rank)


def test_all_gather_kernel_lets_through_on_abort_and_refuses_what_does_not_fit(device):
    targets = local_push_targets(2, 2, N, torch.bfloat16, device)
    targets[0].abort.fill_(1)
    got = all_gather_pushed(torch.ones(1, N, device=device, dtype=torch.bfloat16), targets[0])  # rank 1 never pushes
    assert got.shape == (1, 2 * N) and torch.equal(got[:, :N].float().cpu(), torch.ones(1, N))
    with pytest.raises(ValueError, match="cannot all-gather 3 rows"):
        all_gather_pushed(torch.randn(3, N, device=device, dtype=torch.bfloat16), targets[0])
    with pytest.raises(ValueError, match=r"\[rows, n\]"):
        all_gather_pushed(torch.randn(1, 1, N, device=device, dtype=torch.bfloat16), targets[0])


@pytest.mark.parametrize("world", [2, 3])
def test_lookup_all_reduce_is_the_whole_tables_embedding(world, device):
    """The vocabulary-parallel embedding in one launch: each rank's slice of the table looked up (zeros for tokens
    it does not hold), pushed and added; every row is the whole table's, bit for bit, on every rank. The other
    ranks push their masked lookups first (the ranks are not concurrent here)."""
    vocab, dtype = 50, torch.bfloat16
    per_rank = -(-vocab // world)
    table = torch.randn(vocab, N, generator=torch.Generator().manual_seed(world)).to(device, dtype)
    targets = local_push_targets(world, MAX_ROWS, N, dtype, device)
    for round_, ids in enumerate(([3], [0, vocab - 1, per_rank, per_rank - 1], [vocab - 1] * MAX_ROWS), start=1):
        ids = torch.tensor(ids, device=device)
        runner = round_ % world
        for rank in range(world):
            start, end = rank * per_rank, min((rank + 1) * per_rank, vocab)
            if rank != runner:
                held = (ids >= start) & (ids < end)
                _push_as_is(torch.where(held[:, None], table[ids.clamp(0, vocab - 1)], 0).to(dtype), targets[rank])
        start, end = runner * per_rank, min((runner + 1) * per_rank, vocab)
        got = lookup_all_reduce(ids, table[start:end].contiguous(), start, end, targets[runner])
        assert torch.equal(got, table[ids]), round_
        for rank in range(world):
            if rank != runner:
                assert torch.equal(sum_pushed(targets[rank], len(ids)), got), (round_, rank)
    with pytest.raises(ValueError, match="1-D integer"):
        lookup_all_reduce(ids[None], table, 0, vocab, targets[0])
    with pytest.raises(ValueError, match="cannot all-reduce 9 rows"):
        lookup_all_reduce(torch.zeros(9, dtype=torch.int64, device=device), table, 0, vocab, targets[0])


class _PushingRank(Communicator):
    """One simulated rank whose row-parallel layers push into ``target``; any all-reduce is a test failure."""

    def __init__(self, rank: int, world_size: int, target) -> None:
        self.rank, self.world_size, self.target = rank, world_size, target

    def push_target(self, site, num_rows, n, dtype):
        return self.target

    def all_reduce(self, x):
        raise AssertionError("a deferred row-parallel output was all-reduced instead of pushed")

    def all_gather(self, x, dim=-1):
        raise AssertionError("unexpected all_gather")

    def gather(self, x, dst=0, dim=-1):
        raise AssertionError("unexpected gather")


def test_row_parallel_layer_pushes_and_the_norm_linear_after_it_adds(device, assert_close_to_reference):
    """RowParallelLinear(defer_reduce=True) -> NormLinear: the layers' path, ranks simulated in one process."""
    from infer_core.layers.fused.gemv_fusion import NormLinear  # left the core; this path moves with the tp plugin

    world, num_rows, dtype = 2, 1, torch.bfloat16  # the GEMV runs in half precision only
    hidden, intermediate = N, 2 * K_IN
    targets = local_push_targets(world, MAX_ROWS, hidden, dtype, device)
    gen = torch.Generator().manual_seed(3)
    down_full = (torch.randn(hidden, intermediate, generator=gen) / intermediate**0.5).to(device, dtype)
    up_full = (torch.randn(2 * N_NEXT, hidden, generator=gen) / hidden**0.5).to(device, dtype)
    x_full = torch.randn(num_rows, intermediate, generator=gen).to(device, dtype)
    residual = torch.randn(num_rows, hidden, generator=gen).to(device, dtype)
    norm = RMSNorm(hidden, EPS, dtype=dtype).to(device)
    norm.weight.data.copy_((1 + 0.2 * torch.randn(hidden, generator=gen)).to(dtype))
    norm.force_triton = True
    ranks = []
    for rank in range(world):
        parallel = ParallelContext(rank, world, _PushingRank(rank, world, targets[rank]))
        kw = dict(bias=False, parallel=parallel, dtype=dtype, prefix="layers.0.mlp.down_proj")
        down = RowParallelLinear(intermediate, hidden, method=UnquantizedLinearMethod(), **kw).to(device)
        down.weight_loader(down.weight, down_full)
        gate_up = MergedColumnParallelLinear(hidden, [N_NEXT], bias=False, method=UnquantizedLinearMethod(),
                                             parallel=ParallelContext.single(), dtype=dtype, prefix="next").to(device)
        gate_up.weight.data.copy_(up_full[:N_NEXT])
        for layer in (down, gate_up):
            layer.method.force_triton = True
        ranks.append((rank, down, NormLinear(norm, gate_up)))
    pushed = [down(x_full[:, rank * K_IN:(rank + 1) * K_IN], defer_reduce=True) for rank, down, _ in ranks]
    assert all(isinstance(p, PartialSums) for p in pushed)
    summed = reduced(pushed[0])
    partials = [gemv(x_full[:, r * K_IN:(r + 1) * K_IN], down_full[:, r * K_IN:(r + 1) * K_IN]) for r in range(world)]
    # one rounding of the float32 sum: the GPU rounds as torch, the interpreter truncates (one step off at most)
    assert_close_to_reference(summed, (partials[0].float() + partials[1].float()).to(dtype), ulps=1)
    for (rank, _, norm_linear), partial in zip(ranks, pushed):
        assert norm_linear.fuses(residual, residual)  # so the partial sums go to the fused launch, not .sum()
        got, got_residual = norm_linear(partial, residual)  # adds the partial sums in the fused launch
        expected, expected_residual = norm_linear(summed, residual)
        assert torch.equal(got, expected) and torch.equal(got_residual, expected_residual), rank
        # without a residual (a first layer) the partial sums are summed first: the sum is the next residual
        got, got_residual = norm_linear(partial, None)
        expected, _ = norm_linear(summed, None)
        assert torch.equal(got, expected) and torch.equal(got_residual, summed), rank


@pytest.mark.parametrize("mode", ["sum", "gemv", "all_reduce"])
def test_row_parallel_layer_in_mode_returns_the_sum(mode, device, assert_close_to_reference):
    """``sum``, ``gemv`` and ``all_reduce`` modes: RowParallelLinear(defer_reduce=True) returns the all-reduced tensor.

    Rank 1 pushes its partial sums first (the ranks are not concurrent here); rank 0's layer then pushes its
    own (its GEMV, or the all-reduce kernel) and adds both, as rank 1's reader does.
    """
    world, num_rows, dtype, intermediate = 2, 1, torch.bfloat16, 2 * K_IN
    targets = local_push_targets(world, MAX_ROWS, N, dtype, device, mode=mode)
    gen = torch.Generator().manual_seed(9)
    down_full = (torch.randn(N, intermediate, generator=gen) / intermediate**0.5).to(device, dtype)
    x_full = torch.randn(num_rows, intermediate, generator=gen).to(device, dtype)
    parts = [x_full[:, r * K_IN:(r + 1) * K_IN] for r in range(world)]
    partials = [gemv(parts[r], down_full[:, r * K_IN:(r + 1) * K_IN]) for r in range(world)]
    gemv_push(parts[1], down_full[:, K_IN:].contiguous(), targets[1])  # rank 1's layer, pushed already
    parallel = ParallelContext(0, world, _PushingRank(0, world, targets[0]))
    down = RowParallelLinear(intermediate, N, bias=False, method=UnquantizedLinearMethod(), parallel=parallel,
                             dtype=dtype, prefix="layers.0.mlp.down_proj").to(device)
    down.weight_loader(down.weight, down_full)
    down.method.force_triton = True
    got = down(parts[0], defer_reduce=True)
    assert isinstance(got, torch.Tensor) and got.shape == (num_rows, N)
    assert torch.equal(got, sum_pushed(targets[1], num_rows))  # rank 1 adds the same bits
    assert_close_to_reference(got, (partials[0].float() + partials[1].float()).to(dtype), ulps=1)
