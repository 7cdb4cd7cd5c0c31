"""On a CUDA device: the kernels at real shapes in bfloat16/float16, CUDA-graph capture of decode,
and the engine on a Qwen3-0.6B-shaped model with dummy weights against the torch (and flash) backends.

Run with ``python -m pytest -q -m gpu plugins/attention_triton/tests``.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.interfaces import AttentionLayer, CachedRequestData, NewRequestData, SchedulerOutput
from infer_core.runner.inputs import build_step_inputs
from infer_core.runner.state import apply_scheduler_output
from infer_core.testing import write_config_checkpoint

from infer_attention_triton.backend import TritonAttentionBackend
from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.prefill import prefill_attention
from infer_attention_triton.testing import make_paged_batch, reference_attention, relative_error, write_new_tokens
from infer_attention_triton.tiles import decode_tiles, prefill_tiles

pytestmark = pytest.mark.gpu

DEVICE = "cuda"


def check_decode(batch, scale, num_splits, window=None, tol=1e-2):
    num_seqs, num_heads, head_dim = batch.q.shape
    out = torch.full_like(batch.q, float("nan"))
    scratch = SplitScratch.allocate(num_seqs, num_heads, num_splits, head_dim, DEVICE)
    md = batch.metadata
    decode_attention(
        batch.q,
        batch.kv_cache,
        md.block_tables,
        md.seq_lens,
        out,
        scale=scale,
        num_splits=num_splits,
        tiles=decode_tiles(head_dim),
        sliding_window=window,
        scratch=scratch,
    )
    err = relative_error(out, reference_attention(batch, scale, window, dtype=torch.float32))
    assert err < tol, f"decode relative error {err:.2e}"


@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("num_splits", [1, 4, 64])
def test_decode_bf16_real_shapes(block_size, num_splits):
    contexts = [0, 1, block_size - 1, block_size, block_size + 1, 1000, 4095, 8191, 12000]
    batch = make_paged_batch(
        contexts,
        [1] * len(contexts),
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=block_size,
        dtype=torch.bfloat16,
        device=DEVICE,
        seed=block_size + num_splits,
    )
    write_new_tokens(batch)
    check_decode(batch, 128**-0.5, num_splits)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "dtype"),
    [
        (16, 16, 64, torch.bfloat16),
        (16, 2, 256, torch.bfloat16),
        (64, 8, 128, torch.float16),
        (8, 8, 128, torch.float16),
    ],
)
def test_decode_other_shapes(num_heads, num_kv_heads, head_dim, dtype):
    contexts = [5, 300, 2047, 5000]
    batch = make_paged_batch(
        contexts,
        [1] * 4,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=16,
        dtype=dtype,
        device=DEVICE,
        seed=head_dim,
    )
    write_new_tokens(batch)
    check_decode(batch, head_dim**-0.5, 8)
    check_decode(batch, head_dim**-0.5, 4, window=700)


def test_decode_long_context_128k():
    batch = make_paged_batch(
        [131071],
        [1],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=256,
        dtype=torch.bfloat16,
        device=DEVICE,
        spare_blocks=0,
    )
    write_new_tokens(batch)
    check_decode(batch, 128**-0.5, 64)


@pytest.mark.parametrize(
    ("head_dim", "block_size", "dtype"),
    [(128, 16, torch.bfloat16), (128, 256, torch.bfloat16), (64, 32, torch.float16), (256, 16, torch.bfloat16)],
)
def test_prefill_real_shapes(head_dim, block_size, dtype):
    # Whole prompts, prefix-cache hits (a whole number of blocks cached) and chunks starting mid-block.
    contexts = [0, 0, 2 * block_size, 1024, 700, 33]
    queries = [2048, 17, 500, 1024, 129, 2]
    batch = make_paged_batch(
        contexts,
        queries,
        num_heads=32,
        num_kv_heads=8,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=DEVICE,
        seed=head_dim + block_size,
    )
    write_new_tokens(batch)
    md = batch.metadata
    scale = head_dim**-0.5
    for window in (None, 300):
        out = torch.full_like(batch.q, float("nan"))
        prefill_attention(
            batch.q,
            batch.kv_cache,
            md.block_tables,
            md.seq_lens,
            md.query_start_loc,
            out,
            scale=scale,
            first_req=0,
            num_reqs=md.num_reqs,
            max_query_len=md.max_query_len,
            tiles=prefill_tiles(head_dim, block_size),
            sliding_window=window,
        )
        err = relative_error(out, reference_attention(batch, scale, window, dtype=torch.float32))
        assert err < 1e-2, f"prefill (window {window}) relative error {err:.2e}"


def _backend(num_heads=32, num_kv_heads=8, head_dim=128):
    from infer_core.interfaces import RuntimeContext
    from infer_core.models.config import model_config_from_dict
    from infer_core.settings import EngineSettings

    model = model_config_from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 64,
            "hidden_size": 4096,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "head_dim": head_dim,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
        }
    )
    ctx = RuntimeContext("cuda", "bfloat16", model, EngineSettings(), torch.cuda.get_device_capability(), 1, False)
    return TritonAttentionBackend(ctx)


def test_mixed_step_bf16():
    contexts = [100, 3000, 256, 0, 512, 77]
    queries = [1, 1, 1, 900, 256, 300]
    batch = make_paged_batch(
        contexts,
        queries,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        device=DEVICE,
        seed=9,
    )
    backend = _backend()
    out = backend.forward(
        AttentionLayer(0, 32, 8, 128, 128**-0.5),
        batch.q,
        batch.k,
        batch.v,
        batch.kv_cache,
        backend.build_metadata(batch.metadata),
    )
    err = relative_error(out, reference_attention(batch, 128**-0.5, dtype=torch.float32))
    assert err < 1e-2


def test_decode_step_replays_in_a_cuda_graph():
    """Captured once for 8 requests; replayed with other lengths, pages and queries written in place."""
    backend = _backend()
    layer = AttentionLayer(0, 32, 8, 128, 128**-0.5)
    first = make_paged_batch(
        [8000] * 8,
        [1] * 8,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        device=DEVICE,
        seed=1,
        spare_blocks=64,
    )
    md = first.metadata
    md.max_seq_len = 8192  # capture for the longest context the graph will serve
    metadata = backend.build_metadata(md)
    q, k, v, cache = first.q.clone(), first.k.clone(), first.v.clone(), first.kv_cache
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        backend.forward(layer, q, k, v, cache, metadata)  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(layer, q, k, v, cache, metadata)

    for seed, contexts in ((2, [0, 15, 16, 17, 255, 1000, 4000, 7000]), (3, [3000] * 8)):
        fresh = make_paged_batch(
            contexts,
            [1] * 8,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            block_size=16,
            dtype=torch.bfloat16,
            device=DEVICE,
            seed=seed,
        )
        assert fresh.kv_cache.shape[1] <= cache.shape[1]
        cache.zero_()
        cache[:, : fresh.kv_cache.shape[1]].copy_(fresh.kv_cache)
        for name in ("seq_lens", "slot_mapping"):
            getattr(md, name).copy_(getattr(fresh.metadata, name))
        md.block_tables.zero_()
        md.block_tables[:, : fresh.metadata.block_tables.shape[1]].copy_(fresh.metadata.block_tables)
        for buffer, value in ((q, fresh.q), (k, fresh.k), (v, fresh.v)):
            buffer.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        fresh.kv_cache = cache
        fresh.metadata.block_tables = md.block_tables
        err = relative_error(out[:8], reference_attention(fresh, 128**-0.5, dtype=torch.float32))
        assert err < 1e-2, f"replay with contexts {contexts}: relative error {err:.2e}"


# --- the engine on a Qwen3-0.6B-shaped model -------------------------------------------------------


class TeacherForcedRun:
    """Drives one engine's runner step by step with chosen tokens and collects logits at chosen rows."""

    def __init__(self, llm: LLM) -> None:
        self.runner = llm.engine.executor.worker.runner
        self.block_size = self.runner.config.block_size
        self.next_block = 0

    def blocks(self, num_tokens: int) -> list[int]:
        n = -(-num_tokens // self.block_size)
        ids = list(range(self.next_block, self.next_block + n))
        self.next_block += n
        return ids

    @torch.inference_mode()
    def step(self, output: SchedulerOutput, rows: dict[str, list[int]]) -> torch.Tensor:
        """Logits (float32) at ``rows[request]``: offsets into that request's tokens of this step."""
        runner = self.runner
        apply_scheduler_output(runner.requests, output)
        inputs = build_step_inputs(output, runner.requests, self.block_size, runner.device)
        metadata = runner.attention.build_metadata(inputs.metadata)
        hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, metadata)
        starts = inputs.metadata.query_start_loc_cpu.tolist()
        flat = [starts[inputs.request_ids.index(rid)] + i for rid, offsets in rows.items() for i in offsets]
        return runner.model.compute_logits(hidden[torch.tensor(flat, device=hidden.device)]).float()


