"""One-shot all-reduce over CUDA symmetric memory, for the small all-reduces of decode steps.

A batch-1 decode step of a 36-layer model all-reduces one token's hidden vector 72 times (o_proj,
down_proj). Here each rank copies its partial sum into a buffer every peer has mapped, and one
kernel loads every rank's buffer over NVLink and adds them: a little faster than NCCL inside CUDA
graphs (``bench_all_reduce``), and a worker's death mid-step can hang it (see
``rescue_after_peer_death``), hence off by default. The same buffer holds the push sites
(``push_sites.py``). What ``torch.distributed._symmetric_memory`` needs (read in torch 2.11-2.13's source):

- A persistent buffer, allocated with ``_SymmetricMemory.empty_strided_p2p`` (not ``symm_mem.empty``:
  its memory pool may hand a later engine the same block, whose cached rendezvous would still point
  at the previous engine's peers) and rendezvoused once, eagerly, before any capture: the first
  rendezvous exchanges memory handles (the store, POSIX fds over a Unix socket) and syncs the host,
  which a capturing stream cannot do; allocation cannot happen during capture either. Each call
  looks the rendezvous up in a cache (host only), so the op is capturable, and one eager call
  (the self-test here) precedes every capture. Replays reuse the kernel's fixed arguments (peer
  pointer table, signal pads); every rank must replay the same graphs in the same order (as NCCL).
- Signal pads: each rank's allocation starts with a pad of uint32 flags, one per (block, peer); the
  kernel raises the peer's flag and waits for its own, before loading the peers' buffers and again
  after, so the buffer is free for the next call as soon as a call returns (no double buffering).
  At most 24 blocks of 512 threads: small messages only (``ONE_SHOT_MAX_BYTES``); NCCL above.
- ``one_shot_all_reduce_copy_out(view, x, "sum", group, out)`` copies ``x`` into the buffer inside
  the same kernel (``view`` must have exactly ``x``'s size: the kernel copies ``view.numel()``
  elements); without it (older torch) ``view.copy_(x)`` then ``one_shot_all_reduce_out``.
- Sums bfloat16 and float32 only (float16 takes NCCL), in the tensor's dtype, every rank adding the
  ranks' values in rank order 0..N-1: the same bits on every rank; with two ranks the correctly
  rounded a+b, as NCCL's. Sizes must be a multiple of 16 bytes here (both operands then share the
  kernel's 16-byte vector alignment).
- No NVLink multicast (NVLS; the hosts forbid it): rendezvous creates a multicast object when the
  devices support one, unless ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, which ``setup`` sets; only
  the peer-load kernels (no ``multimem_*``) are used.
- Torch >= 2.11 resolves the group's store itself: ``enable_symm_mem_for_group`` is deprecated, and
  registering the group would make each op call validate its buffer through the store. Older torch
  needs it (and a torch that still asks for it says "group info"): then the group is registered.
- Torch numbers its store exchanges per process; ranks whose processes have rendezvoused a
  different number of times would wait on different keys, so a later engine in a process whose
  workers are fresh takes NCCL (``num_rendezvous`` is compared first).
- A dead peer: the kernel waits for its flags without a timeout, and freeing the buffer syncs the
  device. ``rescue_after_peer_death`` raises the dead peers' flags (and clears theirs) from a side
  stream until the device has drained; the rescuer then owns, and frees, the buffer.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from infer_parallel_tp.push_sites import PushLayout, PushSites

logger = logging.getLogger(__name__)

ONE_SHOT_MAX_BYTES = 512 * 1024  # 64 tokens of a 4096-wide bfloat16 hidden state
SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)
VECTOR_BYTES = 16  # the kernel's widest load; sizes and offsets are kept multiples of it
GROUP_REGISTRY_TORCH = (2, 11)  # from this version on, rendezvous finds the group's store itself
RESCUE_PERIOD_S = 0.001
RESCUE_MIN_SECONDS = 0.5  # a step launched just before the death was known is on the stream by then
RESCUE_SECONDS = 30.0  # at most (NCCL kernels of an aborted group could keep the stream busy)
RESCUE_MAX_BLOCKS = 64  # more than the kernel's 24 blocks; flags beyond those are never read
DEFAULT_SIGNAL_PAD_BYTES = 2048  # torch's, where it does not say

# Symmetric-memory rendezvous this process has made (torch keeps the matching count in C++).
_num_rendezvous = 0


def unsuitable(x: torch.Tensor, max_bytes: int) -> str | None:
    """Why ``x`` cannot be all-reduced in one shot (None: it can); the same on every rank for the same shapes."""
    if x.dtype not in SUPPORTED_DTYPES:
        return f"{x.dtype} (the symmetric-memory kernel sums bfloat16 and float32)"
    nbytes = x.numel() * x.element_size()
    if nbytes > max_bytes:
        return "size"
    if nbytes == 0 or nbytes % VECTOR_BYTES:
        return f"{nbytes} bytes (not a positive multiple of {VECTOR_BYTES})"
    if not x.is_contiguous():
        return "a non-contiguous tensor"
    return None


@dataclass(frozen=True, slots=True)
class RankInfo:
    """What one rank reports before the group decides: where it runs and what it lacks."""

    host: str
    device: int
    problems: tuple[str, ...]
    peer_access: dict[int, bool] = field(default_factory=dict)  # device index -> can this rank map its memory
    num_rendezvous: int = 0


def group_problems(infos: list[RankInfo]) -> list[str]:
    """Why the group cannot use symmetric memory (empty when it can); every rank computes the same list."""
    problems = [f"rank {r}: {p}" for r, info in enumerate(infos) for p in info.problems]
    hosts = sorted({info.host for info in infos})
    if len(hosts) > 1:
        problems.append(f"the ranks span {len(hosts)} hosts ({', '.join(hosts)}); peer memory needs one")
        return problems
    devices = [info.device for info in infos]
    if len(set(devices)) < len(devices):
        problems.append(f"ranks share a device ({devices})")
    for r, info in enumerate(infos):
        blocked = [s for s, other in enumerate(infos) if s != r and not info.peer_access.get(other.device, False)]
        if blocked:
            problems.append(f"rank {r} (cuda:{info.device}) cannot access the memory of ranks {blocked} peer-to-peer")
    counts = [info.num_rendezvous for info in infos]
    if len(set(counts)) > 1:
        problems.append(
            f"the ranks' processes made {counts} symmetric-memory rendezvous before (an earlier engine in this "
            f"process); torch numbers its store exchanges per process, so fresh workers cannot meet rank 0"
        )
    return problems


def local_info(device: int) -> RankInfo:
    """This rank's host, device, peer access and the reasons it cannot take part (torch, ops, backend)."""
    problems: list[str] = []
    ops = getattr(torch.ops, "symm_mem", None)
    if ops is None or not hasattr(ops, "one_shot_all_reduce_out"):
        problems.append("torch.ops.symm_mem.one_shot_all_reduce_out is missing from this torch build")
    try:
        import torch.distributed._symmetric_memory as symm_mem

        get_backend = getattr(symm_mem, "get_backend", None)  # torch without it has only the CUDA backend
        if get_backend is not None and get_backend(torch.device("cuda", device)) not in (None, "CUDA"):
            symm_mem.set_backend("CUDA")  # raises when another backend (NVSHMEM, NCCL) already allocated
    except Exception as e:  # noqa: BLE001 - any failure here means: use NCCL
        problems.append(f"symmetric memory's CUDA backend is not available ({e})")
    peers = {d: d == device or torch.cuda.can_device_access_peer(device, d) for d in range(torch.cuda.device_count())}
    return RankInfo(socket.gethostname(), device, tuple(problems), peers, _num_rendezvous)


