"""Turning per-sequence token updates into RequestOutputs: text, stop strings, n completions.

The updates are the core's ``RequestUpdate``s: in one process its own, across the process
boundary the frontend's copies of them (engine/core_messages.py), whose ``request`` carries only
what is read here (id, status, stop reason, prefix-cache hit, first scheduled time).

Stop strings are found in the detokenized text; the last ``len(longest stop) - 1`` characters
are held back from streaming until it is clear they do not start a stop string, so a client
never sees part of one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from infer_core.engine.detokenizer import IncrementalDetokenizer, backend_decoder
from infer_core.interfaces import RequestStatus, RequestUpdate, TokenLogprobs
from infer_core.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from infer_core.sampling_params import SamplingParams


@dataclass(slots=True)
class _Sequence:
    """One completion being produced (one child request)."""

    output: CompletionOutput
    params: SamplingParams
    detokenizer: IncrementalDetokenizer | None
    holdback: int = 0  # characters kept back from the stream while they could start a stop string
    num_emitted_chars: int = 0
    # text decoded once at the end (None: decoded every step): where each step's text ended in
    # ``output.token_ids``; ints, where a list of each step's ids would be a tracked object per token
    pending_step_ends: list[int] | None = None


@dataclass(slots=True)
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: dict[str, _Sequence]  # child request id -> sequence
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    finished_children: set[str] = field(default_factory=set)
    # final-only: every step hands out this one live output instead of a snapshot
    live_output: RequestOutput | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # filled chunk by chunk as the prompt runs

    def to_output(self) -> RequestOutput:
        finished = len(self.finished_children) == len(self.sequences)
        live = self.live_output
        if live is not None:
            live.finished, live.num_cached_tokens = finished, self.num_cached_tokens
            live.prompt_logprobs = self.prompt_logprobs
            return live
        if len(self.sequences) == 1:
            outputs = [_snapshot(s.output) for s in self.sequences.values()]
        else:
            outputs = [_snapshot(s.output) for s in sorted(self.sequences.values(), key=lambda s: s.output.index)]
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outputs,
                             finished=finished, num_cached_tokens=self.num_cached_tokens, metrics=self.metrics,
                             prompt_logprobs=self.prompt_logprobs)


def _snapshot(output: CompletionOutput) -> CompletionOutput:
    """A copy to hand out: the live output changes on later steps, while a stream consumer may still
    hold this step's (and read its delta) after the engine has moved on. The delta list is shared:
    the live output gets a new one every step and never changes it in place."""
    logprobs = output.logprobs
    return CompletionOutput(output.index, output.text, output.token_ids[:], output.finish_reason, output.stop_reason,
                            None if logprobs is None else logprobs[:], output.delta_text, output.delta_token_ids)


def _ended_on_stop_token(update: RequestUpdate) -> bool:
    """The update's last token is the EOS or a stop_token_id that finished the request."""
    return update.finished and update.request.status is RequestStatus.FINISHED_STOPPED and bool(update.new_token_ids)


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.fast_decode = backend_decoder(tokenizer) if tokenizer is not None else None
        self.parents: dict[str, _Parent] = {}
        self.parent_of: dict[str, str] = {}  # child id -> parent id

    def add(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
            children: list[tuple[str, SamplingParams]], arrival_time: float, *, final_only: bool = False) -> None:
        """Track a request's completions; ``final_only``: see ``mark_final_only``."""
        sequences = {}
        for index, (child_id, params) in enumerate(children):
            detok = (IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                            self.fast_decode)
                     if self.tokenizer is not None else None)
            output = CompletionOutput(index, logprobs=[] if params.logprobs is not None else None)
            holdback = max((len(s) for s in params.stop), default=1) - 1
            sequences[child_id] = _Sequence(output, params, detok, holdback)
            self.parent_of[child_id] = request_id
        metrics = RequestMetrics(arrival_time)
        self.parents[request_id] = _Parent(request_id, prompt, prompt_token_ids, sequences, metrics)
        if final_only:
            self.mark_final_only(request_id)

    def mark_final_only(self, request_id: str) -> None:
        """The caller reads only each step's ``delta_token_ids`` and the final output (``LLM.generate``).

        Each step then hands out the request's one live RequestOutput instead of a copy, and the
        text, where no stop string needs it earlier, is decoded once at the end (the same text, as
        ``IncrementalDetokenizer.update_spans`` says): until the final output, ``text`` and
        ``delta_text`` stay empty. Call it before the request's first step.
        """
        parent = self.parents[request_id]
        by_index = sorted(parent.sequences.values(), key=lambda s: s.output.index)
        parent.live_output = RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids,
                                           [s.output for s in by_index], metrics=parent.metrics)
        if self.fast_decode is None:
            return  # a decoder that cleans up spaces may not give the same text at once: keep it per step
        for seq in by_index:
            if seq.detokenizer is not None and not seq.params.stop and not seq.output.token_ids:
                seq.pending_step_ends = []

    def is_known(self, request_id: str) -> bool:
        """An id in use by a live request or by one of its completions."""
        return request_id in self.parents or request_id in self.parent_of

    def children_of(self, request_id: str) -> list[str]:
        parent = self.parents.get(request_id)
        return [] if parent is None else [c for c in parent.sequences if c not in parent.finished_children]

    def _decode_token(self, token_id: int) -> str | None:
        if self.fast_decode is not None:
            return self.fast_decode([token_id], skip_special_tokens=False)  # tokenizer.decode's default
        return None if self.tokenizer is None else self.tokenizer.decode([token_id])

    def _logprobs(self, entries: list[TokenLogprobs]) -> list[dict[int, Logprob]]:
        decode = self._decode_token
        result = []
        for e in entries:
            d = {e.token_id: Logprob(e.logprob, e.rank, decode(e.token_id))}
            for rank, (tid, lp) in enumerate(zip(e.top_token_ids, e.top_logprobs), start=1):
                d.setdefault(tid, Logprob(lp, rank, decode(tid)))
            result.append(d)
        return result

    def _apply(self, seq: _Sequence, update: RequestUpdate) -> bool:
        """Add the update's tokens and text; True when a stop string ended the sequence."""
        out, params = seq.output, seq.params
        new_token_ids = update.new_token_ids
        out.token_ids.extend(new_token_ids)
        out.delta_token_ids = list(new_token_ids)
        if out.logprobs is not None and update.new_logprobs:
            out.logprobs.extend(self._logprobs(update.new_logprobs))
        stopped = False
        if seq.detokenizer is not None:
            text_ids = new_token_ids
            if _ended_on_stop_token(update) and not params.include_stop_str_in_output:
                text_ids = text_ids[:-1]  # as vLLM: the EOS / stop token id ends the text, it is not in it
            if seq.pending_step_ends is not None:
                seq.pending_step_ends.append(len(out.token_ids) - len(new_token_ids) + len(text_ids))
                if not update.finished:
                    out.delta_text = ""
                    return False
                out.text, out.delta_text = self._decode_pending(seq)
                seq.num_emitted_chars = len(out.text)
                out.finish_reason = update.request.status.finish_reason
                out.stop_reason = update.request.stop_reason
                return False
            previous_len = len(out.text)
            out.text += seq.detokenizer.update(text_ids)
            if params.stop and len(out.token_ids) >= params.min_tokens:  # as vLLM: not within min_tokens
                stopped = self._find_stop(seq, previous_len)
        if update.finished and not stopped:
            out.finish_reason = update.request.status.finish_reason
            out.stop_reason = update.request.stop_reason
        text = out.text
        emitted = seq.num_emitted_chars
        upto = len(text) if out.finish_reason is not None else max(emitted, len(text) - seq.holdback)
        out.delta_text = text[emitted:upto]
        seq.num_emitted_chars = upto
        return stopped and not update.finished

    @staticmethod
    def _decode_pending(seq: _Sequence) -> tuple[str, str]:
        """A final-only sequence's text and last delta, decoded from the steps it held back."""
        step_ends, seq.pending_step_ends = seq.pending_step_ends, None
        return seq.detokenizer.update_spans(seq.output.token_ids, step_ends)

    def _find_stop(self, seq: _Sequence, previous_len: int) -> bool:
        out = seq.output
        best: tuple[int, str] | None = None
        for stop in seq.params.stop:
            index = out.text.find(stop, max(0, previous_len - len(stop) + 1))
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return False
        index, stop = best
        out.text = out.text[: index + (len(stop) if seq.params.include_stop_str_in_output else 0)]
        out.finish_reason, out.stop_reason = "stop", stop
        return True

    def _add_prompt_logprobs(self, scored: dict[str, tuple[int, list[TokenLogprobs]]]) -> None:
        """A step's prompt logprobs into their parents' lists (every child of a parent scores the same prompt)."""
        for child_id, (first, entries) in scored.items():
            parent = self.parents.get(self.parent_of.get(child_id, ""))
            if parent is None:
                continue
            if parent.prompt_logprobs is None:
                parent.prompt_logprobs = [None] * len(parent.prompt_token_ids)
            parent.prompt_logprobs[first:first + len(entries)] = self._logprobs(entries)

    def process(self, updates: list[RequestUpdate], prompt_logprobs: dict[str, tuple[int, list[TokenLogprobs]]] | None
                = None) -> tuple[list[RequestOutput], list[str]]:
        """RequestOutputs of the parents that progressed, and child ids a stop string ended; ``prompt_logprobs``:
        the core's ``EngineCore.take_prompt_logprobs()``, kept until the parent's outputs carry them."""
        if prompt_logprobs:
            self._add_prompt_logprobs(prompt_logprobs)
        now = time.monotonic()
        touched: dict[str, _Parent] = {}
        stopped: list[str] = []
        parents, parent_of = self.parents, self.parent_of
        for update in updates:
            request = update.request
            child_id = request.request_id
            parent = parents.get(parent_of.get(child_id, ""))
            if parent is None:
                continue
            sequences = parent.sequences
            if parent.request_id not in touched:
                touched[parent.request_id] = parent
                if len(sequences) > 1:  # a lone sequence's deltas are set by _apply
                    for seq in sequences.values():
                        seq.output.delta_text, seq.output.delta_token_ids = "", []
            seq = sequences[child_id]
            pending_step_ends = seq.pending_step_ends
            if pending_step_ends is not None and not update.finished and seq.output.logprobs is None:
                # final-only and still running (most of LLM.generate's updates): what _apply does
                # there, without its checks that cannot apply
                out, new_token_ids = seq.output, update.new_token_ids
                out.token_ids.extend(new_token_ids)
                out.delta_token_ids = list(new_token_ids)
                pending_step_ends.append(len(out.token_ids))
                out.delta_text = ""
            elif self._apply(seq, update):
                stopped.append(child_id)
            if seq.output.finish_reason is not None:
                parent.finished_children.add(child_id)
                del parent_of[child_id]  # a core in another process may still send its tokens: dropped
            if update.new_token_ids:
                metrics = parent.metrics
                if metrics.first_token_time is None:
                    metrics.first_token_time = now
                    metrics.first_scheduled_time = request.first_scheduled_time
                    parent.num_cached_tokens = max(request.num_cached_tokens, 0)
                metrics.last_token_time = now
        return [self._finish_if_done(p, now) for p in touched.values()], stopped

    def _finish_if_done(self, parent: _Parent, now: float) -> RequestOutput:
        output = parent.to_output()
        if output.finished:
            parent.metrics.finished_time = now
            self._forget(parent)
        return output

    def _forget(self, parent: _Parent) -> None:
        self.parents.pop(parent.request_id, None)
        for child_id in parent.sequences:
            self.parent_of.pop(child_id, None)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Final output of an aborted request: unfinished completions end with "abort"."""
        parent = self.parents.get(request_id)
        if parent is None:
            return None
        for child_id, seq in parent.sequences.items():
            if seq.pending_step_ends is not None:
                seq.output.text = self._decode_pending(seq)[0]
                seq.num_emitted_chars = len(seq.output.text)
            seq.output.delta_text, seq.output.delta_token_ids = "", []
            if not seq.output.finished:
                seq.output.finish_reason = RequestStatus.FINISHED_ABORTED.finish_reason
                parent.finished_children.add(child_id)
        return self._finish_if_done(parent, time.monotonic())
