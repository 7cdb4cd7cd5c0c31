"""bf16/fp16 logits on the CPU: the greedy argmax and the top-k/top-p cut read them as they are.

Every bf16/fp16 value is exactly a float32 value, so reading them without ``logits.float()`` must
pick the same tokens, ties included (lowest token id). The fused kernel's side of this is checked
in ``fused_checks.py`` (``low_precision_matches_float``), interpreted and on CUDA.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from infer_core.layers.sampler import SamplingBatch, sample
from infer_core.layers.sampling.thresholds import cut_mask, top_k_top_p_cut

_spec = importlib.util.spec_from_file_location("fused_checks", Path(__file__).with_name("fused_checks.py"))
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)

LOW = [torch.bfloat16, torch.float16]


def greedy_logits(num_rows: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rows where the maximum is tied: coarse integer grids, one value everywhere, a tie at both ends,
    -inf everywhere, a NaN; and ordinary rows whose bf16 rounding makes new ties."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab, generator=generator) * 8
    logits[1::4] = torch.randint(-2, 3, (len(logits[1::4]), vocab), generator=generator).float()
    logits[2] = 0.5
    logits[3] = -1.0
    logits[3, [0, vocab - 1]] = 4.0
    logits[5] = float("-inf")
    logits[6, vocab // 2] = float("nan")
    logits[7, -1] = 1e4  # the maximum at the last index
    return logits.to(dtype)


def lowest_index_of_max(logits: torch.Tensor) -> list[int]:
    """numpy's argmax on float32: the first maximal value (the first NaN if there is one)."""
    return np.argmax(logits.float().numpy(), axis=1).tolist()


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_greedy_argmax_of_low_precision_equals_argmax_of_float(dtype):
    logits = greedy_logits(64, 1000, dtype)
    batch = SamplingBatch(temperature=torch.zeros(64), all_greedy=True)
    with checks.LogitsFloatCopies(logits) as seen:
        tokens = sample(logits, batch).token_ids
    assert not seen.copies, f"the greedy path converted the logits: {seen.copies}"
    assert tokens.tolist() == sample(logits.float(), batch).token_ids.tolist() == lowest_index_of_max(logits)
    assert tokens[[2, 3, 5]].tolist() == [0, 0, 0] and tokens[6] == 500 and tokens[7] == 999


def test_converting_features_still_convert():
    """Penalties, banned tokens, logprobs and the torch path compute in float32, as before."""
    logits = greedy_logits(8, 50, torch.bfloat16)
    seen_mask = torch.rand(8, 50, generator=torch.Generator().manual_seed(1)) < 0.3
    batches = {
        "logprobs": SamplingBatch(temperature=torch.zeros(8), all_greedy=True, max_num_logprobs=2),
        "banned": SamplingBatch(temperature=torch.zeros(8), all_greedy=True,
                                banned=(torch.tensor([0, 1]), torch.tensor([3, 4]))),
        "penalties": SamplingBatch(temperature=torch.zeros(8), all_greedy=True,
                                   repetition_penalty=torch.full((8,), 1.3),
                                   seen_mask=seen_mask),
        "torch path": SamplingBatch(temperature=torch.full((8,), 0.7), all_greedy=False, seeds=list(range(8)),
                                    positions=[0] * 8),
    }
    for name, batch in batches.items():
        with checks.LogitsFloatCopies(logits) as seen:
            out = sample(logits, batch, use_fused=False)
        assert seen.copies, f"{name}: expected the logits converted to float32"
        expected = sample(logits.float(), batch, use_fused=False)
        assert torch.equal(out.token_ids, expected.token_ids), name
        if out.logprob is not None:
            assert out.logprob.dtype == torch.float32
            torch.testing.assert_close(out.logprob, expected.logprob, rtol=0, atol=0, equal_nan=True)  # -inf/NaN rows


def test_float64_logits_are_converted_first():
    """Two float64 values that round to one float32 value are a tie: the tokens are those of ``logits.float()``."""
    logits = torch.tensor([[1.0, 1.0 + 1e-12, 0.5], [0.0, -1e-300, 1e-300]], dtype=torch.float64)
    assert int(logits[0].argmax()) == 1  # in float64 the second is larger
    out = sample(logits, SamplingBatch(temperature=torch.zeros(2), all_greedy=True))
    assert out.token_ids.tolist() == [0, 0]


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("use_topk", [True, False], ids=["topk", "sort"])
def test_cut_of_low_precision_equals_cut_of_float(dtype, use_topk):
    generator = torch.Generator().manual_seed(3)
    num_rows, vocab = 300, 64 * 30 + 5  # the two-stage top-k runs (k * 64 * 4 <= vocab for k <= 7)
    logits = torch.randn(num_rows, vocab, generator=generator) * 4
    logits[::3] = torch.randint(-4, 5, (num_rows // 3, vocab), generator=generator).float() * 0.25
    logits[1::7, :vocab // 2] = float("-inf")
    logits = logits.to(dtype)
    temperature = torch.rand(num_rows, generator=generator) * 1.5 + 0.1
    temperature[::5] = 1.0
    top_k = torch.randint(1, 8 if use_topk else 40, (num_rows,), generator=generator)
    top_p = torch.rand(num_rows, generator=generator) * 0.9 + 0.05
    top_p[::4] = 1.0
    if not use_topk:
        top_k[::3] = 0
    max_top_k = int(top_k.max()) if use_topk else None
    for k, p in ((top_k, None), (None, top_p), (top_k, top_p)):
        if use_topk and k is None:
            continue
        threshold, num_ties = top_k_top_p_cut(logits, temperature, k, p, max_top_k if k is not None else None)
        expected = top_k_top_p_cut(logits.float(), temperature, k, p, max_top_k if k is not None else None)
        assert threshold.dtype == torch.float32
        assert torch.equal(threshold, expected[0]) and torch.equal(num_ties, expected[1])
        z = logits.float() / temperature.unsqueeze(1)
        assert torch.equal(cut_mask(z, threshold, num_ties), cut_mask(z, *expected))
