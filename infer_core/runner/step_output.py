"""A launched step's sampled tokens on their way to the host.

The sampled ids (and logprobs, when asked for) are copied into pinned host memory without
blocking, and an event marks when the copy is done: the engine reads the result only after it has
started the next step, so the host's work and the device's overlap.
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


class SampledStep(PendingOutput):
    """The output of a step that sampled ``sample_rows``: per request, its tokens and logprobs."""

    def __init__(self, request_ids: list[str], sample_rows: list[int], states: list[RequestState],
                 sampled: SamplerOutput, logits: torch.Tensor | None = None) -> None:
        self.request_ids = request_ids
        self.sample_rows = sample_rows
        self.states = states  # the sampled rows' states as of this step (the table may drop them before reading)
        self.token_ids = _to_host(sampled.token_ids)
        self.logprob, self.rank = _to_host(sampled.logprob), _to_host(sampled.rank)
        self.top_ids, self.top_logprobs = _to_host(sampled.top_ids), _to_host(sampled.top_logprobs)
        self.logits = logits  # device logits of the sampled rows, copied when read (tests only)
        self.copied = None
        if sampled.token_ids.device.type == "cuda":
            self.copied = torch.cuda.Event()
            self.copied.record()
        self._output: RunnerOutput | None = None

    def result(self) -> RunnerOutput:
        if self._output is None:
            if self.copied is not None:
                self.copied.synchronize()
            self._output = self._collect()
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
        output = RunnerOutput(self.request_ids, sampled, logprobs)
        if self.logits is not None:
            host = self.logits.float().cpu()
            rows = torch.tensor(self.sample_rows)
            output.logits = [host[rows == i] if bool((rows == i).any()) else None for i in range(len(sampled))]
        return output
