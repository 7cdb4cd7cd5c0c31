"""What the Triton kernels support, and why they cannot run somewhere; imports neither torch nor triton."""

from __future__ import annotations

import importlib.util

from infer_core.interfaces import AttentionCapabilities, RuntimeContext, kv_cache_dtype_reasons

# Powers of two: the kernels tile head_dim whole, and tl.dot needs at least 16.
HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = ("float16", "bfloat16", "float32")
MAX_GQA_GROUP = 16  # query heads per KV head that one decode program holds
FP8_CAPABILITY = (8, 9)  # Ada / Hopper: the first GPUs with float8 e4m3 conversions

CAPABILITIES = AttentionCapabilities(
    dtypes=DTYPES,
    head_dims=HEAD_DIMS,
    block_size_multiple=16,
    default_block_size=16,
    supports_sliding_window=True,
    supports_cuda_graphs=True,
    supports_prefill_cuda_graphs=True,  # prefill_attention: grid from max_query_len, lengths read on the device
    kv_cache_dtypes=("auto", "fp8"),  # fp8: quantized on write, dequantized on read, inside the kernels
    reads_device_lengths=True,  # the host's max_seq_len only sizes the decode split count
)


def validate_context(ctx: RuntimeContext) -> list[str]:
    """Reasons the Triton backend cannot run for ``ctx`` (empty when it can)."""
    reasons = []
    if importlib.util.find_spec("triton") is None:
        reasons.append("triton is not installed (pip install triton)")
    if not ctx.is_cuda and not ctx.triton_interpret:
        reasons.append("CUDA is not available (on a CPU the kernels run only under TRITON_INTERPRET=1, slowly)")
    if ctx.is_cuda and ctx.cuda_capability is not None and ctx.cuda_capability < (8, 0):
        major, minor = ctx.cuda_capability
        reasons.append(f"the GPU's compute capability {major}.{minor} is below 8.0 (Ampere), which the kernels need")
    if ctx.dtype not in DTYPES:
        reasons.append(f"dtype {ctx.dtype} is not supported (supported: {', '.join(DTYPES)})")
    if ctx.model.head_dim not in HEAD_DIMS:
        supported = ", ".join(map(str, HEAD_DIMS))
        reasons.append(f"head_dim {ctx.model.head_dim} is not supported (supported: {supported})")
    if ctx.model.num_kv_heads and ctx.model.num_heads % ctx.model.num_kv_heads:
        reasons.append(f"{ctx.model.num_heads} query heads do not divide into {ctx.model.num_kv_heads} KV heads")
    elif ctx.model.num_kv_heads and ctx.model.num_heads // ctx.model.num_kv_heads > MAX_GQA_GROUP:
        reasons.append(f"more than {MAX_GQA_GROUP} query heads per KV head are not supported")
    reasons += kv_cache_dtype_reasons(CAPABILITIES, ctx)
    if ctx.settings.kv_cache_dtype == "fp8" and ctx.is_cuda and ctx.cuda_capability is not None \
            and tuple(ctx.cuda_capability) < FP8_CAPABILITY:
        major, minor = ctx.cuda_capability
        reasons.append(f"an FP8 KV cache needs compute capability 8.9 or newer (float8 e4m3 conversions); this GPU "
                       f"is {major}.{minor}: unset INFER_KV_CACHE_DTYPE")
    return reasons
