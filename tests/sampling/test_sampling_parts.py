"""The sampler's parts on the CPU: Philox noise, the top-k/top-p cut, penalties built on the device side.

The fused kernel itself is checked in ``test_fused_interpreted.py`` (Triton's interpreter, in a
subprocess) and ``test_fused_gpu.py`` (CUDA).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infer_core import SamplingParams
from infer_core.layers.sampler import SamplingBatch, apply_penalties, apply_top_k_top_p, sample
from infer_core.layers.sampling.philox import exponential_from_uint32, philox4x32, philox_uint32, seed_key
from infer_core.layers.sampling.thresholds import cut_mask, top_k_top_p_cut
from infer_core.runner.sampling_inputs import build_sampling_batch
from infer_core.runner.state import RequestState


def test_philox_matches_the_random123_known_answer():
    # Random123's kat_vectors: philox4x32-10, counter 0 and key 0
    out = philox4x32(torch.tensor([0]), torch.tensor([0]), torch.tensor([0]))
    assert [int(word) for word in out] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_philox_draws_are_a_function_of_key_position_and_token():
    keys = torch.tensor([seed_key(s) for s in (1, 2, -7, 2**70 + 3)])
    positions = torch.tensor([0, 5, 5, 1 << 20])
    draws = philox_uint32(keys, positions, 1001)
    assert draws.shape == (4, 1001) and int(draws.min()) >= 0 and int(draws.max()) < 2**32
    # one row alone, or a prefix of the vocabulary, gives the same numbers
    assert torch.equal(philox_uint32(keys[2:3], positions[2:3], 1001), draws[2:3])
    assert torch.equal(philox_uint32(keys, positions, 37), draws[:, :37])
    # another position or key gives other numbers
    assert (philox_uint32(keys, positions + 1, 1001) != draws).float().mean() > 0.99
    assert (philox_uint32(keys + 1, positions, 1001) != draws).float().mean() > 0.99
    assert seed_key(-7) == seed_key(2**64 - 7) and seed_key(2**63) == -(2**63)


def test_exponential_noise_is_exp1_and_never_zero():
    keys = torch.arange(64, dtype=torch.int64)
    q = exponential_from_uint32(philox_uint32(keys, torch.zeros(64, dtype=torch.int64), 4096)).double()
    assert float(q.min()) > 0 and torch.isfinite(q).all()
    assert abs(float(q.mean()) - 1.0) < 0.01 and abs(float(q.var()) - 1.0) < 0.03
    # the extremes of the integer range: smallest is (1/2) / 2**32, largest -log(2**-33)
    edges = exponential_from_uint32(torch.tensor([0, 2**32 - 1]))
    assert float(edges[0]) == pytest.approx(0.5 / 2**32, rel=1e-6) and float(edges[1]) > 20


def _tied_logits(num_rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Logits on a coarse grid (many exact ties), a few rows entirely tied."""
    logits = torch.randint(-6, 7, (num_rows, vocab), generator=generator).float() * 0.5
    logits[::7] = 1.0
    return logits


@pytest.mark.parametrize("use_topk", [True, False], ids=["topk", "sort"])
def test_cut_keeps_exactly_the_reference_set(use_topk):
    generator = torch.Generator().manual_seed(11)
    num_rows, vocab = 400, 97
    logits = _tied_logits(num_rows, vocab, generator)
    logits[200:] = torch.randn(200, vocab, generator=generator) * 3
    temperature = torch.rand(num_rows, generator=generator) + 0.25
    temperature[::5] = 1.0
    top_k = torch.randint(1, 30, (num_rows,), generator=generator)
    top_p = torch.rand(num_rows, generator=generator) * 0.9 + 0.05
    top_p[::3] = 1.0
    if not use_topk:
        top_k[::4] = 0  # rows with top-p alone need the sorted row
    max_top_k = int(top_k.max()) if use_topk else None
    z = logits / temperature.unsqueeze(1)
    for k, p in ((top_k, None), (None, top_p), (top_k, top_p)):
        if use_topk and k is None:
            continue
        expected = torch.isfinite(apply_top_k_top_p(z, k, p))
        threshold, num_ties = top_k_top_p_cut(logits, temperature, k, p, max_top_k if k is not None else None)
        kept = cut_mask(z, threshold, num_ties)
        assert torch.equal(kept, expected), (kept != expected).nonzero()[:5]
        if k is not None:
            assert (kept.sum(dim=1) <= torch.where(k > 0, k, vocab)).all()


