"""Turning a SchedulerOutput into the flat batch of one forward pass.

Everything is computed with numpy over the ``RequestTable``'s rows into preallocated (pinned, on
CUDA) host buffers, then sent with two copies: one for the packed 1-D inputs, one for the used
part of the block tables. The device tensors are views of persistent buffers, which is also what
CUDA graphs need: a captured graph reads the same addresses every replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from infer_core.interfaces import BatchMetadata, SchedulerOutput
from infer_core.runner.prompt_logprobs import PromptLogprobPlan
from infer_core.runner.state import RequestTable

# The packed 1-D inputs, in order: per token, then per request (+1 for query_start_loc's end).
_TOKEN_FIELDS = ("input_ids", "positions", "slot_mapping", "logits_indices")
_REQUEST_FIELDS = ("query_start_loc", "seq_lens", "pending_dst", "pending_src", "decode_order", "pending_rows")


@dataclass(slots=True)
class StepInputs:
    request_ids: list[str]  # batch order: decode-only requests first
    input_ids: torch.Tensor  # int32 [num_tokens (+ padding)]
    positions: torch.Tensor  # int32 [num_tokens (+ padding)]
    metadata: BatchMetadata
    logits_indices: torch.Tensor  # int32: flat-batch index of every position whose logits are sampled
    sample_rows: list[int]  # batch index of the request each sampled position belongs to
    padded_num_tokens: int  # rows of the padded batch (== num_tokens when not padded for a graph)
    # The CUDA graph the batch is padded for (at most one is set; neither: the step runs eagerly):
    decode_graph: int | None = None  # a decode graph's batch size (``padded_num_reqs``)
    prefill_graph: int | None = None  # a prefill graph's token count (``padded_num_tokens``)
    piecewise_graph: int | None = None  # piecewise graphs' token count (runner/piecewise_graphs.py)
    # Tokens sampled by the previous step and not known on the host: ``input_ids[pending_dst]``
    # must be set to ``previous_sampled[pending_src]`` on the device before the forward.
    pending_dst: torch.Tensor | None = None  # int32 flat-batch indices
    pending_src: torch.Tensor | None = None  # int32 rows of the previous step's sampled ids
    pending_rows: torch.Tensor | None = None  # int32 batch index of each pending token's request
    # > 0 when pending_dst and pending_src are both 0..n-1 (steady decode: the batch in the previous step's
    # order, every row pending): then ``input_ids[:n] = previous_sampled[:n]``, one copy instead of a gather
    pending_prefix: int = 0
    pending_max_query_len: int = 0  # the longest query among the requests with a pending token
    # Prompt logprobs: the positions whose logits score the next prompt token (the forward fills its logits)
    prompt_plan: PromptLogprobPlan | None = None


class StepBuffers:
    """Persistent host and device buffers for step inputs, sized for the largest step.

    Rows past a step's real tokens/requests can be filled as padding that reads and writes only
    ``pad_slot``'s block, so a padded CUDA-graph batch never touches a request's KV cache.
    """

    def __init__(self, max_num_tokens: int, max_num_reqs: int, max_blocks_per_req: int, device: torch.device,
                 pad_block: int = 0) -> None:
        self.device = device
        self.max_num_tokens, self.max_num_reqs = max_num_tokens, max_num_reqs
        self.max_blocks_per_req = max_blocks_per_req
        self.pad_block = pad_block
        sizes = [max_num_tokens] * len(_TOKEN_FIELDS) + [max_num_reqs + 1] + [max_num_reqs] * (len(_REQUEST_FIELDS) - 1)
        pin = device.type == "cuda"
        self._packed_host = torch.zeros(sum(sizes), dtype=torch.int32, pin_memory=pin)
        self._block_tables_host = torch.zeros(max_num_reqs, max_blocks_per_req, dtype=torch.int32, pin_memory=pin)
        if device.type == "cuda":
            self._packed = torch.zeros(sum(sizes), dtype=torch.int32, device=device)
            self.block_tables = torch.zeros(max_num_reqs, max_blocks_per_req, dtype=torch.int32, device=device)
        else:  # the CPU reads the host buffers directly
            self._packed, self.block_tables = self._packed_host, self._block_tables_host
        offsets = np.cumsum([0, *sizes])
        names = (*_TOKEN_FIELDS, *_REQUEST_FIELDS)
        self.host = {n: self._packed_host[offsets[i] : offsets[i + 1]].numpy() for i, n in enumerate(names)}
        self.dev = {n: self._packed[offsets[i] : offsets[i + 1]] for i, n in enumerate(names)}
        self.block_tables_np = self._block_tables_host.numpy()
        # The host buffers are rewritten each step; wait until the previous copy has read them
        # (a rank that never syncs on sampled tokens could otherwise run ahead of its copies).
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        # the stream the steps run on, looked up once (current_stream() costs microseconds of Python a call)
        self._stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

    def fits(self, num_tokens: int, num_reqs: int, max_blocks: int) -> bool:
        return (num_tokens <= self.max_num_tokens and num_reqs <= self.max_num_reqs
                and max_blocks <= self.max_blocks_per_req)

    def wait_for_previous_copy(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()

    def copy_to_device(self, num_reqs: int, num_block_cols: int) -> None:
        if self._copied is None:
            return
        self._packed.copy_(self._packed_host, non_blocking=True)
        self.block_tables[:num_reqs, :num_block_cols].copy_(
            self._block_tables_host[:num_reqs, :num_block_cols], non_blocking=True)
        self._copied.record(self._stream)

    def fill_padding(self, num_tokens: int, padded_tokens: int, num_reqs: int, padded_reqs: int,
                     block_size: int) -> None:
        """Padding tokens are one-token requests at position 0 of the pad block (a decode graph's), or,
        with ``padded_reqs == num_reqs``, tokens of no request that write only the pad block (a
        prefill graph's: the attention of the step's request stops at its own length)."""
        h = self.host
        h["input_ids"][num_tokens:padded_tokens] = 0
        h["positions"][num_tokens:padded_tokens] = 0
        h["slot_mapping"][num_tokens:padded_tokens] = self.pad_block * block_size
        h["query_start_loc"][num_reqs + 1 : padded_reqs + 1] = num_tokens + 1 + np.arange(padded_reqs - num_reqs)
        h["seq_lens"][num_reqs:padded_reqs] = 1
        self.block_tables_np[num_reqs:padded_reqs] = self.pad_block


def _batch_order(scheduled: dict[str, int]) -> list[str]:
    """Decode-only requests (one query token) first; stable, so schedule order is kept otherwise."""
    decodes = [rid for rid, n in scheduled.items() if n == 1]
    if len(decodes) == len(scheduled):
        return decodes
    return decodes + [rid for rid, n in scheduled.items() if n != 1]


def build_step_inputs(
    output: SchedulerOutput, states: RequestTable, block_size: int, device: torch.device,
    buffers: StepBuffers | None = None, padded_num_reqs: int | None = None,
    previous_sample_rows: dict[str, int] | None = None, padded_num_tokens: int | None = None,
    piecewise_graph: int | None = None,
) -> StepInputs:
    """The flat batch of ``output``; with ``padded_num_reqs``, padded with one-token dummy requests
    (decode-only steps replayed by a CUDA graph of that size); with ``padded_num_tokens``, padded
    with tokens of no request (one request's prompt chunk replayed by a prefill graph); with
    ``piecewise_graph``, padded so too (any step, replayed by the piecewise graphs of that size).

    ``previous_sample_rows``: request id -> row of the previous step's sampled ids, for requests
    whose last token is still pending (see ``StepInputs.pending_dst``).
    """
    scheduled = output.num_scheduled_tokens
    request_ids = _batch_order(scheduled)
    num_reqs = len(request_ids)
    padded_reqs = padded_num_reqs or num_reqs
    # One pass over the requests for everything read from their Python state.
    per_request = np.array([(s.row, scheduled[rid], len(s.block_ids), len(s.token_ids), s.num_pending_tokens)
                            for rid in request_ids for s in (states[rid],)], dtype=np.int64).reshape(num_reqs, 5)
    rows, num_allocated, num_on_host = per_request[:, 0], per_request[:, 2], per_request[:, 3]
    num_pending = per_request[:, 4]
    num_known = num_on_host + num_pending
    query_lens = per_request[:, 1].astype(np.int32)
    for rid, draft in output.spec_token_ids.items():
        if draft:
            state = states[rid]
            states.write_draft_tokens(state.row, len(state.token_ids) + state.num_pending_tokens, draft)
    num_tokens = int(query_lens.sum())
    padded_tokens = (padded_num_tokens if padded_num_tokens is not None else piecewise_graph
                     if piecewise_graph is not None else num_tokens + (padded_reqs - num_reqs))
    max_blocks = int(num_allocated.max())
    if buffers is None or not buffers.fits(padded_tokens, padded_reqs, max_blocks):
        if padded_tokens > num_tokens:
            raise RuntimeError("a padded (CUDA-graph) step must use the graphs' own buffers")
        buffers = StepBuffers(padded_tokens, padded_reqs, max_blocks, device)  # a one-off, larger step
    buffers.wait_for_previous_copy()
    h = buffers.host

    query_start_loc = h["query_start_loc"][: num_reqs + 1]
    query_start_loc[0] = 0
    np.cumsum(query_lens, out=query_start_loc[1:])
    computed = states.num_computed_tokens[rows]
    token_rows = np.repeat(rows, query_lens)
    positions = np.arange(num_tokens, dtype=np.int64) - np.repeat(query_start_loc[:-1] - computed, query_lens)
    h["positions"][:num_tokens] = positions
    h["input_ids"][:num_tokens] = states.token_ids[token_rows, positions]
    seq_lens = h["seq_lens"][:num_reqs]
    np.add(computed, query_lens, out=seq_lens)
    if np.any(seq_lens > num_allocated * block_size):  # would write into another request's block
        bad = int(np.argmax(seq_lens > num_allocated * block_size))
        raise RuntimeError(f"request {request_ids[bad]}: {seq_lens[bad]} tokens but blocks for "
                           f"{num_allocated[bad] * block_size}; scheduler and runner disagree")
    block_tables = buffers.block_tables_np
    block_tables[:num_reqs, :max_blocks] = states.block_table[rows, :max_blocks]
    h["slot_mapping"][:num_tokens] = (states.block_table[token_rows, positions // block_size] * block_size
                                      + positions % block_size)

    # Sampled positions: a request that reaches the end of its known tokens samples its last
    # position, plus one per draft token it verifies.
    beyond_known = computed + query_lens - num_known  # the draft tokens fed, when >= 0
    samples = np.where(beyond_known >= 0, beyond_known + 1, 0)
    ends = query_start_loc[1:].astype(np.int64)
    sample_rows = np.repeat(np.arange(num_reqs), samples)
    num_samples = int(samples.sum())
    first_of_row = np.repeat(np.cumsum(samples) - samples, samples)
    h["logits_indices"][:num_samples] = (np.repeat(ends - samples, samples) + np.arange(num_samples) - first_of_row)

    pending_reqs = np.flatnonzero(num_pending)
    pending_prefix = 0
    if len(pending_reqs):
        pending_prefix = _place_pending(request_ids, pending_reqs, num_known - 1 - computed, query_lens,
                                        query_start_loc, previous_sample_rows, h)

    if padded_tokens > num_tokens:
        buffers.fill_padding(num_tokens, padded_tokens, num_reqs, padded_reqs, block_size)
    num_decode_only = int(np.count_nonzero(query_lens == 1))
    # the decode-only rows (a graph's padding rows too), longest context first: see BatchMetadata.decode_order
    num_ordered = padded_reqs if num_decode_only == num_reqs else num_decode_only
    h["decode_order"][:num_ordered] = np.argsort(-h["seq_lens"][:num_ordered], kind="stable")
    buffers.copy_to_device(padded_reqs, max_blocks)
    d = buffers.dev
    metadata = BatchMetadata(
        num_reqs=num_reqs,
        num_tokens=num_tokens,
        num_decode_only=num_decode_only,
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()),
        block_size=block_size,
        query_start_loc=d["query_start_loc"][: num_reqs + 1],
        seq_lens=d["seq_lens"][:num_reqs],
        block_tables=buffers.block_tables[:num_reqs, :max_blocks],
        slot_mapping=d["slot_mapping"][:num_tokens],
        query_start_loc_cpu=torch.from_numpy(query_start_loc),
        seq_lens_cpu=torch.from_numpy(seq_lens),
        decode_order=d["decode_order"][:num_decode_only],
    )
    return StepInputs(
        request_ids=request_ids,
        input_ids=d["input_ids"][:padded_tokens],
        positions=d["positions"][:padded_tokens],
        metadata=metadata,
        logits_indices=d["logits_indices"][:num_samples],
        sample_rows=sample_rows.tolist(),
        padded_num_tokens=padded_tokens,
        decode_graph=padded_num_reqs,
        prefill_graph=padded_num_tokens,
        piecewise_graph=piecewise_graph,
        pending_dst=d["pending_dst"][: len(pending_reqs)] if len(pending_reqs) else None,
        pending_src=d["pending_src"][: len(pending_reqs)] if len(pending_reqs) else None,
        pending_prefix=pending_prefix,
        pending_rows=d["pending_rows"][: len(pending_reqs)] if len(pending_reqs) else None,
        pending_max_query_len=int(query_lens[pending_reqs].max()) if len(pending_reqs) else 0,
    )


def _place_pending(request_ids: list[str], pending_reqs: np.ndarray, pending_offset: np.ndarray,
                   query_lens: np.ndarray, query_start_loc: np.ndarray,
                   previous_sample_rows: dict[str, int] | None, h: dict[str, np.ndarray]) -> int:
    """Where each request's last pending token goes in the flat batch (``pending_offset``: its index in
    the request's query), and which previous sample it is; returns n when both are 0..n-1 (see
    ``StepInputs.pending_prefix``), else 0."""
    get = (previous_sample_rows or {}).get
    # -1: not sampled by the previous step (checked below with the rest, over whole arrays)
    src = np.fromiter((get(request_ids[i], -1) for i in pending_reqs.tolist()), dtype=np.int64,
                      count=len(pending_reqs))
    offset = pending_offset[pending_reqs]
    bad = (src < 0) | (offset < 0) | (offset >= query_lens[pending_reqs])
    if bad.any():
        i = int(pending_reqs[np.argmax(bad)])
        raise RuntimeError(f"request {request_ids[i]}: a pending token at offset {pending_offset[i]} of its query, "
                           "or one the previous step did not sample; scheduler and runner disagree")
    n = len(pending_reqs)
    h["pending_rows"][:n] = pending_reqs
    dst = h["pending_dst"][:n]
    np.add(query_start_loc[pending_reqs], offset, out=dst)
    h["pending_src"][:n] = src
    in_order = src[-1] == n - 1 and dst[-1] == n - 1 and np.array_equal(src, np.arange(n)) and np.array_equal(dst, src)
    return n if in_order else 0
