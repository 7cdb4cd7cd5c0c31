"""The decode kernel: one query token per request against its paged context, split-K (flash-decoding).

Launched by ``decode.decode_attention``, which checks the arguments and picks the grid.

Each program takes one request, one KV head and one contiguous slice (split) of the context; the
query heads that share that KV head ride along as the rows of one tile, so K and V are read from
memory once. With several splits, the partial results are merged by their log-sum-exp: by the
last split program of each (request, KV head) to finish, found with an atomic counter (one
launch), or by a second kernel (``merge_in_kernel=False``); both run the same merge code, so
their outputs are bit-identical. A split whose slice is empty writes a zero weight and still
counts, so the launch grid depends only on the batch size and the split count, never on the
lengths of this step (CUDA graphs).

Before its PDL wait (``fused/pdl.py``) a program reads only what the launch before it (the layer's KV write) does
not write, the step's lengths, block tables and launch order, and asks L2 for its split's first tile of K and V,
so at short contexts those reads overlap that launch instead of following it. Only L2, which every store reaches,
is asked: the step's new key may still be being written, and the tile's loads after the wait read it as written.

An FP8 cache (float8 e4m3, holding value / scale) is read as its values cast to float16 (``FP8_AS``), and
the query and the probabilities with them, so both dots run in float16: e4m3 pairs convert to float16 in one
instruction, to bfloat16 only through float32, and that conversion, not the halved reads, bounded the kernel;
every e4m3 and bfloat16 query value is a float16 one (the query is clamped to float16's range first).
``k_scale`` is folded into the softmax scale on the host and ``v_scale`` multiplies the output.
``v_scale`` is None for a cache in the model's dtype, a compile-time constant like ``KV_FP8``, so that
launch is the kernel it always was.
"""

from __future__ import annotations

import triton
import triton.language as tl
from infer_core.layers.fused.gemv import prefetch_w_to_l2
from infer_core.layers.fused.pdl import pdl_enter

from infer_attention_triton.split_merge import _merge_splits

LOG2E = 1.4426950408889634
# What a step may vary without a new kernel variant: the split count, the scratch's strides (its capacity grows
# with the batch), the block table's row stride (a draft model's tables are as wide as the step's longest row), the
# window, and the alignment of the index arrays (slices of the step's buffers). Triton would otherwise compile a
# variant per divisibility of each, mid-run, where a server's first requests wait on it.
VARYING_INTS = ["sliding_window", "num_splits", "stride_bt_req", "stride_po_req", "stride_po_h", "stride_po_split",
                "stride_pl_req", "stride_pl_h", "stride_sc_req"]
INDEX_POINTERS = ["block_tables_ptr", "seq_lens_ptr", "req_order_ptr", "split_counts_ptr"]


