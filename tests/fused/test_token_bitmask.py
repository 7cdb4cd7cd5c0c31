"""The grammar-mask kernel (layers/sampling/bitmask.py) against the torch path, in Triton's interpreter
without CUDA (the conftest sets it): masks in place, any logits dtype, a vocabulary that is not a
multiple of the block or of 32, padded (strided) rows, and a bitmask shorter than the vocabulary (its ids past
the bitmask's words never allowed)."""

from __future__ import annotations

import pytest
import torch

from infer_core.layers.sampling.masks import apply_token_bitmask

pytest.importorskip("triton")


@pytest.mark.parametrize("vocab, dtype, padded, short", [(4200, torch.bfloat16, False, 0), (70, torch.float16, True, 0),
                                                          (200, torch.float32, False, 2)])
def test_kernel_matches_the_torch_path(device, vocab, dtype, padded, short):
    """``short``: words fewer than the vocabulary's (a grammar over a tokenizer smaller than the LM head)."""
    g = torch.Generator().manual_seed(vocab)
    words = -(-vocab // 32) - short
    logits = torch.randn((3, vocab + 7 * padded), generator=g).to(dtype)[:, :vocab].to(device)
    rows = torch.tensor([2, 0], dtype=torch.int64, device=device)
    bitmask = torch.randint(-2**31, 2**31 - 1, (2, words), generator=g, dtype=torch.int64).to(torch.int32)
    bitmask[1, -1] = 0  # the last word of row 0 allows nothing
    bitmask = bitmask.to(device)
    expected = apply_token_bitmask(logits, rows, bitmask, use_kernel=False)
    got = apply_token_bitmask(logits.clone() if not padded else logits, rows, bitmask, use_kernel=True)
    assert torch.equal(got, expected)
    assert torch.isinf(got[0, 32 * (words - 1):]).all() and torch.equal(got[1], logits[1])
    if not padded:  # unit stride: masked in the tensor given
        inplace = logits.clone()
        assert apply_token_bitmask(inplace, rows, bitmask, use_kernel=True) is inplace
