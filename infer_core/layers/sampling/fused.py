"""The fused GPU sampling pass: temperature, top-k/top-p cut, min-p, Philox noise and argmax, in one launch.

Tokens are those of the exponential race ``argmax(p / q)`` in its Gumbel form ``z - log(q)``, with
``z = logits / temperature`` and ``q ~ Exp(1)`` from Philox keyed by (row key, position, token);
tokens outside the row's top-k/top-p set (a threshold value plus how many tokens tied at it are
kept, lowest ids first) or below min-p score -inf; greedy rows score their raw logits. Logits may
be bfloat16, float16 or float32, widened exactly in registers. How the kernel avoids scoring every
token exactly is in ``kernels.py``. Importing this module imports triton.

Unseeded rows draw their key inside the kernel from the generator's (seed, Philox offset), which
this module advances by 4 per launch, so a step costs no extra launch for its random keys.
"""

from __future__ import annotations

import functools

import torch
import triton

from infer_core.layers.sampling.kernels import argmax_kernel, count_ties_kernel, sample_kernel
from infer_core.layers.sampling.philox import SMALL_V, seed_key
from infer_core.sampling_params import MIN_SAMPLING_TEMPERATURE

NUM_WARPS = 8
TILE = NUM_WARPS * 32 * 8  # tokens per loop iteration of a program: 8 per thread, 4 per Philox counter
LOGITS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # widened to float32 exactly, in registers
PROGRAMS_PER_SM = 4  # enough programs to keep every SM busy (and the memory system fed)
_GENERATOR_STEP = 4  # Philox offset a launch consumes (CUDA generators advance in multiples of 4)


@functools.cache
def _num_sms(device_index: int | None) -> int:
    if device_index is None:  # the interpreter, on the CPU: few programs, as it runs them one by one
        return 1
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def plan_splits(num_rows: int, vocab_size: int, num_sms: int, num_splits: int | None = None) -> tuple[int, int]:
    """(slices per row, tiles per slice): splits double until the grid fills the GPU a few times over.

    Powers of two keep the number of compiled variants small (the tiles per slice are a constant).
    """
    num_tiles = triton.cdiv(vocab_size, TILE)
    if num_splits is None:
        num_splits = 1
        while num_splits * num_rows < PROGRAMS_PER_SM * num_sms and num_splits < num_tiles:
            num_splits *= 2
    tiles_per_split = triton.cdiv(num_tiles, min(num_splits, num_tiles))
    return triton.cdiv(num_tiles, tiles_per_split), tiles_per_split


def row_counts_per_plan(max_num_rows: int, vocab_size: int, device: torch.device) -> list[int]:
    """The smallest row count of each distinct launch plan for 1..``max_num_rows`` rows.

    The plan's split and tile counts are compile-time constants of the kernels, so a launch at
    each of these row counts compiles every variant those batch sizes meet (a handful: the splits
    are powers of two).
    """
    firsts: dict[tuple[int, int], int] = {}
    for num_rows in range(1, max_num_rows + 1):
        firsts.setdefault(_plan(num_rows, vocab_size, device.index, None), num_rows)
    return sorted(firsts.values())


