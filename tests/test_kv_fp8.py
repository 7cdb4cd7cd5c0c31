"""The FP8 KV cache (``INFER_KV_CACHE_DTYPE=fp8``): the setting, the backends' seam, the torch reference's read,
checkpoint scales, and a tiny engine on the CPU.

The engine pair is a tiny Qwen3 in bfloat16 whose checkpoint carries per-layer ``k_scale``/``v_scale``
(as llm-compressor writes them); the same ``kv_cache_gb`` holds twice the tokens in float8, and prompts
are fed in chunks, so later chunks read earlier ones back from the cache. A tiny random model's logits are
nearly flat, so greedy tokens part ways wherever two candidates are within the quantization's error (or
tie exactly in bfloat16): the test bounds the logits' error and checks that tokens part only at such
near-ties. The Triton kernels' FP8 paths are tested against this reference in
``plugins/attention_triton/tests/test_kv_fp8.py``.
"""

from __future__ import annotations

import logging
import random
import re

import pytest
import torch
from safetensors.torch import save_file

from infer_core import LLM, SamplingParams
from infer_core.builtin.attention_torch import TorchAttentionBackend
from infer_core.errors import ModelError, PluginError, SettingsError
from infer_core.interfaces import (
    AttentionBackend,
    AttentionLayer,
    BatchMetadata,
    RuntimeContext,
)
from infer_core.layers.kv_write import (
    FP8_KV_DTYPE,
    dequantize_kv,
    quantize_kv,
    write_kv,
)
from infer_core.loader import load_catalog
from infer_core.models.config import model_config_from_dict
from infer_core.settings import EngineSettings, load_settings
from infer_core.testing import LogitsRecorder, make_tiny_checkpoint

SCALES = {0: (0.05, 0.02), 1: (0.04, 0.03)}  # layer -> (k_scale, v_scale), as the checkpoint carries them
PROMPT_LENGTHS = (5, 40, 17, 60)
NEW_TOKENS = 8


def test_setting_names_fp8_and_refuses_others_with_a_suggestion():
    assert EngineSettings().kv_cache_dtype == "auto"
    assert load_settings(kv_cache_dtype="FP8_E4M3").kv_cache_dtype == "fp8"
    with pytest.raises(SettingsError, match=r"INFER_KV_CACHE_DTYPE.*'fp9' is not a KV cache dtype, did you mean fp8\?"):
        load_settings(kv_cache_dtype="fp9")


def _ctx(kv_cache_dtype: str) -> RuntimeContext:
    model = model_config_from_dict({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 64,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    })
    return RuntimeContext("cpu", "float32", model, EngineSettings(kv_cache_dtype=kv_cache_dtype))


class ModelDtypeOnly(AttentionBackend):
    """A backend that declares nothing about its cache: it reads and writes the model's dtype only."""

    def forward(self, layer, q, k, v, kv_cache, metadata, *, kv_written=False):
        raise NotImplementedError


