"""q/k norm + rotary that also stores k and v into the paged KV cache, against the two launches it replaces.

The reference is today's path: ``qk_norm_rope_inplace`` without a cache, then a scatter of the rotated
k rows and the v rows to their slots. The fused call must leave q, k, v and the whole cache exactly
(``torch.equal``) as that does. Runs in Triton's interpreter on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig


def make_layers(head_dim: int, dtype: torch.dtype, device: str, *, partial: float = 1.0):
    """(q-norm weight, k-norm weight, rotary) as a Qwen3 attention layer holds them, weights random."""
    q_weight, k_weight = (torch.randn(head_dim, device=device).to(dtype) for _ in range(2))
    rope = RopeConfig(theta=1e6, partial_rotary_factor=partial)
    return q_weight, k_weight, RotaryEmbedding(head_dim, rope, 4096, 4096).to(device)


def fused_qkv(num_tokens, heads, kv_heads, head_dim, dtype, device):
    """(qkv buffer, q view, k view, v view) as the attention layer makes them."""
    qkv = (torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device=device) * 2).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return qkv, *(x.reshape(num_tokens, -1, head_dim) for x in (q, k, v))


def scatter_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """What the attention backends' KV write does: row t to slot ``slot_mapping[t]``, slot -1 skipped."""
    num_blocks, block_size = kv_cache.shape[1:3]
    n = slot_mapping.shape[0]
    keep = (slot_mapping >= 0).nonzero().flatten()
    slots = slot_mapping[keep].long()
    for index, rows in ((0, k[:n][keep]), (1, v[:n][keep])):
        kv_cache[index][slots // block_size, slots % block_size] = rows


def make_cache(num_blocks, block_size, kv_heads, head_dim, dtype, device, *, head_major=False):
    """A random cache (so a stray write shows); ``head_major`` stores it [2, blocks, heads, rows, D] and
    hands out the [2, blocks, rows, heads, D] view, so row and head strides are not the usual ones."""
    if head_major:
        base = torch.randn(2, num_blocks, kv_heads, block_size, head_dim, device=device).to(dtype)
        return base.transpose(2, 3)
    return torch.randn(2, num_blocks, block_size, kv_heads, head_dim, device=device).to(dtype)


def random_slots(num_slots: int, num_blocks: int, block_size: int, device, *, seed: int, skipped=()):
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_slots].to(torch.int32)
    slots[list(skipped)] = -1
    return slots.to(device)


