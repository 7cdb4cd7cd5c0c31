"""The CPU's C kernels against the torch code they replace: paged decode attention (``layers/cpu_attention.py``)
against the torch backend's gather + SDPA, the residual add + RMSNorm and the rotary (``layers/cpu_elementwise.py``)
and the SiLU-and-mul (``layers/cpu_activation.py``) against the layers' torch references."""

from __future__ import annotations

import pytest
import torch

from infer_core.builtin.attention_torch import TorchAttentionBackend
from infer_core.interfaces import AttentionLayer, BatchMetadata
from infer_core.layers import cpu_attention, cpu_elementwise
from infer_core.layers.norm import ResidualRMSNorm
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig

pytestmark = pytest.mark.skipif(cpu_attention.load() is None or cpu_elementwise.load() is None,
                                reason="no C compiler for the CPU kernels here")


def _decode_batch(seq_lens: list[int], block_size: int, num_blocks: int, gen: torch.Generator) -> BatchMetadata:
    rows = len(seq_lens)
    per_row = max(-(-n // block_size) for n in seq_lens) + 1
    tables = torch.randperm(num_blocks, generator=gen)[: rows * per_row].view(rows, per_row).int()
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    slots = torch.stack([tables[r, (n - 1) // block_size] * block_size + (n - 1) % block_size
                         for r, n in enumerate(seq_lens)]).int()
    starts = torch.arange(rows + 1, dtype=torch.int32)
    return BatchMetadata(rows, rows, rows, 1, max(seq_lens), block_size, starts, seq, tables, slots, starts, seq)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim,window,seq_lens", [
    (9, 3, 64, None, [1, 17, 40, 5, 64, 33]), (4, 4, 32, None, [1, 17, 40, 5, 64, 33]),
    (8, 2, 128, 20, [1, 17, 40, 5, 64, 33]), (9, 3, 64, None, [50]), (8, 2, 64, 7, [3, 30])])
def test_paged_decode_kernel_is_gather_and_sdpa(dtype, heads, kv_heads, head_dim, window, seq_lens):
    """Batches of 6 rows (a row per work item) and of 1-2 (a KV head per item), with and without a window."""
    gen = torch.Generator().manual_seed(heads * head_dim + len(seq_lens))
    block_size, num_blocks = 16, 64
    metadata = _decode_batch(seq_lens, block_size, num_blocks, gen)
    rows = metadata.num_reqs
    kv_cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    # q as the model hands it over: a view into a wider row (q then k heads), heads contiguous
    qk = torch.randn(rows, heads + kv_heads, head_dim, generator=gen).to(dtype)
    q = qk[:, :heads]
    k = torch.randn(rows, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(rows, kv_heads, head_dim, generator=gen).to(dtype)
    layer = AttentionLayer(0, heads, kv_heads, head_dim, head_dim**-0.5, window)
    ctx = type("Ctx", (), {"device": "cpu", "dtype": str(dtype).removeprefix("torch.")})()
    paged = TorchAttentionBackend(ctx)
    assert paged.cpu_kernel is not None
    reference = TorchAttentionBackend(ctx)
    reference.cpu_kernel = None  # the gather + SDPA path
    expected_cache = kv_cache.clone()
    expected = reference.forward(layer, q, k, v, expected_cache, metadata)
    got = paged.forward(layer, q, k, v, kv_cache, metadata)
    assert torch.equal(kv_cache, expected_cache)  # the step's K/V written alike
    assert got.shape == expected.shape and got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert (got.float() - expected.float()).abs().max().item() < tolerance


def test_paged_decode_kernel_takes_head_dims_of_its_vectors_only():
    cache = torch.empty(2, 4, 16, 2, 64)
    assert cpu_attention.supports(torch.float32, cache, 64)
    assert not cpu_attention.supports(torch.float32, cache, 40)  # the torch backend gathers for SDPA instead
    assert not cpu_attention.supports(torch.bfloat16, cache, 64)  # a cache in another dtype (FP8: dequantized)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("scalar_only", [False, True], ids=["vectors", "scalar"])
@pytest.mark.parametrize("width", [96, 583])
def test_add_rms_norm_kernel_is_the_torch_norm(dtype, with_residual, scalar_only, width):
    """Both compiled paths (AVX-512 where this CPU has it, and the scalar loops), rows of whole and partial
    16-lane vectors."""
    gen = torch.Generator().manual_seed(3)
    norm = ResidualRMSNorm(width, 1e-6, dtype=dtype)
    assert norm.cpu_kernels is not None
    norm.cpu_kernels = cpu_elementwise.load(scalar_only=scalar_only)
    assert norm.cpu_kernels is not None
    norm.weight.data.copy_(torch.rand(width, generator=gen) + 0.5)
    wide = (torch.randn(7, width + 32, generator=gen) * 3).to(dtype)
    x = wide[:, :width]  # rows with a stride, as a projection's slice hands them
    residual = torch.randn(7, width, generator=gen).to(dtype) if with_residual else None
    got, got_residual = norm(x, residual)
    expected, expected_residual = norm.forward_torch(x, residual) if with_residual else (norm.forward_torch(x), x)
    assert torch.equal(got_residual, expected_residual)
    # the sum of squares in another order: within an ulp of torch's norm before the (exact) dtype rounding
    tolerance = 2e-6 if dtype == torch.float32 else 8e-3
    assert ((got.float() - expected.float()).abs() <= tolerance * expected.float().abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("scalar_only", [False, True], ids=["vectors", "scalar"])
def test_rotary_kernel_rotates_in_place_as_the_torch_rotary(dtype, partial, scalar_only):
    """Both compiled paths; half a rotation of 16 (one vector) and of 8 (a partial one)."""
    gen = torch.Generator().manual_seed(4)
    rope = RopeConfig(theta=1e4, partial_rotary_factor=partial)
    rotary = RotaryEmbedding(32, rope, 256, 256)
    assert rotary.cpu_kernels is not None
    rotary.cpu_kernels = cpu_elementwise.load(scalar_only=scalar_only)
    assert rotary.cpu_kernels is not None
    qkv = torch.randn(5, (4 + 2 * 2) * 32, generator=gen).to(dtype)
    q, k = qkv[:, :128].view(5, 4, 32), qkv[:, 128:192].view(5, 2, 32)  # views into the projection's output
    positions = torch.tensor([0, 3, 17, 200, 255], dtype=torch.int32)
    expected_q, expected_k = rotary.forward_torch(positions, q.clone(), k.clone())
    v_before = qkv[:, 192:].clone()
    got_q, got_k = rotary(positions, q, k)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()  # in place
    assert torch.equal(qkv[:, 192:], v_before)
    tolerance = 1e-6 if dtype == torch.float32 else 0.0  # bfloat16: every rounding as torch's ops round
    for got, expected in ((got_q, expected_q), (got_k, expected_k)):
        assert (got.float() - expected.float()).abs().max().item() <= tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scalar_only", [False, True], ids=["vectors", "scalar"])
def test_silu_and_mul_kernel_is_the_torch_activation(dtype, scalar_only):
    """Rows of a gate_up output (a view with a wider row stride, as a fused layer may hand it), values over silu's
    whole range, and its edges: -inf, huge negatives (0), huge positives (x), inf, NaN, subnormal products; both
    compiled paths (700 columns: whole 16-lane vectors and a partial one)."""
    from infer_core.layers import cpu_activation
    from infer_core.layers.activation import SiluAndMul

    gen = torch.Generator().manual_seed(11)
    wide = (torch.randn(300, 2 * 700 + 8, generator=gen) * 6).to(dtype)
    x = wide[:, : 2 * 700]
    x[0, :14] = torch.tensor([float("-inf"), -1e30, -100.0, -88.8, -88.7, -88.5, -88.4, -87.5, 0.0, 87.5, 88.9, 1e30,
                              float("inf"), float("nan")])
    x[1, :4], x[1, 700:704] = 1.0, torch.tensor([1e-39, -3e-39, 5e-40, 2e-38])  # products below float32's normals
    library = cpu_activation.load(scalar_only=scalar_only)
    assert library is not None
    assert cpu_activation.takes(x) and x.stride(0) == 2 * 700 + 8
    got, expected = cpu_activation.silu_and_mul(library, x), SiluAndMul().forward_torch(x)
    assert got.shape == expected.shape == (300, 700) and got.dtype == dtype
    assert torch.equal(got.isnan(), expected.isnan())
    finite = expected.isfinite()
    assert torch.equal(got[~finite & ~expected.isnan()], expected[~finite & ~expected.isnan()])
    g, e = got[finite].double(), expected[finite].double()
    if dtype == torch.bfloat16:  # silu rounded to bfloat16, then the product: torch's roundings, bit for bit
        assert torch.equal(g, e)
    else:  # its exponential within 2 float32 ulps of the exact one, torch's within its own
        assert ((g - e).abs() <= 1e-6 * e.abs() + 1e-30).all()


def test_the_activation_layer_runs_the_kernel_on_the_cpu():
    from infer_core.layers.activation import SiluAndMul

    layer = SiluAndMul()
    assert layer.cpu_kernel is not None
    x = torch.randn(4, 64).bfloat16()
    assert torch.equal(layer(x), layer.forward_torch(x))


def test_without_a_working_compiler_the_layers_keep_their_torch_code(monkeypatch, caplog, tmp_path):
    """No compiler found, or a build that fails: ``compiled`` says why and returns None (the callers' torch path)."""
    from infer_core.layers import cpu_build

    build = cpu_build.compiled.__wrapped__  # past the per-process cache
    monkeypatch.setattr(cpu_build, "_compiler", lambda: None)
    assert build("none_here", "void f(void) {}", (("f", ()),)) is None
    monkeypatch.setattr(cpu_build, "_compiler", lambda: "/nonexistent/cc")
    monkeypatch.setattr(cpu_build, "cache_root", lambda: tmp_path)
    with caplog.at_level("WARNING", logger="infer_core.layers.cpu_build"):
        assert build("broken", "void f(void) {}", (("f", ()),)) is None
    assert "the torch code runs instead" in caplog.text
