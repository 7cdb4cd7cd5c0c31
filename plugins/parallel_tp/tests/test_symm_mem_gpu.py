"""The one-shot all-reduce on two GPUs: NCCL's sums, eagerly and replayed from CUDA graphs, and in the engine.

Run on a machine with two GPUs: ``python -m pytest -m gpu plugins/parallel_tp/tests/test_symm_mem_gpu.py``.
Each case runs in processes of its own: torch numbers its symmetric-memory exchanges per process,
so only an engine process's first tensor-parallel engine uses the one-shot path (see ``symm_mem``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]

# Under torchrun, one process per GPU: the plugin's join_group, then the communicator's all_reduce
# against dist.all_reduce (NCCL) and against every rank's inputs summed in float64 and rounded once.
RANKS = textwrap.dedent(
    """
    import os

    import torch
    import torch.distributed as dist

    from infer_parallel_tp.group import join_group, leave_group, torchrun_placement, torchrun_store

    placement = torchrun_placement("cuda")
    comm = join_group(placement, torchrun_store(placement), enable_symm_mem=True).communicator
    rank, world = placement.rank, placement.world_size
    one_shot = comm.one_shot
    assert one_shot is not None and comm.all_reduce_path.startswith("one-shot"), comm.all_reduce_path
    assert one_shot.handle.multicast_ptr == 0  # no NVLink multicast object
    device = torch.device("cuda", placement.local_rank)
    gen = torch.Generator(device=device).manual_seed(1234 + rank)


    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)


    def nccl(x):
        y = x.clone()
        dist.all_reduce(y)
        return y


    def exact(x):
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        return sum(p.double() for p in parts).to(x.dtype)


    def check(x, path, clone=True):
        before = (comm.num_one_shot, comm.num_fallback)
        got = comm.all_reduce(x.clone() if clone else x)  # NCCL sums in place; the one-shot kernel does not
        took = "one-shot" if comm.num_one_shot > before[0] else "nccl"
        assert took == path and comm.num_one_shot + comm.num_fallback == sum(before) + 1, (x.shape, x.dtype, took)
        torch.testing.assert_close(got, nccl(x), rtol=0, atol=0)  # two ranks: a+b rounded once by both
        if world == 2:
            torch.testing.assert_close(got, exact(x), rtol=0, atol=0)


    limit = one_shot.max_bytes
    for dtype in (torch.bfloat16, torch.float32):
        size = torch.tensor([], dtype=dtype).element_size()
        for shape in [(8,), (1, 4096), (8, 4096), (3, 5120), (limit // size,), (limit // size // 4096, 4096)]:
            check(rand(*shape, dtype=dtype), "one-shot")
        check(rand(limit // size + 8, dtype=dtype), "nccl")  # past the buffer
    check(rand(3, 1001), "nccl")  # 6006 bytes: not a multiple of 16
    check(rand(4096, dtype=torch.float16), "nccl")
    check(rand(4097, dtype=torch.float32)[1:], "one-shot", clone=False)  # 4-byte storage offset: copy, then sum

    # A chain of all-reduces (as a decode step's layers) captured in a CUDA graph, with one NCCL
    # all-reduce past the limit in the same graph, replayed on new inputs without syncing in between.
    xs = torch.zeros(4, 4096, dtype=torch.bfloat16, device=device)
    big = torch.zeros(limit // 2 + 64, dtype=torch.bfloat16, device=device)


    def step(reduce):
        y = reduce(xs * 1.0)
        for layer in range(16):
            y = reduce(y * 0.5 + (rank + layer) / 8)
        return y, reduce(big * 2.0)


    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as the runner does
        step(comm.all_reduce)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    before = (comm.num_one_shot, comm.num_fallback)
    with torch.cuda.graph(graph):
        y, w = step(comm.all_reduce)
    assert (comm.num_one_shot - before[0], comm.num_fallback - before[1]) == (17, 1)
    for replay in range(5):
        xs.copy_(rand(4, 4096))
        big.copy_(rand(big.numel()))
        for _ in range(20):  # back to back: the one-shot buffer is reused by the next call at once
            graph.replay()
        ry, rw = step(nccl)
        torch.testing.assert_close(y, ry, rtol=0, atol=0)
        torch.testing.assert_close(w, rw, rtol=0, atol=0)
    torch.cuda.synchronize()
    del graph
    leave_group()
    os.write(1, f"OK {rank} {comm.num_one_shot} {comm.num_fallback}\\n".encode())
    """
)


def _run(command: list[str], timeout: float) -> tuple[int, str, str]:
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = run.communicate(timeout=timeout)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    return run.returncode, stdout, stderr


def test_one_shot_all_reduce_sums_as_nccl_eagerly_and_in_cuda_graphs(tmp_path):
    program = tmp_path / "ranks.py"
    program.write_text(RANKS)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(program)]
    code, stdout, stderr = _run(command, 300)
    assert code == 0, stdout[-2000:] + stderr[-4000:]
    assert sorted(line.split()[:2] for line in stdout.splitlines() if line.startswith("OK")) == [
        ["OK", "0"], ["OK", "1"]], stdout[-2000:]


# The engine on two GPUs, in a process of its own (its first tensor-parallel engine): the path the
# group chose and the calls down each, and greedy tokens against one GPU (float32: the same tokens).
ENGINE = textwrap.dedent(
    """
    import json, sys

    from infer_core import LLM, SamplingParams

    if __name__ == "__main__":
        prompts = json.loads(sys.argv[2])
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        found = {}
        for size in (2, 1):
            llm = LLM(sys.argv[1], device="cuda", dtype="float32", attention="triton", tensor_parallel_size=size,
                      max_model_len=1024, gpu_memory_utilization=0.5, enable_symm_mem_all_reduce=True)
            outputs = llm.generate(prompts, params, use_tqdm=False)
            found[size] = {"tokens": [o.outputs[0].token_ids for o in outputs]}
            if size > 1:
                executor = llm.engine.executor
                found[size]["graphs"] = executor.worker.runner.graphs is not None
                found[size]["all_reduce"] = executor.parallel.communicator.describe()
            llm.shutdown()
        print("RESULT", json.dumps(found), flush=True)
    """
)


def test_engine_on_two_gpus_takes_the_one_shot_path_and_gives_one_gpus_tokens(tiny_checkpoint, tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (5, 40, 97, 12)]
    code, stdout, stderr = _run([sys.executable, str(script), str(tiny_checkpoint("qwen3")), json.dumps(prompts)], 300)
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert code == 0 and lines, stdout[-2000:] + stderr[-4000:]
    found = json.loads(lines[0].removeprefix("RESULT "))
    tp2, tp1 = found["2"], found["1"]
    assert tp2["graphs"], "the decode steps were not captured in CUDA graphs"
    assert tp2["all_reduce"]["path"].startswith("one-shot"), tp2["all_reduce"]
    assert tp2["all_reduce"]["num_one_shot"] > 0, tp2["all_reduce"]
    assert tp2["tokens"] == tp1["tokens"]
