"""The KV write: every real token's K/V lands in its slot, slot -1 is skipped, nothing else changes.

``fused/kv_write.py`` is the Triton kernel the Triton and flash attention backends launch (run by
the interpreter on the CPU); ``layers/kv_write.py`` is the torch write of the same layout, and
chooses between the two.
"""

from __future__ import annotations

import pytest
import torch

from infer_core.layers import kv_write as torch_kv_write
from infer_core.layers.fused.kv_write import write_kv


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


@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(1, 64, 16), (2, 96, 16), (8, 128, 64)])
def test_torch_write_stores_what_the_kernel_stores(device, num_kv_heads, head_dim, block_size):
    """The torch write (real tokens only: it has no slot -1) leaves the cache equal to the kernel's."""
    gen = torch.Generator().manual_seed(head_dim)
    num_blocks, num_tokens = 4, 19
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(device)
    key, value = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(device) for _ in range(2))
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(torch.int32).to(device)
    by_kernel, by_torch = cache.clone(), cache.clone()
    write_kv(by_kernel, key, value, slots)
    torch_kv_write.write_kv(by_torch, key, value, slots)
    assert torch.equal(by_torch, by_kernel) and not torch.equal(by_torch, cache)


def test_choose_kv_writer_takes_the_kernel_on_cuda_only():
    assert torch_kv_write.choose_kv_writer(is_cuda=False) is torch_kv_write.write_kv
    assert torch_kv_write.choose_kv_writer(is_cuda=True) is write_kv  # triton imports wherever this test runs
