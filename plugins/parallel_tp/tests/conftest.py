"""Fixtures of the tensor-parallel suite: tiny real checkpoints, a check that no worker outlives a test, and
push sites of ranks simulated in one process (the pushed partial sums' kernels run in Triton's interpreter
without CUDA: set before any kernel module is imported, as in the core's ``tests/fused``)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from infer_core.testing import TinyCheckpoints


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> TinyCheckpoints:
    """``tiny_checkpoint("qwen2", num_key_value_heads=1)`` -> folder of a random tiny model."""
    return TinyCheckpoints(tmp_path_factory)


def child_pids() -> list[int]:
    """Live (not zombie) processes whose parent is this one, from /proc.

    multiprocessing's resource tracker (one per interpreter, started with the first spawned
    process and gone with the interpreter) is not a worker and is left out.
    """
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me and state != "Z" and b"multiprocessing.resource_tracker" not in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def assert_no_workers_left():
    """A check that every worker process of this test has exited and been reaped.

    Children that were alive before the test (another suite's server, in a whole-repo run) are not
    this test's workers and are left out.
    """
    before = set(child_pids())

    def check() -> None:
        assert multiprocessing.active_children() == []
        assert sorted(set(child_pids()) - before) == []

    return check


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def simulated_push_targets(world_size: int, max_rows: int, n: int, dtype, device, mode: str = "gemv") -> list:
    """``PushTarget``s of ``world_size`` ranks simulated in one process (each rank's memory a tensor here).

    Run every rank's pushing kernel before any rank's reader: the ranks are not concurrent here.
    """
    from infer_parallel_tp.push_target import WORD_DTYPE, PushTarget, values_per_word

    words = n // values_per_word(dtype)
    slots = [torch.zeros((world_size, max_rows, words), dtype=WORD_DTYPE, device=device) for _ in range(world_size)]
    return [
        PushTarget(rank=rank, world_size=world_size, dtype=dtype, n=n,
                   dest_ptrs=torch.tensor([s[rank].data_ptr() for s in slots], dtype=torch.int64, device=device),
                   slots=slots[rank], abort=torch.zeros(1, dtype=torch.int32, device=device), mode=mode)
        for rank in range(world_size)
    ]


@pytest.fixture
def push_targets():
    """``push_targets(world_size, max_rows, n, dtype, device, mode="gemv")``: see ``simulated_push_targets``."""
    return simulated_push_targets


class SimulatedRendezvous:
    """torch's symmetric-memory handle for ranks simulated in one process: ``get_buffer(rank, sizes, dtype,
    storage_offset)`` views rank's buffer (a tensor here) as the handle views a peer's mapping."""

    def __init__(self, buffers: list[torch.Tensor]) -> None:
        self.buffers = buffers

    def get_buffer(self, rank, sizes, dtype, storage_offset=0):
        count = torch.Size(sizes).numel()
        return self.buffers[rank].view(dtype)[storage_offset:storage_offset + count].view(sizes)


@pytest.fixture
def simulated_sites(device):
    """``simulated_sites(layout, offset=0)``: every rank's ``PushSites`` over buffers of this process, on ``device``."""
    from infer_parallel_tp.push_sites import PushSites

    def make(layout, offset: int = 0) -> list:
        buffers = [torch.full((offset + layout.nbytes,), 255, dtype=torch.uint8, device=device)
                   for _ in range(layout.world_size)]
        handle = SimulatedRendezvous(buffers)
        return [PushSites(handle, r, layout, offset, torch.device(device)) for r in range(layout.world_size)]

    return make
