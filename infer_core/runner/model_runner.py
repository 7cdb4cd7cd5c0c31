"""ModelRunner: builds the model on this rank, owns its KV cache, and runs one step at a time."""

from __future__ import annotations

import functools
import logging
import time

import numpy as np
import torch

from infer_core.config import EngineConfig
from infer_core.interfaces import (
    NewRequestData,
    ParallelContext,
    PendingOutput,
    ReadyOutput,
    RunnerOutput,
    SchedulerOutput,
)
from infer_core.layers import fused
from infer_core.layers.sampler import (
    SamplerOutput,
    SamplingBatch,
    fused_kernels,
    greedy_argmax,
    sample,
    takes_argmax,
)
from infer_core.loader import Catalog
from infer_core.models.build import BuildContext
from infer_core.models.weights import load_model_weights
from infer_core.profiling import step_range
from infer_core.runner.cuda_graphs import CudaGraphRunner, capture_sizes, prefill_capture_sizes
from infer_core.runner.inputs import StepBuffers, build_step_inputs
from infer_core.runner.kv_cache import (
    allocate_kv_caches,
    block_bytes,
    cpu_num_blocks,
    cuda_num_blocks,
)
from infer_core.runner.sampling_inputs import build_sampling_batch, to_device
from infer_core.runner.state import RequestState, RequestTable
from infer_core.runner.step_output import HostSlots, SampledStep
from infer_core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(self, config: EngineConfig, parallel: ParallelContext, device: torch.device, catalog: Catalog) -> None:
        self.config = config
        self.parallel = parallel
        self.device = device
        self.dtype = DTYPES[config.dtype]
        self.ctx = config.context
        names = config.implementations
        self.attention = catalog.load_class("attention", names["attention"])(self.ctx)
        self.quantizer = catalog.load_class("quantization", names["quantization"])(self.ctx)
        self.strategy = catalog.load_class("parallel", names["parallel"])(self.ctx)
        self.model_class = catalog.load_class("model", config.model.architecture)
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        settings = config.settings
        fused.PDL = settings.pdl  # process-wide, like torch.backends flags: read at each kernel launch
        self.max_blocks_per_req = -(-config.max_model_len // config.block_size) + 1  # +1: a draft's lookahead
        self.requests = RequestTable(settings.max_num_seqs, config.max_model_len, self.max_blocks_per_req)
        self.buffers: StepBuffers | None = None  # sized and allocated with the KV cache
        self.host_slots: HostSlots | None = None  # pinned buffers for sampled ids (CUDA), with the KV cache
        self.graphs: CudaGraphRunner | None = None
        self.return_logits = False  # tests and accuracy checks: copy sampled positions' logits to the host
        # Unseeded sampling draws from this generator, not torch's global one: reproducible run to
        # run, and unaffected by (and not affecting) whatever else the process draws.
        self.generator = torch.Generator(device=device).manual_seed(config.settings.seed)
        # The last step's sampled ids (on the device) and each sampled request's row in them: the
        # next step reads a request's pending token from here (overlapped scheduling).
        self.last_sampled: torch.Tensor | None = None
        self.last_sample_rows: dict[str, int] = {}

    @property
    def num_kv_heads(self) -> int:
        """KV heads on this rank (split over ranks, or one replicated head)."""
        return max(1, self.config.model.num_kv_heads // self.parallel.world_size)

    def load_model(self) -> None:
        start = time.perf_counter()
        build = BuildContext(self.config.model, self.parallel, self.quantizer, self.attention, self.dtype,
                             self.config.max_model_len)
        with torch.device(self.device):
            model = self.model_class(build)
        load_model_weights(model, self.config.source, self.config.load_format, self.config.settings.seed)
        self.strategy.prepare_model(model, self.parallel)
        self.model = model.eval()
        logger.info("model %s loaded on %s (%s, %s) in %.1f s", self.config.model.architecture, self.device,
                    self.config.dtype, self.config.load_format, time.perf_counter() - start)

    def bytes_per_block(self) -> int:
        m = self.config.model
        return block_bytes(m.num_layers, self.config.block_size, self.num_kv_heads, m.head_dim, self.dtype)

    def profile_num_blocks(self) -> int:
        """KV blocks that fit on this rank (after a max-size dummy step on CUDA)."""
        s = self.config.settings
        max_useful = s.max_num_seqs * -(-self.config.max_model_len // self.config.block_size)
        if self.device.type != "cuda":
            return cpu_num_blocks(s.kv_cache_gb, self.bytes_per_block(), max_useful)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self._dummy_step()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        # A captured decode batch of max_num_seqs tokens needs about that share of the profiled
        # activations (which are for max_num_batched_tokens tokens).
        graph_tokens = max([s.max_num_seqs, *self._prefill_graph_sizes()])
        graph_share = min(1.0, graph_tokens / s.max_num_batched_tokens) if self.uses_cuda_graphs() else 0.0
        return cuda_num_blocks(s.gpu_memory_utilization, s.kv_cache_gb, self.bytes_per_block(), self.device,
                               max_useful, graph_share)

    def _dummy_step(self) -> None:
        """One forward + sampling at the largest step the scheduler may produce.

        The batch holds the longest prefill chunk that fits next to ``max_num_seqs - 1`` one-token
        requests, and every row samples with top-k, top-p, penalties and 20 logprobs: the peak of
        both the forward pass and the sampler.
        """
        s = self.config.settings
        num_reqs = max(1, min(s.max_num_seqs, s.max_num_batched_tokens))
        longest = max(1, min(s.max_num_batched_tokens - (num_reqs - 1), self.config.max_model_len - 1))
        per_req = [longest] + [1] * (num_reqs - 1)
        params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.1, logprobs=20)
        output, num_blocks = self._dummy_output(per_req, params)
        self.kv_caches = allocate_kv_caches(self.config.model.num_layers, num_blocks, self.config.block_size,
                                            self.num_kv_heads, self.config.model.head_dim, self.dtype, self.device)
        self.execute(output)
        self.requests.clear()
        self.kv_caches = []

    def _dummy_output(self, per_req: list[int], params: SamplingParams) -> tuple[SchedulerOutput, int]:
        """A step of new requests with ``per_req`` prompt tokens each, on blocks 0, 1, ...; and the
        number of blocks it uses."""
        block_size = self.config.block_size
        output = SchedulerOutput()
        next_block = 0
        for i, n in enumerate(per_req):
            num_blocks = -(-n // block_size)
            ids = list(range(next_block, next_block + num_blocks))
            next_block += num_blocks
            rid = f"dummy-{i}"
            output.new_requests.append(NewRequestData(rid, [0] * n, n, params, ids, 0))
            output.num_scheduled_tokens[rid] = n
        return output, next_block

    def _warm_up_kernels(self) -> None:
        """Compile the kernels' other shape variants now rather than in the first requests' steps.

        Triton specialises integer arguments on divisibility by 16 (and on 1), and the profiling
        step and the graph capture use only such sizes; a mixed step of odd sizes and small
        sampled batches (top-k/top-p at 3 rows, plain temperature at 1) covers the rest.
        """
        start = time.perf_counter()
        for per_req, params in (([19, 1, 1], SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05)),
                                ([5], SamplingParams(temperature=0.6))):
            output, _ = self._dummy_output(per_req, params)
            self.execute(output)  # writes only into blocks no request holds yet
            self.requests.clear()
        self._warm_up_sampler()
        torch.cuda.synchronize(self.device)
        logger.info("warmed up kernels for odd step sizes and the sampler's batch sizes in %.1f s",
                    time.perf_counter() - start)

    def _warm_up_sampler(self) -> None:
        """Compile the sampler's kernels for every launch plan a batch of 1..max_num_seqs rows meets:
        greedy, one temperature for all rows (requests sharing a SamplingParams) and a temperature
        per row (each request its own, as the server and ``LLM.generate`` with a list make them).
        Otherwise the first steps at each new batch size compile them, ~1 s each, mid-run."""
        kernels = fused_kernels()
        if kernels is None:
            return
        vocab_size = self.config.model.vocab_size
        generator = torch.Generator(device=self.device).manual_seed(0)  # the runner's stream stays as it was
        for num_rows in kernels.row_counts_per_plan(self.config.settings.max_num_seqs, vocab_size, self.device):
            logits = torch.randn(num_rows, vocab_size, device=self.device).to(self.dtype)
            per_row = torch.full((num_rows,), 0.7, dtype=torch.float32, device=self.device)
            for batch in (SamplingBatch(temperature=None, all_greedy=True),
                          SamplingBatch(temperature=0.7, all_greedy=False, generator=generator),
                          SamplingBatch(temperature=per_row, all_greedy=False, generator=generator)):
                sample(logits, batch)

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` KV blocks (plus the pad block padded graph rows write to), the
        step buffers, and capture the CUDA graphs."""
        m, s = self.config.model, self.config.settings
        self.kv_caches = allocate_kv_caches(m.num_layers, num_blocks + 1, self.config.block_size, self.num_kv_heads,
                                            m.head_dim, self.dtype, self.device)
        max_num_tokens = max(s.max_num_batched_tokens, s.max_num_seqs)
        self.buffers = StepBuffers(max_num_tokens, s.max_num_seqs, self.max_blocks_per_req, self.device,
                                   pad_block=num_blocks)
        if self.device.type == "cuda":
            self.host_slots = HostSlots(max_num_tokens, torch.cuda.current_stream(self.device))
        if self.uses_cuda_graphs():
            self.graphs = CudaGraphRunner(self.buffers, self.config.block_size, self.config.max_model_len,
                                          capture_sizes(s.max_num_seqs), self._prefill_graph_sizes())
            with torch.inference_mode():
                self.graphs.capture(self.attention.build_metadata, self._forward_logits, self._forward_sampled,
                                    greedy_argmax)
        if self.device.type == "cuda":
            self._warm_up_kernels()

    def uses_cuda_graphs(self) -> bool:
        if self.device.type != "cuda" or self.config.settings.enforce_eager:
            return False
        if not self.attention.capabilities(self.ctx).supports_cuda_graphs:
            logger.info("CUDA graphs off: attention %r does not support them; every step runs eagerly",
                        self.config.implementations.get("attention"))
            return False
        return True

    def _prefill_graph_sizes(self) -> list[int]:
        """Token counts of the one-request prefill graphs: none where the backend does not support them,
        and with several ranks (their collectives in such graphs are not measured yet)."""
        if (not self.uses_cuda_graphs() or self.parallel.world_size > 1
                or not self.attention.capabilities(self.ctx).supports_prefill_cuda_graphs):
            return []
        return prefill_capture_sizes(self.config.settings.prefill_graph_max_tokens)

    def _forward_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata) -> torch.Tensor | None:
        """Logits of every row (what a captured decode step computes)."""
        return self.model.compute_logits(self.model(input_ids, positions, self.kv_caches, metadata))

    def _forward_sampled(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata,
                         logits_indices: torch.Tensor) -> torch.Tensor | None:
        """Logits of the rows ``logits_indices`` names (what an eager step and a prefill graph compute)."""
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
        # Denormal activations (seen in GGUF-dequantized models) make CPU kernels ~10x slower;
        # flushing them to zero changes nothing measurable. Only for our step: the thread's mode
        # is put back to IEEE behaviour afterwards.
        torch.set_flush_denormal(True)
        try:
            return self._execute(output)
        finally:
            torch.set_flush_denormal(False)

    def _graph_sizes(self, output: SchedulerOutput) -> tuple[int | None, int | None]:
        """(decode graph's batch size, prefill graph's token count) the step replays at; at most one is
        set, (None, None): run it eagerly."""
        if self.graphs is None or output.spec_token_ids:
            return None, None
        scheduled = output.num_scheduled_tokens
        if all(n == 1 for n in scheduled.values()):
            return self.graphs.padded_size(len(scheduled)), None
        if len(scheduled) == 1:  # one request's prompt chunk
            return None, self.graphs.padded_prefill_size(next(iter(scheduled.values())))
        return None, None

    def _execute(self, output: SchedulerOutput) -> PendingOutput:
        with step_range("infer.prepare_inputs"):
            self.requests.apply(output)
            if output.is_empty:
                return ReadyOutput(RunnerOutput())
            graph_size, prefill_size = self._graph_sizes(output)
            inputs = build_step_inputs(output, self.requests, self.config.block_size, self.device, self.buffers,
                                       graph_size, self.last_sample_rows, prefill_size)
            if inputs.pending_prefix:  # steady decode: the previous step's ids, in order, are the first inputs
                inputs.input_ids[: inputs.pending_prefix].copy_(self.last_sampled[: inputs.pending_prefix])
            elif inputs.pending_dst is not None:
                pending_ids = self.last_sampled.index_select(0, inputs.pending_src).to(inputs.input_ids.dtype)
                inputs.input_ids.index_put_((inputs.pending_dst,), pending_ids)
        with step_range("infer.forward"):
            if graph_size is not None:
                logits = self.graphs.replay(graph_size)
                if logits is not None:
                    num_reqs = len(inputs.request_ids)
                    if len(inputs.sample_rows) == num_reqs:
                        # Every request samples its one row: the graph output's first rows, read before
                        # the next replay rewrites them (copied only for return_logits).
                        logits = logits[:num_reqs].clone() if self.return_logits else logits[:num_reqs]
                    else:  # a one-token prompt chunk that does not reach the prompt's end samples nothing
                        logits = logits.index_select(0, inputs.logits_indices)
            elif prefill_size is not None:
                logits = self.graphs.replay_prefill(prefill_size)  # the KV writes happen whether it samples or not
                if not inputs.sample_rows:
                    logits = None
                elif self.return_logits and logits is not None:
                    logits = logits.clone()
            else:
                metadata = self.attention.build_metadata(inputs.metadata)
                hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, metadata)
                logits = None
                if inputs.sample_rows:
                    logits = self.model.compute_logits(hidden.index_select(0, inputs.logits_indices))
        if logits is None:  # nothing to sample
            self.last_sampled, self.last_sample_rows = None, {}
            return ReadyOutput(RunnerOutput(inputs.request_ids, [[] for _ in inputs.request_ids],
                                            [None for _ in inputs.request_ids]))
        with step_range("infer.sample"):
            sampled_ids = [inputs.request_ids[row] for row in inputs.sample_rows]
            states = [self.requests[rid] for rid in sampled_ids]
            batch = build_sampling_batch(states, self.config.model.vocab_size, self.config.eos_token_ids,
                                         self.device, self.generator, token_table=self.requests.token_ids,
                                         pending=functools.partial(self._pending_ids, states, sampled_ids,
                                                                   self.last_sampled, self.last_sample_rows))
            greedy_ids = None
            if graph_size is not None and len(inputs.sample_rows) == len(inputs.request_ids) \
                    and takes_argmax(batch, logits):  # the decode graph's argmax, replayed: no launch from here
                greedy_ids = self.graphs.replay_argmax(graph_size)
            if greedy_ids is not None:
                # A view of the argmax graph's output, which shares the graphs' memory pool: it holds until
                # another graph replays. The next step reads it before replaying (the pending placement);
                # only penalties read last_sampled after, and a row with penalties keeps this path off.
                result = SamplerOutput(token_ids=greedy_ids[: len(inputs.request_ids)])
            else:
                result = sample(logits, batch)
        self.last_sampled = result.token_ids
        self.last_sample_rows = {rid: i for i, rid in enumerate(sampled_ids)}
        slot = self.host_slots.take(result.token_ids.shape[0]) if self.host_slots is not None else None
        return SampledStep(inputs.request_ids, inputs.sample_rows, states, result,
                           logits if self.return_logits else None, slot)

    def _pending_ids(self, states: list[RequestState], request_ids: list[str], last_sampled: torch.Tensor | None,
                     last_sample_rows: dict[str, int]) -> tuple[list[int], torch.Tensor] | None:
        """(sampling rows, their pending token ids on the device): the penalties count them too. Called by the
        batch builder only when some row has penalties (with the previous step's sampled ids, bound at the call)."""
        rows = [i for i, state in enumerate(states) if state.num_pending_tokens]
        if not rows:
            return None
        src = np.array([last_sample_rows[request_ids[i]] for i in rows], dtype=np.int64)
        return rows, last_sampled.index_select(0, to_device(src, self.device))
