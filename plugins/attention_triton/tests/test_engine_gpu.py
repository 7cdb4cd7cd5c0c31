"""On a CUDA device, the engine on a Qwen3-0.6B-shaped model with dummy weights: its logits against the torch (and
flash) backends, triton as the default, and every kernel variant a step may choose compiled at start
(``TritonAttentionBackend.warm_up``), none while requests wait.

Run with ``python -m pytest -q -m gpu plugins/attention_triton/tests``.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.interfaces import CachedRequestData, NewRequestData, SchedulerOutput
from infer_core.runner.inputs import build_step_inputs
from infer_core.runner.state import apply_scheduler_output
from infer_core.testing import write_config_checkpoint

pytestmark = pytest.mark.gpu



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
    from infer_attention_triton.decode_kernel import _decode_kernel
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
