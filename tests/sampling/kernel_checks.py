"""Checks of the fused kernels themselves (``infer_core.layers.sampling.fused``), shared by two test files.

``test_fused_interpreted.py`` runs them on the CPU in a subprocess with ``TRITON_INTERPRET=1`` (small
shapes), ``test_fused_gpu.py`` on CUDA at real shapes. Run directly:
``python tests/sampling/kernel_checks.py NAME [ARGS]``.

What they pin down: the greedy pass is torch's argmax (first maximum, a NaN first); a row's token
does not depend on how many programs share the row (so the in-launch combine and its counters are
right); the per-token bound never lets pass B skip the winner, at extreme temperatures and logit
scales and under top-k/top-p/min-p cuts too; unseeded rows follow the generator.
"""

from __future__ import annotations

import sys

import torch

from infer_core.layers.sampler import SamplingBatch, sample
from infer_core.layers.sampling import fused
from infer_core.layers.sampling.philox import seed_key
from infer_core.layers.sampling.thresholds import top_k_top_p_cut
from infer_core.sampling_params import MIN_SAMPLING_TEMPERATURE


def _counters_are_zero() -> bool:
    return all(int(buffer.abs().sum()) == 0 for buffer in fused._COUNTERS.buffers.values())


def _split_plans(vocab: int) -> list[int | None]:
    num_tiles = -(-vocab // fused.TILE)
    return sorted({1, min(2, num_tiles), min(3, num_tiles), num_tiles}) + [None]


def _argmax_rows(num_rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Ordinary rows, and rows whose maximum is tied, signed zero, infinite, NaN, or everywhere -inf."""
    logits = torch.randn(num_rows, vocab, generator=generator) * 8
    logits[1::5] = torch.randint(-2, 3, (len(logits[1::5]), vocab), generator=generator).float()
    special = [
        torch.full((vocab,), 0.5),
        torch.full((vocab,), float("-inf")),
        torch.where(torch.arange(vocab) % 2 == 0, -0.0, 0.0),  # -0.0 first: equal to +0.0, so token 0
        torch.full((vocab,), -3.0).index_fill(0, torch.tensor([vocab // 2, vocab - 1]), float("inf")),
        torch.randn(vocab, generator=generator).index_fill(0, torch.tensor([vocab - 2, vocab // 3]), float("nan")),
        torch.full((vocab,), float("-inf")).index_fill(0, torch.tensor([vocab - 1]), -1e30),
    ]
    for i, row in enumerate(special[: num_rows - 1]):
        logits[1 + i] = row
    return logits


def check_argmax_matches_torch(device: str, num_rows: int, vocab: int) -> None:
    generator = torch.Generator().manual_seed(num_rows + vocab)
    logits = _argmax_rows(num_rows, vocab, generator)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        low = logits.to(dtype).to(device)
        expected = low.float().cpu().argmax(dim=1)  # torch on the CPU: the first maximum, a NaN first
        for splits in _split_plans(vocab):
            tokens = fused.fused_argmax(low, num_splits=splits).cpu()
            wrong = (tokens != expected).nonzero().flatten().tolist()
            assert not wrong, f"{dtype} splits={splits}: rows {wrong[:8]}: {tokens[wrong[:8]].tolist()} " \
                              f"vs {expected[wrong[:8]].tolist()}"
    assert _counters_are_zero()


def _kernel_inputs(logits: torch.Tensor, batch: SamplingBatch) -> dict:
    """What ``sample`` hands the kernel for ``batch`` (the cut computed the same way)."""
    temperature = batch.temperature.float()
    threshold = num_ties = None
    if batch.top_k is not None or batch.top_p is not None:
        cut_temperature = torch.where(temperature < MIN_SAMPLING_TEMPERATURE, 1.0, temperature)
        threshold, num_ties = top_k_top_p_cut(logits, cut_temperature, batch.top_k, batch.top_p, batch.max_top_k)
    return dict(temperature=temperature, generator=batch.generator, seeds=batch.seeds, positions=batch.positions,
                is_seeded=batch.is_seeded, min_p=batch.min_p, threshold=threshold, num_ties=num_ties)


def _seeded_batch(temperature: torch.Tensor, generator: torch.Generator, device: str, **features) -> SamplingBatch:
    num_rows = len(temperature)
    return SamplingBatch(temperature=temperature.to(device), all_greedy=False,
                         seeds=torch.randint(-(2**62), 2**62, (num_rows,), generator=generator).to(device),
                         positions=torch.randint(0, 5000, (num_rows,), generator=generator).to(device),
                         is_seeded=torch.ones(num_rows, dtype=torch.bool, device=device), **features)


def check_split_plans_agree(device: str, num_rows: int, vocab: int) -> None:
    """Seeded rows: the same tokens with 1, 2, 3, ... programs per row, equal to the torch reference."""
    generator = torch.Generator().manual_seed(vocab * 3 + num_rows)
    logits = (torch.randn(num_rows, vocab, generator=generator) * 3).to(device)
    logits[1::4] = torch.randint(-2, 3, (len(logits[1::4]), vocab), generator=generator).float().to(device)
    temperature = torch.rand(num_rows, generator=generator) + 0.3
    temperature[::5] = 0.0
    top_k = torch.randint(0, 40, (num_rows,), generator=generator).to(device)
    cases = {
        "temperature": {},
        "top_k": dict(top_k=top_k, max_top_k=int(top_k.max())),
        "top_p,min_p": dict(top_p=(torch.rand(num_rows, generator=generator) * 0.8 + 0.2).to(device),
                            min_p=(torch.rand(num_rows, generator=generator) * 0.2).to(device)),
    }
    for name, features in cases.items():
        batch = _seeded_batch(temperature, generator, device, **features)
        reference = sample(logits, batch, use_fused=False).token_ids.cpu()
        inputs = _kernel_inputs(logits, batch)
        for splits in _split_plans(vocab):
            tokens = fused.fused_sample(logits, **inputs, num_splits=splits).cpu()
            wrong = (tokens != reference).nonzero().flatten().tolist()
            assert not wrong, f"{name} splits={splits}: rows {wrong[:8]}: {tokens[wrong[:8]].tolist()} " \
                              f"vs {reference[wrong[:8]].tolist()}"
    assert _counters_are_zero()


def check_bounds_keep_the_winner(device: str, vocab: int) -> None:
    """Extreme temperatures and logit scales, near-flat and peaked rows, -inf padding, huge float32 logits."""
    generator = torch.Generator().manual_seed(vocab)
    rows, temperatures = [], []
    for temperature in (MIN_SAMPLING_TEMPERATURE * 2, 0.01, 0.3, 1.0, 4.0, 50.0):
        for scale in (1e-4, 0.5, 2.0, 30.0):
            rows += list(torch.randn(3, vocab, generator=generator) * scale)
            temperatures += [temperature] * 3
        peaked = torch.randn(vocab, generator=generator)
        peaked[torch.randint(0, vocab, (3,), generator=generator)] += 12.0
        rows.append(peaked)
        temperatures.append(temperature)
    padded = torch.randn(vocab, generator=generator)
    padded[vocab // 2:] = float("-inf")
    lonely = torch.full((vocab,), float("-inf"))
    lonely[vocab // 3] = -3.0e38  # z = l / 0.885 is finite, just: its bound may overflow to -inf
    huge = torch.randn(vocab, generator=generator) * 1e37
    rows += [padded, lonely, huge, torch.full((vocab,), float("-inf"))]
    temperatures += [0.7, 0.885, 0.5, 1.0]
    logits = torch.stack(rows).to(device)
    batch = _seeded_batch(torch.tensor(temperatures), generator, device)
    reference = sample(logits, batch, use_fused=False).token_ids.cpu()
    tokens = sample(logits, batch, use_fused=True).token_ids.cpu()
    wrong = (tokens != reference).nonzero().flatten().tolist()
    assert not wrong, f"rows {wrong[:8]}: {tokens[wrong[:8]].tolist()} vs {reference[wrong[:8]].tolist()}"
    assert tokens[len(rows) - 3] == vocab // 3 and tokens[-1] == 0


def check_cut_bounds_keep_the_winner(device: str, vocab: int) -> None:
    """The same extremes under top-k + min-p and under top-p cuts, with tie rows: rows, or slices, where
    the cut keeps one token whose bound overflows, or none at all, still give the reference's tokens."""
    generator = torch.Generator().manual_seed(vocab + 2)
    rows, temperatures = [], []
    for temperature in (MIN_SAMPLING_TEMPERATURE * 2, 0.3, 50.0):
        peaked = torch.randn(vocab, generator=generator) * 2.0
        peaked[torch.randint(0, vocab, (3,), generator=generator)] += 12.0
        rows += [peaked, torch.randint(-2, 3, (vocab,), generator=generator).float()]
        temperatures += [temperature] * 2
    padded = torch.randn(vocab, generator=generator)
    padded[vocab // 2:] = float("-inf")
    lonely = torch.full((vocab,), float("-inf"))
    lonely[vocab // 3] = -3.0e38  # the only token any cut keeps: finite z, a bound that overflows
    huge = torch.randn(vocab, generator=generator) * 1e37
    rows += [padded, lonely, huge, torch.full((vocab,), float("-inf"))]
    temperatures += [0.7, 0.885, 0.5, 1.0]
    logits = torch.stack(rows).to(device)
    num_rows = len(rows)
    top_k = torch.randint(1, 40, (num_rows,), generator=generator).to(device)
    min_p, top_p = torch.full((num_rows,), 0.05, device=device), torch.full((num_rows,), 0.6, device=device)
    cases = {"top_k,min_p": dict(top_k=top_k, max_top_k=int(top_k.max()), min_p=min_p), "top_p": dict(top_p=top_p)}
    for name, features in cases.items():
        batch = _seeded_batch(torch.tensor(temperatures), generator, device, **features)
        reference = sample(logits, batch, use_fused=False).token_ids.cpu()
        tokens = sample(logits, batch, use_fused=True).token_ids.cpu()
        wrong = (tokens != reference).nonzero().flatten().tolist()
        assert not wrong, f"{name}: rows {wrong[:8]}: {tokens[wrong[:8]].tolist()} vs {reference[wrong[:8]].tolist()}"
        assert tokens[num_rows - 3] == vocab // 3 and tokens[-1] == 0, name


def check_unseeded_rows_follow_the_generator(device: str, vocab: int) -> None:
    """Same generator state, same tokens; each launch moves the generator on (and CUDA's by 4 offsets)."""
    num_rows = 16
    logits = torch.zeros(num_rows, vocab, device=device)  # uniform: the token is the noise's choice

    def draw(generator):
        batch = SamplingBatch(temperature=torch.ones(num_rows, device=device), all_greedy=False, generator=generator)
        return sample(logits, batch, use_fused=True).token_ids.cpu()

    def fresh(seed):
        return torch.Generator(device=device).manual_seed(seed)

    first, again = draw(fresh(5)), draw(fresh(5))
    generator = torch.Generator(device=device).manual_seed(5)
    step1, step2 = draw(generator), draw(generator)
    other = draw(fresh(6))
    assert torch.equal(first, again) and torch.equal(first, step1)
    assert (step1 != step2).sum() >= num_rows // 2 and (first != other).sum() >= num_rows // 2
    if device == "cuda":
        generator = torch.Generator(device=device).manual_seed(5)
        before = generator.get_offset()
        draw(generator)
        assert generator.get_offset() == before + 4
    # a seeded row's noise is its seed's, whatever the generator
    seeded = SamplingBatch(temperature=torch.ones(1, device=device), all_greedy=False,
                           generator=torch.Generator(device=device).manual_seed(1),
                           seeds=torch.tensor([seed_key(77)], device=device),
                           positions=torch.tensor([3], device=device),
                           is_seeded=torch.ones(1, dtype=torch.bool, device=device))
    tokens = {int(sample(logits[:1], seeded, use_fused=True).token_ids) for _ in range(3)}
    assert len(tokens) == 1


def check_uniform_temperature(device: str, vocab: int) -> None:
    """One temperature for every row, as a float (no column copied to the device): the column's tokens."""
    generator = torch.Generator().manual_seed(vocab + 1)
    num_rows = 5
    logits = (torch.randn(num_rows, vocab, generator=generator) * 3).bfloat16().to(device)
    column = _seeded_batch(torch.full((num_rows,), 0.6), generator, device)
    uniform = SamplingBatch(**{name: getattr(column, name) for name in SamplingBatch.__slots__})
    uniform.temperature = 0.6
    tokens = sample(logits, uniform, use_fused=True).token_ids
    assert torch.equal(tokens, sample(logits, column, use_fused=True).token_ids)
    assert torch.equal(tokens, sample(logits, uniform, use_fused=False).token_ids)
    for splits in _split_plans(vocab):
        assert torch.equal(fused.fused_sample(logits, 0.6, None, uniform.seeds, uniform.positions,
                                              uniform.is_seeded, num_splits=splits), tokens)


def check_place_tokens(device: str, num_rows: int) -> None:
    """The next step's input ids take the sampled tokens: the index_select + cast + index_put_ it replaces."""
    from infer_core.layers.sampling.placement import place_tokens

    generator = torch.Generator().manual_seed(num_rows)
    for index_dtype in (torch.int32, torch.int64):
        input_ids = torch.randint(0, 1000, (num_rows * 3 + 5,), generator=generator, dtype=torch.int32).to(device)
        sampled = torch.randint(0, 151936, (num_rows + 2,), generator=generator).to(device)
        dst = torch.randperm(len(input_ids), generator=generator)[:num_rows].to(index_dtype).to(device)
        src = torch.randperm(len(sampled), generator=generator)[:num_rows].to(index_dtype).to(device)
        expected = input_ids.clone()
        expected.index_put_((dst.long(),), sampled.index_select(0, src).to(torch.int32))
        place_tokens(input_ids, dst, sampled, src)
        assert torch.equal(input_ids, expected), (input_ids - expected).nonzero()[:5]


if __name__ == "__main__":
    from infer_core.testing_interpreter import quicken_triton_interpreter

    quicken_triton_interpreter()
    name, *args = sys.argv[1:]
    globals()[f"check_{name}"]("cuda" if torch.cuda.is_available() else "cpu", *map(int, args))
    print("ok")
