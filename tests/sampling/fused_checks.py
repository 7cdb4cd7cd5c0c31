"""Checks of the fused sampling kernel against the torch path, shared by two test files.

``test_fused_interpreted.py`` runs them on the CPU in a subprocess with ``TRITON_INTERPRET=1``
(small shapes, so the core test process never turns the interpreter on), ``test_fused_gpu.py``
runs them on CUDA at real shapes. Run directly: ``python tests/sampling/fused_checks.py NAME``.

Seeded rows get the same Philox noise on both paths, so the fused kernel must pick exactly the
token the reference picks (argmax of ``p / q`` there, of ``z - log q`` here). bf16/fp16 logits,
read by the kernel as they are, must give the tokens of the same logits converted to float32.
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from infer_core.layers.sampler import SamplingBatch, sample
from infer_core.layers.sampling.philox import seed_key


def _batch(num_rows: int, generator: torch.Generator, device: str, *, top_k: bool, top_p: bool, min_p: bool,
           vocab: int) -> SamplingBatch:
    temperature = torch.rand(num_rows, generator=generator) * 1.2 + 0.2
    temperature[::6] = 0.0  # greedy rows between sampled ones
    batch = SamplingBatch(temperature=temperature.to(device), all_greedy=False,
                          seeds=torch.randint(-(2**62), 2**62, (num_rows,), generator=generator).to(device),
                          positions=torch.randint(0, 5000, (num_rows,), generator=generator).to(device),
                          is_seeded=torch.ones(num_rows, dtype=torch.bool, device=device))
    if top_k:
        k = torch.randint(1, min(vocab, 60), (num_rows,), generator=generator)
        k[::4] = 0
        batch.top_k = k.to(device)
        batch.max_top_k = None if top_p else int(k.max())
    if top_p:
        batch.top_p = (torch.rand(num_rows, generator=generator) * 0.9 + 0.1).to(device)
        batch.top_p[::5] = 1.0
    if min_p:
        batch.min_p = (torch.rand(num_rows, generator=generator) * 0.3).to(device)
        batch.min_p[::3] = 0.0
    return batch


def _logits(num_rows: int, vocab: int, generator: torch.Generator, device: str) -> torch.Tensor:
    logits = torch.randn(num_rows, vocab, generator=generator) * 3
    logits[1::3] = torch.randint(-3, 4, (len(logits[1::3]), vocab), generator=generator).float()  # exact ties
    return logits.to(device)


def _fused_equals_reference(logits: torch.Tensor, generator: torch.Generator, device: str, vocab: int,
                            features: dict) -> torch.Tensor:
    """A batch with ``features`` (top_k / top_p / min_p) over ``logits``: the fused kernel's tokens, which must be
    the torch reference's."""
    flags = dict(dict(top_k=False, top_p=False, min_p=False), **features)
    batch = _batch(len(logits), generator, device, vocab=vocab, **flags)
    fused = sample(logits, batch, use_fused=True).token_ids
    reference = sample(logits, batch, use_fused=False).token_ids
    mismatched = (fused != reference).nonzero().flatten().tolist()
    assert not mismatched, f"{features}: rows {mismatched[:8]} differ: {fused[mismatched[:8]].tolist()} " \
                           f"vs {reference[mismatched[:8]].tolist()}"
    return fused


def check_matches_reference(device: str, num_rows: int, vocab: int) -> None:
    generator = torch.Generator().manual_seed(num_rows * 7919 + vocab)
    logits = _logits(num_rows, vocab, generator, device)
    for features in ({}, dict(top_k=True), dict(top_p=True), dict(top_k=True, top_p=True), dict(min_p=True),
                     dict(top_k=True, top_p=True, min_p=True)):
        _fused_equals_reference(logits, generator, device, vocab, features)


