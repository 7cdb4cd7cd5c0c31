"""The grammar masks of a step's constrained rows: kept buffers, sent to the device without blocking.

``ModelRunner._sample`` calls ``build`` after the step's forward is launched, so the host's work here
overlaps the device's; a batch without constrained requests never comes here. The bitmask is written
into host buffers kept across steps (pinned on CUDA) and copied without blocking into one kept on the
device; a host buffer is written again only once the copy out of it is done. Its width is the words of
the matchers' ``vocab_size`` (one grammar backend, one tokenizer: the same for all), or of the logits; the
bits past that size in the last word are cleared (xgrammar sets them where most tokens are allowed).
"""

from __future__ import annotations

import torch

from infer_core.runner.constraints import catch_up, fill_rows
from infer_core.runner.state import RequestState, RequestTable
from infer_core.runner.step_output import SampledStep


class GrammarMasks:
    """Each step's (rows, bitmask) of the constrained rows, in buffers kept across steps (grown when a step has
    more constrained rows than they hold)."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.device = device
        self.vocab_size = vocab_size  # the logit columns: the width of a matcher that names none
        self.mask_vocab_size = self.num_words = 0  # the ids the buffers' rows cover, in words
        self.tail: int | None = None  # the last word's bits of ids below mask_vocab_size (None: all of them)
        self.capacity = 0
        self.host_rows = self.host_bitmask = self.rows = self.bitmask = None
        self._host_rows = None  # host_rows as numpy (a list is written into it without a tensor made of it)
        # CUDA: marks the last copy out of the host buffers; build writes its buffer again only after it
        self.copied = torch.cuda.Event() if device.type == "cuda" else None

    def _reserve(self, num_rows: int, vocab_size: int) -> None:
        """Buffers of at least ``num_rows`` rows covering ``vocab_size`` ids (new ones where these are short)."""
        if num_rows <= self.capacity and vocab_size == self.mask_vocab_size:
            return
        self.capacity = max(num_rows, 2 * self.capacity if vocab_size == self.mask_vocab_size else 0, 8)
        self.mask_vocab_size, self.num_words = vocab_size, -(-vocab_size // 32)
        self.tail = (1 << vocab_size % 32) - 1 if vocab_size % 32 else None
        with torch.inference_mode(False):  # plain tensors: written in place in and out of inference mode
            self._allocate()

    def _allocate(self) -> None:
        pinned = self.device.type == "cuda"
        self.host_rows = torch.empty(self.capacity, dtype=torch.int64, pin_memory=pinned)
        self._host_rows = self.host_rows.numpy()
        self.host_bitmask = torch.empty((self.capacity, self.num_words), dtype=torch.int32, pin_memory=pinned)
        if self.device.type != "cpu":
            self.rows = torch.empty(self.capacity, dtype=torch.int64, device=self.device)
            self.bitmask = torch.empty((self.capacity, self.num_words), dtype=torch.int32, device=self.device)

    def _mask_vocab_size(self, states: list[RequestState], rows: list[int]) -> int:
        """The ids these rows' matchers' masks cover."""
        sizes = {states[row].matcher.vocab_size for row in rows}
        if len(sizes) > 1:
            raise ValueError(f"constrained requests of one step have masks of {sorted(sizes, key=str)} ids: one "
                             "grammar backend with one tokenizer gives one size; this is a bug")
        size = sizes.pop()
        return size if size is not None else self.vocab_size

    def build(self, table: RequestTable, states: list[RequestState], last_step: SampledStep | None,
              last_sample_rows: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows, bitmask) of the constrained rows among ``states`` (one per sampled row), on the device: views
        of the kept buffers, good until the next step's call; None when no row is constrained."""
        catch_up(table, [s for s in states if s.matcher is not None], last_step, last_sample_rows)
        rows = [row for row, state in enumerate(states) if state.matcher is not None]
        if not rows:
            return None
        num_rows = len(rows)
        self._reserve(num_rows, self._mask_vocab_size(states, rows))
        host = self.host_bitmask
        if self.copied is not None:
            self.copied.synchronize()  # the previous copy out of it (long done where a step's ids were read)
        fill_rows([states[row].matcher for row in rows], host, range(num_rows))
        if self.tail is not None:
            host[:num_rows, -1] &= self.tail
        self._host_rows[:num_rows] = rows
        if self.device.type == "cpu":
            return self.host_rows[:num_rows], host[:num_rows]
        self.rows[:num_rows].copy_(self.host_rows[:num_rows], non_blocking=True)
        self.bitmask[:num_rows].copy_(host[:num_rows], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        return self.rows[:num_rows], self.bitmask[:num_rows]
