"""Run by ``test_kept_drafts.py`` in a subprocess with ``TRITON_INTERPRET=1``: the one-launch kernel that makes a
step planned over a greedy verify step exact (layers/sampling/kept_drafts.py) against the runner's torch form of it
(``AcceptedDrafts.apply`` on the CPU) and against the definition written as loops. Prints "ok"."""

from __future__ import annotations

import random

import numpy as np
import torch

from infer_core.interfaces import BatchMetadata
from infer_core.layers.sampling.kept_drafts import keep_drafts
from infer_core.runner.accepted_drafts import AcceptedDrafts
from infer_core.runner.inputs import StepInputs

BLOCK_SIZE = 4


def scenario(rng: random.Random):
    """A verify step's rows (per request: drafts, then the row after the last) and the step planned over it."""
    num_prev = rng.randrange(1, 5)
    most = 21 if rng.random() < 0.3 else 5  # now and then more drafts than the kernel's 16-wide blocks hold
    drafts_per = [rng.randrange(0, most) for _ in range(num_prev)]
    sample_rows, sampled, draft_ids = [], [], []
    for r, k in enumerate(drafts_per):
        keep = rng.randrange(0, k + 1)  # drafts kept before the first miss
        for j in range(k + 1):
            token = rng.randrange(10, 50)
            sampled.append(token)
            draft_ids.append(-1 if j == k else token if j < keep else token + 1)
            sample_rows.append(r)
    # the next step: a batch of requests, some of them pending from the verify step (in any order)
    pending_prev = rng.sample(range(num_prev), rng.randrange(1, num_prev + 1))
    num_reqs = len(pending_prev) + rng.randrange(0, 3)
    rows = rng.sample(range(num_reqs), len(pending_prev))
    # a pending request's query is 1 + its drafts; another may be a prompt chunk past the kernel's 16-wide block
    query_lens = [rng.randrange(1, most + 1) if r in rows or rng.random() < 0.5 else rng.randrange(17, 41)
                  for r in range(num_reqs)]
    max_blocks = 16
    block_tables = torch.tensor([[rng.randrange(0, 100) for _ in range(max_blocks)] for _ in range(num_reqs)],
                                dtype=torch.int32)
    starts = np.r_[0, np.cumsum(query_lens)]
    computed = [rng.randrange(10, 20) for _ in range(num_reqs)]  # as planned: every draft kept
    positions = torch.tensor(np.concatenate([np.arange(c, c + q) for c, q in zip(computed, query_lens)]),
                             dtype=torch.int32)
    token_rows = np.repeat(np.arange(num_reqs), query_lens)
    slot_mapping = (block_tables[token_rows, positions.long() // BLOCK_SIZE] * BLOCK_SIZE
                    + positions % BLOCK_SIZE).to(torch.int32)
    seq_lens = torch.tensor([c + q for c, q in zip(computed, query_lens)], dtype=torch.int32)
    metadata = BatchMetadata(num_reqs, int(starts[-1]), 0, max(query_lens), int(seq_lens.max()), BLOCK_SIZE,
                             torch.tensor(starts, dtype=torch.int32), seq_lens, block_tables, slot_mapping,
                             torch.tensor(starts, dtype=torch.int32), seq_lens.clone())
    inputs = StepInputs([f"r{i}" for i in range(num_reqs)], torch.zeros(int(starts[-1]), dtype=torch.int32),
                        positions, metadata, torch.zeros(0, dtype=torch.int32), [], int(starts[-1]),
                        pending_dst=torch.tensor([starts[b] for b in rows], dtype=torch.int32),
                        pending_src=torch.tensor(pending_prev, dtype=torch.int32),
                        pending_rows=torch.tensor(rows, dtype=torch.int32),
                        pending_max_query_len=max(query_lens[r] for r in rows))
    return (torch.tensor(sampled), torch.tensor(draft_ids), sample_rows), inputs, drafts_per


def expected(verify, inputs: StepInputs):
    """The definition, as loops."""
    sampled, draft_ids, sample_rows = (t.tolist() if torch.is_tensor(t) else t for t in verify)
    md = inputs.metadata
    input_ids, positions = inputs.input_ids.clone(), inputs.positions.clone()
    seq_lens, slots = md.seq_lens.clone(), md.slot_mapping.clone()
    for src, row, dst in zip(inputs.pending_src.tolist(), inputs.pending_rows.tolist(), inputs.pending_dst.tolist()):
        rows = [i for i, r in enumerate(sample_rows) if r == src]
        first_miss = next(i for i in rows if draft_ids[i] != sampled[i])
        rejected = rows[-1] - first_miss
        input_ids[dst] = sampled[first_miss]
        seq_lens[row] -= rejected
        for t in range(int(md.query_start_loc[row]), int(md.query_start_loc[row + 1])):
            positions[t] -= rejected
            p = int(positions[t])
            slots[t] = int(md.block_tables[row, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE
    return input_ids, positions, seq_lens, slots


def state(inputs: StepInputs):
    return inputs.input_ids, inputs.positions, inputs.metadata.seq_lens, inputs.metadata.slot_mapping


def copy_of(inputs: StepInputs) -> StepInputs:
    md = inputs.metadata
    metadata = BatchMetadata(md.num_reqs, md.num_tokens, 0, md.max_query_len, md.max_seq_len, BLOCK_SIZE,
                             md.query_start_loc, md.seq_lens.clone(), md.block_tables, md.slot_mapping.clone(),
                             md.query_start_loc_cpu, md.seq_lens.clone())
    return StepInputs(inputs.request_ids, inputs.input_ids.clone(), inputs.positions.clone(), metadata,
                      inputs.logits_indices, [], inputs.padded_num_tokens, pending_dst=inputs.pending_dst,
                      pending_src=inputs.pending_src, pending_rows=inputs.pending_rows,
                      pending_max_query_len=inputs.pending_max_query_len)


def main() -> None:
    rng = random.Random(0)
    for _ in range(60):
        verify, inputs, _ = scenario(rng)
        want = expected(verify, inputs)
        by_torch = copy_of(inputs)
        accepted = AcceptedDrafts(*verify, frozenset())
        accepted.apply(by_torch, by_torch.metadata.block_tables, BLOCK_SIZE)
        by_kernel = copy_of(inputs)
        start, end = accepted.segments()
        keep_drafts(verify[0], verify[1], start, end, by_kernel.pending_src, by_kernel.pending_rows,
                    by_kernel.pending_dst, by_kernel.input_ids, by_kernel.positions, by_kernel.metadata.slot_mapping,
                    by_kernel.metadata.seq_lens, by_kernel.metadata.query_start_loc, by_kernel.metadata.block_tables,
                    BLOCK_SIZE, int((accepted.seg_end - accepted.seg_start).max()), by_kernel.pending_max_query_len)
        for name, a, b, c in zip(("input_ids", "positions", "seq_lens", "slot_mapping"), want, state(by_torch),
                                 state(by_kernel)):
            assert torch.equal(a, b), (name, "torch", a, b)
            assert torch.equal(a, c), (name, "kernel", a, c)
    # a request kept at random cannot be counted: refused, naming it
    verify, inputs, _ = scenario(rng)
    try:
        AcceptedDrafts(*verify, frozenset({"r0"})).check(["r1", "r0"])
    except RuntimeError as error:
        assert "['r0']" in str(error)
    else:
        raise AssertionError("a request kept at random was counted")
    print("ok")


if __name__ == "__main__":
    main()