def _register_group(group_name: str) -> None:
    """Give symmetric memory the group's store, as torch < 2.11 needs (deprecated from 2.11 on)."""
    import torch.distributed._symmetric_memory as symm_mem

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(group_name)


def rescue_views(pads: list[torch.Tensor], rank: int, dead: list[int]) -> list[tuple[torch.Tensor, int]]:
    """(flags, value) pairs that let this rank's kernels pass the barriers of ``dead`` peers.

    ``pads[r]`` is rank r's signal pad as int32 [blocks, world_size]: flag [b, p] of rank r's pad
    is raised by peer p for block b and lowered by r when it waits. This rank waits on its own
    flags [:, p] (raised here to 1) and raises flags [:, rank] of peer p's pad, only once they are
    0 again (lowered here).
    """
    views = []
    for p in dead:
        views.append((pads[rank][:, p], 1))
        views.append((pads[p][:, rank], 0))
    return views


class OneShotAllReduce:
    """Sums a small contiguous tensor over the group's ranks with one kernel over symmetric memory."""

    def __init__(self, buffer: torch.Tensor, handle, group_name: str, rank: int, world_size: int,
                 max_bytes: int | None = None) -> None:
        self.buffer = buffer  # uint8, this rank's symmetric buffer: max_bytes for the one-shot, then push sites
        self.handle = handle  # the rendezvous: peers' pointers and signal pads
        self.group_name = group_name
        self.rank = rank
        self.world_size = world_size
        self.max_bytes = buffer.numel() if max_bytes is None else max_bytes
        self.push_sites: PushSites | None = None  # row-parallel layers' pushed partial sums (push_sites.py)
        ops = torch.ops.symm_mem
        self._copy_out = getattr(ops, "one_shot_all_reduce_copy_out", None)
        self._out = ops.one_shot_all_reduce_out
        self._rescuer: threading.Thread | None = None
        self._views: dict[tuple[torch.dtype, torch.Size], torch.Tensor] = {}

    @classmethod
    def setup(cls, rank: int, world_size: int, device: int, max_bytes: int = ONE_SHOT_MAX_BYTES,
              push_layout: PushLayout | None = None) -> tuple[OneShotAllReduce | None, str]:
        """Collective over the default (NCCL) group: the all-reduce, or None and why not, the same on every rank.

        With ``push_layout``, the buffer also holds the sites the row-parallel layers push their partial sums to.
        """
        infos: list[RankInfo | None] = [None] * world_size
        dist.all_gather_object(infos, local_info(device))
        problems = group_problems(infos)
        if problems:
            return None, "; ".join(problems)
        one_shot = None
        # Every rank rendezvouses before any runs the self-test's kernel, which would wait for a rank that did not.
        for stage in ("rendezvous", "self-test"):
            try:
                if stage == "rendezvous":
                    one_shot, outcome = cls._rendezvous(rank, world_size, device, max_bytes, push_layout), None
                else:
                    outcome = one_shot.self_test()
            except Exception as e:  # noqa: BLE001 - reported to every rank, which all fall back together
                outcome = f"rank {rank}: {stage}: {type(e).__name__}: {e}"
            outcomes: list[str | None] = [None] * world_size
            dist.all_gather_object(outcomes, outcome)
            failures = [o for o in outcomes if o is not None]
            if failures:
                return None, "; ".join(failures)
        path = f"one-shot over symmetric memory up to {max_bytes // 1024} KiB (peer loads, no multicast)"
        if one_shot.push_sites is not None:
            one_shot.push_sites.zeroed_everywhere()
            layout = one_shot.push_sites.layout
            path += (f"; row-parallel layers of up to {layout.max_rows} rows push their partial sums "
                     f"({layout.num_sites} sites, added by {layout.mode})")
        return one_shot, path

    @classmethod
    def _rendezvous(cls, rank: int, world_size: int, device: int, max_bytes: int,
                    push_layout: PushLayout | None) -> OneShotAllReduce:
        global _num_rendezvous
        from torch.distributed._symmetric_memory import _SymmetricMemory

        os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"  # read by rendezvous: no NVLS object is made
        total = max_bytes + (push_layout.nbytes if push_layout is not None else 0)
        buffer = _SymmetricMemory.empty_strided_p2p((total,), (1,), torch.uint8, torch.device("cuda", device))
        group_name = dist.group.WORLD.group_name
        if torch.torch_version.TorchVersion(torch.__version__) < GROUP_REGISTRY_TORCH:
            _register_group(group_name)
        _num_rendezvous += 1
        try:
            handle = _SymmetricMemory.rendezvous(buffer, group_name)
        except RuntimeError as e:
            if "group info" not in str(e):
                raise
            # raised by every rank before any exchange (the same torch everywhere): register, retry
            _register_group(group_name)
            handle = _SymmetricMemory.rendezvous(buffer, group_name)
        if handle is None:
            raise RuntimeError("rendezvous returned no handle (the buffer is not symmetric memory)")
        if getattr(handle, "multicast_ptr", 0):
            raise RuntimeError("rendezvous mapped an NVLink multicast object although it was disabled")
        one_shot = cls(buffer, handle, group_name, rank, world_size, max_bytes)
        if push_layout is not None:
            one_shot.push_sites = PushSites(handle, rank, push_layout, max_bytes, buffer.device)
        return one_shot

    def self_test(self) -> str | None:
        """One eager all-reduce (before any capture) whose sum every rank knows; the problem, or None."""
        x = torch.full((VECTOR_BYTES,), float(self.rank + 1), dtype=torch.float32, device=self.buffer.device)
        got = self(x)
        expected = self.world_size * (self.world_size + 1) / 2
        if not bool((got == expected).all()):
            return f"rank {self.rank}: the one-shot self-test summed to {got.tolist()}, not {expected}"
        return None

    def unsuitable(self, x: torch.Tensor) -> str | None:
        return unsuitable(x, self.max_bytes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``x`` (checked by ``unsuitable`` first), in a new tensor."""
        view = self._views.get((x.dtype, x.shape))
        if view is None:  # a few shapes per model (decode batch sizes): cached, to keep eager calls cheap
            view = self.buffer[: x.numel() * x.element_size()].view(x.dtype).view(x.shape)
            self._views[x.dtype, x.shape] = view
        out = torch.empty_like(x)
        if self._copy_out is not None and (x.storage_offset() * x.element_size()) % VECTOR_BYTES == 0:
            return self._copy_out(view, x, "sum", self.group_name, out)
        view.copy_(x)
        return self._out(view, "sum", self.group_name, out)

    # after a peer died ----------------------------------------------------------------------------

    def rescue_after_peer_death(self, dead: list[int]) -> None:
        """Let this rank's waiting kernels pass the barriers of ``dead`` ranks until the device has drained.

        The results are garbage (the engine is dead); what matters is that nothing waits on the device forever
        (a sync, freeing memory). The rescuer writes the flags every millisecond from a side stream, by copies
        from pinned memory (copy engines: a ``fill_`` kernel could find no SM free while the waiting kernels hold
        them), until the device's default stream (the runner's) has run through what was launched, at least
        RESCUE_MIN_SECONDS and at most RESCUE_SECONDS. Its thread holds this object until it ends, so the mapped
        pads outlive the writes, and frees it then (``test_worker_killed_during_a_step_on_cuda[one-shot]``).
        """
        if self._rescuer is not None or not dead:
            return
        if self.push_sites is not None:
            self.push_sites.rescue_after_peer_death()
        self._rescuer = threading.Thread(target=self._rescue, args=(sorted(dead),), name="infer-tp-symm-rescue",
                                         daemon=True)
        self._rescuer.start()

    def _rescue(self, dead: list[int]) -> None:
        from torch.distributed._symmetric_memory import _SymmetricMemory

        device = self.buffer.device
        pad_bytes = getattr(_SymmetricMemory, "signal_pad_size", DEFAULT_SIGNAL_PAD_BYTES)
        blocks = min(RESCUE_MAX_BLOCKS, pad_bytes // 4 // self.world_size)
        try:
            with torch.cuda.device(device):
                pads = [self.handle.get_signal_pad(r, [blocks, self.world_size], torch.int32)
                        for r in range(self.world_size)]
                # one flag at a time from pinned host memory: a copy engine writes it (cudaMemcpyAsync of one
                # contiguous element), not a kernel, which might find no SM free while the waiting blocks hold them
                writes = [(flags[b:b + 1], torch.full((1,), value, dtype=flags.dtype).pin_memory())
                          for flags, value in rescue_views(pads, self.rank, dead) for b in range(flags.shape[0])]
                stream = torch.cuda.Stream(device)
                start = time.monotonic()
                drained = None  # recorded on the default stream (the runner's) one round earlier
                while time.monotonic() < start + RESCUE_SECONDS:
                    with torch.cuda.stream(stream):
                        for flag, value in writes:
                            flag.copy_(value, non_blocking=True)
                    stream.synchronize()
                    if drained is not None and drained.query() and time.monotonic() > start + RESCUE_MIN_SECONDS:
                        return  # every step launched before the death is known has run through
                    drained = torch.cuda.Event()
                    drained.record(torch.cuda.default_stream(device))
                    time.sleep(RESCUE_PERIOD_S)
        except Exception:  # noqa: BLE001 - a broken context after a death: nothing more to do
            logger.exception("symmetric-memory rescue after a peer's death stopped")
