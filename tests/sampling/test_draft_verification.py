"""Sampling the positions of a step that verifies drafts (layers/draft_verification.py), on the CPU.

Each row reports the target's probability of its draft token after every sampling transform, and
draws its token from the residual (the distribution without the draft token): what modified
rejection sampling needs for a point-mass draft.
"""

from __future__ import annotations

import torch

from infer_core.layers.draft_verification import sample_verified
from infer_core.layers.sampler import SamplingBatch, transformed_probs


def test_greedy_rows_give_their_argmax_and_whether_the_draft_is_it():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.5, 0.1], [0.0, 0.0, 4.0]])
    out, probs = sample_verified(logits, SamplingBatch(temperature=None, all_greedy=True), torch.tensor([1, 2, -1]))
    assert out.token_ids.tolist() == [1, 0, 2] and probs.tolist() == [1.0, 0.0, 0.0]


def test_sampled_rows_report_the_transformed_probability_and_draw_from_the_residual():
    torch.manual_seed(0)
    vocab, rows = 6, 20000
    row_logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -1.0, -3.0])
    logits = row_logits.repeat(rows, 1)
    batch = SamplingBatch(temperature=torch.full((rows,), 0.8), all_greedy=False, top_p=torch.full((rows,), 0.9),
                          generator=torch.Generator().manual_seed(1))
    draft = torch.ones(rows, dtype=torch.int64)  # every row verifies token 1
    out, probs = sample_verified(logits, batch, draft)
    expected = transformed_probs(row_logits.unsqueeze(0), SamplingBatch(temperature=0.8, all_greedy=False,
                                                                           top_p=torch.tensor([0.9])),
                                 torch.tensor([0.8]), torch.tensor([False]))[0]
    assert expected[-1] == 0 and 0.2 < expected[1] < 0.5  # the cut removed the tail; the draft is likely
    assert torch.allclose(probs, expected[1].expand(rows))
    counts = torch.bincount(out.token_ids, minlength=vocab).double()
    assert counts[1] == 0  # never the draft token itself
    residual = expected.double().clone()
    residual[1] = 0
    residual /= residual.sum()
    assert torch.allclose(counts / rows, residual, atol=0.015)  # the residual's shares
    # rows that verify no draft draw from the distribution itself
    out, probs = sample_verified(logits, batch, torch.full((rows,), -1))
    assert probs.abs().sum() == 0
    assert torch.allclose(torch.bincount(out.token_ids, minlength=vocab).double() / rows, expected.double(),
                          atol=0.015)


def test_seeded_rows_do_not_depend_on_the_batch():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2))
    batch = SamplingBatch(temperature=torch.full((3,), 1.0), all_greedy=False, seeds=[None, 7, 7], positions=[0, 4, 5],
                          generator=torch.Generator().manual_seed(3))
    draft = torch.tensor([-1, 3, 9])
    out, probs = sample_verified(logits, batch, draft)
    alone = SamplingBatch(temperature=torch.full((1,), 1.0), all_greedy=False, seeds=[7], positions=[5],
                          generator=torch.Generator().manual_seed(99))
    out_alone, probs_alone = sample_verified(logits[2:], alone, draft[2:])
    assert out_alone.token_ids.tolist() == out.token_ids[2:].tolist() and torch.equal(probs_alone, probs[2:])


def test_logit_bias_moves_the_verified_probability_as_it_moves_sampling():
    """A draft is verified against the distribution the request samples from: its logit bias included."""
    logits = torch.zeros(2, 4)
    bias = (torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([100.0, -100.0]))
    batch = SamplingBatch(temperature=torch.ones(2), all_greedy=False, logit_bias=bias,
                          generator=torch.Generator().manual_seed(0))
    out, probs = sample_verified(logits, batch, torch.tensor([2, 3]))
    assert probs[0] > 0.999 and probs[1] < 1e-6  # row 0 favours its draft, row 1 all but bans it
    greedy = SamplingBatch(temperature=None, all_greedy=True, logit_bias=bias)
    out, probs = sample_verified(logits, greedy, torch.tensor([2, -1]))
    assert out.token_ids[0] == 2 and probs.tolist() == [1.0, 0.0]