class _SplitCounters:
    """Per (device, stream): int32 counters, zero between launches (each row's last program resets its own)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}

    def get(self, device: torch.device, num_rows: int) -> torch.Tensor:
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (device.type, device.index, stream)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.numel() < num_rows:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                # zeros allocated in a capture are zeroed only when that graph replays: another graph using
                # them first would read garbage counters. Run the kernel once on this stream before capturing.
                raise RuntimeError("the sampler's split counters for this stream must exist before a CUDA graph "
                                   "capture: launch the kernel once on the capture stream first")
            size = max(num_rows, 256, 0 if buffer is None else 2 * buffer.numel())
            buffer = self.buffers[key] = torch.zeros(size, dtype=torch.int32, device=device)
        return buffer


_COUNTERS = _SplitCounters()  # scratch memory, like a library workspace: no configuration lives here


def generator_base(generator: torch.Generator | None, device: torch.device) -> tuple[int, int]:
    """(Philox key, counter) the kernel derives this launch's unseeded row keys from.

    A CUDA generator gives its seed and offset (read and advanced on the host, no device work); a
    CPU generator (the interpreter's) gives one draw.
    """
    if generator is None and device.type == "cuda":
        generator = torch.cuda.default_generators[device.index if device.index is not None
                                                  else torch.cuda.current_device()]
    if generator is not None and generator.device.type == "cuda":
        offset = generator.get_offset()
        generator.set_offset(offset + _GENERATOR_STEP)
        return seed_key(generator.initial_seed()), offset // _GENERATOR_STEP
    return int(torch.randint(0, 1 << 62, (1,), generator=generator)), 0


@functools.lru_cache(maxsize=64)
def _plan(num_rows: int, vocab_size: int, device_index: int | None, num_splits: int | None) -> tuple[int, int]:
    return plan_splits(num_rows, vocab_size, _num_sms(device_index), num_splits)


def _outputs(logits: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(token ids, per-program best keys, the row counters); the last two only for split rows."""
    num_rows, device = logits.shape[0], logits.device
    out = torch.empty(num_rows, dtype=torch.int64, device=device)
    if num_splits == 1:
        return out, None, None
    partial = torch.empty(num_rows, num_splits, dtype=torch.int64, device=device)
    return out, partial, _COUNTERS.get(device, num_rows)


def _check(logits: torch.Tensor) -> None:
    assert logits.dtype in LOGITS_DTYPES and logits.stride(1) == 1, (logits.dtype, logits.stride())


def fused_argmax(logits: torch.Tensor, num_splits: int | None = None) -> torch.Tensor:
    """Each row's argmax [R] int64 (the first maximum; a NaN counts as the maximum, as torch.argmax says)."""
    _check(logits)
    num_rows, vocab_size = logits.shape
    num_splits, num_tiles = _plan(num_rows, vocab_size, logits.device.index, num_splits)
    out, partial, counters = _outputs(logits, num_splits)
    argmax_kernel[(num_rows, num_splits)](logits, logits.stride(0), out, partial, counters, vocab_size, num_splits,
                                          NUM_TILES=num_tiles, TILE=TILE,
                                          SPLITS_P2=triton.next_power_of_2(num_splits), num_warps=NUM_WARPS)
    return out


def fused_sample(logits: torch.Tensor, temperature: torch.Tensor | float,
                 generator: torch.Generator | None = None,
                 seeds: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                 is_seeded: torch.Tensor | None = None, min_p: torch.Tensor | None = None,
                 threshold: torch.Tensor | None = None, num_ties: torch.Tensor | None = None,
                 num_splits: int | None = None) -> torch.Tensor:
    """Sampled token ids [R] int64 of ``logits`` [R, V] (bfloat16, float16 or float32; unit stride along V).

    ``temperature`` [R] float32, or one float for every row (below MIN_SAMPLING_TEMPERATURE:
    greedy; a cut needs the column). Seeded rows (``is_seeded`` [R] bool) use ``seeds`` [R] int64
    Philox keys at ``positions`` [R] int64; the others a key drawn from ``generator``.
    ``threshold`` [R] float32 / ``num_ties`` [R] int32 describe each row's top-k/top-p set in
    scaled-logit space (see ``thresholds.py``); ``min_p`` [R] float32 (0 = off). ``num_splits``
    overrides the slices per row (tests).
    """
    _check(logits)
    if seeds is not None:
        assert positions is not None and is_seeded is not None
    num_rows, vocab_size = logits.shape
    device = logits.device
    num_splits, num_tiles = _plan(num_rows, vocab_size, device.index, num_splits)
    out, partial, counters = _outputs(logits, num_splits)
    grid = (num_rows, num_splits)
    gen_seed, gen_counter = generator_base(generator, device)
    tie_counts = None
    if threshold is not None and num_splits > 1:
        assert isinstance(temperature, torch.Tensor), "a cut needs the temperature column"
        tie_counts = torch.empty(num_rows, num_splits, dtype=torch.int32, device=device)
        count_ties_kernel[grid](logits, logits.stride(0), temperature, threshold, tie_counts, vocab_size, num_splits,
                                MIN_TEMPERATURE=MIN_SAMPLING_TEMPERATURE, NUM_TILES=num_tiles, TILE=TILE,
                                num_warps=NUM_WARPS)
    row_max = logits.amax(dim=1).float() if min_p is not None else None  # exact: the max is one of the values
    uniform = not isinstance(temperature, torch.Tensor)
    sample_kernel[grid](
        logits, logits.stride(0), out, partial, counters, None if uniform else temperature,
        float(temperature) if uniform else 1.0, seeds, positions, is_seeded, gen_seed, gen_counter, min_p, row_max,
        threshold, num_ties, tie_counts, vocab_size, num_splits,
        UNIFORM_TEMPERATURE=uniform, HAS_SEEDS=seeds is not None, HAS_MIN_P=min_p is not None,
        HAS_THRESHOLD=threshold is not None, MIN_TEMPERATURE=MIN_SAMPLING_TEMPERATURE, SMALL_V=SMALL_V,
        NUM_TILES=num_tiles, NUM_TILES_P2=triton.next_power_of_2(num_tiles), TILE=TILE,
        SPLITS_P2=triton.next_power_of_2(num_splits), NATIVE=not triton.knobs.runtime.interpret, num_warps=NUM_WARPS,
    )
    return out
