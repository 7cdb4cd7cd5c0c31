"""The mixture-of-experts kernels against their torch references, in the interpreter on the CPU: the experts'
grouped GEMMs (``fused/moe_gemm.py``) against ``experts_torch``, the one-launch grouping of entries by expert
(``fused/moe_align.py``) against ``align_by_expert`` (whose invariants are checked here too), the one-launch
router (``fused/moe_route.py``) against ``route``."""

from __future__ import annotations

import pytest
import torch

from infer_core.layers.fused.moe_align import moe_align
from infer_core.layers.fused.moe_gemm import choose_tiles, combine_entries, fused_experts
from infer_core.layers.fused.moe_route import moe_route
from infer_core.layers.moe import UnquantizedMoEMethod, experts_torch, route
from infer_core.layers.moe.align import align_by_expert, max_slots
from infer_core.layers.moe.routing import local_ids


SHAPES = [  # (tokens, experts, top-k, hidden, intermediate), reaching every tile set of choose_tiles
    (1, 4, 2, 48, 40),  # one token: blocks of one entry
    (7, 8, 2, 64, 32),
    (40, 2, 1, 48, 40),  # 20 entries an expert: 32-row blocks
    (70, 4, 3, 80, 24),  # 52 entries an expert: 64 x 64 tiles, a K tail on both GEMMs
    (140, 2, 2, 48, 40),  # 140 entries an expert: the widest tiles
]


def _experts(num_experts: int, hidden: int, inter: int, dtype: torch.dtype, device: str, seed: int):
    generator = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=generator) * hidden**-0.5
    down = torch.randn(num_experts, hidden, inter, generator=generator) * inter**-0.5
    return gate_up.to(device, dtype), down.to(device, dtype)


def _routing(num_tokens: int, num_experts: int, top_k: int, renormalize: bool, device: str, seed: int):
    generator = torch.Generator().manual_seed(seed + 1)
    logits = torch.randn(num_tokens, num_experts, generator=generator).to(device)
    return route(logits, top_k, renormalize)


def assert_close_to_float32_experts(out, x, gate_up, down, weights, ids) -> None:
    """``out`` against the torch path in float32 from the same (rounded) values: the kernels round their
    intermediate once, so float32 within 1e-5 and bfloat16 within 1% in norm."""
    assert out.shape == x.shape and out.dtype == x.dtype
    expected = experts_torch(x.float(), gate_up.float(), down.float(), weights, ids)
    if x.dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    else:
        error = float((out.float() - expected).norm() / expected.norm())
        assert error < 1e-2, f"bfloat16 experts off the float32 reference by {error:.2e}"


