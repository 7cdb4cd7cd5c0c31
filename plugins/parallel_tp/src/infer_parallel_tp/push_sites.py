"""Where the pushing layers push their partial sums: one site per layer in the symmetric buffer.

A ``PushTarget`` (``push_target.py``) names, for one layer, the slot its kernel fills on every rank;
``pushed_sums.py`` has the kernels and the protocol (each 64-bit word of a slot carries 32 bits of values
and the round of the push that wrote them). This module lays the sites out in the symmetric-memory buffer
after the one-shot all-reduce's bytes, with the peers' addresses taken from the rendezvous, and after them
the LM head's gather site (``all_gather_pushed``: its logits, rank r's slot holding rank r's vocabulary slice):

    slots         int64 [sites, world, max_rows, n / values a word]    slot [s, r]: rank r's partial sums of site s
    gather_slots  int64 [world, max_rows, gather_n / values a word]

Sites are handed out by ``take`` in the order the strategy's ``prepare_model`` walks the model's modules
(the same model on every rank, so the same order), and every site's address tables are built at start,
eagerly: a graph capture cannot copy them to the device. Slots start at zero (round 0) on every rank
before any rank may push (a barrier).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from infer_parallel_tp.push_target import PUSH_MODES, WORD_DTYPE, PushTarget, values_per_word

PUSH_DTYPES = (torch.bfloat16, torch.float16)  # what the decode GEMV runs in
MAX_ROWS = 8  # the GEMV's most rows (infer_core.layers.fused.gemv.MAX_ROWS; that module imports triton)
ALIGN = 16


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclass(frozen=True, slots=True)
class PushLayout:
    """How many sites of how many values, for a model: two sites a layer (o_proj, down_proj) and the embedding's,
    and the LM head's gather site of ``gather_n`` values a row (0: none)."""

    num_sites: int
    hidden_size: int  # n of every site: the row-parallel layers' output
    world_size: int
    dtype: torch.dtype
    max_rows: int = MAX_ROWS
    mode: str = "gemv"  # PushTarget.mode: who adds the pushed values (the pushed_partial_sums_mode setting)
    gather_n: int = 0  # the LM head's logits a rank holds (its vocabulary rows)

    def __post_init__(self) -> None:
        if self.mode not in PUSH_MODES:
            dropped = " (mode fused, the slowest, was dropped)" if self.mode == "fused" else ""
            raise ValueError(f"pushed_partial_sums_mode={self.mode!r} is not one of {', '.join(PUSH_MODES)}"
                             f"{dropped}: use gemv, the default")

    @property
    def words_per_row(self) -> int:
        return self.hidden_size // values_per_word(self.dtype)

    @property
    def sites_nbytes(self) -> int:
        return _aligned(self.num_sites * self.world_size * self.max_rows * self.words_per_row * WORD_DTYPE.itemsize)

    @property
    def nbytes(self) -> int:
        gather_words = self.world_size * self.max_rows * (self.gather_n // values_per_word(self.dtype))
        return self.sites_nbytes + _aligned(gather_words * WORD_DTYPE.itemsize)

    @classmethod
    def for_model(cls, num_layers: int, hidden_size: int, world_size: int, dtype: torch.dtype,
                  mode: str = "gemv", vocab_rows: int = 0) -> PushLayout | None:
        """The layout for a decoder of ``num_layers`` layers (two sites a layer, and one for the vocabulary-parallel
        embedding's lookup) whose LM head holds ``vocab_rows`` rows a rank (its gather site; 0: none); None where
        the GEMV never runs (float32)."""
        per_word = values_per_word(dtype)
        if dtype not in PUSH_DTYPES or world_size < 2 or hidden_size % per_word:
            return None
        gather_n = vocab_rows if vocab_rows % per_word == 0 else 0
        return cls(2 * num_layers + 1, hidden_size, world_size, dtype, mode=mode, gather_n=gather_n)


class PushSites:
    """The sites of one rank, built from the rendezvoused buffer's views of every rank's memory."""

    def __init__(self, handle, rank: int, layout: PushLayout, byte_offset: int, device: torch.device) -> None:
        world, sites = layout.world_size, layout.num_sites
        if byte_offset % ALIGN:
            raise ValueError(f"the push region must start {ALIGN}-byte aligned, not at {byte_offset}")
        self.layout = layout
        self.rank = rank
        slot_shape = (sites, world, layout.max_rows, layout.words_per_row)
        offset = byte_offset // WORD_DTYPE.itemsize
        slots = [handle.get_buffer(r, slot_shape, WORD_DTYPE, offset) for r in range(world)]
        self.slots = slots[rank]  # [sites, world, max_rows, words a row], this rank's memory
        # [site, r]: where this rank's slot of the site lies on rank r
        dest = [[slots[r][s, rank].data_ptr() for r in range(world)] for s in range(sites)]
        self.dest_ptrs = torch.tensor(dest, dtype=torch.int64, device=device)
        self.abort = torch.zeros(1, dtype=torch.int32, device=device)
        self.slots.zero_()
        self._targets: list[PushTarget] = [
            PushTarget(rank, world, layout.dtype, layout.hidden_size, self.dest_ptrs[s], self.slots[s], self.abort,
                       layout.mode)
            for s in range(sites)
        ]
        self.gather: PushTarget | None = None  # the LM head's (all_gather_pushed)
        if layout.gather_n:
            gather_shape = (world, layout.max_rows, layout.gather_n // values_per_word(layout.dtype))
            gather_offset = (byte_offset + layout.sites_nbytes) // WORD_DTYPE.itemsize
            gathers = [handle.get_buffer(r, gather_shape, WORD_DTYPE, gather_offset) for r in range(world)]
            gathers[rank].zero_()
            gather_dest = torch.tensor([gathers[r][rank].data_ptr() for r in range(world)], dtype=torch.int64,
                                       device=device)
            self.gather = PushTarget(rank, world, layout.dtype, layout.gather_n, gather_dest, gathers[rank],
                                     self.abort, layout.mode)
        self.pushes = [0] * sites  # calls that pushed into each site (a captured call counts once, not per replay)
        self.num_taken = 0  # sites handed out by take()

    def zeroed_everywhere(self) -> None:
        """Collective: once every rank zeroed its slots (here, on the device), any may push."""
        torch.cuda.current_stream(self.slots.device).synchronize()
        dist.barrier()

    def take(self) -> tuple[int, PushTarget] | None:
        """The next free site and its target, or None once every site is taken (the layer then all-reduces)."""
        if self.num_taken == len(self._targets):
            return None
        site = self.num_taken
        self.num_taken += 1
        return site, self._targets[site]

    @property
    def num_sites_pushed(self) -> int:
        """Sites into which at least one push was made."""
        return sum(1 for count in self.pushes if count)

    def rescue_after_peer_death(self) -> None:
        """Let every wait for a peer's push through (the results are garbage: the engine is dead).

        A copy engine writes ``abort`` from pinned memory, not a kernel: the waiting kernels may hold every SM.
        """
        stream = torch.cuda.Stream(self.abort.device)
        one = torch.ones(1, dtype=torch.int32).pin_memory()
        with torch.cuda.stream(stream):
            self.abort.copy_(one, non_blocking=True)
        stream.synchronize()
