"""The experts of a mixture-of-experts layer at decode sizes: two GEMV launches over the (token, k) entries, no grouping.

At a token or two a step, each routed expert meets one entry: its weights are read once and multiplied by one
row, so the layer is a read of the routed experts' bytes. The grouped GEMMs (``moe_gemm.py``) pad each entry to
a ``BLOCK_M``-row block, launch the grouping first, and give each block's weight tile to a few programs; here,
as in the dense GEMV (``gemv.py``), each program owns ``BLOCK_N`` rows of one entry's expert and walks the
whole of K, reading the entry's expert id on the device (no grouping, no host sync: a CUDA graph replays it for
any routing):

- gate_up: program (entry, column block) sums ``x[token] . W_gate[e, j]`` and ``x[token] . W_up[e, j]`` for its
  columns ``j`` and stores ``silu(gate) * up``, rounded once to the model dtype, as the entry's intermediate row;
- down: program (token, column block) loads, each K step, the tiles of all the token's top-k experts at once (one
  ``[slots, BLOCK_N, BLOCK_K]`` load, so the experts' weights stream together), sums each against its entry's
  intermediate row, and stores the routing-weighted sum over the top-k, in float32, rounded once: the token's
  output row, with no per-entry rows and no separate top-k sum.

The gate_up launch waits on the router before reading an id. The down launch reads them before its PDL wait (and
asks L2 for its experts' first K step meanwhile, while gate_up still streams): a PDL launch starts only after
every program of the launch before it has passed its own wait, and gate_up's wait returned only once every launch
before it, the ids' writer among them, had completed. The rows it sums are gate_up's, read after the wait.

8-bit weights (int8 or float8 e4m3, with one float32 scale a weight row) are converted to float32 as they load
and each row's sum is multiplied by the row's scale after the K loop; their tiles are the model dtype's (the
same values a thread), half the bytes.

An entry whose expert is another rank's (id ``num_local``) computes nothing and adds nothing. Tiles come from the
dense GEMV's rule (``gemv_tiles.choose_config``) on each launch's whole output; the gate_up program loads a gate
and an up tile each K step, so each has half the columns, and the down program splits its K step over the top-k
slots. Where two entries share an expert (more tokens, few experts) its weights are read twice:
:func:`use_moe_gemv` says where that does not happen or costs little.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.gemv import prefetch_w_to_l2
from infer_core.layers.fused.gemv_tiles import L2_LINE_BYTES, GemvConfig, choose_config, num_sms
from infer_core.layers.fused.moe_gemm import scaled_weights
from infer_core.layers.fused.pdl import pdl_enter

MAX_ENTRIES = 16  # decode steps: more entries run the grouped GEMMs (4 tokens of top-8 measured no faster here)


def use_moe_gemv(num_tokens: int, top_k: int, num_experts: int) -> bool:
    """Whether a step of ``num_tokens`` runs these GEMVs: one token (its top-k experts are distinct, so each is
    read once), or few entries among many experts (sharing an expert, re-read from L2 or at worst once more, is
    rare), up to ``MAX_ENTRIES``."""
    num_entries = num_tokens * top_k
    return 0 < num_entries <= MAX_ENTRIES and (num_tokens == 1 or 4 * num_entries <= num_experts)


@triton.jit
def _load_row(ptr, k, K, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(ptr + k).to(tl.float32)
    return tl.load(ptr + k, mask=k < K, other=0.0).to(tl.float32)


@triton.jit
def _w_tile(w_ptrs, mask, MASKED: tl.constexpr, SCALED: tl.constexpr):
    """A weight tile in float32, zero where ``mask`` is off (with MASKED); an 8-bit tile's masked lanes are zeroed
    after the conversion rather than by a float ``other`` on the 8-bit load, as the W8 GEMV does."""
    if not MASKED:
        return tl.load(w_ptrs).to(tl.float32)
    if not SCALED:
        return tl.load(w_ptrs, mask=mask, other=0.0).to(tl.float32)
    return tl.where(mask, tl.load(w_ptrs, mask=mask).to(tl.float32), 0.0)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, ids_ptr, out_ptr, s_ptr, num_local, I, K, stride_xm, stride_we, stride_wn,
                    stride_om, stride_se, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr, SCALED: tl.constexpr, USE_PDL: tl.constexpr):
    """``out[e, j] = silu(x[e // TOP_K] . W[id(e), j]) * (x[e // TOP_K] . W[id(e), I + j])`` for this block's j;
    SCALED: W is 8-bit, ``s[id(e), row]`` its rows' scales."""
    entry = tl.program_id(0)
    pdl_enter(USE_PDL)  # the ids are the router's output: wait for it before any load
    expert = tl.load(ids_ptr + entry).to(tl.int64)
    if expert >= num_local:  # another rank's expert: the down launch leaves the entry out
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(cols, I - 1).to(tl.int64)  # past I: row I-1 again, never stored
    offs_k = tl.arange(0, BLOCK_K)
    gate_ptrs = w_ptr + expert * stride_we + (rows * stride_wn)[:, None] + offs_k[None, :]
    up_ptrs = gate_ptrs + I * stride_wn
    x_row = x_ptr + (entry // TOP_K).to(tl.int64) * stride_xm
    gate = tl.zeros([BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        k = k0 + offs_k
        xk = _load_row(x_row, k, K, EVEN_K)
        in_k = (k < K)[None, :]
        gate += tl.sum(_w_tile(gate_ptrs, in_k, not EVEN_K, SCALED) * xk[None, :], axis=1)
        up += tl.sum(_w_tile(up_ptrs, in_k, not EVEN_K, SCALED) * xk[None, :], axis=1)
        gate_ptrs += BLOCK_K
        up_ptrs += BLOCK_K
    if SCALED:
        scales = s_ptr + expert * stride_se + rows
        gate *= tl.load(scales)
        up *= tl.load(scales + I)
    act = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + entry.to(tl.int64) * stride_om + cols, act.to(out_ptr.dtype.element_ty), mask=cols < I)


@triton.jit
def _down_kernel(a_ptr, w_ptr, ids_ptr, weights_ptr, out_ptr, s_ptr, num_local, H, K, stride_am, stride_we,
                 stride_wn, stride_om, stride_se, TOP_K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr, PREFETCH_LINES: tl.constexpr,
                 SCALED: tl.constexpr, USE_PDL: tl.constexpr):
    """``out[t, j] = sum_k weight[t, k] * (a[t * TOP_K + k] . W[id(t, k), j])`` for this block's j: a K step loads
    the tiles of all the token's top-k experts at once (``[SLOTS, BLOCK_N, BLOCK_K]``, SLOTS the next power of two),
    and the weighted sum over k is taken from the float32 sums, rounded once; another rank's experts add nothing.
    The ids are read, and the first ``PREFETCH_LINES`` lines of each W row asked of L2, before the PDL wait: see
    the module's note."""
    token = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, SLOTS)
    entries = token * TOP_K + slots
    experts = tl.load(ids_ptr + entries, mask=slots < TOP_K, other=num_local).to(tl.int64)
    valid = experts < num_local
    experts = tl.where(valid, experts, 0)  # a row of expert 0 in bounds, masked off below
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(cols, H - 1).to(tl.int64)
    if PREFETCH_LINES > 0:
        w_rows = (experts * stride_we)[:, None] + (rows * stride_wn)[None, :]
        prefetch_w_to_l2(w_ptr, tl.reshape(w_rows, [SLOTS * BLOCK_N]), K, PREFETCH_LINES)
    pdl_enter(USE_PDL)  # before reading the gate_up launch's rows
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = (w_ptr + (experts * stride_we)[:, None, None] + (rows * stride_wn)[None, :, None]
              + offs_k[None, None, :])
    a_ptrs = a_ptr + (entries * stride_am)[:, None] + offs_k[None, :]
    acc = tl.zeros([SLOTS, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        if EVEN_K:
            w_mask, a_mask = valid[:, None, None], valid[:, None]
        else:
            in_k = k0 + offs_k < K
            w_mask, a_mask = valid[:, None, None] & in_k[None, None, :], valid[:, None] & in_k[None, :]
        w = _w_tile(w_ptrs, w_mask, True, SCALED)
        a = tl.load(a_ptrs, mask=a_mask, other=0.0).to(tl.float32)
        acc += tl.sum(w * a[:, None, :], axis=2)
        w_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
    if SCALED:  # each slot's rows' scales (an invalid slot's expert 0: its weight is zero below)
        acc *= tl.load(s_ptr + (experts * stride_se)[:, None] + rows[None, :])
    weights = tl.load(weights_ptr + entries, mask=valid, other=0.0)
    out = tl.sum(acc * weights[:, None], axis=0)
    tl.store(out_ptr + token * stride_om + cols, out.to(out_ptr.dtype.element_ty), mask=cols < H)


def gate_up_tiles(num_entries: int, inter: int, hidden: int, element_size: int, sms: int) -> GemvConfig:
    """The dense GEMV's tiles for ``num_entries * inter`` columns of K ``hidden``, for a program that loads a gate
    and an up tile each K step, which together hold what the dense GEMV's one tile holds: half its columns (it has
    4 or more) at its warps. At one token of Qwen3-30B-A3B 2 x 2048 at 4 warps, faster than 4 x 2048 at 8."""
    cfg = choose_config(num_entries * inter, hidden, element_size, sms)
    return GemvConfig(cfg.block_n // 2, cfg.block_k, cfg.num_warps, cfg.num_stages)


def down_tiles(num_tokens: int, top_k: int, hidden: int, inter: int, element_size: int, sms: int) -> GemvConfig:
    """The dense GEMV's tiles for ``num_tokens * hidden`` columns of K ``top_k * inter`` (a token's entries side by
    side), a K step split over the top-k slots: each slot's tile is ``block_k / slots`` wide, at most ``inter``."""
    slots = triton.next_power_of_2(top_k)
    cfg = choose_config(num_tokens * hidden, slots * inter, element_size, sms)
    block_k = min(max(16, cfg.block_k // slots), triton.next_power_of_2(inter))
    return GemvConfig(cfg.block_n, block_k, cfg.num_warps, 2 if block_k < inter else 1)


def down_prefetch_lines(cfg: GemvConfig, inter: int, element_size: int, pdl: bool) -> int:
    """L2 lines of each expert row the down launch asks for before its PDL wait: its first K step (0 without PDL,
    where the launch before has drained when this one starts)."""
    if not pdl:
        return 0
    return triton.next_power_of_2(triton.cdiv(min(inter, cfg.block_k) * element_size, L2_LINE_BYTES.value))


def moe_gemv_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, gate_up_scale: torch.Tensor | None = None,
                     down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` with ``e = topk_ids[t, k]``.

    ``x`` [T, H]; ``gate_up`` [E, 2I, H] (gate rows, then up rows); ``down`` [E, H, I]; ``topk_weights``
    [T, top_k] float32; ``topk_ids`` [T, top_k], ids from ``E`` on naming experts of other ranks (zero here).
    ``gate_up_scale`` [E, 2I] and ``down_scale`` [E, H] (float32, contiguous rows): given with 8-bit weights.
    """
    num_tokens, top_k = topk_ids.shape
    num_experts, two_inter, hidden = gate_up.shape
    inter = two_inter // 2
    if x.shape != (num_tokens, hidden) or down.shape != (num_experts, hidden, inter) or two_inter != 2 * inter:
        raise ValueError(f"x {tuple(x.shape)}, gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)} and topk_ids "
                         f"{tuple(topk_ids.shape)} do not fit: gate_up must be [E, 2I, H] and down [E, H, I] for x "
                         "[T, H]")
    if gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError("the MoE GEMV reads weight rows as contiguous: pass contiguous expert weights")
    scaled = scaled_weights(gate_up, down, gate_up_scale, down_scale)
    x = x if x.stride(1) == 1 else x.contiguous()
    num_entries = num_tokens * top_k
    ids = topk_ids.reshape(-1)
    weights = topk_weights.reshape(-1).to(torch.float32)
    out = torch.empty((num_tokens, hidden), dtype=x.dtype, device=x.device)
    if num_entries == 0:
        return out.zero_()
    inter_rows = torch.empty((num_entries, inter), dtype=x.dtype, device=x.device)
    sms = num_sms(x.device)
    pdl = use_pdl(x)
    tile_bytes = x.element_size() if scaled else gate_up.element_size()  # 8-bit: the model dtype's tiles
    cfg = gate_up_tiles(num_entries, inter, hidden, tile_bytes, sms)
    _gate_up_kernel[(num_entries, triton.cdiv(inter, cfg.block_n))](
        x, gate_up, ids, inter_rows, gate_up_scale if scaled else gate_up, num_experts, inter, hidden, x.stride(0),
        gate_up.stride(0), gate_up.stride(1), inter_rows.stride(0), gate_up_scale.stride(0) if scaled else 0,
        TOP_K=top_k, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=hidden % cfg.block_k == 0,
        NUM_STAGES=cfg.num_stages, SCALED=scaled, USE_PDL=pdl, launch_pdl=pdl, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    cfg = down_tiles(num_tokens, top_k, hidden, inter, tile_bytes, sms)
    _down_kernel[(num_tokens, triton.cdiv(hidden, cfg.block_n))](
        inter_rows, down, ids, weights, out, down_scale if scaled else down, num_experts, hidden, inter,
        inter_rows.stride(0), down.stride(0), down.stride(1), out.stride(0), down_scale.stride(0) if scaled else 0,
        TOP_K=top_k, SLOTS=triton.next_power_of_2(top_k), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=inter % cfg.block_k == 0, NUM_STAGES=cfg.num_stages,
        PREFETCH_LINES=down_prefetch_lines(cfg, inter, down.element_size(), pdl), SCALED=scaled, USE_PDL=pdl,
        launch_pdl=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
