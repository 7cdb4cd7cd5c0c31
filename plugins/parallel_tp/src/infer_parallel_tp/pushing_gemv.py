"""The row-parallel GEMV that pushes its partial sums to every rank instead of storing them (``pushed_sums.py``).

Its tile is the core decode GEMV's (``infer_core.layers.fused.gemv.gemv_tile``, inlined: the same code, tiles
and constexprs as ``gemv`` would run for this layer), so the partial sums are the bits the plain GEMV would
hand an all-reduce. Each program then stores its tile as this round's words of its rank's slot on every rank
(``push_tile``); in mode ``gemv`` the launch's last programs also wait for every rank's words and add them
(``add_pushed_block``), so the sum comes out of the same launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.gemv import checked_rows, choose_config, gemv_tile, num_sms, tile_constexprs

from infer_parallel_tp.push_target import PushTarget, checked_values_per_word
from infer_parallel_tp.pushed_sums import add_pushed_block, adding_block, push_tile


@triton.jit(do_not_specialize=["num_rows"])
def _pushing_gemv_kernel(x_ptr, w_ptr, bias_ptr, own_slot_ptr, num_rows, N, K, stride_xm, stride_wn, stride_ym,
                         dest_ptrs, slots_ptr, slot_words, sum_ptr, abort_ptr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                         SINGLE_STEP: tl.constexpr, PREFETCH_LINES: tl.constexpr, USE_PDL: tl.constexpr,
                         PUSH_RANKS: tl.constexpr, PUSH_VALUES_PER_WORD: tl.constexpr, ADD_PROGRAMS: tl.constexpr,
                         ADD_BLOCK: tl.constexpr):
    """``x @ W^T`` pushed as this rank's words of a site to every rank (``own_slot_ptr``: this rank's slot here);
    with ``ADD_PROGRAMS`` > 0 the last that many programs then add every rank's words into ``sum_ptr``.

    The arguments are the plain GEMV's, in its order (``bias_ptr`` and ``stride_ym`` unread: a row-parallel
    layer's bias is added once, after the sum), then the push's: with a shorter list the compiler orders the
    parameter loads otherwise, and this kernel's sm_90 PTX would no longer be, instruction for instruction,
    that of the GEMV that pushed from inside the core (``benchmarks/results/tp-pushing-gemv-ptx-*``).
    """
    acc = gemv_tile(x_ptr, w_ptr, bias_ptr, num_rows, N, K, stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                    False, NUM_STAGES, SINGLE_STEP, PREFETCH_LINES, USE_PDL)
    offs_m = tl.arange(0, BLOCK_M)
    round_ = push_tile(acc, offs_m, tl.program_id(0) * BLOCK_N, num_rows, N, dest_ptrs, own_slot_ptr,
                       x_ptr.dtype.element_ty, PUSH_VALUES_PER_WORD, BLOCK_M, BLOCK_N, PUSH_RANKS)
    if ADD_PROGRAMS > 0:  # the last programs (the last to start) add the ranks' words: no sum launch
        block = tl.program_id(0) - (tl.num_programs(0) - ADD_PROGRAMS)
        if block >= 0:
            add_pushed_block(slots_ptr, slot_words, sum_ptr, block, num_rows, N, round_, abort_ptr, PUSH_RANKS,
                             x_ptr.dtype.element_ty, PUSH_VALUES_PER_WORD, ADD_BLOCK)


def gemv_push(x: torch.Tensor, weight: torch.Tensor, target: PushTarget, *, config=None,
              add: bool = False) -> torch.Tensor | None:
    """``x @ W^T`` (this rank's partial sums of a row-parallel layer) pushed into ``target``'s slots on every rank.

    Tiles as the core ``gemv``'s for this shape (``config``: others), so the partial sums are the bits the plain
    GEMV would all-reduce. Without ``add`` nothing is returned: the sum is read from ``target``
    (``pushed_sums.sum_pushed``); with it, the launch's last programs wait for every rank's push and return the
    sum, ``[rows, N]`` (mode ``gemv``).
    """
    rows = checked_rows(x, weight, None)
    num_rows, k = rows.shape
    n = weight.shape[0]
    if not target.fits(num_rows, n, x.dtype):
        raise ValueError(f"push target of {target.max_rows} rows of {target.n} {target.dtype} cannot take "
                         f"{num_rows} rows of {n} {x.dtype} partial sums")
    if k == 0:
        raise ValueError("gemv_push needs K >= 1")
    cfg = config or choose_config(n, k, x.element_size(), num_sms(x.device))
    per_word = checked_values_per_word(target)
    if cfg.block_n % per_word:
        raise ValueError(f"{per_word} {x.dtype} values a word: the tiles must be {per_word} columns wide or more, "
                         f"not {cfg.block_n}")
    num_blocks = triton.cdiv(n, cfg.block_n)
    add_block = adding_block(num_rows * n, rows.is_cuda)
    add_programs = triton.cdiv(num_rows * n, add_block) if add else 0
    if add_programs > num_blocks:  # only tiles of over 128 columns: no config of choose_config's
        raise ValueError(f"{num_blocks} programs of {cfg.block_n} columns cannot add {num_rows} rows: narrow the tiles")
    summed = torch.empty((num_rows, n), dtype=x.dtype, device=x.device) if add else None
    _pushing_gemv_kernel[(num_blocks,)](
        rows, weight, weight, target.slots[target.rank], num_rows, n, k, rows.stride(0), weight.stride(0), n,
        target.dest_ptrs, target.slots, target.slots[0].numel(), summed if summed is not None else weight, target.abort,
        PUSH_RANKS=target.world_size, PUSH_VALUES_PER_WORD=per_word, ADD_PROGRAMS=add_programs, ADD_BLOCK=add_block,
        **tile_constexprs(cfg, num_rows, k, rows.element_size(), use_pdl(rows)),
    )
    return summed
