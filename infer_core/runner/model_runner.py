"""ModelRunner: builds the model on this rank, owns its KV cache, and runs one step at a time.

A step (``execute_async``) runs in three stages, each one method:

1. ``_prepare``: the request table takes the scheduler's changes; ``build_step_inputs`` (inputs.py)
   writes the flat batch into persistent buffers, padded for the CUDA graph ``graph_for`` picks;
   tokens the previous step sampled that the host has not seen yet are copied in on the device.
2. forward: ``forward_step`` (cuda_graphs.py) replays that graph or calls ``forward_eager``, and
   gives the logits of the rows that sample.
3. ``_sample``: the sampling batch (sampling_inputs.py), the constrained rows' grammar masks (grammar_masks.py)
   and the sampler, or a greedy decode batch's argmax graph; the ids start their copy to the host
   (step_output.py) and stay on the device for the next step's pending tokens.
   A step that verifies draft tokens samples in verify.py instead.

Start-up's dummy steps (the memory profile that sizes the KV cache, the kernel warm-up) are in
warmup.py.
"""

from __future__ import annotations

import functools
import logging
import time

import numpy as np
import torch

from infer_core.config import EngineConfig
from infer_core.interfaces import ParallelContext, PendingOutput, ReadyOutput, RunnerOutput, SchedulerOutput
from infer_core.layers import fused
from infer_core.layers.attention import attention_layers
from infer_core.layers.sampler import SamplerOutput, sample, takes_argmax
from infer_core.loader import Catalog
from infer_core.models.build import BuildContext
from infer_core.platform import use_physical_cores
from infer_core.models.weights import load_model_weights
from infer_core.profiling import step_range
from infer_core.runner.accepted_drafts import AcceptedDrafts
from infer_core.runner.cuda_graphs import CudaGraphRunner, forward_step, graph_for
from infer_core.runner.graph_plan import capture_graphs, prefill_graph_sizes, uses_cuda_graphs
from infer_core.runner.piecewise_graphs import PiecewiseGraphs
from infer_core.runner.draft_model import draft_model_for
from infer_core.runner.grammar_masks import GrammarMasks
from infer_core.runner.inputs import StepBuffers, StepInputs, build_step_inputs
from infer_core.runner.kv_cache import allocate_kv_caches, block_bytes, kv_cache_dtype
from infer_core.runner.prompt_logprobs import plan_prompt_logprobs, score, wanting_prompt_logprobs
from infer_core.runner.sampling_inputs import build_sampling_batch, to_device
from infer_core.runner.state import RequestState, RequestTable
from infer_core.runner.step_output import HostSlots, SampledStep
from infer_core.runner.verify import verify_drafts
from infer_core.runner.warmup import profile_num_blocks, warm_up

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """One rank's model, KV cache, step buffers and CUDA graphs; ``execute_async`` runs a step."""

    def __init__(self, config: EngineConfig, parallel: ParallelContext, device: torch.device, catalog: Catalog) -> None:
        self.config = config
        self.parallel = parallel
        self.device = device
        self.dtype = DTYPES[config.dtype]
        self.kv_dtype = kv_cache_dtype(config.settings.kv_cache_dtype, self.dtype)  # the attention backend accepted it
        self.ctx = config.context
        names = config.implementations
        self.attention = catalog.load_class("attention", names["attention"])(self.ctx)
        self.quantizer = catalog.load_class("quantization", names["quantization"])(self.ctx)
        self.strategy = catalog.load_class("parallel", names["parallel"])(self.ctx)
        self.model_class = catalog.load_class("model", config.model.architecture)
        self.model: torch.nn.Module | None = None
        self.draft = draft_model_for(config, parallel, device, self.dtype, catalog)  # the policy's draft model, if any
        self.kv_caches: list[torch.Tensor] = []
        settings = config.settings
        if device.type == "cpu":
            use_physical_cores()
        fused.PDL = settings.pdl  # process-wide, like torch.backends flags: read at each kernel launch
        self.max_blocks_per_req = -(-config.max_model_len // config.block_size) + 1  # +1: a draft's lookahead
        self.requests = RequestTable(settings.max_num_seqs, config.max_model_len, self.max_blocks_per_req)
        self.buffers: StepBuffers | None = None  # sized and allocated with the KV cache
        self.host_slots: HostSlots | None = None  # pinned buffers for sampled ids (CUDA), with the KV cache
        self.graphs: CudaGraphRunner | None = None
        self._uses_cuda_graphs: bool | None = None
        self.piecewise: PiecewiseGraphs | None = None  # every other step's layers (runner/piecewise_graphs.py)
        self.return_logits = False  # tests and accuracy checks: copy sampled positions' logits to the host
        # Unseeded sampling draws from this generator, not torch's global one: reproducible run to
        # run, and unaffected by (and not affecting) whatever else the process draws.
        self.generator = torch.Generator(device=device).manual_seed(config.settings.seed)
        # The last step's sampled ids (on the device) and each sampled request's row in them: the
        # next step reads a request's pending token from here (overlapped scheduling).
        self.last_sampled: torch.Tensor | None = None
        self.last_sample_rows: dict[str, int] = {}
        self.last_step: SampledStep | None = None  # its ids' host copy: grammar matchers' pending tokens
        # A verify step's sampled and draft ids: the next step reads its pending tokens and moves its
        # positions back by the rejected drafts from them (runner/accepted_drafts.py).
        self.last_accepted: AcceptedDrafts | None = None
        self.grammar_masks = GrammarMasks(config.model.vocab_size, device)  # buffers made on a first constrained step

    @property
    def num_kv_heads(self) -> int:
        """KV heads on this rank (split over ranks, or one replicated head)."""
        return max(1, self.config.model.num_kv_heads // self.parallel.world_size)

    def load_model(self) -> None:
        start = time.perf_counter()
        logger.info("loading the weights of %s (%s, %s) onto %s…", self.config.model.architecture, self.config.dtype,
                    self.config.load_format, self.device)
        build = BuildContext(self.config.model, self.parallel, self.quantizer, self.attention, self.dtype,
                             self.config.max_model_len)
        with torch.device(self.device):
            model = self.model_class(build)
        load_model_weights(model, self.config.source, self.config.model, self.config.load_format,
                           self.config.settings.seed)
        self.strategy.prepare_model(model, self.parallel)
        self.attention.bind_layers(attention_layers(model))
        self.model = model.eval()
        if self.draft is not None:
            self.draft.load(self.strategy)
        logger.info("model %s loaded on %s (%s, %s) in %.1f s", self.config.model.architecture, self.device,
                    self.config.dtype, self.config.load_format, time.perf_counter() - start)

    def bytes_per_block(self) -> int:
        m = self.config.model
        draft = self.draft.bytes_per_block() if self.draft is not None else 0  # its cache mirrors the blocks
        return block_bytes(m.num_layers, self.config.block_size, self.num_kv_heads, m.head_dim, self.kv_dtype) + draft

    def profile_num_blocks(self) -> int:
        """KV blocks that fit on this rank (after a max-size dummy step on CUDA: runner/warmup.py)."""
        if self.draft is None:
            return profile_num_blocks(self)
        return max(0, profile_num_blocks(self) - -(-self.draft.reserved_bytes() // self.bytes_per_block()))

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` KV blocks (plus the pad block padded graph rows write to), the
        step buffers, and capture the CUDA graphs."""
        m, s = self.config.model, self.config.settings
        logger.info("allocating the KV cache: %d blocks…", num_blocks)
        self.kv_caches = allocate_kv_caches(m.num_layers, num_blocks + 1, self.config.block_size, self.num_kv_heads,
                                            m.head_dim, self.kv_dtype, self.device)
        if self.draft is not None:
            self.draft.init_kv_cache(num_blocks, self.uses_cuda_graphs())
        max_num_tokens = max(s.max_num_batched_tokens, s.max_num_seqs)
        self.buffers = StepBuffers(max_num_tokens, s.max_num_seqs, self.max_blocks_per_req, self.device,
                                   pad_block=num_blocks)
        if self.device.type == "cuda":
            self.host_slots = HostSlots(max_num_tokens, torch.cuda.current_stream(self.device))
        self.graphs, self.piecewise = capture_graphs(self)
        if self.device.type == "cuda":
            warm_up(self)

    def uses_cuda_graphs(self) -> bool:
        """Decided (and, when off, said) once: start-up asks it several times."""
        if self._uses_cuda_graphs is None:
            self._uses_cuda_graphs = uses_cuda_graphs(self)
        return self._uses_cuda_graphs

    def prefill_graph_sizes(self) -> list[int]:
        return prefill_graph_sizes(self)

    def _forward_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata) -> torch.Tensor | None:
        """Logits of every row (what a captured decode step computes)."""
        return self.model.compute_logits(self.model(input_ids, positions, self.kv_caches, metadata))

    def _forward_sampled(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata,
                         logits_indices: torch.Tensor) -> torch.Tensor | None:
        """Logits of the rows ``logits_indices`` names (what a captured prefill step computes)."""
        hidden = self.model(input_ids, positions, self.kv_caches, metadata)
        return self.model.compute_logits(hidden.index_select(0, logits_indices))

    def execute(self, output: SchedulerOutput) -> RunnerOutput:
        """Run one step and wait for its sampled tokens."""
        return self.execute_async(output).result()

    @torch.inference_mode()
    def execute_async(self, output: SchedulerOutput) -> PendingOutput:
        """Launch one step; its sampled tokens reach the host while the caller does other work."""
        if self.device.type != "cpu":
            return self._execute(output)
        # Denormal activations (seen in GGUF-dequantized models) make CPU kernels many times slower;
        # flushing them to zero changes nothing measurable. Only for our step: the thread's mode
        # is put back to IEEE behaviour afterwards.
        torch.set_flush_denormal(True)
        try:
            return self._execute(output)
        finally:
            torch.set_flush_denormal(False)

    def _execute(self, output: SchedulerOutput) -> PendingOutput:
        """One step in three stages: prepare its inputs, run its forward (a graph or eager), sample."""
        with step_range("infer.prepare_inputs"):
            inputs = self._prepare(output)
        if inputs is None:
            return ReadyOutput(RunnerOutput())
        with step_range("infer.forward"):
            logits = forward_step(inputs, self.graphs, self, self.return_logits)
        scored = score(inputs.prompt_plan, self.requests) if inputs.prompt_plan is not None else None
        if logits is None:  # nothing to sample
            self.last_sampled, self.last_sample_rows, self.last_step, self.last_accepted = None, {}, None, None
            return ReadyOutput(RunnerOutput(inputs.request_ids, [[] for _ in inputs.request_ids],
                                            [None for _ in inputs.request_ids], prompt_logprobs=scored))
        step = self._sample(inputs, logits) if not output.spec_token_ids else None
        if step is None:  # drafts to verify: each position's token and its draft's probability
            with step_range("infer.sample"):
                step = verify_drafts(inputs, logits, output.spec_token_ids, self.requests,
                                     self.config.model.vocab_size, self.config.eos_token_ids, self.device,
                                     self.generator, self.host_slots, self.return_logits)
            self.last_sampled, self.last_step, self.last_accepted = None, None, step.accepted
            self.last_sample_rows = step.accepted.request_index(inputs.request_ids)
        step.prompt_logprobs = scored
        return step

    def _prepare(self, output: SchedulerOutput) -> StepInputs | None:
        """Stage 1: the request table brought up to date and the step's inputs in the persistent buffers,
        padded for the CUDA graph that will run it; the tokens the previous step sampled and the host has
        not seen (overlapped scheduling) are placed from its sampled ids, on the device. None: an empty step."""
        self.requests.apply(output)
        if output.is_empty:
            return None
        scoring = wanting_prompt_logprobs(output, self.requests) if self.requests.num_prompt_logprobs else None
        # prompt logprobs need the prompt positions' logits too, and a graph gives the sampled rows' only
        decode_graph, prefill_graph = (None, None) if scoring else graph_for(self.graphs, output)
        piecewise = (self.piecewise.padded_size(output.total_num_scheduled_tokens) if self.piecewise is not None
                     and decode_graph is prefill_graph is None and not scoring else None)
        inputs = build_step_inputs(output, self.requests, self.config.block_size, self.device, self.buffers,
                                   decode_graph, self.last_sample_rows, prefill_graph, piecewise)
        if scoring:
            inputs.prompt_plan = plan_prompt_logprobs(scoring, inputs, output.num_scheduled_tokens, self.requests)
        if self.last_accepted is not None and inputs.pending_dst is not None:  # planned over a verify step
            if self.last_accepted.kept_at_random:
                self.last_accepted.check([rid for rid in inputs.request_ids if self.requests[rid].num_pending_tokens])
            self.last_accepted.apply(inputs, inputs.metadata.block_tables, self.config.block_size)
        elif inputs.pending_prefix:  # steady decode: the previous step's ids, in order, are the first inputs
            inputs.input_ids[: inputs.pending_prefix].copy_(self.last_sampled[: inputs.pending_prefix])
        elif inputs.pending_dst is not None:
            pending_ids = self.last_sampled.index_select(0, inputs.pending_src).to(inputs.input_ids.dtype)
            inputs.input_ids.index_put_((inputs.pending_dst,), pending_ids)
        return inputs

    def forward_eager(self, inputs: StepInputs) -> torch.Tensor | None:
        """Stage 2 where no whole-step graph holds the step: the model run from Python, or its piecewise graphs;
        the logits of the sampled rows (None: no row samples, and the LM head does not run)."""
        metadata = self.attention.build_metadata(inputs.metadata)
        if inputs.piecewise_graph is not None:  # the layers replayed, the attention run from here
            hidden = self.piecewise.replay(inputs.piecewise_graph, metadata)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, metadata)
        if inputs.prompt_plan is not None:  # prompt logprobs: the LM head on the positions that score them too
            inputs.prompt_plan.logits = self.model.compute_logits(hidden.index_select(0, inputs.prompt_plan.rows))
        if not inputs.sample_rows:
            return None
        return self.model.compute_logits(hidden.index_select(0, inputs.logits_indices))

    def _sample(self, inputs: StepInputs, logits: torch.Tensor) -> SampledStep:
        """Stage 3: a token per sampled row, on its way to the host. A greedy decode batch replays its
        decode graph's argmax graph instead of launching the sampler."""
        with step_range("infer.sample"):
            sampled_ids = [inputs.request_ids[row] for row in inputs.sample_rows]
            states = [self.requests[rid] for rid in sampled_ids]
            batch = build_sampling_batch(states, self.config.model.vocab_size, self.config.eos_token_ids,
                                         self.device, self.generator, token_table=self.requests.token_ids,
                                         pending=functools.partial(self._pending_ids, states, sampled_ids,
                                                                   self.last_sampled, self.last_sample_rows))
            if self.requests.num_constrained:  # structured outputs: grammar masks, filled while the forward runs
                batch.allowed = self.grammar_masks.build(self.requests, states, self.last_step, self.last_sample_rows)
            greedy_ids = None
            if inputs.decode_graph is not None and len(inputs.sample_rows) == len(inputs.request_ids) \
                    and takes_argmax(batch, logits):  # the decode graph's argmax, replayed: no launch from here
                greedy_ids = self.graphs.replay_argmax(inputs.decode_graph)
            if greedy_ids is not None:
                # A view of the argmax graph's output, which shares the graphs' memory pool: it holds until
                # another graph replays. The next step reads it before replaying (the pending placement);
                # only penalties read last_sampled after, and a row with penalties keeps this path off.
                result = SamplerOutput(token_ids=greedy_ids[: len(inputs.request_ids)])
            else:
                result = sample(logits, batch)
        self.last_sampled, self.last_accepted = result.token_ids, None
        self.last_sample_rows = {rid: i for i, rid in enumerate(sampled_ids)}
        slot = self.host_slots.take(result.token_ids.shape[0]) if self.host_slots is not None else None
        self.last_step = SampledStep(inputs.request_ids, inputs.sample_rows, states, result,
                                     logits if self.return_logits else None, slot)
        return self.last_step

    def _pending_ids(self, states: list[RequestState], request_ids: list[str], last_sampled: torch.Tensor | None,
                     last_sample_rows: dict[str, int]) -> tuple[list[int], torch.Tensor] | None:
        """(sampling rows, their pending token ids on the device): the penalties count them too. Called by the
        batch builder only when some row has penalties (with the previous step's sampled ids, bound at the call)."""
        rows = [i for i, state in enumerate(states) if state.num_pending_tokens]
        if not rows:
            return None
        src = np.array([last_sample_rows[request_ids[i]] for i in rows], dtype=np.int64)
        return rows, last_sampled.index_select(0, to_device(src, self.device))