@triton.jit
def _tile_rows(block_table, keys, key_mask, start, any_key, stride_cache_block, stride_cache_tok,
               BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """The cache offsets of one tile's keys, from the request's block table (``any_key``: the tile starts before
    the split's end, so its page entry exists)."""
    if PAGE_SIZE % BLOCK_N == 0:
        page = tl.load(block_table + start // PAGE_SIZE, mask=any_key, other=0).to(tl.int64)
    else:
        page = tl.load(block_table + keys // PAGE_SIZE, mask=key_mask, other=0).to(tl.int64)
    return page * stride_cache_block + (keys % PAGE_SIZE) * stride_cache_tok


@triton.jit(do_not_specialize=VARYING_INTS, do_not_specialize_on_alignment=INDEX_POINTERS)
def _decode_kernel(
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    req_order_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    split_counts_ptr,
    scale_log2,
    sliding_window,
    num_splits,
    stride_q_t,
    stride_q_h,
    stride_cache_kv,
    stride_cache_block,
    stride_cache_tok,
    stride_cache_h,
    stride_bt_req,
    stride_out_t,
    stride_out_h,
    stride_po_req,
    stride_po_h,
    stride_po_split,
    stride_pl_req,
    stride_pl_h,
    stride_sc_req,
    v_scale,  # an FP8 cache's V scale; None otherwise
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    MERGE: tl.constexpr,  # with IS_SPLIT: the last split program of a (request, KV head) merges its splits
    BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_ORDER: tl.constexpr,
    USE_PDL: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,  # 128-byte lines of a K or V row asked of L2 before the PDL wait (0: none)
    KV_FP8: tl.constexpr,
    FP8_AS: tl.constexpr,  # the dtype an FP8 cache's tiles are converted to: float16, or a float32 query's
    CLAMP_Q: tl.constexpr,  # FP8_AS is float16 and the query is not
):
    # The KV heads vary fastest, then the requests in launch order: programs start roughly in that order
    kv_head = tl.program_id(0)
    req = tl.program_id(1)
    if HAS_ORDER:
        req = tl.load(req_order_ptr + req)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    first_key = 0
    if USE_WINDOW:
        first_key = tl.maximum(seq_len - sliding_window, 0)
    # Splits own whole tiles; tiles start at multiples of BLOCK_N so none straddles a page.
    tiles_lo = first_key // BLOCK_N
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N) - tiles_lo, num_splits)
    lo = (tiles_lo + split * tiles_per_split) * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, seq_len)
    block_table = block_tables_ptr + req.to(tl.int64) * stride_bt_req
    k_base = cache_ptr + kv_head * stride_cache_h
    if PREFETCH_LINES > 0:  # the split's first tile into L2 while the launch before drains: see the module's note
        if lo < hi:  # the tile's keys past hi lie in its pages too: every address is in the cache
            keys = lo + tl.arange(0, BLOCK_N)
            rows = _tile_rows(block_table, keys, keys < hi, lo, True, stride_cache_block, stride_cache_tok, BLOCK_N,
                              PAGE_SIZE)
            prefetch_w_to_l2(k_base, rows, HEAD_DIM, PREFETCH_LINES)
            prefetch_w_to_l2(k_base + stride_cache_kv, rows, HEAD_DIM, PREFETCH_LINES)
    pdl_enter(USE_PDL)  # before any other load or store: see fused/pdl.py

    groups = tl.arange(0, BLOCK_G)
    heads = kv_head * GROUP + groups
    group_mask = groups < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + req.to(tl.int64) * stride_q_t + heads[:, None] * stride_q_h + dims[None, :],
        mask=group_mask[:, None],
        other=0.0,
    )
    if KV_FP8 and not UPCAST:
        if CLAMP_Q:  # to float16's range
            q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0)
        q = q.to(FP8_AS)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_mask = keys < hi
        rows = _tile_rows(block_table, keys, key_mask, start, True, stride_cache_block, stride_cache_tok, BLOCK_N,
                          PAGE_SIZE)
        k = tl.load(k_base + rows[:, None] + dims[None, :], mask=key_mask[:, None], other=0.0)
        v = tl.load(k_base + stride_cache_kv + rows[:, None] + dims[None, :], mask=key_mask[:, None], other=0.0)
        if KV_FP8:  # exact: every e4m3 value is a bfloat16, float16 and float32 value
            k, v = k.to(FP8_AS), v.to(FP8_AS)
        if UPCAST:  # the interpreter's dot reads bfloat16 operands as raw bits: multiply in float32
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = s * scale_log2
        if USE_WINDOW:
            key_mask = key_mask & (keys >= first_key)
        s = tl.where(key_mask[None, :], s, float("-inf"))
        # Every split's first tile holds a visible key, so m_new is finite from the first tile on.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if UPCAST:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if KV_FP8:
        acc = acc * v_scale
    if IS_SPLIT:
        is_empty = l_i == 0.0
        acc = acc / tl.where(is_empty, 1.0, l_i)[:, None]
        lse = tl.where(is_empty, float("-inf"), m_i + tl.log2(tl.where(is_empty, 1.0, l_i)))
        part = part_out_ptr + req.to(tl.int64) * stride_po_req + split * stride_po_split
        tl.store(part + heads[:, None] * stride_po_h + dims[None, :], acc, mask=group_mask[:, None])
        tl.store(part_lse_ptr + req.to(tl.int64) * stride_pl_req + heads * stride_pl_h + split, lse, mask=group_mask)
        if MERGE:
            # The barrier puts every thread's stores above before the release of the count; the acquire
            # of the program that counts last makes all splits' partials visible to it.
            tl.debug_barrier()
            counter = split_counts_ptr + req.to(tl.int64) * stride_sc_req + kv_head
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
                _merge_splits(
                    part_out_ptr, part_lse_ptr, out_ptr, req.to(tl.int64), kv_head, num_splits,
                    stride_po_req, stride_po_h, stride_po_split, stride_pl_req, stride_pl_h, stride_out_t, stride_out_h,
                    GROUP, BLOCK_H, HEAD_DIM, BLOCK_S,
                )  # fmt: skip
                tl.store(counter, 0)  # every split has counted: zero for the next launch (and graph replay)
    else:
        acc = acc / l_i[:, None]
        out = out_ptr + req.to(tl.int64) * stride_out_t + heads[:, None] * stride_out_h + dims[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=group_mask[:, None])
