"""Keeping the objects that exist when an engine gets work out of the garbage collector's full passes.

CPython's cyclic collector walks every tracked object of the process in a full (generation-2)
pass: after torch, transformers and a loaded model that is hundreds of thousands to millions of
objects, a quarter of a second on the host, while the GPU runs dry. The step loop keeps few objects
for long, but each generation-1 pass promotes what a step still holds at that moment, and after
enough promotions CPython runs a full pass (``benchmarks/host_stalls.py`` shows one per offline
run, 0.26 s on a CPU). So while any engine has requests in progress the heap is frozen
(``gc.freeze``) as it was when that work began: full passes then walk only what came after. When
the last busy engine goes idle it is unfrozen, and cyclic garbage from before is collected again.

The collector is one per process, so its holders are counted in one object per process. A heap
somebody else froze, or a collector somebody disabled, is left alone: that program manages it.
"""

from __future__ import annotations

import gc
import threading


class HeapFreeze:
    """Counts the engines in a busy period; the first one freezes the heap, the last one unfreezes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._num_holders = 0
        self._owns_freeze = False  # this object froze the heap (and so unfreezes it)

    @property
    def num_holders(self) -> int:
        return self._num_holders

    @property
    def is_frozen_here(self) -> bool:
        return self._owns_freeze

    def hold(self) -> None:
        """An engine starts work: freeze what exists now (again, for a later holder: its start-up too)."""
        with self._lock:
            if self._num_holders == 0:
                self._owns_freeze = gc.isenabled() and gc.get_freeze_count() == 0
            self._num_holders += 1
            if self._owns_freeze:
                gc.freeze()

    def release(self) -> None:
        """An engine went idle (or stopped); the last one gives the frozen objects back to the collector."""
        with self._lock:
            if self._num_holders == 0:
                raise RuntimeError("HeapFreeze.release() without a matching hold(); this is a bug")
            self._num_holders -= 1
            if self._num_holders == 0 and self._owns_freeze:
                gc.unfreeze()
                self._owns_freeze = False


# One per process, as the collector it steers is.
HEAP_FREEZE = HeapFreeze()
