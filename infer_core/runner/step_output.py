"""A launched step's sampled tokens on their way to the host.

The sampled ids (and logprobs, when asked for) are copied into pinned host memory without
blocking, and an event marks when the copy is done: the engine reads the result only after it has
started the next step, so the host's work and the device's overlap. The ids go into one of a few
pinned buffers reused round-robin (``HostSlots``), each with its own event, rather than a new
pinned tensor, a new event and a lookup of the current stream every step: at batch 1 those are a
visible share of the host's time per step.
"""

from __future__ import annotations

import torch

from infer_core.interfaces import PendingOutput, RunnerOutput, TokenLogprobs
from infer_core.layers.sampler import SamplerOutput
from infer_core.runner.state import RequestState


def _to_host(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A non-blocking copy of ``tensor`` into pinned memory (the tensor itself on the CPU)."""
    if tensor is None or tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


class HostSlot:
    """A pinned buffer for one step's sampled ids and the event that marks their copy."""

    def __init__(self, max_rows: int, stream: torch.cuda.Stream) -> None:
        self.ids = torch.empty(max_rows, dtype=torch.int64, pin_memory=True)
        self.copied = torch.cuda.Event()
        self.stream = stream
        self.in_use = False  # taken by a step whose result has not been read yet


class HostSlots:
    """``HostSlot``s reused round-robin. At most two steps are in flight (the engine reads step N after it
    launched N+1), so a slot is free again when its turn comes; a slot still unread gets a fresh one instead."""

    def __init__(self, max_rows: int, stream: torch.cuda.Stream, num_slots: int = 4) -> None:
        self.max_rows, self.stream = max_rows, stream
        self.slots = [HostSlot(max_rows, stream) for _ in range(num_slots)]
        self.next = 0

    def take(self, num_rows: int) -> HostSlot | None:
        """A free slot of at least ``num_rows`` rows, marked in use (None: more rows than a slot holds)."""
        if num_rows > self.max_rows:
            return None
        slot = self.slots[self.next]
        if slot.in_use:  # a result never read (an abandoned step): leave that buffer to it
            slot = self.slots[self.next] = HostSlot(self.max_rows, self.stream)
        self.next = (self.next + 1) % len(self.slots)
        slot.in_use = True
        return slot


class SampledStep(PendingOutput):
    """The output of a step that sampled ``sample_rows``: per request, its tokens and logprobs."""

    def __init__(self, request_ids: list[str], sample_rows: list[int], states: list[RequestState],
                 sampled: SamplerOutput, logits: torch.Tensor | None = None, slot: HostSlot | None = None) -> None:
        """``slot``: where the ids go on CUDA (taken from ``HostSlots``; None: a new pinned tensor and event)."""
        self.request_ids = request_ids
        self.sample_rows = sample_rows
        self.states = states  # the sampled rows' states as of this step (the table may drop them before reading)
        self.slot = slot if sampled.token_ids.is_cuda else None
        if self.slot is not None:
            self.token_ids = self.slot.ids[: sampled.token_ids.shape[0]]
            self.token_ids.copy_(sampled.token_ids, non_blocking=True)
        else:
            self.token_ids = _to_host(sampled.token_ids)
        self.logprob, self.rank = _to_host(sampled.logprob), _to_host(sampled.rank)
        self.top_ids, self.top_logprobs = _to_host(sampled.top_ids), _to_host(sampled.top_logprobs)
        self.logits = logits  # device logits of the sampled rows, copied when read (tests only)
        self.copied = None
        if self.slot is not None:
            self.copied = self.slot.copied
            self.copied.record(self.slot.stream)
        elif sampled.token_ids.is_cuda:
            self.copied = torch.cuda.Event()
            self.copied.record()
        self._output: RunnerOutput | None = None
        self.prompt_logprobs = None  # RunnerOutput.prompt_logprobs of this step, set by the runner

    def host_token_ids(self) -> torch.Tensor:
        """The sampled ids [rows] on the host, once their copy is done (waits for it)."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.token_ids

    def result(self) -> RunnerOutput:
        if self._output is None:
            if self.copied is not None:
                self.copied.synchronize()
            self._output = self._collect()
            if self.slot is not None:
                self.slot.in_use = False  # the ids are in _output now: the buffer may take another step's
        return self._output

    def _collect(self) -> RunnerOutput:
        """Group the sampled tokens (and logprobs) per request, in ``request_ids`` order."""
        sampled: list[list[int]] = [[] for _ in self.request_ids]
        logprobs: list[list[TokenLogprobs] | None] = [None for _ in self.request_ids]
        token_ids = self.token_ids.tolist()
        has_logprobs = self.logprob is not None
        if has_logprobs:
            token_lp, ranks = self.logprob.tolist(), self.rank.tolist()
            top_ids = self.top_ids.tolist() if self.top_ids is not None else None
            top_lp = self.top_logprobs.tolist() if self.top_logprobs is not None else None
        for i, row in enumerate(self.sample_rows):
            sampled[row].append(token_ids[i])
            wanted = self.states[i].sampling_params.logprobs
            if has_logprobs and wanted is not None:
                entry = TokenLogprobs(token_ids[i], token_lp[i], ranks[i],
                                      top_ids[i][:wanted] if top_ids else [], top_lp[i][:wanted] if top_lp else [])
                if logprobs[row] is None:
                    logprobs[row] = []
                logprobs[row].append(entry)
        output = RunnerOutput(self.request_ids, sampled, logprobs, prompt_logprobs=self.prompt_logprobs)
        if self.logits is not None:
            host = self.logits.float().cpu()
            rows = torch.tensor(self.sample_rows)
            output.logits = [host[rows == i] if bool((rows == i).any()) else None for i in range(len(sampled))]
        return output