def test_a_backend_declares_the_cache_dtypes_it_can_read():
    assert ModelDtypeOnly.validate(_ctx("auto")) == []
    assert ModelDtypeOnly.validate(_ctx("fp8")) == [
        "KV cache dtype fp8 (INFER_KV_CACHE_DTYPE) is not supported (supported: auto)"]
    assert TorchAttentionBackend.validate(_ctx("fp8")) == []
    with pytest.raises(PluginError) as refused:  # flash: refused with its reason, and who can run it named
        load_catalog(["flash"]).resolve("attention", "flash", _ctx("fp8"))
    message = str(refused.value)
    assert "attention 'flash' cannot run here" in message
    assert "KV cache dtype fp8 (INFER_KV_CACHE_DTYPE) is not supported: flash-attn 2's paged kernels" in message
    assert re.search(r"Attention backends that can run here: torch\b", message)


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest per-token ||got - expected|| / ||expected||."""
    got, expected = got.double().flatten(1), expected.double().flatten(1)
    return float(((got - expected).norm(dim=1) / expected.norm(dim=1)).max())


def _mixed_step(block: int, contexts: list[int], queries: list[int]) -> BatchMetadata:
    """Requests (decodes first) whose pages are consecutive blocks, in order."""
    seq_lens = [c + n for c, n in zip(contexts, queries)]
    pages = [-(-s // block) for s in seq_lens]
    first = [sum(pages[:i]) for i in range(len(pages))]
    tables = torch.zeros(len(pages), max(pages), dtype=torch.int32)
    for i, (f, n) in enumerate(zip(first, pages)):
        tables[i, :n] = torch.arange(f, f + n)
    slots = torch.cat([torch.arange(f * block + c, f * block + c + n) for f, c, n in zip(first, contexts, queries)])
    starts = torch.tensor([0, *torch.tensor(queries).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return BatchMetadata(
        num_reqs=len(pages), num_tokens=sum(queries), num_decode_only=sum(n == 1 for n in queries),
        max_query_len=max(queries), max_seq_len=max(seq_lens), block_size=block, query_start_loc=starts, seq_lens=lens,
        block_tables=tables, slot_mapping=slots.to(torch.int32), query_start_loc_cpu=starts, seq_lens_cpu=lens)


def test_torch_backend_reads_an_fp8_cache_as_its_dequantized_values():
    """One mixed step (a decode, a prompt) on an FP8 cache equals, to float32 rounding, the same step on a
    float32 cache that holds the FP8 cache's values times the scales, written the same way (the FP8 read folds
    ``k_scale`` into the softmax scale instead of multiplying each key: another float32 rounding)."""
    gen = torch.Generator().manual_seed(0)
    num_blocks, block, heads, kv_heads, dim = 6, 4, 4, 2, 16
    layer = AttentionLayer(0, heads, kv_heads, dim, dim**-0.5, k_scale=0.3, v_scale=0.7)
    context = torch.randn(2, num_blocks, block, kv_heads, dim, generator=gen) * 50  # some beyond +-448 * scale
    fp8 = torch.stack([quantize_kv(context[0], 0.3), quantize_kv(context[1], 0.7)])
    dequantized = torch.stack([dequantize_kv(fp8[0], 0.3, torch.float32), dequantize_kv(fp8[1], 0.7, torch.float32)])
    q, k, v = (torch.randn(6, h, dim, generator=gen) for h in (heads, kv_heads, kv_heads))
    metadata = BatchMetadata(
        num_reqs=2, num_tokens=6, num_decode_only=1, max_query_len=5, max_seq_len=9, block_size=block,
        query_start_loc=torch.tensor([0, 1, 6], dtype=torch.int32), seq_lens=torch.tensor([9, 5], dtype=torch.int32),
        block_tables=torch.tensor([[3, 0, 5], [1, 4, 0]], dtype=torch.int32),
        slot_mapping=torch.tensor([4 * 5, 4, 5, 6, 7, 16], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 1, 6], dtype=torch.int32), seq_lens_cpu=torch.tensor([9, 5]))
    backend = TorchAttentionBackend(_ctx("fp8"))
    got = backend.forward(layer, q, k, v, fp8, metadata)
    slots = metadata.slot_mapping.long()
    for i, (x, scale) in enumerate(((k, 0.3), (v, 0.7))):  # what the FP8 write stored, read back
        dequantized[i].view(-1, kv_heads, dim)[slots] = dequantize_kv(quantize_kv(x, scale), scale, torch.float32)
    assert _relative_error(got, backend.forward(layer, q, k, v, dequantized, metadata, kv_written=True)) < 1e-5
    assert float(fp8.float().abs().max()) == 448.0  # clamped, not inf or nan
    stored = torch.empty_like(fp8)
    write_kv(stored, k, v, slots, 0.3, 0.7)
    assert stored.dtype == FP8_KV_DTYPE and torch.equal(stored[0].view(-1, kv_heads, dim)[slots].view(torch.uint8),
                                                         quantize_kv(k, 0.3).view(torch.uint8))


def test_torch_backend_in_bfloat16_reads_fp8_keys_exactly():
    """bfloat16 on an FP8 cache whose keys reach the e4m3 range: within 1e-2 of float64 attention over the cache's
    values (stored * scale), decodes, a prompt and a chunk after a cached prefix alike.

    Keys up to 448 * k_scale make scores of tens to hundreds, so softmax weight moves between near-tied keys
    with any error of a score. The keys read as ``stored * k_scale`` rounded to bfloat16 (2^-9 of each key)
    put errors of a few tenths into such scores and 3-5% into the outputs of these tokens; read exactly, with
    ``k_scale`` in the softmax scale, only the probabilities' and values' bfloat16 roundings remain (~0.2%)."""
    gen = torch.Generator().manual_seed(5)
    block, heads, kv_heads, dim, k_scale, v_scale = 16, 4, 2, 32, 0.37, 0.61
    contexts, queries = [130, 1, 0, 40], [1, 1, 60, 30]
    metadata = _mixed_step(block, contexts, queries)
    num_blocks = int(metadata.block_tables.max()) + 1
    context = torch.randn(2, num_blocks, block, kv_heads, dim, generator=gen)
    cache = torch.stack([quantize_kv(context[0], k_scale), quantize_kv(context[1], v_scale)])
    q = torch.randn(sum(queries), heads, dim, generator=gen).bfloat16()
    k = (torch.randn(sum(queries), kv_heads, dim, generator=gen) * 100).bfloat16()  # clamped at 448 * k_scale
    v = torch.randn(sum(queries), kv_heads, dim, generator=gen).bfloat16()
    layer = AttentionLayer(0, heads, kv_heads, dim, dim**-0.5, k_scale=k_scale, v_scale=v_scale)
    backend = TorchAttentionBackend(_ctx("fp8"))
    got = backend.forward(layer, q, k, v, cache, metadata)
    values = torch.stack([dequantize_kv(cache[0], k_scale, torch.float64), dequantize_kv(cache[1], v_scale, torch.float64)])
    expected = backend.forward(layer, q.double(), k, v, values, metadata, kv_written=True)
    assert float(cache[0].float().abs().max()) == 448.0
    assert _relative_error(got, expected) < 1e-2


class KVCapacityLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.tokens: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"KV cache: \d+ blocks of \d+ tokens = (\d+) tokens", record.getMessage())
        if found:
            self.tokens.append(int(found.group(1)))


@pytest.fixture(scope="module")
def scaled_checkpoint(tmp_path_factory):
    folder = make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("qwen3-kv-scales"))
    scales = {}
    for layer, (k_scale, v_scale) in SCALES.items():
        scales[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(k_scale)
        scales[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor([v_scale])  # () and [1] both occur
    save_file(scales, str(folder / "kv_scales.safetensors"))
    return folder


@pytest.fixture(scope="module")
def runs(scaled_checkpoint):
    """{kv_cache_dtype: (llm, logged KV tokens, greedy tokens, logits per request)} for auto and fp8."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in PROMPT_LENGTHS]
    log = KVCapacityLog()
    core = logging.getLogger("infer_core.engine.core")
    core.addHandler(log)
    # whatever an earlier test in this process did to logging (a dictConfig disables the loggers that exist
    # by then, logging.disable mutes every level), the engine's capacity line must reach this handler
    level, disabled, muted = core.level, core.disabled, logging.root.manager.disable
    core.level, core.disabled = logging.INFO, False
    logging.disable(logging.NOTSET)
    found = {}
    try:
        for kv in ("auto", "fp8"):
            llm = LLM(str(scaled_checkpoint), device="cpu", dtype="bfloat16", kv_cache_dtype=kv, kv_cache_gb=0.01,
                      max_num_batched_tokens=32)  # prompts in chunks: later chunks read earlier ones from the cache
            with LogitsRecorder(llm.engine) as recorder:
                outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
                                       use_tqdm=False)
            found[kv] = (llm, log.tokens[-1], [o.outputs[0].token_ids for o in outputs],
                         [recorder.logits[o.request_id] for o in outputs])
    finally:
        core.removeHandler(log)
        core.level, core.disabled = level, disabled
        logging.disable(muted)
    return found


