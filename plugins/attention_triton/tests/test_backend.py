"""The backend as the runner drives it: mixed steps, padding, metadata, validation, registration."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from infer_core.interfaces import AttentionLayer, RuntimeContext
from infer_core.models.config import model_config_from_dict
from infer_core.settings import EngineSettings

from infer_attention_triton.backend import TritonAttentionBackend, TritonMetadata, multiprocessor_count
from infer_attention_triton.capabilities import validate_context
from infer_attention_triton.tiles import choose_num_splits
from infer_attention_triton.testing import make_paged_batch, reference_attention, relative_error


def make_ctx(device="cpu", dtype="float32", head_dim=32, num_heads=4, num_kv_heads=2, interpret=True, window=None):
    model = model_config_from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 64,
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "head_dim": head_dim,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            **({"sliding_window": window} if window else {}),
        }
    )
    return RuntimeContext(
        device,
        dtype,
        model,
        EngineSettings(),
        (9, 0) if device == "cuda" else None,
        1 if device == "cuda" else 0,
        interpret,
    )


@pytest.mark.parametrize("sliding_window", [None, 12])
def test_mixed_step_matches_reference_and_skips_padding(device, sliding_window):
    # Three decodes (contexts 0, one block, a block + 1) and three prefills (a whole prompt, a
    # prefix-cache hit, a chunk that starts mid-block), then two padded rows (CUDA graphs).
    contexts, queries = [0, 16, 17, 0, 32, 21], [1, 1, 1, 19, 8, 16]
    batch = make_paged_batch(
        contexts, queries, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, device=device, seed=3
    )
    num_padded = 2
    q = torch.cat([batch.q, torch.randn(num_padded, 4, 32, device=device)])
    k = torch.cat([batch.k, torch.randn(num_padded, 2, 32, device=device)])
    v = torch.cat([batch.v, torch.randn(num_padded, 2, 32, device=device)])
    before = batch.kv_cache.clone()

    backend = TritonAttentionBackend(make_ctx(device))
    metadata = backend.build_metadata(batch.metadata)
    layer = AttentionLayer(0, 4, 2, 32, 0.2, sliding_window)
    out = backend.forward(layer, q, k, v, batch.kv_cache, metadata)

    assert out.shape == q.shape
    expected = reference_attention(batch, 0.2, sliding_window)  # reads the cache the forward wrote
    assert relative_error(out[: batch.metadata.num_tokens], expected) < 1e-5
    slots = batch.metadata.slot_mapping.long()
    changed = (batch.kv_cache != before).flatten(0, 2).any(-1).any(-1).nonzero().flatten()  # [2 * slots]
    written = torch.cat([slots, slots + batch.kv_cache.shape[1] * 16]).sort().values
    assert torch.equal(changed.sort().values, written)  # the new tokens' slots, and no padding row
    view = batch.kv_cache.view(2, -1, 2, 32)
    assert torch.equal(view[0][slots], batch.k) and torch.equal(view[1][slots], batch.v)


def test_build_metadata_splits_long_decodes_and_reuses_scratch(device):
    backend = TritonAttentionBackend(make_ctx(device))
    # long enough to split on this device (a GPU's tiles hold 64 keys, the interpreter's 16)
    long_batch = make_paged_batch(
        [300, 200] if device == "cpu" else [4000, 3000], [1, 1], num_heads=4, num_kv_heads=2, head_dim=32,
        block_size=16, device=device
    )
    first = backend.build_metadata(long_batch.metadata)
    assert isinstance(first, TritonMetadata) and first.num_splits > 1
    assert first.scratch.part_out.shape[1:] == (4, first.num_splits, 32)
    second = backend.build_metadata(long_batch.metadata)
    assert second.scratch is first.scratch  # no allocation once it fits
    prefill_only = make_paged_batch([0], [40], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, device=device)
    assert backend.build_metadata(prefill_only.metadata).num_splits == 1


def test_the_split_count_follows_the_kv_heads_of_this_ranks_layers(device):
    """Two tensor-parallel ranks hold half the model's KV heads: the grid has half the programs, so more splits."""
    backend = TritonAttentionBackend(make_ctx(device, num_heads=8, num_kv_heads=4))
    # a batch whose split count the KV heads decide on this device (4 interpreter "SMs" or a GPU's)
    batch_size, context = (2, 300) if device == "cpu" else (64, 4000)
    batch = make_paged_batch([context] * batch_size, [1] * batch_size, num_heads=4, num_kv_heads=2, head_dim=32,
                             block_size=16, device=device)
    whole_model = backend.build_metadata(batch.metadata).num_splits
    backend.bind_layers([AttentionLayer(i, 4, 2, 32, 32**-0.5) for i in range(3)])
    rank_share = backend.build_metadata(batch.metadata).num_splits
    sms, block_n = multiprocessor_count(torch.device(device)), backend.decode_tiles.block_n
    assert whole_model == choose_num_splits(batch_size, 4, batch.metadata.max_seq_len, sms, block_n)
    assert rank_share == choose_num_splits(batch_size, 2, batch.metadata.max_seq_len, sms, block_n) > whole_model


