"""A draft model beside the target on one rank: its weights, its KV cache, and its proposals.

A decoding policy that names a draft model (``DecodingPolicy.draft_model``) gets one per rank, built
with the core's model classes and the target's attention backend, unquantized, in the target's dtype.
Its proposals are its greedy tokens (a point-mass draft distribution, which the verify step's
modified rejection sampling makes exact: ``runner/verify.py``).

**Its KV cache mirrors the target's blocks.** It has the target's number of blocks, and the draft's
K/V of a request's position lives at the slot the target's block table gives that position; one
allocator (the scheduler's) serves both, so a request's draft KV is freed with it, and the memory
profile counts a block as the target's bytes plus the draft's. Positions past the blocks the
request holds when it drafts (its newest token and the drafts, whose blocks the scheduler allocates
only when it schedules them) go to scratch blocks after the mirrored ones, a few per batch row.

**What the draft has computed** is tracked per request (``_DraftState``): the positions written at
mirrored slots with the request's tokens. Each proposal first feeds the tokens after that (a
prompt's on the first proposal, one or a few otherwise: the accepted drafts whose K/V is already
in place are not fed again), then drafts one token a forward. A preemption (its count changes)
starts the request's draft KV over. And per block, ``block_content`` records the token prefix
(a chain hash up to the block's end) whose draft K/V a full block holds, dropped when the draft
writes into the block again: a request starting (or resuming) over blocks that hold its own prefix
(a prefix-cache hit on blocks the draft filled) skips them. So chunked prefill (a request drafts
only once its whole prompt is computed), prefix-cache hits and preemption never leave the draft
reading K/V it did not write for the request's tokens; exactness never depends on it anyway.

A forward of one-token requests (a decode step of up to ``GRAPH_SIZES[-1]`` requests) replays a CUDA
graph where the target's runner captures them (the core's ``CudaGraphRunner`` over the draft's own
step buffers, with each size's greedy argmax); any other forward (a catch-up over several tokens)
runs eagerly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from infer_core.config import EngineConfig
from infer_core.errors import ModelError
from infer_core.interfaces import BatchMetadata, DraftRequest, ParallelContext
from infer_core.layers.attention import attention_layers
from infer_core.layers.sampler import greedy_argmax
from infer_core.loader import Catalog
from infer_core.models.build import BuildContext
from infer_core.models.source import read_model_config, resolve_model_source
from infer_core.models.weights import load_model_weights
from infer_core.runner.cuda_graphs import CudaGraphRunner
from infer_core.runner.inputs import StepBuffers
from infer_core.runner.kv_cache import allocate_kv_caches, block_bytes
from infer_core.runner.state import RequestTable

logger = logging.getLogger(__name__)

GRAPH_SIZES = (1, 2, 4, 8)  # decode batch sizes of the draft's CUDA graphs (batch 1 is where users wait)


@dataclass(slots=True)
class _DraftState:
    """Positions [0, base) of the draft's cache hold the request's tokens; [base, base + len(tail)) hold
    ``tail`` (drafts fed last time, kept where the request accepted them)."""

    num_preemptions: int
    base: int = 0
    tail: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # [i]: the chain hash of the tokens up to block i's end

    def num_valid(self, tokens: list[int]) -> int:
        valid = self.base
        for token in self.tail:
            if valid >= len(tokens) or tokens[valid] != token:
                break
            valid += 1
        return min(valid, len(tokens) - 1)  # the newest token is always fed: its logits give draft 1


def draft_model_for(config: EngineConfig, parallel: ParallelContext, device: torch.device, dtype: torch.dtype,
                    catalog: Catalog) -> DraftModel | None:
    """The draft model the chosen decoding policy names (None: it names none)."""
    policy = catalog.load_class("decoding", config.implementations.get("decoding", "standard"))
    folder = policy.draft_model(config.settings)
    return DraftModel(folder, config, parallel, device, dtype, catalog) if folder else None


class DraftModel:
    def __init__(self, folder: str, config: EngineConfig, parallel: ParallelContext, device: torch.device,
                 dtype: torch.dtype, catalog: Catalog) -> None:
        self.source = resolve_model_source(folder)
        self.model_config = read_model_config(self.source)
        target = config.model
        if self.model_config.vocab_size != target.vocab_size:
            raise ModelError(f"the draft model {self.source.describe()} has a vocabulary of "
                             f"{self.model_config.vocab_size} tokens, the target {config.source.describe()} one of "
                             f"{target.vocab_size}; a draft must share the target's tokenizer")
        self.config, self.parallel, self.device, self.dtype = config, parallel, device, dtype
        self.block_size = config.block_size
        self.num_kv_heads = max(1, self.model_config.num_kv_heads // parallel.world_size)  # on this rank
        self.ctx = replace(config.context, model=self.model_config)
        self.attention = catalog.load_class("attention", config.implementations["attention"])(self.ctx)
        self.quantizer = catalog.load_class("quantization", "none")(self.ctx)
        self.model_class = catalog.load_class("model", self.model_config.architecture)
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.graphs: CudaGraphRunner | None = None
        self.scratch_start = 0  # first scratch block (after the mirrored ones and the pad block)
        # scratch blocks of one batch row: the newest token and up to 16 drafts past the request's blocks
        self.scratch_per_row = -(-17 // self.block_size) + 1
        self.states: dict[str, _DraftState] = {}
        self.block_content: dict[int, int] = {}  # block id -> chain hash of the prefix its draft K/V is of

    def load(self, strategy) -> None:
        load_format = self.config.load_format
        if load_format != "dummy":
            load_format = "gguf" if self.source.gguf_file else "safetensors"
        build = BuildContext(self.model_config, self.parallel, self.quantizer, self.attention, self.dtype,
                             self.config.max_model_len)
        with torch.device(self.device):
            model = self.model_class(build)
        load_model_weights(model, self.source, self.model_config, load_format, self.config.settings.seed)
        strategy.prepare_model(model, self.parallel)
        self.attention.bind_layers(attention_layers(model))
        self.model = model.eval()
        logger.info("draft model %s (%s) loaded: %d layers", self.source.describe(), self.model_config.architecture,
                    self.model_config.num_layers)

    def bytes_per_block(self) -> int:
        m = self.model_config
        return block_bytes(m.num_layers, self.block_size, self.num_kv_heads, m.head_dim, self.dtype)

    def reserved_bytes(self) -> int:
        """The scratch blocks' bytes: held apart from the mirrored blocks the memory profile sizes."""
        return self.config.settings.max_num_seqs * self.scratch_per_row * self.bytes_per_block()

    def init_kv_cache(self, num_blocks: int, cuda_graphs: bool) -> None:
        """The mirrored blocks, the pad block (``num_blocks``: graph padding writes there) and the scratch
        blocks; then, with ``cuda_graphs``, the decode graphs."""
        m, max_num_seqs = self.model_config, self.config.settings.max_num_seqs
        self.scratch_start = num_blocks + 1
        total = self.scratch_start + max_num_seqs * self.scratch_per_row
        self.kv_caches = allocate_kv_caches(m.num_layers, total, self.block_size, self.num_kv_heads, m.head_dim,
                                            self.dtype, self.device)
        if cuda_graphs:
            sizes = [size for size in GRAPH_SIZES if size <= max_num_seqs]
            max_len = self.config.max_model_len + 17  # drafts may run past max_model_len before the scheduler trims
            buffers = StepBuffers(sizes[-1], sizes[-1], -(-max_len // self.block_size) + self.scratch_per_row,
                                  self.device, pad_block=num_blocks)
            self.graphs = CudaGraphRunner(buffers, self.block_size, max_len, sizes)
            with torch.inference_mode():
                self.graphs.capture(self.attention.build_metadata, self._logits, None, greedy_argmax)

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata) -> torch.Tensor:
        return self.model.compute_logits(self.model(input_ids, positions, self.kv_caches, metadata))

    def _replay(self, input_ids, positions, slots, seq_lens, block_rows) -> torch.Tensor | None:
        """A decode step of one-token requests in its graph: each row's greedy token (None: no graph holds it)."""
        rows = len(slots)
        size = self.graphs.padded_size(rows)
        if size is None:
            return None
        b = self.graphs.buffers
        b.wait_for_previous_copy()
        h = b.host
        h["positions"][:rows], h["slot_mapping"][:rows], h["seq_lens"][:rows] = positions, slots, seq_lens
        h["query_start_loc"][: rows + 1] = np.arange(rows + 1)
        for i, row in enumerate(block_rows):
            b.block_tables_np[i, :len(row)] = row
        on_device = isinstance(input_ids, torch.Tensor)
        if not on_device:
            h["input_ids"][:rows] = input_ids
        b.fill_padding(rows, size, rows, size, self.block_size)
        h["decode_order"][:size] = np.argsort(-h["seq_lens"][:size], kind="stable")
        b.copy_to_device(size, b.max_blocks_per_req)
        if on_device:  # after the host buffers' copy, which also writes input_ids
            b.dev["input_ids"][:rows].copy_(input_ids)
        self.graphs.replay(size)
        return self.graphs.replay_argmax(size)[:rows].clone()  # the graph's buffer: rewritten by its next replay

    def _forward(self, input_ids, positions, slots, query_lens, seq_lens, block_rows, logits_rows) -> torch.Tensor:
        """One forward over requests [decode-only first]; the greedy token of each ``logits_rows``."""
        num_reqs = len(query_lens)
        if self.graphs is not None and len(slots) == num_reqs:  # one token each: a decode graph may hold it
            greedy = self._replay(input_ids, positions, slots, seq_lens, block_rows)
            if greedy is not None:
                return greedy
        query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(query_lens, out=query_start_loc[1:])
        width = max(len(row) for row in block_rows)
        tables = np.zeros((num_reqs, width), dtype=np.int32)
        for i, row in enumerate(block_rows):
            tables[i, :len(row)] = row
        def to_dev(a):
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(self.device)

        seq_lens = np.asarray(seq_lens, dtype=np.int32)
        common = BatchMetadata(
            num_reqs=num_reqs, num_tokens=len(slots), num_decode_only=int(np.count_nonzero(query_lens == 1)),
            max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()), block_size=self.block_size,
            query_start_loc=to_dev(query_start_loc), seq_lens=to_dev(seq_lens), block_tables=to_dev(tables),
            slot_mapping=to_dev(slots), query_start_loc_cpu=torch.from_numpy(query_start_loc),
            seq_lens_cpu=torch.from_numpy(seq_lens))
        ids = input_ids if isinstance(input_ids, torch.Tensor) else to_dev(input_ids)
        hidden = self.model(ids.to(torch.int32), to_dev(positions), self.kv_caches,
                            self.attention.build_metadata(common))
        logits = self.model.compute_logits(hidden.index_select(0, to_dev(logits_rows)))
        return logits.argmax(dim=-1)

    def _slots(self, blocks: list[int], scratch: list[int], positions: np.ndarray) -> np.ndarray:
        table = np.asarray(blocks + scratch, dtype=np.int64)
        index = positions // self.block_size
        if index.size and index.max() >= len(table):
            raise RuntimeError(f"a draft position {int(positions.max())} past the request's {len(blocks)} blocks "
                               f"and {len(scratch)} scratch blocks; the runner and the scheduler disagree")
        return table[index] * self.block_size + positions % self.block_size

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], table: RequestTable) -> dict[str, list[int]]:
        """Each request's greedy draft of ``num_tokens`` tokens (requests the runner does not hold: none)."""
        for request_id in [r for r in self.states if r not in table]:
            del self.states[request_id]
        work = []
        for r in requests:
            held = table.get(r.request_id)
            if held is None or r.num_tokens < 1 or len(r.token_ids) < 1:
                continue
            state = self.states.get(r.request_id)
            blocks = list(held.block_ids)
            if state is None or state.num_preemptions != r.num_preemptions:
                state = self.states[r.request_id] = self._start(r, blocks)
            valid = state.num_valid(r.token_ids)
            for block in blocks[valid // self.block_size:]:  # written again below: no longer a full prefix's
                self.block_content.pop(block, None)
            work.append((r, state, valid, blocks))
        if not work:
            return {}
        work.sort(key=lambda w: -w[0].num_tokens)  # draft order: the requests still drafting are a prefix
        rows = len(work)
        scratch = [list(range(self.scratch_start + i * self.scratch_per_row,
                              self.scratch_start + (i + 1) * self.scratch_per_row)) for i in range(rows)]
        # forward 1: each request's tokens from its first uncomputed one; decode-only requests first
        order = sorted(range(rows), key=lambda i: len(work[i][0].token_ids) - work[i][2] != 1)
        ids, pos, slots, qlens, slens, btabs = [], [], [], [], [], []
        for i in order:
            r, _, valid, blocks = work[i]
            n = len(r.token_ids)
            p = np.arange(valid, n, dtype=np.int64)
            ids.append(np.asarray(r.token_ids[valid:], dtype=np.int64))
            pos.append(p)
            slots.append(self._slots(blocks, scratch[i], p))
            qlens.append(n - valid)
            slens.append(n)
            btabs.append(blocks + scratch[i])
        qlens = np.asarray(qlens)
        last = np.cumsum(qlens) - 1
        first = self._forward(np.concatenate(ids), np.concatenate(pos), np.concatenate(slots), qlens, slens, btabs,
                              last)
        inverse = np.empty(rows, dtype=np.int64)
        inverse[np.asarray(order)] = np.arange(rows)
        drafted = [first.index_select(0, torch.from_numpy(inverse).to(self.device))]
        # forwards 2..k: one token per request still drafting, on the device from the forward before
        max_k = work[0][0].num_tokens
        for j in range(1, max_k):
            active = sum(1 for w in work if w[0].num_tokens > j)
            p = np.asarray([len(w[0].token_ids) - 1 + j for w in work[:active]], dtype=np.int64)
            slots = np.concatenate([self._slots(w[3], scratch[i], p[i:i + 1]) for i, w in enumerate(work[:active])])
            drafted.append(self._forward(drafted[-1][:active], p, slots, np.ones(active, dtype=np.int64), p + 1,
                                         [w[3] + scratch[i] for i, w in enumerate(work[:active])],
                                         np.arange(active)))
        columns = [d.tolist() for d in drafted]
        proposals = {}
        for i, (r, state, _, blocks) in enumerate(work):
            draft = [columns[j][i] for j in range(r.num_tokens)]
            proposals[r.request_id] = draft
            n, capacity = len(r.token_ids), len(blocks) * self.block_size
            state.base = min(n, capacity)  # fed at mirrored slots: the request's tokens
            state.tail = draft[:r.num_tokens - 1][:max(0, capacity - n)]  # drafts fed at mirrored slots
            self._record_full_blocks(state, r.token_ids, blocks)
        return proposals

    def _chain(self, state: _DraftState, tokens: list[int], i: int) -> int:
        previous = state.hashes[i - 1] if i else 0
        return hash((previous, tuple(tokens[i * self.block_size:(i + 1) * self.block_size])))

    def _start(self, r: DraftRequest, blocks: list[int]) -> _DraftState:
        """A request's state when it first drafts (or after a preemption): the leading blocks that hold
        the draft K/V of its own prefix count as computed."""
        state = _DraftState(r.num_preemptions)
        for i, block in enumerate(blocks[:(len(r.token_ids) - 1) // self.block_size]):
            digest = self._chain(state, r.token_ids, i)
            if self.block_content.get(block) != digest:
                break
            state.hashes.append(digest)
        state.base = len(state.hashes) * self.block_size
        return state

    def _record_full_blocks(self, state: _DraftState, tokens: list[int], blocks: list[int]) -> None:
        """Blocks the draft has filled with the request's tokens: their prefix, for later requests' hits."""
        for i in range(len(state.hashes), state.base // self.block_size):
            state.hashes.append(self._chain(state, tokens, i))
            self.block_content[blocks[i]] = state.hashes[i]