@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 4, 2), (6, 8, 2), (40, 4, 3), (3, 16, 4)])
def test_align_groups_every_entry_once_in_blocks_of_one_expert(num_tokens, num_experts, top_k, device):
    _, ids = _routing(num_tokens, num_experts, top_k, False, device, num_tokens)
    num_entries = ids.numel()
    blocks = align_by_expert(ids, num_experts, 16)
    sorted_ids, expert_ids = blocks.sorted_ids.cpu(), blocks.expert_ids.cpu()
    num_padded = int(blocks.num_padded)
    counts = torch.bincount(ids.reshape(-1).cpu(), minlength=num_experts)
    assert num_padded == int(((counts + 15) // 16 * 16).sum())
    assert sorted_ids.numel() == max_slots(num_entries, num_experts, 16) >= num_padded
    assert sorted(sorted_ids[sorted_ids < num_entries].tolist()) == list(range(num_entries))
    assert bool((sorted_ids[num_padded:] == num_entries).all())
    flat = ids.reshape(-1).cpu()
    for block in range(num_padded // 16):
        entries = sorted_ids[block * 16:(block + 1) * 16]
        entries = entries[entries < num_entries]
        assert bool((flat[entries.long()] == expert_ids[block]).all())
        assert entries.tolist() == sorted(entries.tolist())


def test_align_leaves_out_the_experts_of_other_ranks(device):
    ids = torch.tensor([[0, 2], [2, 1], [2, 2], [1, 0]], device=device)  # 2 = not this rank's
    blocks = align_by_expert(ids, 2, 16)
    kept = blocks.sorted_ids[blocks.sorted_ids < ids.numel()].tolist()
    assert sorted(kept) == [0, 3, 6, 7]
    assert int(blocks.num_padded) == 32 and blocks.expert_ids[:2].tolist() == [0, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k,hidden,inter", SHAPES)
def test_fused_experts_match_the_torch_path(dtype, num_tokens, num_experts, top_k, hidden, inter, device):
    gate_up, down = _experts(num_experts, hidden, inter, dtype, device, num_tokens)
    x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(3)).to(device, dtype)
    weights, ids = _routing(num_tokens, num_experts, top_k, True, device, num_tokens)
    tiles = choose_tiles(ids.numel(), num_experts)
    out = fused_experts(x, gate_up, down, weights, align_by_expert(ids, num_experts, tiles.block_m), tiles)
    assert_close_to_float32_experts(out, x, gate_up, down, weights, ids)


def test_entries_of_other_ranks_count_as_zero(device):
    gate_up, down = _experts(4, 32, 16, torch.float32, device, 5)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4)).to(device)
    weights, ids = _routing(5, 6, 2, False, device, 9)  # ids 4 and 5: experts of another rank
    local = torch.where(ids < 4, ids, 4)
    tiles = choose_tiles(ids.numel(), 6)  # the model's experts
    out = fused_experts(x, gate_up, down, weights, align_by_expert(local, 4, tiles.block_m), tiles, local_ids=local)
    torch.testing.assert_close(out, experts_torch(x, gate_up, down, weights, local), rtol=1e-5, atol=1e-5)


def test_the_combine_sums_each_tokens_entries_in_k_order_and_never_reads_another_ranks(device):
    """float32: the sequential sum's bits; an entry of another rank's expert (id >= 4) holds NaN and is not read."""
    g = torch.Generator().manual_seed(5)
    per_entry = torch.randn(9 * 3, 2100, generator=g)  # a column tail past the 1,024-wide blocks
    ids = torch.randint(0, 6, (9, 3), generator=g, dtype=torch.int32)
    expected = torch.zeros(9, 2100)
    for k in range(3):
        expected = expected + torch.where(ids[:, k, None] < 4, per_entry.view(9, 3, -1)[:, k], 0.0)
    per_entry.view(9, 3, -1)[ids >= 4] = float("nan")
    out = combine_entries(per_entry.to(device), 3, ids.to(device), 4)
    assert torch.equal(out.cpu(), expected)
    assert torch.equal(combine_entries(per_entry[:0].to(device), 3), torch.empty(0, 2100))
    with pytest.raises(ValueError, match="num_local=0"):  # ids without the rank's expert count would drop them all
        combine_entries(per_entry.to(device), 3, ids.to(device))
    with pytest.raises(ValueError, match="not \\[tokens x 4"):
        combine_entries(per_entry.to(device), 4)


def test_the_tiles_cover_every_tier_and_follow_the_entries_an_expert_gets():
    """The cases above reach every tile set; an expert-parallel rank passes the model's expert count, so at 256
    tokens of top-8 over 128 experts (16 entries an expert, on one GPU and on a rank of 64) both take the same
    tiles, not the taller ones 2,048 entries over 64 experts would pick."""
    from types import SimpleNamespace

    from infer_core.layers.moe.unquantized import tiles_for

    reached = {choose_tiles(t * k, e) for t, e, k, _, _ in SHAPES}
    assert [t.block_m for t in sorted(reached, key=lambda t: (t.block_m, t.block_n))] == [16, 32, 64, 64]
    assert choose_tiles(2048, 128).block_m == 32 and choose_tiles(2048, 64).block_m == 64
    rank = SimpleNamespace(num_experts=128, num_local_experts=64)  # what a layer of an EP=2 rank says
    assert tiles_for(rank, 2048) == choose_tiles(2048, 128)


def test_mismatched_blocks_are_refused(device):
    gate_up, down = _experts(2, 32, 16, torch.float32, device, 1)
    weights, ids = _routing(3, 2, 1, False, device, 1)
    tiles = choose_tiles(ids.numel(), 2)
    with pytest.raises(ValueError, match="blocks of 32"):
        fused_experts(torch.zeros(3, 32, device=device), gate_up, down, weights, align_by_expert(ids, 2, 32), tiles)


def test_the_method_chooses_the_kernel_where_built_for_it(device, triton_on_cpu):
    layer = torch.nn.Module()
    layer.num_experts = layer.num_local_experts = 4
    method = UnquantizedMoEMethod()
    with torch.device(device):
        method.create_weights(layer, 4, 32, 16, torch.float32)
    assert method.triton
    layer.gate_up_proj.data, layer.down_proj.data = _experts(4, 32, 16, torch.float32, device, 2)
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(2)).to(device)
    weights, ids = _routing(9, 4, 2, True, device, 2)
    expected = experts_torch(x, layer.gate_up_proj, layer.down_proj, weights, ids)
    torch.testing.assert_close(method.apply(layer, x, weights, ids), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_tokens,num_experts,local,top_k,block_m", [
    (1, 128, 128, 8, 16), (5, 8, 8, 2, 16), (37, 6, 6, 3, 32), (128, 128, 128, 8, 16),
    # several programs with other ranks' experts left out, and expert counts that are no power of two
    (128, 128, 64, 8, 16), (100, 60, 30, 8, 16), (127, 6, 3, 3, 32), (64, 512, 512, 8, 16), (0, 128, 128, 8, 16),
    # decode batches past 128 tokens at top-8, up to MAX_ENTRIES
    (300, 128, 64, 8, 16), (512, 128, 128, 8, 16)])