def test_fp8_kv_doubles_the_logged_capacity(runs):
    (_, bf16_tokens, _, _), (llm, fp8_tokens, _, _) = runs["auto"], runs["fp8"]
    assert 1.99 <= fp8_tokens / bf16_tokens <= 2.01, (bf16_tokens, fp8_tokens)
    caches = llm.engine.executor.worker.runner.kv_caches
    assert {c.dtype for c in caches} == {FP8_KV_DTYPE}


def test_checkpoint_scales_reach_every_layer(runs):
    for kv in ("auto", "fp8"):  # read either way; only an FP8 cache uses them
        model = runs[kv][0].engine.executor.worker.runner.model
        for i, decoder in enumerate(model.model.layers):
            layer = decoder.self_attn.attn.layer
            assert (layer.k_scale, layer.v_scale) == pytest.approx(SCALES[i])


def test_fp8_kv_greedy_tokens_stay_close_to_bf16(runs):
    """Up to where a prompt's tokens part ways, both runs read the same history: the logits stay within 15%
    (measured: at most 7.5%), and where they part, the FP8 run's token is the bfloat16 run's best or within a
    tenth of a standard deviation of the logits below it (measured: an exact tie, 1.2% and 7.2% of one).

    How many prompts part is not asserted: a tiny random model's logits are nearly flat, and an error of 5-7%
    of their norm is 5-7% of their standard deviation per logit (their mean is near 0), so the difference of
    two logits moves by about 0.1 standard deviations: first-token margins of 0.07 (this seed's third prompt)
    flip or not by the roundings of the reads, however exact. The bounds above are what a wrong read breaks."""
    (_, _, expected, expected_logits), (_, _, got, logits) = runs["auto"], runs["fp8"]
    for g, e, g_logits, e_logits in zip(got, expected, logits, expected_logits):
        parted = next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), len(e))
        for step in range(min(parted + 1, len(e))):
            ref = e_logits[step].float()
            assert float((g_logits[step].float() - ref).norm() / ref.norm()) < 0.15, (step, g, e)
        if parted < len(e):
            ref = e_logits[parted].float()
            assert float(ref.max() - ref[g[parted]]) <= 0.1 * float(ref.std()), (parted, g, e)


def test_a_scale_per_head_is_refused(tmp_path):
    folder = make_tiny_checkpoint("llama", tmp_path / "llama")
    save_file({"model.layers.0.self_attn.k_scale": torch.ones(2)}, str(folder / "kv_scales.safetensors"))
    with pytest.raises(ModelError, match=r"k_scale' holds 2 KV cache scales .* only one scale per layer"):
        LLM(str(folder), device="cpu", kv_cache_dtype="fp8", kv_cache_gb=0.01)
