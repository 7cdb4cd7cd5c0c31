"""Atomic counters that split-K kernels keep zero between launches, one buffer per (device, stream).

A kernel whose programs each sum a slice of a long axis lets the last program of a group to finish add
the slices (so the sum runs in one fixed order: the same bits every run). It finds that program by an
atomic count per group and resets the count to zero, so the next launch, or a CUDA-graph replay, finds
zeros. The buffer must therefore be zeroed once, outside any graph capture.
"""

from __future__ import annotations

import torch


class SplitCounters:
    """Per (device, stream): int32 counters, zero between launches (each group's last program resets its own)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner  # who counts, for the error message
        self.buffers: dict[tuple, torch.Tensor] = {}

    def get(self, device: torch.device, num_groups: int) -> torch.Tensor:
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (device.type, device.index, stream)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.numel() < num_groups:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                # zeros allocated in a capture are zeroed only when that graph replays: another graph using
                # them first would read garbage counters. Run the kernel once on this stream before capturing.
                raise RuntimeError(f"the {self.owner}'s split counters for this stream must exist before a CUDA "
                                   "graph capture: launch the kernel once on the capture stream first")
            size = max(num_groups, 256, 0 if buffer is None else 2 * buffer.numel())
            buffer = self.buffers[key] = torch.zeros(size, dtype=torch.int32, device=device)
        return buffer
