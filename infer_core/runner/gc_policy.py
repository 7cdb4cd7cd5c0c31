"""The garbage collector's settings while engines have work: the start-up heap frozen, young passes rarer.

CPython's cyclic collector walks every tracked object of the process in a full (generation-2)
pass: after torch, transformers and a loaded model that is hundreds of thousands to millions of
objects, a quarter of a second on the host, while the GPU runs dry. The step loop keeps few objects
for long, but each generation-1 pass promotes what a step still holds at that moment, and after
enough promotions CPython runs a full pass (``benchmarks/host_stalls.py`` shows one per offline
run, 0.26 s on a CPU). So while any engine has requests in progress:

- the heap is frozen (``gc.freeze``) as it was when that work began: full passes walk only what
  came after;
- a young pass waits for 10,000 more tracked objects than were freed (not 700): a decode step of
  256 requests holds a few thousand objects for a moment and frees them, which at 700 set off a
  young pass every step or two and so the promotions that lead to the full passes.

When the last busy engine goes idle both are undone, and cyclic garbage from before is collected
again. An engine dropped while busy gives its hold back as it is freed (``hold_while_alive``): a
hold outliving its engine would keep the process's heap frozen for good. The collector is one per process, so its holders are counted in one object per process.
A worker rank in a process of its own (tensor parallelism) serves steps from its start to its stop,
so it holds the collector that whole time (``Worker.hold_gc``). A
collector somebody disabled (or set to threshold 0) is left alone: that program manages it. A heap
somebody froze before is frozen further while busy and, since CPython has one permanent generation
and cannot unfreeze part of it, unfrozen with ours at idle: freezing only spares collection passes,
so no object's life changes (standing down for a heap frozen at start-up would leave the full passes in:
``benchmarks/host_stalls.py`` measures them).
"""

from __future__ import annotations

import gc
import threading
import weakref

YOUNG_THRESHOLD = 10_000  # net new tracked objects before a generation-0 pass, while engines are busy


class StepLoopGC:
    """Counts the engines in a busy period; the first one sets the collector up, the last one undoes it."""

    def __init__(self, young_threshold: int = YOUNG_THRESHOLD) -> None:
        self.young_threshold = young_threshold
        self._lock = threading.RLock()  # a release may run from a finalizer during hold()
        self._num_holders = 0
        self._owns = False  # this object froze the heap and set the threshold (and so undoes them)
        self._saved_threshold: tuple[int, int, int] = (0, 0, 0)
        self._busy_threshold: tuple[int, int, int] = (0, 0, 0)

    @property
    def num_holders(self) -> int:
        return self._num_holders

    @property
    def is_managing(self) -> bool:
        """The collector is set up by this object now (some engine is busy and nobody else manages it)."""
        return self._owns

    def hold(self) -> None:
        """An engine starts work: freeze what exists now (again, for a later holder: its start-up too)."""
        with self._lock:
            if self._num_holders == 0:
                threshold = gc.get_threshold()
                self._owns = gc.isenabled() and threshold[0] > 0
                if self._owns:
                    self._saved_threshold = threshold
                    self._busy_threshold = (max(threshold[0], self.young_threshold), *threshold[1:])
                    gc.set_threshold(*self._busy_threshold)
            self._num_holders += 1
            if self._owns:
                gc.freeze()

    def hold_while_alive(self, owner: object) -> weakref.finalize:
        """``hold()`` for ``owner``; the handle returned releases once: when called, or when ``owner`` is freed."""
        self.hold()
        return weakref.finalize(owner, self.release)

    def release(self) -> None:
        """An engine went idle (or stopped); the last one gives the collector back as it found it."""
        with self._lock:
            if self._num_holders == 0:
                raise RuntimeError("StepLoopGC.release() without a matching hold(); this is a bug")
            self._num_holders -= 1
            if self._num_holders == 0 and self._owns:
                gc.unfreeze()
                if gc.get_threshold() == self._busy_threshold:  # else the program changed it since: keep that
                    gc.set_threshold(*self._saved_threshold)
                self._owns = False


# One per process, as the collector it steers is.
STEP_LOOP_GC = StepLoopGC()
