"""The one-shot all-reduce's decisions, checked on the CPU: which tensors it takes, when a group may use it,
how a dead peer's barriers are released, and the setting that turns it off. ``test_symm_mem_gpu.py`` runs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from infer_core.settings import EngineSettings, load_settings

from infer_parallel_tp.group import SYMM_MEM_SETTING, symm_mem_all_reduce_enabled
from infer_parallel_tp.settings import TPSettings
from infer_parallel_tp.symm_mem import ONE_SHOT_MAX_BYTES, RankInfo, group_problems, rescue_views, unsuitable


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_small_contiguous_tensors_take_the_one_shot_path(dtype):
    assert unsuitable(torch.zeros(1, 4096, dtype=dtype), ONE_SHOT_MAX_BYTES) is None  # a batch-1 decode step
    assert unsuitable(torch.zeros(8), 32) is None  # exactly at the limit
    assert unsuitable(torch.zeros(100, 8, dtype=dtype)[3:], ONE_SHOT_MAX_BYTES) is None  # offset views too


def test_what_takes_the_library_all_reduce():
    assert unsuitable(torch.zeros(9), 32) == "size"
    assert unsuitable(torch.zeros(8192, 4096, dtype=torch.bfloat16), ONE_SHOT_MAX_BYTES) == "size"  # a prefill
    assert "float16" in unsuitable(torch.zeros(8, dtype=torch.float16), ONE_SHOT_MAX_BYTES)
    assert "6 bytes" in unsuitable(torch.zeros(3, dtype=torch.bfloat16), ONE_SHOT_MAX_BYTES)
    assert "0 bytes" in unsuitable(torch.zeros(0), ONE_SHOT_MAX_BYTES)
    assert "non-contiguous" in unsuitable(torch.zeros(8, 8).t(), ONE_SHOT_MAX_BYTES)


def _info(host="gpu-host", device=0, problems=(), peer_access=None, num_rendezvous=0, world=2) -> RankInfo:
    access = {d: True for d in range(world)} if peer_access is None else peer_access
    return RankInfo(host, device, tuple(problems), access, num_rendezvous)


def test_a_group_on_one_host_with_peer_access_may_use_symmetric_memory():
    assert group_problems([_info(device=d) for d in range(2)]) == []
    assert group_problems([_info(device=d, world=8) for d in range(8)]) == []


def test_why_a_group_takes_nccl():
    (problem,) = group_problems([_info(device=0, problems=("no one_shot_all_reduce_out",)), _info(device=1)])
    assert problem == "rank 0: no one_shot_all_reduce_out"
    (problem,) = group_problems([_info("a", 0), _info("b", 0)])
    assert "span 2 hosts (a, b)" in problem
    (problem,) = group_problems([_info(device=0), _info(device=0)])
    assert "share a device" in problem
    (problem,) = group_problems([_info(device=0), _info(device=1, peer_access={0: False, 1: True})])
    assert problem == "rank 1 (cuda:1) cannot access the memory of ranks [0] peer-to-peer"
    (problem,) = group_problems([_info(device=0, num_rendezvous=1), _info(device=1)])
    assert "[1, 0] symmetric-memory rendezvous" in problem
    assert group_problems([_info(device=0, num_rendezvous=1), _info(device=1, num_rendezvous=1)]) == []


@pytest.mark.parametrize("world,rank,dead", [(2, 0, [1]), (4, 0, [1, 2, 3]), (4, 2, [3])])
def test_rescue_raises_this_ranks_flags_from_the_dead_and_clears_its_own_at_theirs(world, rank, dead):
    blocks = 5
    pads = [torch.full((blocks, world), 7, dtype=torch.int32) for _ in range(world)]
    for flags, value in rescue_views(pads, rank, dead):
        flags.fill_(value)
    for r in range(world):
        for p in range(world):
            if r == rank and p in dead:
                expected = 1  # this rank waits here for p's signal: given
            elif r in dead and p == rank:
                expected = 0  # this rank signals p here, once p has taken the last one: taken
            else:
                expected = 7
            assert pads[r][:, p].eq(expected).all(), (r, p)


def test_the_plugins_setting_turns_it_on(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no stray .env
    monkeypatch.delenv("INFER_ENABLE_SYMM_MEM_ALL_REDUCE", raising=False)
    assert symm_mem_all_reduce_enabled(load_settings()) is False  # off by default
    assert symm_mem_all_reduce_enabled(load_settings(enable_symm_mem_all_reduce=True)) is True
    monkeypatch.setenv("INFER_ENABLE_SYMM_MEM_ALL_REDUCE", "true")
    assert symm_mem_all_reduce_enabled(load_settings()) is True
    assert symm_mem_all_reduce_enabled(EngineSettings()) is True  # settings made directly read it on first use
    assert TPSettings in [section.settings_class for section in load_settings().declared_sections]
    assert SYMM_MEM_SETTING in TPSettings.model_fields


AGREEMENT = textwrap.dedent(
    """
    import os

    import torch.distributed as dist

    from infer_parallel_tp.symm_mem import OneShotAllReduce

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    one_shot, why = OneShotAllReduce.setup(rank, world, rank)  # no GPU here: no peer access
    dist.destroy_process_group()
    os.write(1, f"RESULT {rank} {one_shot is None} {why}\\n".encode())
    """
)


def test_every_rank_reaches_the_same_decision_and_says_why(tmp_path):
    """The set-up is collective: the ranks exchange what they have and all fall back together."""
    program = tmp_path / "agreement.py"
    program.write_text(AGREEMENT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", str(program)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    results = sorted(line.split(" ", 3)[1:] for line in run.stdout.splitlines() if line.startswith("RESULT"))
    assert [r[:2] for r in results] == [["0", "True"], ["1", "True"], ["2", "True"]]
    assert len({r[2] for r in results}) == 1, results  # the same reasons on every rank
    assert "rank 2 (cuda:2) cannot access the memory of ranks [0, 1] peer-to-peer" in results[0][2]