def mixed_batch_logits(llm: LLM) -> torch.Tensor:
    """Step 1: three prompts (one cut after its first 1024-token chunk). Step 2, the mixed step:
    two decodes, that prompt's second chunk, a prompt sharing another's first 512 cached tokens
    (a prefix-cache hit) and a new prompt; logits at 64 positions spread over it."""
    run = TeacherForcedRun(llm)
    rng = random.Random(7)
    a, b, c, e = ([rng.randrange(0, 150000) for _ in range(n)] for n in (700, 1500, 90, 300))
    d = a[:512] + [rng.randrange(0, 150000) for _ in range(200)]
    params = SamplingParams(temperature=0)
    blocks = {"a": run.blocks(701), "b": run.blocks(1500), "c": run.blocks(91)}
    run.step(
        SchedulerOutput(
            new_requests=[
                NewRequestData("a", a, 700, params, blocks["a"], 0),
                NewRequestData("b", b, 1500, params, blocks["b"], 0),
                NewRequestData("c", c, 90, params, blocks["c"], 0),
            ],
            num_scheduled_tokens={"a": 700, "b": 1024, "c": 90},
        ),
        {"a": [699]},
    )
    shared = 512 // run.block_size  # d reuses a's first full blocks, as a prefix-cache hit would
    d_blocks = blocks["a"][:shared] + run.blocks(712 - 512)
    second = SchedulerOutput(
        new_requests=[
            NewRequestData("d", d, 712, params, d_blocks, 512),
            NewRequestData("e", e, 300, params, run.blocks(300), 0),
        ],
        cached_requests=[
            CachedRequestData("a", [11], [], 700),
            CachedRequestData("c", [12], [], 90),
            CachedRequestData("b", [], [], 1024),
        ],
        num_scheduled_tokens={"a": 1, "c": 1, "b": 476, "d": 200, "e": 300},
    )
    rows = {
        "a": [0],
        "c": [0],
        "b": list(range(0, 476, 22)),
        "d": list(range(0, 200, 10)),
        "e": list(range(2, 300, 15)),
    }
    assert sum(map(len, rows.values())) == 64
    return run.step(second, rows)


