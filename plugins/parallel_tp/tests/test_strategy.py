"""Choosing the ``tp`` strategy, the reasons it refuses a model or a host, and the communicator's collectives."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from infer_core import LLM
from infer_core.errors import PluginError
from infer_core.models.source import read_model_config, resolve_model_source
from infer_core.platform import make_runtime_context
from infer_core.settings import load_settings

from infer_parallel_tp.strategy import TensorParallelStrategy


def _context(folder, **settings):
    settings = load_settings(model=str(folder), **settings)
    return make_runtime_context(settings, read_model_config(resolve_model_source(str(folder))))


def test_environment_selects_tp_and_rpc_reaches_every_rank(tiny_checkpoint, monkeypatch, assert_no_workers_left):
    monkeypatch.setenv("INFER_PARALLEL", "tp")
    monkeypatch.setenv("INFER_TENSOR_PARALLEL_SIZE", "2")
    with LLM(str(tiny_checkpoint("qwen3")), device="cpu", num_kv_blocks=32) as llm:
        assert llm.engine.config.implementations["parallel"] == "tp"
        executor = llm.engine.executor
        assert executor.collective_rpc("set_return_logits", False) == [None, None]
        assert len(executor.worker_pids) == 1
        executor.check_health()
        assert executor.parallel.communicator.describe()["path"] == "gloo"  # symmetric memory is for CUDA only
    assert_no_workers_left()


def test_tp_is_the_default_strategy_for_several_devices(tiny_checkpoint):
    from infer_core.loader import choose_names, load_catalog

    for size, expected in ((1, "single"), (2, "tp")):
        ctx = _context(tiny_checkpoint("llama"), device="cpu", tensor_parallel_size=size)
        assert choose_names(ctx.settings, load_catalog(ctx.settings.plugins), ctx)["parallel"] == expected


def test_heads_that_do_not_split_are_refused_before_any_worker_starts(tiny_checkpoint, assert_no_workers_left):
    with pytest.raises(PluginError, match=r"num_attention_heads=4 is not divisible by tensor_parallel_size=3"):
        LLM(str(tiny_checkpoint("llama")), device="cpu", tensor_parallel_size=3)
    assert_no_workers_left()


def test_kv_heads_must_divide_or_be_divided_by_the_ranks(tiny_checkpoint):
    ctx = _context(
        tiny_checkpoint("llama", num_attention_heads=12, num_key_value_heads=3, hidden_size=96, intermediate_size=96),
        device="cpu",
        tensor_parallel_size=2,
    )
    assert any("num_key_value_heads=3 and tensor_parallel_size=2" in r for r in TensorParallelStrategy.validate(ctx))
    assert (
        TensorParallelStrategy.validate(
            dataclasses.replace(ctx, settings=ctx.settings.model_copy(update={"tensor_parallel_size": 3}))
        )
        == []
    )


def test_experts_whose_intermediate_size_does_not_split_are_refused(tiny_checkpoint):
    """The experts' (and the shared expert's) intermediate sizes split over the ranks; Mixtral's dense-sized
    intermediate_size is the experts' own, and a Qwen-MoE model's unused one (every layer sparse) is not checked."""
    ctx = _context(tiny_checkpoint("qwen2_moe", moe_intermediate_size=34, shared_expert_intermediate_size=90),
                   device="cpu", tensor_parallel_size=4)
    reasons = TensorParallelStrategy.validate(ctx)
    assert any("moe_intermediate_size=34 is not divisible by tensor_parallel_size=4" in r for r in reasons)
    assert any("shared_expert_intermediate_size=90 is not divisible by tensor_parallel_size=4" in r for r in reasons)
    every_layer_sparse = _context(tiny_checkpoint("qwen3_moe", intermediate_size=90), device="cpu",
                                  tensor_parallel_size=2)
    assert TensorParallelStrategy.validate(every_layer_sparse) == []


def test_cuda_needs_a_gpu_per_rank(tiny_checkpoint, monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    ctx = _context(tiny_checkpoint("llama"), device="cpu", tensor_parallel_size=2)
    on_one_gpu = dataclasses.replace(ctx, device="cuda", dtype="bfloat16", num_gpus=1, cuda_capability=(9, 0))
    (reason,) = TensorParallelStrategy.validate(on_one_gpu)
    assert "needs 2 GPUs and this host has 1" in reason and "torchrun" in reason
    assert TensorParallelStrategy.validate(dataclasses.replace(on_one_gpu, num_gpus=2)) == []


COLLECTIVES = textwrap.dedent(
    """
    import os

    import torch
    import torch.distributed as dist

    from infer_parallel_tp.communicator import DistributedCommunicator

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = DistributedCommunicator(rank, world, "gloo")
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * rank
    assert torch.equal(comm.all_reduce(x.clone()), sum(torch.arange(6.0).reshape(2, 3) + 10 * r for r in range(world)))
    assert comm.describe() == {"path": "gloo", "one_shot_max_bytes": 0, "num_one_shot": 0, "num_pushed": 0,
                               "num_push_sites": 0, "num_sites_pushed": 0, "num_gathers_pushed": 0, "num_gloo": 1}
    everyone = [torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r for r in range(world)]
    assert torch.equal(comm.all_gather(x, dim=-1), torch.cat(everyone, dim=-1))
    assert torch.equal(comm.all_gather(x, dim=0), torch.cat(everyone, dim=0))
    gathered = comm.gather(x, dst=0, dim=-1)
    assert (gathered is None) == (rank != 0)
    assert rank != 0 or torch.equal(gathered, torch.cat(everyone, dim=-1))
    # all_to_all: rank r sends r+1 rows to every rank
    send = torch.full((world * (rank + 1), 2), float(rank))
    got = comm.all_to_all(send, [r + 1 for r in range(world)], [rank + 1] * world)
    assert torch.equal(got, torch.cat([torch.full((r + 1, 2), float(r)) for r in range(world)]))
    dist.destroy_process_group()
    os.write(1, f"OK {rank}\\n".encode())  # one write: the ranks share the pipe, print() may interleave
    """
)


def test_communicator_collectives_over_gloo(tmp_path):
    program = tmp_path / "collectives.py"
    program.write_text(COLLECTIVES)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", str(program)]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, stderr[-3000:]
    assert sorted(line for line in stdout.splitlines() if line.startswith("OK")) == ["OK 0", "OK 1", "OK 2"]
