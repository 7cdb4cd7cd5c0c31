"""On a GPU: a batch-1 verify step (ngram or draft) replays a verify CUDA graph and gives the eager verify's tokens."""

from __future__ import annotations

import random

import pytest
import torch

from infer_core import LLM, SamplingParams


@pytest.mark.gpu
def test_batch_one_verify_steps_replay_the_verify_graph(tiny_checkpoint):
    pytest.importorskip("infer_attention_triton")
    folder = str(tiny_checkpoint("qwen3"))
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 30) for _ in range(n)] for n in (40, 90, 12)]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)

    def run(enforce_eager: bool, decoding: str):
        llm = LLM(folder, attention="triton", enforce_eager=enforce_eager, decoding=decoding, max_model_len=512,
                  max_num_seqs=8, gpu_memory_utilization=0.3)
        replayed: list[int] = []
        try:
            graphs = llm.engine.executor.worker.runner.graphs
            if graphs is not None:
                replay = graphs.replay_verify
                graphs.replay_verify = lambda size: replayed.append(size) or replay(size)
            tokens = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]  # batch 1
            return tokens, replayed, llm.engine.decoding.stats()
        finally:
            llm.shutdown()
            torch.cuda.empty_cache()

    eager, _, eager_stats = run(True, "ngram")
    graphed, replayed, stats = run(False, "ngram")
    assert graphed == eager
    assert stats.num_drafts == eager_stats.num_drafts and len(replayed) == stats.num_drafts > 0
    assert set(replayed) <= {2, 4, 8}  # k <= 4 drafts: k+1 tokens in the verify graph of 2, 4 or 8


@pytest.mark.gpu
def test_a_draft_model_on_the_gpu_gives_plain_greedy_tokens(tiny_checkpoint):
    """The draft's decode forwards replay its CUDA graphs beside a graphed target (float32: argmax ties of
    bfloat16 aside); the output is the plain output, and an identical draft is all but always accepted."""
    pytest.importorskip("infer_attention_triton")
    folder = str(tiny_checkpoint("qwen3"))
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 30) for _ in range(n)] for n in (40, 90, 12)]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    settings = dict(attention="triton", dtype="float32", max_model_len=512, max_num_seqs=8, gpu_memory_utilization=0.3)

    def run(**extra):
        llm = LLM(folder, **settings, **extra)
        runner = llm.engine.executor.worker.runner
        draft = runner.draft
        replays: list = []  # the draft's decode graph sizes, ("verify", size) of the target's verify graphs
        if draft is not None:
            replay = draft.graphs.replay
            draft.graphs.replay = lambda size: replays.append(size) or replay(size)
            verify = runner.graphs.replay_verify  # the target's batch-1 verify steps
            runner.graphs.replay_verify = lambda size: replays.append(("verify", size)) or verify(size)
        try:
            batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]  # batch 1
            return batched, alone, llm.engine.decoding.stats(), replays
        finally:
            llm.shutdown()
            torch.cuda.empty_cache()

    plain, plain_alone, _, _ = run()
    assert plain_alone == plain
    for draft in (str(tiny_checkpoint("qwen3", num_hidden_layers=1)), folder):
        batched, alone, stats, replays = run(decoding="draft", speculative_model=draft, num_speculative_tokens=4)
        assert batched == plain and alone == plain
        assert stats.num_drafts > 0 and 1 in replays  # batch-1 draft forwards replayed a graph
        assert {("verify", n) for n in (2, 4, 8)} & set(replays)  # so did the target's batch-1 verify steps
        if draft == folder:
            assert stats.acceptance_rate > 0.9


@pytest.mark.gpu
def test_overlapped_ngram_steps_on_the_gpu_give_plain_greedy_tokens(tiny_checkpoint, monkeypatch):
    """Overlapped scheduling with n-gram drafts on CUDA graphs (float32: argmax ties of bfloat16 aside): each step
    is planned while the verify step before it runs and moved back on the device by its rejected drafts (the
    kernel of layers/sampling/kept_drafts.py)."""
    pytest.importorskip("infer_attention_triton")
    from infer_core.runner.accepted_drafts import AcceptedDrafts

    planned_over: list[int] = []  # steps planned over a verify step: their pending requests
    apply = AcceptedDrafts.apply
    monkeypatch.setattr(AcceptedDrafts, "apply",
                        lambda self, inputs, *rest: planned_over.append(inputs.pending_src.shape[0]) or apply(
                            self, inputs, *rest))
    folder = str(tiny_checkpoint("qwen3"))
    rng = random.Random(9)
    prompts = [[rng.randrange(3, 30) for _ in range(n)] for n in (40, 90, 12, 64)]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    settings = dict(attention="triton", dtype="float32", max_model_len=512, max_num_seqs=8, gpu_memory_utilization=0.3)

    def run(**extra):
        llm = LLM(folder, **settings, **extra)
        try:
            at_start = kept_drafts_variants()
            batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]  # batch 1
            return batched, alone, llm.engine.decoding.stats(), llm.engine.overlap, (at_start, kept_drafts_variants())
        finally:
            llm.shutdown()
            torch.cuda.empty_cache()

    plain, plain_alone, _, _, _ = run()
    planned_over.clear()
    batched, alone, stats, overlap, variants = run(decoding="ngram", num_speculative_tokens=4, prompt_lookup_min=1)
    assert overlap and batched == plain and alone == plain_alone == plain
    assert len(planned_over) > 10 and max(planned_over) > 1  # batch 1 and batched
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0  # drafts kept and drafts rejected
    # the kernel compiled at start is the one every step ran: no variant compiled mid-run
    assert variants[0] >= 1 and variants[1] == variants[0], variants


def kept_drafts_variants() -> int:
    """Variants of the kept-drafts kernel this process has compiled or loaded (Triton's per-device caches)."""
    from infer_core.layers.sampling.kept_drafts import _kept_drafts_kernel

    return sum(len(caches[0]) for caches in _kept_drafts_kernel.device_caches.values())