def engine_logits(folder, attention: str, block_size: int) -> torch.Tensor:
    llm = LLM(
        str(folder),
        attention=attention,
        load_format="dummy",
        block_size=block_size,
        kv_cache_gb=1,
        max_model_len=4096,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        seed=0,
    )
    try:
        assert llm.engine.config.dtype == "bfloat16"
        return mixed_batch_logits(llm)
    finally:
        del llm
        torch.cuda.empty_cache()


def test_engine_teacher_forced_logits_match_torch_and_flash(tmp_path):
    write_config_checkpoint("Qwen3-0.6B", tmp_path)
    expected = engine_logits(tmp_path, "torch", 16)
    peers = {"torch": expected}
    if importlib.util.find_spec("flash_attn") is not None and importlib.util.find_spec("infer_attention_flash"):
        peers["flash"] = engine_logits(tmp_path, "flash", 256)
    for block_size in (16, 256):
        got = engine_logits(tmp_path, "triton", block_size)
        for name, reference in peers.items():
            rel = (got - reference).norm(dim=-1) / reference.norm(dim=-1)
            assert float(rel.max()) < 2e-2, f"triton (block {block_size}) vs {name}: logits off by {rel.max():.2e}"


def test_engine_generates_on_cuda_by_default(tmp_path):
    """INFER_ATTENTION unset: triton, the default on CUDA where it can run; the engine runs."""
    write_config_checkpoint("Qwen3-0.6B", tmp_path)
    llm = LLM(str(tmp_path), load_format="dummy", kv_cache_gb=1, max_model_len=2048, max_num_seqs=8)
    assert llm.engine.config.implementations["attention"] == "triton"
    outputs = llm.generate(
        [[1, 2, 3]] * 4, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False
    )
    assert [len(o.outputs[0].token_ids) for o in outputs] == [8] * 4


def kernel_variants() -> int:
    """Variants of the decode and prefill kernels this process holds (Triton's per-device caches)."""
    from infer_attention_triton.decode import _decode_kernel
    from infer_attention_triton.prefill import _prefill_kernel

    return sum(len(caches[0]) for kernel in (_decode_kernel, _prefill_kernel) for caches in kernel.device_caches.values())


def test_no_kernel_variant_compiled_after_start(tmp_path):
    """Steps of decodes beside prompt chunks pick their split count and launch order from their own lengths, and
    their prompts start anywhere in the batch: every such choice was compiled at start, none mid-run (a server's
    first requests waited seconds on them)."""
    write_config_checkpoint("Qwen3-0.6B", tmp_path, num_hidden_layers=2)
    llm = LLM(str(tmp_path), attention="triton", load_format="dummy", kv_cache_gb=2, max_model_len=4096,
              max_num_seqs=64, max_num_batched_tokens=512, seed=0)
    try:
        at_start = kernel_variants()
        rng = random.Random(0)
        prompts = [[rng.randrange(1000, 2000) for _ in range(n)] for n in (300, 700, 1100, 1500, 2200, 3000, 5, 17)]
        prompts += [[rng.randrange(1000, 2000) for _ in range(rng.randrange(20, 400))] for _ in range(48)]
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [24] * len(prompts)
        assert kernel_variants() == at_start, (at_start, kernel_variants())
    finally:
        llm.shutdown()
        torch.cuda.empty_cache()
