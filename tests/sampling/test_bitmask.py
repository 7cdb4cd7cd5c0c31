"""Grammar masks on logits: the torch path against a per-token reference, and the sampler never picking a
masked token (tests/fused/test_token_bitmask.py holds the Triton kernel to the torch path)."""

from __future__ import annotations

import pytest
import torch

from infer_core.layers.sampler import SamplingBatch, sample, takes_argmax
from infer_core.layers.sampling.masks import apply_token_bitmask


def _random_bitmask(rows: int, vocab: int, generator: torch.Generator, density: float = 0.3) -> torch.Tensor:
    words = -(-vocab // 32)
    bits = torch.rand((rows, words * 32), generator=generator) < density
    weights = torch.ones(32, dtype=torch.int64) << torch.arange(32)
    packed = (bits.view(rows, words, 32).long() * weights).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # two's complement words


def _reference(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    for m, row in enumerate(rows.tolist()):
        for token in range(logits.shape[1]):
            word = token // 32
            allowed = word < bitmask.shape[1] and (int(bitmask[m, word]) >> (token % 32)) & 1
            if not allowed:
                out[row, token] = float("-inf")
    return out


@pytest.mark.parametrize("vocab, words_short", [(100, 0), (96, 0), (70, 1)])
def test_torch_path_masks_exactly_the_disallowed_tokens(vocab, words_short):
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn((5, vocab), generator=generator)
    rows = torch.tensor([4, 0, 2])
    bitmask = _random_bitmask(3, vocab, generator)[:, : -(-vocab // 32) - words_short]  # short: the tail is banned
    out = apply_token_bitmask(logits, rows, bitmask, use_kernel=False)
    assert torch.equal(out, _reference(logits, rows, bitmask))
    assert torch.equal(out[[1, 3]], logits[[1, 3]])  # rows without a mask are untouched


def test_sampler_picks_only_allowed_tokens():
    generator = torch.Generator().manual_seed(0)
    vocab = 300
    logits = torch.randn((6, vocab), generator=generator)
    rows = torch.tensor([0, 2, 3, 5])
    bitmask = _random_bitmask(4, vocab, generator, density=0.02)
    bitmask[:, 0] |= 1  # every row allows at least token 0
    allowed = apply_token_bitmask(torch.zeros((6, vocab)), rows, bitmask) == 0
    for temperature in (None, 0.8):
        for _ in range(20):
            batch = SamplingBatch(temperature=temperature, all_greedy=temperature is None, generator=generator,
                                  allowed=(rows, bitmask))
            assert not takes_argmax(batch, logits)  # the argmax graph would skip the mask
            tokens = sample(logits, batch).token_ids
            assert all(allowed[r, tokens[r]] for r in rows.tolist())