def test_validate_reasons():
    assert validate_context(make_ctx()) == []
    assert validate_context(make_ctx("cuda", "bfloat16", interpret=False)) == []
    no_cuda = validate_context(make_ctx(interpret=False))
    assert len(no_cuda) == 1 and "CUDA is not available" in no_cuda[0] and "TRITON_INTERPRET=1" in no_cuda[0]
    odd = validate_context(make_ctx(head_dim=96))
    assert len(odd) == 1 and "head_dim 96" in odd[0]
    gqa = validate_context(make_ctx(num_heads=64, num_kv_heads=2))
    assert len(gqa) == 1 and "query heads per KV head" in gqa[0]
    assert TritonAttentionBackend.validate(make_ctx(window=64)) == []  # sliding windows are supported
    caps = TritonAttentionBackend.capabilities(make_ctx())
    assert caps.supports_cuda_graphs and caps.block_size_multiple == 16 and 128 in caps.head_dims


def test_default_backend_is_triton_only_on_cuda():
    from infer_attention_triton import plugin

    assert plugin.default_attention_backend(make_ctx()) is None  # the interpreter is never a default
    assert plugin.default_attention_backend(make_ctx("cuda", "bfloat16", interpret=False)) == "triton"
    assert plugin.default_attention_backend(make_ctx("cuda", "bfloat16", head_dim=96, interpret=False)) is None


def test_registering_does_not_import_triton():
    script = textwrap.dedent("""
        import sys
        from infer_core.loader import load_catalog
        catalog = load_catalog()
        impl = catalog.get("attention", "triton")
        assert impl is not None and impl.distribution == "infer-attention-triton", impl
        assert "triton" not in sys.modules, "registering imported triton"
        assert not any(m.startswith("infer_attention_triton.backend") for m in sys.modules)
        cls = impl.load()
        assert "triton" in sys.modules and cls.__name__ == "TritonAttentionBackend"
    """)
    env = {k: v for k, v in os.environ.items() if k != "INFER_PLUGINS"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr


def test_decode_warm_up_runs_each_choice_and_writes_no_cache(device):
    """What the backend runs at start on CUDA (``warm_up_decode``): every split count up to the given one, with and
    without a launch order, on one key of block 0; the cache and the runner's block tables are left as they were."""
    from infer_attention_triton.tiles import decode_tiles
    from infer_attention_triton.warmup import warm_up_decode

    cache = torch.randn(2, 3, 16, 2, 32, device=device)
    tables = torch.randint(1, 3, (5, 4), dtype=torch.int32, device=device)
    cache_before, tables_before = cache.clone(), tables.clone()
    warm_up_decode(AttentionLayer(0, 4, 2, 32, 32**-0.5), cache, tables, torch.float32, decode_tiles(32), max_splits=4)
    assert torch.equal(cache, cache_before) and torch.equal(tables, tables_before)
