"""What flash-attn 2 supports, and why it cannot run somewhere; imports neither torch nor flash_attn."""

from __future__ import annotations

import importlib.util

from infer_core.interfaces import AttentionCapabilities, RuntimeContext

INSTALL_HINT = "pip install flash-attn --no-build-isolation"
DTYPES = ("float16", "bfloat16")
# flash-attn 2 compiles kernels up to head_dim 256 and pads any other size to a multiple of 8; a
# padded head_dim would make it copy the whole paged cache, so only multiples of 8 are accepted.
HEAD_DIMS = tuple(range(8, 257, 8))
# Its paged-KV kernels read a block as whole 256-token tiles.
PAGED_BLOCK_MULTIPLE = 256
MIN_CAPABILITY = (8, 0)  # Ampere

CAPABILITIES = AttentionCapabilities(
    dtypes=DTYPES,
    head_dims=HEAD_DIMS,
    block_size_multiple=PAGED_BLOCK_MULTIPLE,
    default_block_size=PAGED_BLOCK_MULTIPLE,
    supports_sliding_window=True,
    supports_cuda_graphs=True,
    reads_device_lengths=True,  # the host's lengths only give flash-attn its maximum lengths
)


def flash_attn_installed() -> bool:
    """Whether ``flash_attn`` can be imported, found without importing it."""
    return importlib.util.find_spec("flash_attn") is not None


def validate_context(ctx: RuntimeContext) -> list[str]:
    """Reasons the flash backend cannot run for ``ctx`` (empty when it can)."""
    reasons = []
    if not flash_attn_installed():
        reasons.append(f"flash_attn is not installed ({INSTALL_HINT})")
    if not ctx.is_cuda:
        reasons.append("CUDA is not available (flash-attn runs only on NVIDIA GPUs)")
    elif ctx.cuda_capability is not None and tuple(ctx.cuda_capability) < MIN_CAPABILITY:
        major, minor = ctx.cuda_capability
        reasons.append(f"the GPU's compute capability {major}.{minor} is below 8.0 (Ampere), which flash-attn 2 needs")
    if ctx.dtype not in DTYPES:
        reasons.append(f"dtype {ctx.dtype} is not supported (flash-attn needs float16 or bfloat16; set INFER_DTYPE)")
    head_dim = ctx.model.head_dim
    if head_dim not in HEAD_DIMS:
        reasons.append(f"head_dim {head_dim} is not supported (flash-attn takes multiples of 8 up to 256)")
    if ctx.settings.kv_cache_dtype not in CAPABILITIES.kv_cache_dtypes:
        reasons.append(f"KV cache dtype {ctx.settings.kv_cache_dtype} (INFER_KV_CACHE_DTYPE) is not supported: "
                       f"flash-attn 2's paged kernels read K and V in the query's dtype and take no dequantization "
                       f"scale (supported: {', '.join(CAPABILITIES.kv_cache_dtypes)})")
    return reasons


def block_size_fits(block_size: int | None) -> bool:
    """Whether a user-set block size (None: unset) is one the paged kernels accept."""
    return block_size is None or block_size % PAGED_BLOCK_MULTIPLE == 0