def test_the_one_launch_grouping_equals_the_torch_ops(num_tokens, num_experts, local, top_k, block_m, device):
    _, ids = _routing(max(num_tokens, 1), num_experts, top_k, False, device, num_tokens + num_experts)
    ids = ids[:num_tokens]
    if num_tokens == 37:
        ids = torch.where(ids == 2, num_experts, ids)  # an expert of another rank: left out
    ids = local_ids(ids, 0, local)  # a rank holding the first ``local`` experts: the others' ids left out
    got, want = moe_align(ids, local, block_m), align_by_expert(ids, local, block_m)
    assert torch.equal(got.num_padded, want.num_padded) and torch.equal(got.expert_ids, want.expert_ids)
    assert torch.equal(got.sorted_ids, want.sorted_ids)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 128, 8), (5, 8, 2), (37, 60, 4), (3, 6, 6)])
def test_the_one_launch_router_equals_route(num_tokens, num_experts, top_k, renormalize, device):
    logits = torch.randn(num_tokens, num_experts, generator=torch.Generator().manual_seed(num_experts)).to(device)
    weights, ids = moe_route(logits, top_k, renormalize)
    want_weights, want_ids = route(logits, top_k, renormalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("first,count", [(0, 64), (64, 64), (4, 2)])
def test_the_one_launch_router_gives_a_ranks_local_ids(first, count, device):
    logits = torch.randn(7, 128 if count == 64 else 8, generator=torch.Generator().manual_seed(count)).to(device)
    weights, ids = moe_route(logits, 4, True, local=(first, count))
    want_weights, want_ids = route(logits, 4, True)
    assert torch.equal(ids.long(), local_ids(want_ids, first, count))
    assert set(ids.unique().tolist()) <= set(range(count + 1)) and (ids == count).any()
    torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-7)


def test_gate_up_tiles_hold_what_the_dense_gemvs_tile_holds():
    """A gate and an up tile a K step: together the dense GEMV's one tile (half its columns); Qwen3-30B-A3B's one
    and two tokens (8 and 16 entries of 768 columns, K=2048) take 2 x 2048 at 4 warps."""
    from infer_core.layers.fused.gemv_tiles import GemvConfig, choose_config
    from infer_core.layers.fused.moe_gemv import gate_up_tiles

    for entries in (8, 16):
        assert gate_up_tiles(entries, 768, 2048, 2, 132) == GemvConfig(2, 2048, 4, 1)
    assert choose_config(16 * 768, 1536, 2, 132).block_n == 16  # 16 x 512 (K no power of two: even steps)
    assert gate_up_tiles(16, 768, 1536, 2, 132) == GemvConfig(8, 512, 4, 3)
    assert choose_config(2 * 14336, 4096, 2, 132).block_n == 8  # Mixtral's top-2: the large-K tile, 8 x 1024
    assert gate_up_tiles(2, 14336, 4096, 2, 132) == GemvConfig(4, 1024, 8, 1)


