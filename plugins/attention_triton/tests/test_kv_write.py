"""write_kv: every real token's K/V lands in its slot, slot -1 is skipped, nothing else changes."""

from __future__ import annotations

import pytest
import torch

from infer_attention_triton.kv_write import write_kv


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("num_kv_heads", "head_dim", "block_size"), [(1, 64, 16), (2, 32, 32), (3, 16, 16), (8, 128, 64), (2, 96, 16)]
)
def test_write_kv_matches_indexing(device, dtype, num_kv_heads, head_dim, block_size):
    gen = torch.Generator().manual_seed(num_kv_heads * 1000 + head_dim)
    num_blocks, num_tokens = 5, 23
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    # K and V as views into a fused qkv projection, as the model hands them over (strided rows).
    qkv = torch.randn(num_tokens, 3 * num_kv_heads * head_dim, generator=gen).to(dtype).to(device)
    key = qkv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, 2 * num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(torch.int32)
    slots[[3, 11]] = -1
    expected = cache.clone()
    keep = slots >= 0
    expected[0].view(-1, num_kv_heads, head_dim)[slots[keep].long()] = key[keep.to(device)]
    expected[1].view(-1, num_kv_heads, head_dim)[slots[keep].long()] = value[keep.to(device)]

    write_kv(cache, key, value, slots.to(device))
    assert torch.equal(cache, expected)


def test_write_kv_refuses_mismatched_shapes(device):
    cache = torch.zeros(2, 4, 16, 2, 32, device=device)
    key = torch.zeros(3, 4, 32, device=device)
    with pytest.raises(ValueError, match="kv_cache"):
        write_kv(cache, key, key, torch.zeros(3, dtype=torch.int32, device=device))


def test_write_kv_of_no_tokens_is_a_no_op(device):
    cache = torch.ones(2, 4, 16, 2, 32, device=device)
    key = torch.zeros(0, 2, 32, device=device)
    write_kv(cache, key, key, torch.zeros(0, dtype=torch.int32, device=device))
    assert bool((cache == 1).all())
