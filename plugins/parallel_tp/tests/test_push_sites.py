"""Push sites laid out in the symmetric buffer, checked on the CPU: sizes, the order sites are handed out,
and every rank's addresses, with the pushing GEMV and the sum kernel run on them in Triton's interpreter.

The rendezvous is simulated: each rank's symmetric buffer is a tensor of this process, and ``get_buffer``
views it as torch's handle views a peer's mapping. ``test_gpu.py`` runs the real thing on two GPUs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from infer_parallel_tp.push_sites import MAX_ROWS, PushLayout


def test_two_sites_a_layer_and_the_embeddings_in_half_precision_only():
    layout = PushLayout.for_model(36, 4096, 2, torch.bfloat16)  # Qwen3-8B at two ranks
    assert (layout.num_sites, layout.hidden_size, layout.max_rows, layout.gather_n) == (73, 4096, MAX_ROWS, 0)
    assert layout.words_per_row == 2048  # two bfloat16 values and a round a word
    assert layout.nbytes == 73 * 2 * MAX_ROWS * 2048 * 8  # 18.25 MiB a rank
    with_head = PushLayout.for_model(36, 4096, 2, torch.bfloat16, vocab_rows=75968)  # and its LM head's gather
    assert with_head.gather_n == 75968 and with_head.sites_nbytes == layout.nbytes
    assert with_head.nbytes == layout.nbytes + 2 * MAX_ROWS * 75968 // 2 * 8  # 4.6 MiB more
    assert PushLayout.for_model(36, 4096, 2, torch.bfloat16, vocab_rows=75969).gather_n == 0  # an odd slice: none
    assert PushLayout.for_model(36, 4096, 2, torch.float32) is None  # the GEMV never runs in float32
    assert PushLayout.for_model(36, 4096, 1, torch.bfloat16) is None
    assert PushLayout.for_model(36, 4095, 2, torch.bfloat16) is None  # an odd hidden size fills no word


SIMULATED_RANKS = textwrap.dedent(
    """
    import os
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import torch.distributed as dist
    from infer_core.layers.fused.gemv import gemv
    from infer_parallel_tp.push_all_reduce import all_gather_pushed
    from infer_parallel_tp.push_sites import PushLayout, PushSites
    from infer_parallel_tp.pushed_sums import sum_pushed
    from infer_parallel_tp.pushing_gemv import gemv_push

    WORLD, N, K, OFFSET = 2, 24, 16, 64  # OFFSET: the one-shot all-reduce's bytes before the sites

    class Rendezvous:
        # torch's handle: get_buffer(rank, sizes, dtype, storage_offset) views rank's buffer
        def __init__(self, buffers):
            self.buffers = buffers

        def get_buffer(self, rank, sizes, dtype, storage_offset=0):
            count = torch.Size(sizes).numel()
            return self.buffers[rank].view(dtype)[storage_offset:storage_offset + count].view(sizes)

    VOCAB = 20  # each rank's slice of the LM head
    layout = PushLayout(num_sites=3, hidden_size=N, world_size=WORLD, dtype=torch.bfloat16, gather_n=VOCAB)
    buffers = [torch.full((OFFSET + layout.nbytes,), 255, dtype=torch.uint8) for _ in range(WORLD)]
    sites = [PushSites(Rendezvous(buffers), r, layout, OFFSET, torch.device("cpu")) for r in range(WORLD)]
    assert all(int(s.slots.abs().sum()) == 0 for s in sites)  # zeroed: round 0 (the buffer held 0xff)
    assert all(int(s.gather.slots.abs().sum()) == 0 for s in sites)
    for s in sites:  # handed out in order, each once
        taken = [s.take() for _ in range(4)]
        assert taken[3] is None and [site for site, _ in taken[:3]] == [0, 1, 2]  # then all 3 sites are taken
        assert all(target is s._targets[site] for site, target in taken[:3])
        assert s.num_taken == 3 and s.pushes == [0, 0, 0]
        target = s._targets[0]
        assert target.fits(8, N, torch.bfloat16) and not target.fits(9, N, torch.bfloat16)  # more rows than a slot
        assert not target.fits(1, N + 1, torch.bfloat16) and not target.fits(1, N, torch.float16)
        assert not target.fits(0, N, torch.bfloat16)
    # where rank 0's slot of site 1 lies on rank 1: in rank 1's buffer, after the one-shot's bytes
    target = sites[0]._targets[1]
    assert int(target.dest_ptrs[1]) == sites[1].slots[1, 0].data_ptr()
    assert sites[1].slots.data_ptr() == buffers[1].data_ptr() + OFFSET
    assert sites[1].slots.shape == (3, WORLD, 8, N // 2)
    # both ranks push into site 1 (small integers: every sum exact in bfloat16), then each adds
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randint(-3, 4, (2, K), generator=gen).to(torch.bfloat16) for _ in range(WORLD)]
    ws = [torch.randint(-3, 4, (N, K), generator=gen).to(torch.bfloat16) for _ in range(WORLD)]
    for r in range(WORLD):
        gemv_push(xs[r], ws[r], sites[r]._targets[1])
    expected = gemv(xs[0], ws[0]).float() + gemv(xs[1], ws[1]).float()
    for r in range(WORLD):
        assert torch.equal(sum_pushed(sites[r]._targets[1], 2).float(), expected), r
        rounds = (sites[r].slots >> 32) & 0xFFFFFFFF  # of each word: site 1's first 2 rows pushed once
        assert rounds[1, :, :2].unique().tolist() == [1] and rounds[1, :, 2:].unique().tolist() == [0]
        assert rounds[0].unique().tolist() == [0] and rounds[2].unique().tolist() == [0]
    # the gather site: after the sites, to the buffer's end; rank 1 pushes first (the ranks are not concurrent)
    assert sites[1].gather.slots.data_ptr() == buffers[1].data_ptr() + OFFSET + layout.sites_nbytes
    assert sites[1].gather.slots.shape == (WORLD, 8, VOCAB // 2) and layout.nbytes % 16 == 0
    assert OFFSET + layout.nbytes == buffers[1].numel()
    assert int(sites[0].gather.dest_ptrs[1]) == sites[1].gather.slots[0].data_ptr()
    gather = sites[0].gather
    assert gather.fits(3, VOCAB, torch.bfloat16) and not gather.fits(9, VOCAB, torch.bfloat16)
    assert not gather.fits(1, N, torch.bfloat16)
    logits = [torch.randn(3, VOCAB, generator=gen).to(torch.bfloat16) for _ in range(WORLD)]
    gemv_push(logits[1], torch.eye(VOCAB, dtype=torch.bfloat16), sites[1].gather)  # rank 1's words, as they are
    got = all_gather_pushed(logits[0], gather)
    assert torch.equal(got, torch.cat(logits, dim=-1))  # rank 0's: its own slice, then rank 1's pushed
    assert ((sites[1].gather.slots[0, :3] >> 32) == 1).all()  # rank 0's logits reached rank 1 with round 1
    print("OK")
    """
)


@pytest.mark.slow
def test_sites_addresses_and_a_push_between_simulated_ranks(tmp_path):
    script = tmp_path / "simulated_ranks.py"
    script.write_text(SIMULATED_RANKS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