def check_masked_rows(device: str, num_rows: int, vocab: int) -> None:
    """Rows as a grammar leaves them: most logits -inf, whole slices of the kernel masked (the allowed tokens in
    the first 3% of the vocabulary, or only in its last 40 ids, or a handful spread over it), and rows with
    nothing allowed (every key ties at -inf: the first token, as the reference's argmax of NaN ratios gives),
    greedy and sampled, with and without top-k, top-p and min-p: the reference's tokens, one for one."""
    generator = torch.Generator().manual_seed(num_rows * 31 + vocab)
    logits = _logits(num_rows, vocab, generator, "cpu")
    allowed = torch.zeros(num_rows, vocab, dtype=torch.bool)
    allowed[0::4, : max(2, vocab * 3 // 100)] = True
    allowed[1::4, vocab - 40:] = True
    allowed[2::4, torch.randint(0, vocab, (7,), generator=generator)] = True
    # rows 3::4 allow nothing
    logits = logits.masked_fill(~allowed, float("-inf")).to(device)
    for features in ({}, dict(top_k=True), dict(top_p=True), dict(min_p=True)):
        fused = _fused_equals_reference(logits, generator, device, vocab, features)
        kept = allowed.to(device)[torch.arange(num_rows, device=device), fused] | ~allowed.to(device).any(dim=1)
        assert bool(kept.all()), f"{features}: a masked token was sampled"


def check_ties_across_slices(device: str, vocab: int) -> None:
    """A top-k that cuts through a tie spread over the whole row (and over the kernel's slices).

    About half the tokens tie at 1, the rest at 0: the first row's cut falls at about 4/5 of the row
    (in the last slice, past its first tile, at the interpreter's 8000 tokens), the second's at its
    end (through the 0s when fewer than half are 1s), the third's at its start.
    """
    generator = torch.Generator().manual_seed(5)
    num_rows = 3
    logits = torch.randint(0, 2, (num_rows, vocab), generator=generator).float().to(device)
    for trial in range(4):
        top_k = torch.tensor([vocab * 2 // 5, vocab // 2 + trial, 7 + trial], device=device)
        batch = SamplingBatch(temperature=torch.ones(num_rows, device=device), all_greedy=False, top_k=top_k,
                              max_top_k=int(top_k.max()),
                              seeds=torch.tensor([seed_key(trial * 10 + r) for r in range(num_rows)], device=device),
                              positions=torch.zeros(num_rows, dtype=torch.int64, device=device),
                              is_seeded=torch.ones(num_rows, dtype=torch.bool, device=device))
        fused = sample(logits, batch, use_fused=True).token_ids
        reference = sample(logits, batch, use_fused=False).token_ids
        assert torch.equal(fused, reference), (trial, fused.tolist(), reference.tolist())


def check_seeded_rows_ignore_the_batch(device: str, vocab: int) -> None:
    """Seeded rows alone, and reversed among unseeded rows of other settings (other slice counts too)."""
    generator = torch.Generator().manual_seed(3)
    num_seeded = 4
    logits = _logits(num_seeded, vocab, generator, device)
    seeds = torch.tensor([seed_key(s) for s in (11, -5, 2**40, 99)], device=device)
    positions = torch.tensor([0, 7, 3, 100], device=device)
    temperature = torch.tensor([0.8, 1.0, 1.3, 0.6], device=device)
    top_k = torch.tensor([0, 20, 0, 40], device=device)

    def seeded_batch(rows, where):
        batch = SamplingBatch(temperature=torch.rand(rows, generator=generator).to(device) + 0.5, all_greedy=False,
                              top_k=torch.randint(0, 30, (rows,), generator=generator).to(device), max_top_k=40,
                              seeds=torch.zeros(rows, dtype=torch.int64, device=device),
                              positions=torch.zeros(rows, dtype=torch.int64, device=device),
                              is_seeded=torch.zeros(rows, dtype=torch.bool, device=device))
        for i, row in enumerate(where):
            batch.temperature[row], batch.top_k[row] = temperature[i], top_k[i]
            batch.seeds[row], batch.positions[row], batch.is_seeded[row] = seeds[i], positions[i], True
        return batch

    alone = sample(logits, seeded_batch(num_seeded, list(range(num_seeded))), use_fused=True).token_ids
    for rows in (9, 40):
        where = list(range(rows - 1, 0, -(rows // num_seeded)))[:num_seeded]
        mixed_logits = _logits(rows, vocab, generator, device)
        mixed_logits[where] = logits
        mixed = sample(mixed_logits, seeded_batch(rows, where), use_fused=True).token_ids[where]
        assert torch.equal(mixed, alone), (rows, mixed.tolist(), alone.tolist())


class LogitsFloatCopies(TorchDispatchMode):
    """Records every op that reads ``logits`` and writes a float32 tensor as large as they are.

    ``logits.float()`` is one; so is any other whole-row float32 pass over them. Used as a context
    manager around ``sample``; ``copies`` lists the ops' names.
    """

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.storage = logits.untyped_storage().data_ptr()
        self.numel = logits.numel()
        self.copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        reads = any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == self.storage
                    for a in tree_leaves((args, kwargs)))
        if reads and any(isinstance(o, torch.Tensor) and o.dtype == torch.float32 and o.numel() >= self.numel
                         for o in tree_leaves(out)):
            self.copies.append(str(func))
        return out


def _low_precision_batches(num_rows: int, vocab: int, generator: torch.Generator, device: str):
    """(name, build) pairs: ``build()`` makes the same batch afresh (unseeded rows' generator included)."""
    # (top-k + top-p alone: the rows of the last set whose min_p is 0)
    for features in ({}, dict(top_k=True), dict(top_p=True), dict(min_p=True),
                     dict(top_k=True, top_p=True, min_p=True)):
        flags = dict(dict(top_k=False, top_p=False, min_p=False), **features)
        batch = _batch(num_rows, generator, device, vocab=vocab, **flags)
        for seeding in ("seeded", "mixed"):
            def build(batch=batch, seeding=seeding):
                copy = SamplingBatch(**{name: getattr(batch, name) for name in SamplingBatch.__slots__})
                copy.generator = torch.Generator(device=device).manual_seed(17)
                if seeding == "mixed":  # unseeded rows draw their keys from the (fresh) generator
                    copy.is_seeded = torch.arange(num_rows, device=device) % 2 == 0
                return copy
            yield f"{'+'.join(features) or 'temperature'},{seeding}", build
    all_greedy = SamplingBatch(temperature=torch.zeros(num_rows, device=device), all_greedy=True)
    yield "all_greedy", lambda: all_greedy


def check_low_precision_matches_float(device: str, num_rows: int, vocab: int, every_case: int = 1) -> None:
    """bf16/fp16 logits give, token for token, what ``logits.float()`` gives, and are not converted.

    bf16 (the models') gets every case, fp16 a few; with ``every_case=0`` bf16 gets fp16's few too: a
    shape chosen for how its rows are split and masked (which no case changes) need not repeat the rest.
    """
    generator = torch.Generator().manual_seed(num_rows * 31 + vocab)
    few_cases = {"temperature,mixed", "top_k+top_p+min_p,mixed", "all_greedy"}
    for dtype in (torch.bfloat16, torch.float16):
        logits = (_logits(num_rows, vocab, generator, device) * 4).to(dtype)  # bf16 rounding makes more ties
        logits[2::5, vocab // 3:] = float("-inf")
        wide = torch.full((num_rows, vocab + 40), 7.0, dtype=dtype, device=device)
        wide[:, :vocab] = logits
        strided = wide[:, :vocab]  # rows of a padded vocabulary: stride(0) != vocab
        for name, build in _low_precision_batches(num_rows, vocab, generator, device):
            if (dtype == torch.float16 or not every_case) and name not in few_cases:
                continue
            # both layouts hold the same values, so ``low.float()`` is the same float32 batch for each
            expected = sample(logits.float(), build(), use_fused=True).token_ids
            for low in (logits, strided) if name.endswith(",mixed") else (logits,):
                with LogitsFloatCopies(low) as seen:
                    tokens = sample(low, build(), use_fused=True).token_ids
                assert not seen.copies, f"{dtype} {name}: the logits were converted: {seen.copies}"
                mismatched = (tokens != expected).nonzero().flatten().tolist()
                assert not mismatched, f"{dtype} {name}: rows {mismatched[:8]} differ: " \
                                       f"{tokens[mismatched[:8]].tolist()} vs {expected[mismatched[:8]].tolist()}"
            if name.endswith(",seeded"):  # and the torch reference on float32 agrees
                reference = sample(logits.float(), build(), use_fused=False).token_ids
                assert torch.equal(tokens, reference), f"{dtype} {name}: fused bf16 vs torch reference"
        # a batch with logprobs still converts (and the detector sees it)
        batch = _low_precision_batches(num_rows, vocab, generator, device).__next__()[1]()
        batch.max_num_logprobs = 0
        with LogitsFloatCopies(logits) as seen:
            sample(logits, batch, use_fused=True)
        assert seen.copies, "logprobs need float32 logits: expected a conversion"


if __name__ == "__main__":
    from infer_core.testing_interpreter import quicken_triton_interpreter

    quicken_triton_interpreter()
    name, *args = sys.argv[1:]
    globals()[f"check_{name}"]("cuda" if torch.cuda.is_available() else "cpu", *map(int, args))
    print("ok")