def check_fused_equals_two_step(num_tokens, heads, kv_heads, head_dim, dtype, block_size, device, *, partial=1.0,
                                skipped=(), num_slots=None, head_major=False, block_h=None, slot_dtype=torch.int32):
    torch.manual_seed(num_tokens * 97 + heads * 13 + head_dim + block_size)
    q_weight, k_weight, rotary = make_layers(head_dim, dtype, device, partial=partial)
    qkv, q, k, v = fused_qkv(num_tokens, heads, kv_heads, head_dim, dtype, device)
    positions = torch.randint(0, 4096, (num_tokens,), device=device)
    num_blocks = -(-num_tokens // block_size) + 2
    cache = make_cache(num_blocks, block_size, kv_heads, head_dim, dtype, device, head_major=head_major)
    num_slots = num_tokens if num_slots is None else num_slots
    slots = random_slots(num_slots, num_blocks, block_size, device, seed=num_tokens, skipped=skipped).to(slot_dtype)
    args = (q_weight, k_weight, 1e-6, rotary.cos_sin_cache, rotary.rot_dim)

    before, ref_qkv, ref_cache = cache.clone(), qkv.clone(), cache.clone()
    ref_q, ref_k, ref_v = (x.view(num_tokens, -1, head_dim) for x in ref_qkv.split(
        [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1))
    qk_norm_rope_inplace(positions, ref_q, ref_k, *args, block_h=block_h)
    scatter_kv(ref_cache, ref_k, ref_v, slots)

    out_q, out_k = qk_norm_rope_inplace(positions, q, k, *args, block_h=block_h, kv_cache=cache, v=v,
                                        slot_mapping=slots)
    assert out_q is q and out_k is k
    assert torch.equal(qkv, ref_qkv)  # q, k rewritten exactly as before; v untouched
    assert torch.equal(cache, ref_cache)  # the kept tokens' k and v at their slots, nothing else
    assert torch.equal(cache, before) == (not bool((slots >= 0).any()))  # the test sees a write when one is due


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32, 5])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 1), (2, 2)])
def test_stores_k_and_v_exactly_as_the_two_launches(dtype, block_size, heads, kv_heads, device):
    check_fused_equals_two_step(9, heads, kv_heads, 64, dtype, block_size, device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_partial_rotary(dtype, device):
    """head_dim 48, rot_dim 24: the normalised-only channels reach the cache too."""
    check_fused_equals_two_step(7, 3, 1, 48, dtype, 16, device, partial=0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slot_minus_one_and_padding_rows_are_not_stored(dtype, device):
    """Slots -1 (tokens whose KV is not kept) and rows past slot_mapping (padding of a captured batch)."""
    check_fused_equals_two_step(11, 4, 2, 32, dtype, 16, device, skipped=(0, 4, 5), num_slots=8)
    check_fused_equals_two_step(3, 4, 2, 32, dtype, 16, device, skipped=(0, 1, 2))  # nothing stored


def test_head_major_cache_int64_slots_and_one_head_per_program(device):
    """Cache strides that are not the contiguous layout's; block_h=1 gives every k head its own program."""
    check_fused_equals_two_step(6, 4, 2, 32, torch.bfloat16, 16, device, head_major=True, block_h=1,
                                slot_dtype=torch.int64)


def test_a_layer_of_the_runners_cache(device):
    """The runner's caches are views of one [layers, 2, ...] tensor: only this layer's slots change."""
    torch.manual_seed(1)
    q_weight, k_weight, rotary = make_layers(32, torch.bfloat16, device)
    _, q, k, v = fused_qkv(4, 4, 2, 32, torch.bfloat16, device)
    storage = torch.zeros(3, 2, 4, 16, 2, 32, dtype=torch.bfloat16, device=device)
    slots = torch.tensor([17, 3, 40, 63], dtype=torch.int32, device=device)
    qk_norm_rope_inplace(torch.arange(4, device=device), q, k, q_weight, k_weight, 1e-6, rotary.cos_sin_cache,
                         rotary.rot_dim, kv_cache=storage[1], v=v, slot_mapping=slots)
    assert not storage[0].any() and not storage[2].any()
    flat = storage[1].view(2, -1, 2, 32)
    assert torch.equal(flat[0][slots.long()], k) and torch.equal(flat[1][slots.long()], v)
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[slots.long()] = False
    assert not flat[:, untouched].any()


def test_bad_kv_arguments(device):
    q_weight, k_weight, rotary = make_layers(16, torch.float32, device)
    args = (q_weight, k_weight, 1e-6, rotary.cos_sin_cache, rotary.rot_dim)
    positions = torch.zeros(3, dtype=torch.long, device=device)
    q, k, v = (torch.randn(3, h, 16, device=device) for h in (2, 1, 1))
    cache = torch.zeros(2, 4, 16, 1, 16, device=device)
    slots = torch.arange(3, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="go together"):
        qk_norm_rope_inplace(positions, q, k, *args, kv_cache=cache, slot_mapping=slots)
    with pytest.raises(ValueError, match="is not"):
        qk_norm_rope_inplace(positions, q, k, *args, kv_cache=cache[:, :, :, :, :8], v=v, slot_mapping=slots)
    with pytest.raises(ValueError, match="must match k"):
        qk_norm_rope_inplace(positions, q, k, *args, kv_cache=cache.half(), v=v, slot_mapping=slots)
    with pytest.raises(ValueError, match="at most one slot per token"):
        qk_norm_rope_inplace(positions, q, k, *args, kv_cache=cache, v=v,
                             slot_mapping=torch.arange(4, device=device))
    with pytest.raises(ValueError, match="int32/int64"):
        qk_norm_rope_inplace(positions, q, k, *args, kv_cache=cache, v=v, slot_mapping=slots.float())
    assert not cache.any()


# On CUDA, at the shapes of Qwen3-0.6B and Qwen3-8B (q heads, kv heads, head_dim): block sizes of the
# triton/torch backends (16) and of flash-attn (256); 16411 tokens: past 16k, no multiple of any block.
REAL_SHAPES = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
@pytest.mark.parametrize("num_tokens", [1, 7, 256, 2048, 16411])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("block_size", [16, 256])
def test_real_shapes_on_cuda(model, num_tokens, dtype, block_size):
    heads, kv_heads, head_dim = REAL_SHAPES[model]
    check_fused_equals_two_step(num_tokens, heads, kv_heads, head_dim, dtype, block_size, "cuda",
                                skipped=(0,) if num_tokens > 1 else ())


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
def test_replays_in_a_cuda_graph(model):
    """A padded decode batch as the runner captures it: replayed on new qkv, positions and slots, the
    cache and qkv equal the two launches run eagerly on the same inputs."""
    torch.manual_seed(5)
    heads, kv_heads, head_dim = REAL_SHAPES[model]
    num_tokens, num_real, block_size, dtype = 8, 5, 16, torch.bfloat16
    q_weight, k_weight, rotary = make_layers(head_dim, dtype, "cuda")
    args = (q_weight, k_weight, 1e-6, rotary.cos_sin_cache, rotary.rot_dim)
    qkv, q, k, v = fused_qkv(num_tokens, heads, kv_heads, head_dim, dtype, "cuda")
    positions = torch.zeros(num_tokens, dtype=torch.long, device="cuda")
    cache = torch.zeros(2, 32, block_size, kv_heads, head_dim, dtype=dtype, device="cuda")
    slots = torch.full((num_real,), -1, dtype=torch.int32, device="cuda")

    def step():
        qk_norm_rope_inplace(positions, q, k, *args, kv_cache=cache, v=v, slot_mapping=slots)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for seed in (1, 2):
        torch.manual_seed(seed)
        new_qkv = fused_qkv(num_tokens, heads, kv_heads, head_dim, dtype, "cuda")[0]
        new_positions = torch.randint(0, 4096, (num_tokens,), device="cuda")
        new_slots = random_slots(num_real, 32, block_size, "cuda", seed=seed, skipped=(seed,))
        new_cache = torch.randn_like(cache, dtype=torch.float32).to(dtype)
        ref_qkv, ref_cache = new_qkv.clone(), new_cache.clone()
        ref_q, ref_k, ref_v = (x.view(num_tokens, -1, head_dim) for x in ref_qkv.split(
            [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1))
        qk_norm_rope_inplace(new_positions, ref_q, ref_k, *args)
        scatter_kv(ref_cache, ref_k, ref_v, new_slots)
        for buffer, value in ((qkv, new_qkv), (positions, new_positions), (slots, new_slots), (cache, new_cache)):
            buffer.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(qkv, ref_qkv)
        assert torch.equal(cache, ref_cache)