def test_the_router_takes_no_more_rows_than_the_step_has():
    """A decode step's routing is one row at one warp (warp-shuffle reductions); wide steps 16 rows at 4."""
    from infer_core.layers.fused.moe_route import route_tiles

    assert route_tiles(1, 128) == (128, 1, 1)
    assert route_tiles(3, 128) == (128, 4, 1)
    assert route_tiles(300, 128) == (128, 16, 4)
    assert route_tiles(300, 8) == (8, 16, 1)
    assert route_tiles(1, 1000) == (1024, 1, 2)


def test_the_router_reads_bfloat16_logits(device):
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    weights, ids = moe_route(logits, 4, True)
    want_weights, want_ids = route(logits, 4, True)
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k,hidden,inter", [
    (1, 4, 2, 48, 40),  # K tails on both launches (48 and 40 columns: no power of two)
    (2, 16, 4, 64, 32),  # two tokens, possibly sharing an expert
    (1, 8, 8, 32, 96),  # every expert routed
])
def test_decode_gemv_experts_match_the_torch_path(dtype, num_tokens, num_experts, top_k, hidden, inter, device):
    from infer_core.layers.fused.moe_gemv import moe_gemv_experts

    gate_up, down = _experts(num_experts, hidden, inter, dtype, device, num_tokens + hidden)
    x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(8)).to(device, dtype)
    weights, ids = _routing(num_tokens, num_experts, top_k, True, device, hidden)
    out = moe_gemv_experts(x, gate_up, down, weights, ids)
    assert_close_to_float32_experts(out, x, gate_up, down, weights, ids)


def test_decode_gemv_entries_of_other_ranks_count_as_zero(device):
    from infer_core.layers.fused.moe_gemv import moe_gemv_experts

    gate_up, down = _experts(4, 32, 16, torch.float32, device, 5)
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(4)).to(device)
    weights, ids = _routing(2, 6, 3, False, device, 9)
    local = torch.where(ids < 4, ids, 4)  # ids 4 and 5: experts of another rank
    assert bool((local == 4).any()) and bool((local < 4).any())
    out = moe_gemv_experts(x, gate_up, down, weights, local)
    torch.testing.assert_close(out, experts_torch(x, gate_up, down, weights, local), rtol=1e-5, atol=1e-5)
    nowhere = moe_gemv_experts(x, gate_up, down, weights, torch.full_like(ids, 4))
    assert bool((nowhere == 0).all())


def test_decode_gemv_takes_one_token_or_few_entries_among_many_experts():
    from infer_core.layers.fused.moe_gemv import MAX_ENTRIES, use_moe_gemv

    assert use_moe_gemv(1, 8, 128) and use_moe_gemv(2, 8, 128) and not use_moe_gemv(3, 8, 128)  # 24 > 16 entries
    assert use_moe_gemv(1, 2, 8) and not use_moe_gemv(2, 2, 8)  # Mixtral: two tokens would share experts
    assert not use_moe_gemv(0, 8, 128) and not use_moe_gemv(1, MAX_ENTRIES + 1, 1024)


def test_the_method_runs_the_gemv_at_decode_sizes(device, triton_on_cpu, monkeypatch):
    from infer_core.layers.fused import moe_align, moe_gemm

    layer = torch.nn.Module()
    layer.num_experts = layer.num_local_experts = 16
    method = UnquantizedMoEMethod()
    with torch.device(device):
        method.create_weights(layer, 16, 32, 24, torch.float32)
    layer.gate_up_proj.data, layer.down_proj.data = _experts(16, 32, 24, torch.float32, device, 6)
    grouped = []
    monkeypatch.setattr(moe_gemm, "fused_experts", lambda *a, **kw: grouped.append(1))
    monkeypatch.setattr(moe_align, "moe_align", lambda *a, **kw: grouped.append(1))
    for num_tokens in (1, 2):
        x = torch.randn(num_tokens, 32, generator=torch.Generator().manual_seed(num_tokens)).to(device)
        weights, ids = _routing(num_tokens, 16, 2, True, device, num_tokens)
        expected = experts_torch(x, layer.gate_up_proj, layer.down_proj, weights, ids)
        torch.testing.assert_close(method.apply(layer, x, weights, ids), expected, rtol=1e-5, atol=1e-5)
    assert grouped == []