def test_cut_without_filters_keeps_everything():
    logits = torch.randn(3, 10)
    threshold, num_ties = top_k_top_p_cut(logits, torch.ones(3), torch.tensor([0, 0, 0]),
                                          torch.tensor([1.0, 1.0, 1.0]), None)
    assert cut_mask(logits, threshold, num_ties).all()


def test_reference_ties_are_broken_by_token_id():
    z = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 3.0]])
    kept = torch.isfinite(apply_top_k_top_p(z, torch.tensor([3]), None))
    assert kept.tolist() == [[False, True, True, False, True, False]]


# ---------------------------------------------------------------------------------------------
# penalties: the device-side counts equal the host construction they replace


def _host_penalty_tensors(states, vocab_size):
    """The previous implementation: [R, V] counts and seen-mask built row by row on the host."""
    counts = torch.zeros(len(states), vocab_size, dtype=torch.float32)
    seen = torch.zeros(len(states), vocab_size, dtype=torch.bool)
    for row, state in enumerate(states):
        outputs = torch.tensor(state.token_ids[state.num_prompt_tokens:], dtype=torch.int64)
        counts[row].scatter_add_(0, outputs, torch.ones_like(outputs, dtype=torch.float32))
        seen[row, torch.tensor(state.token_ids, dtype=torch.int64)] = True
    return counts, seen


def _random_states(generator: np.random.Generator, num_rows: int, vocab: int) -> list[RequestState]:
    states = []
    for i in range(num_rows):
        num_prompt = int(generator.integers(1, 40))
        tokens = generator.integers(0, vocab, num_prompt + int(generator.integers(0, 60))).tolist()
        params = SamplingParams(temperature=float(generator.uniform(0, 1.5)),
                                repetition_penalty=float(generator.uniform(0.5, 2.0)),
                                frequency_penalty=float(generator.uniform(-2, 2)),
                                presence_penalty=float(generator.uniform(-2, 2)) if i % 3 else 0.0)
        states.append(RequestState(f"r{i}", tokens, num_prompt, params, [], num_prompt))
    return states


def test_penalties_match_the_host_construction():
    rng = np.random.default_rng(4)
    vocab = 50  # small: many repeats within a history
    states = _random_states(rng, 24, vocab)
    batch = build_sampling_batch(states, vocab, eos_token_ids=(), device=torch.device("cpu"))
    counts, seen = _host_penalty_tensors(states, vocab)
    assert torch.equal(batch.output_counts, counts) and torch.equal(batch.seen_mask, seen)
    logits = torch.randn(len(states), vocab, generator=torch.Generator().manual_seed(2)) * 3
    legacy = SamplingBatch(temperature=batch.temperature, all_greedy=False, output_counts=counts, seen_mask=seen,
                           presence_penalty=batch.presence_penalty, frequency_penalty=batch.frequency_penalty,
                           repetition_penalty=batch.repetition_penalty)
    assert torch.equal(apply_penalties(logits, batch), apply_penalties(logits, legacy))


def test_penalties_read_the_runners_token_table():
    rng = np.random.default_rng(5)
    vocab = 40
    states = _random_states(rng, 6, vocab)
    table = np.full((8, 128), vocab - 1, dtype=np.int32)  # padding past each history must be ignored
    for row, state in enumerate(states):
        state.row = row + 2 if hasattr(state, "row") else None
        if state.row is None:
            pytest.skip("RequestState has no row in this tree")
        table[state.row, : len(state.token_ids)] = state.token_ids
    from_lists = build_sampling_batch(states, vocab, eos_token_ids=(), device=torch.device("cpu"))
    from_table = build_sampling_batch(states, vocab, eos_token_ids=(), device=torch.device("cpu"), token_table=table)
    assert torch.equal(from_lists.output_counts, from_table.output_counts)
    assert torch.equal(from_lists.seen_mask, from_table.seen_mask)


# ---------------------------------------------------------------------------------------------
# the batch built for the sampler


