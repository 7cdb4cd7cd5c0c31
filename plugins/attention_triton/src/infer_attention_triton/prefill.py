"""Prefill/extend: variable-length query chunks attending causally to their paged context.

One launch covers every request with more than one query token: its queries sit at positions
``[seq_len - query_len, seq_len)`` and see every cached key before them (a prefix-cache hit or
earlier chunks) plus the chunk itself, whose K/V were written to the cache first. Online softmax
over key tiles; keys that every query of a tile sees are processed without a mask, the diagonal
tiles with one.

An FP8 cache is read as in decode_kernel.py: its values cast to float16 (``FP8_AS``; a float32 query's dtype), the
query (clamped to float16's range) and the probabilities with them, so both dots run in float16 with no
conversion through float32; ``k_scale`` folded into the softmax scale on the host, ``v_scale`` (None otherwise,
like ``KV_FP8``) multiplying the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_attention_triton.tiles import PrefillTiles, dot_precision, is_interpreted

LOG2E = 1.4426950408889634


@triton.jit
def _attend(
    q,
    m_i,
    l_i,
    acc,
    k_base,
    stride_cache_kv,
    stride_cache_block,
    stride_cache_tok,
    block_table,
    lo,
    hi,
    q_pos,
    scale_log2,
    sliding_window,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """Online softmax of the query tile over keys [lo, hi); returns the running (m, l, acc)."""
    dims = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        if PAGE_SIZE % BLOCK_N == 0:
            page = tl.load(block_table + start // PAGE_SIZE).to(tl.int64)
        else:
            page = tl.load(block_table + keys // PAGE_SIZE, mask=keys < hi, other=0).to(tl.int64)
        rows = page * stride_cache_block + (keys % PAGE_SIZE) * stride_cache_tok
        if CAUSAL_MASK:
            k = tl.load(k_base + rows[:, None] + dims[None, :], mask=(keys < hi)[:, None], other=0.0)
            v = tl.load(k_base + stride_cache_kv + rows[:, None] + dims[None, :], mask=(keys < hi)[:, None], other=0.0)
        else:
            k = tl.load(k_base + rows[:, None] + dims[None, :])
            v = tl.load(k_base + stride_cache_kv + rows[:, None] + dims[None, :])
        if KV_FP8:  # exact: every e4m3 value is a bfloat16, float16 and float32 value
            k, v = k.to(q.dtype), v.to(q.dtype)
        if UPCAST:  # the interpreter's dot reads bfloat16 operands as raw bits: multiply in float32
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = s * scale_log2
        if CAUSAL_MASK or USE_WINDOW:
            visible = keys[None, :] <= q_pos[:, None]
            if USE_WINDOW:
                visible = visible & (keys[None, :] > q_pos[:, None] - sliding_window)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows that have seen no visible key yet (padding rows, window edges) keep m = -inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if UPCAST:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


# Where a step's prompts start in the batch, how many query tiles it has and its block table's row stride (a draft
# model's tables are as wide as the step's longest row) vary by step: no kernel variant per value (Triton
# specialises integers equal to 1 or divisible by 16), which a server's first requests waited on.
@triton.jit(do_not_specialize=["sliding_window", "first_req", "num_m_tiles", "stride_bt_req"])
def _prefill_kernel(
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    out_ptr,
    scale_log2,
    sliding_window,
    first_req,
    num_m_tiles,
    stride_q_t,
    stride_q_h,
    stride_cache_kv,
    stride_cache_block,
    stride_cache_tok,
    stride_cache_h,
    stride_bt_req,
    stride_out_t,
    stride_out_h,
    v_scale,  # an FP8 cache's V scale; None otherwise
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    KV_FP8: tl.constexpr,
    FP8_AS: tl.constexpr,  # the dtype an FP8 cache's tiles are converted to: float16, or a float32 query's
    CLAMP_Q: tl.constexpr,  # FP8_AS is float16 and the query is not
):
    tile_m = num_m_tiles - 1 - tl.program_id(0)  # the longest (most keys) tiles start first
    head = tl.program_id(1)
    req = first_req + tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    query_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    m_begin = tile_m * BLOCK_M
    if m_begin >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - query_len
    offs_m = m_begin + tl.arange(0, BLOCK_M)
    row_mask = offs_m < query_len
    q_pos = context_len + offs_m
    dims = tl.arange(0, HEAD_DIM)
    tokens = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + tokens[:, None] * stride_q_t + head * stride_q_h + dims[None, :], mask=row_mask[:, None], other=0.0
    )
    if KV_FP8 and not UPCAST:
        if CLAMP_Q:  # to float16's range
            q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0)
        q = q.to(FP8_AS)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    block_table = block_tables_ptr + req.to(tl.int64) * stride_bt_req
    k_base = cache_ptr + (head // GROUP) * stride_cache_h
    first_pos = context_len + m_begin
    end = tl.minimum(first_pos + BLOCK_M, seq_len)  # one past the last key any row of the tile sees
    diagonal = first_pos // BLOCK_N * BLOCK_N  # keys below it are visible to every row (causally)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(first_pos - sliding_window + 1, 0) // BLOCK_N * BLOCK_N
    m_i, l_i, acc = _attend(
        q,
        m_i,
        l_i,
        acc,
        k_base,
        stride_cache_kv,
        stride_cache_block,
        stride_cache_tok,
        block_table,
        lo,
        diagonal,
        q_pos,
        scale_log2,
        sliding_window,
        HEAD_DIM,
        BLOCK_N,
        PAGE_SIZE,
        False,
        USE_WINDOW,
        DOT_PRECISION,
        UPCAST,
        KV_FP8,
    )
    m_i, l_i, acc = _attend(
        q,
        m_i,
        l_i,
        acc,
        k_base,
        stride_cache_kv,
        stride_cache_block,
        stride_cache_tok,
        block_table,
        tl.maximum(diagonal, lo),
        end,
        q_pos,
        scale_log2,
        sliding_window,
        HEAD_DIM,
        BLOCK_N,
        PAGE_SIZE,
        True,
        USE_WINDOW,
        DOT_PRECISION,
        UPCAST,
        KV_FP8,
    )
    if KV_FP8:
        acc = acc * v_scale
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out = out_ptr + tokens[:, None] * stride_out_t + head * stride_out_h + dims[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def prefill_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    first_req: int,
    num_reqs: int,
    max_query_len: int,
    tiles: PrefillTiles,
    sliding_window: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Causal attention for requests ``[first_req, first_req + num_reqs)`` of the flat batch.

    ``q``/``out`` are ``[num_tokens, num_heads, head_dim]`` indexed by ``query_start_loc``; the
    K/V of every query token must already be in ``kv_cache``. ``max_query_len`` (a host int)
    sizes the grid: programs past a request's own length return at once. A float8 e4m3 ``kv_cache``
    holds K / ``k_scale`` and V / ``v_scale``; other caches ignore the scales.
    """
    if num_reqs == 0:
        return
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, page_size = kv_cache.shape[3], kv_cache.shape[2]
    num_m_tiles = triton.cdiv(max_query_len, tiles.block_m)
    kv_fp8 = kv_cache.dtype == torch.float8_e4m3fn
    _prefill_kernel[(num_m_tiles, num_heads, num_reqs)](
        q,
        kv_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        scale * LOG2E * k_scale if kv_fp8 else scale * LOG2E,
        sliding_window or 0,
        first_req,
        num_m_tiles,
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        v_scale if kv_fp8 else None,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        PAGE_SIZE=page_size,
        USE_WINDOW=sliding_window is not None,
        DOT_PRECISION=dot_precision(q.dtype),
        UPCAST=is_interpreted(),
        KV_FP8=kv_fp8,
        FP8_AS=tl.float32 if q.dtype == torch.float32 else tl.float16,
        CLAMP_Q=kv_fp8 and q.dtype == torch.bfloat16,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