def test_batch_columns_and_seeds():
    states = [
        RequestState("a", [1, 2, 3], 2, SamplingParams(temperature=0.7, top_k=5, seed=-3), [], 2),
        RequestState("b", [1, 2], 2, SamplingParams(temperature=0.0), [], 2),
        RequestState("c", [4, 4, 4, 4], 1, SamplingParams(temperature=1.1, top_p=0.5, top_k=9, min_p=0.1), [], 1),
    ]
    batch = build_sampling_batch(states, 16, eos_token_ids=(), device=torch.device("cpu"))
    assert batch.temperature.tolist() == pytest.approx([0.7, 0.0, 1.1])
    assert batch.top_k.tolist() == [5, 0, 9] and batch.max_top_k == 9
    assert batch.top_p.tolist() == pytest.approx([1.0, 1.0, 0.5]) and batch.min_p.tolist() == pytest.approx([0, 0, 0.1])
    assert batch.seeds.tolist() == [seed_key(-3), 0, 0] and batch.is_seeded.tolist() == [True, False, False]
    assert batch.positions.tolist() == [1, 0, 3]
    # a top-p row without top-k: the cut needs whole sorted rows
    states.append(RequestState("d", [1], 1, SamplingParams(top_p=0.8), [], 1))
    assert build_sampling_batch(states, 16, eos_token_ids=(), device=torch.device("cpu")).max_top_k is None


def test_one_shared_temperature_is_a_float_and_copies_nothing():
    """LLM.generate's batches (one SamplingParams) carry their temperature as a float; mixed ones a column."""
    shared = SamplingParams(temperature=0.6)
    states = [RequestState(f"r{i}", [1, 2, 3], 2, shared, [], 2) for i in range(4)]
    batch = build_sampling_batch(states, 16, eos_token_ids=(), device=torch.device("cpu"))
    assert batch.temperature == pytest.approx(0.6) and isinstance(batch.temperature, float)
    assert batch.top_p is None and batch.min_p is None and not batch.all_greedy
    tokens = sample(torch.randn(4, 16), batch).token_ids  # the torch path expands it
    assert tokens.shape == (4,)
    for other in (SamplingParams(temperature=0.6, top_p=0.9), SamplingParams(temperature=0.7)):
        mixed = build_sampling_batch(states + [RequestState("x", [1], 1, other, [], 1)], 16, eos_token_ids=(),
                                     device=torch.device("cpu"))
        assert isinstance(mixed.temperature, torch.Tensor) and len(mixed.temperature) == 5


def test_place_sampled_tokens_on_the_cpu():
    from infer_core.layers.sampler import place_sampled_tokens

    input_ids = torch.arange(10, dtype=torch.int32)
    place_sampled_tokens(input_ids, torch.tensor([7, 2], dtype=torch.int32), torch.tensor([100, 200, 300]),
                         torch.tensor([2, 0], dtype=torch.int32))
    assert input_ids.tolist() == [0, 1, 100, 3, 4, 5, 6, 300, 8, 9] and input_ids.dtype == torch.int32


def test_list_and_tensor_seeds_sample_the_same():
    generator = torch.Generator().manual_seed(8)
    logits = torch.randn(6, 300, generator=generator)
    seeds, positions = [5, None, 7, -1, None, 2**65], [0, 3, 9, 2, 0, 4]
    temperature = torch.full((6,), 0.9)
    as_lists = sample(logits, SamplingBatch(temperature=temperature, all_greedy=False, seeds=seeds,
                                            positions=positions)).token_ids
    as_tensors = sample(logits, SamplingBatch(
        temperature=temperature, all_greedy=False,
        seeds=torch.tensor([0 if s is None else seed_key(s) for s in seeds]), positions=torch.tensor(positions),
        is_seeded=torch.tensor([s is not None for s in seeds]))).token_ids
    seeded = [0, 2, 3, 5]
    assert torch.equal(as_lists[seeded], as_tensors[seeded])


@pytest.mark.parametrize("vocab", [64 * 40, 64 * 40 + 17])  # a whole number of chunks, and a short last chunk
def test_two_stage_top_k_finds_the_leading_values(vocab):
    from infer_core.layers.sampling.thresholds import leading_values

    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(64, vocab, generator=generator)
    logits[::2] = torch.randint(0, 5, (32, vocab), generator=generator).float()  # ties across chunks
    logits[1, -3:] = 50.0  # the largest values in the short last chunk
    logits[3, ::64] = 9.0  # one large value in every chunk
    for width in (1, 5, 10):
        assert torch.equal(leading_values(logits, width), logits.topk(width, dim=1).values)
