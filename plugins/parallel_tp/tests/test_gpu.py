"""Tensor parallelism on two CUDA devices (NCCL): parity with one GPU, bfloat16 accuracy, dead workers.

Run on a machine with two GPUs: ``python -m pytest -m gpu plugins/parallel_tp/tests``. Skipped
with fewer than two.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.errors import EngineDeadError
from infer_core.testing import LogitsRecorder, write_config_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _prompts(vocab: int, lengths=(5, 40, 97, 300, 12)) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def _generate(folder, prompts, tensor_parallel_size: int, **settings):
    llm = LLM(
        str(folder),
        device="cuda",
        tensor_parallel_size=tensor_parallel_size,
        max_model_len=1024,
        gpu_memory_utilization=0.5,
        **settings,
    )
    try:
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outputs], [recorder.logits[o.request_id][0] for o in outputs]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("kind,overrides", [("llama", {}), ("qwen2", {"num_key_value_heads": 1}), ("qwen3", {})])
def test_two_gpus_match_one_in_float32(tiny_checkpoint, assert_no_workers_left, kind, overrides):
    folder = tiny_checkpoint(kind, **overrides)
    prompts = _prompts(384)
    settings = {"dtype": "float32", "max_num_batched_tokens": 64}  # prefill in chunks
    ref_tokens, ref_logits = _generate(folder, prompts, 1, **settings)
    tokens, logits = _generate(folder, prompts, 2, **settings)
    assert tokens == ref_tokens
    for got, expected in zip(logits, ref_logits):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    assert_no_workers_left()


SAMPLING = [
    SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
    SamplingParams(seed=7, temperature=0.9, top_k=20, top_p=0.9, max_tokens=16, ignore_eos=True),
    SamplingParams(seed=3, temperature=1.0, presence_penalty=1.5, frequency_penalty=0.7, repetition_penalty=1.3,
                   max_tokens=16, ignore_eos=True),
    SamplingParams(seed=11, temperature=0.7, min_p=0.05, max_tokens=16, logprobs=2, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=30, max_tokens=16, ignore_eos=True),  # the runner's generator
]


def _sample(folder, tensor_parallel_size: int, **settings):
    """Tokens and per-request logits of SAMPLING's requests; also whether rank 0 captured CUDA graphs."""
    llm = LLM(str(folder), device="cuda", dtype="float32", tensor_parallel_size=tensor_parallel_size,
              max_model_len=1024, gpu_memory_utilization=0.5, **settings)
    try:
        assert llm.engine.overlap  # the default: steps overlap on one rank and on two
        has_graphs = llm.engine.executor.worker.runner.graphs is not None  # no reference kept: see release_worker
        prompts = _prompts(384, (5, 40, 97, 12, 64))
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, SAMPLING, use_tqdm=False)
        return ([o.outputs[0].token_ids for o in outputs],
                [torch.stack(recorder.logits[o.request_id]) for o in outputs], has_graphs)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_overlapped_sampling_on_two_gpus_gives_the_tokens_of_one(tiny_checkpoint, assert_no_workers_left, kind):
    """Every rank samples from the all-gathered logits and feeds its own tokens to the next step:
    greedy, seeded with penalties, min-p with logprobs, and unseeded rows all match one GPU's."""
    folder = tiny_checkpoint(kind)
    ref_tokens, ref_logits, _ = _sample(folder, 1)
    tokens, logits, _ = _sample(folder, 2)
    assert tokens == ref_tokens
    for got, expected in zip(logits, ref_logits):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    assert_no_workers_left()


def test_tensor_parallel_decode_replays_cuda_graphs_like_eager(tiny_checkpoint, assert_no_workers_left):
    """The all-reduces and the LM head's all-gather captured in the graphs give the eager steps' logits."""
    folder = tiny_checkpoint("qwen3")
    eager_tokens, eager_logits, eager_graphs = _sample(folder, 2, attention="triton", enforce_eager=True)
    tokens, logits, has_graphs = _sample(folder, 2, attention="triton")  # a backend that supports graphs
    assert (eager_graphs, has_graphs) == (False, True)
    assert tokens == eager_tokens
    for got, expected in zip(logits, eager_logits):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert_no_workers_left()


# In a process of its own, one per mode: torch numbers its symmetric-memory rendezvous per process, so a
# second tensor-parallel engine in a process whose first one used symmetric memory falls back to NCCL.
PUSHED_BITS = textwrap.dedent(
    """
    import json, random, sys
    import torch
    from infer_core import LLM, SamplingParams
    from infer_core.testing import LogitsRecorder

    def one_request_at_a_time(folder, **settings):
        # batch-1 decode (where the row-parallel GEMVs push their partial sums), CUDA graphs on
        llm = LLM(folder, device="cuda", dtype="bfloat16", attention="triton", tensor_parallel_size=2,
                  max_model_len=1024, gpu_memory_utilization=0.5, **settings)
        try:
            rng = random.Random(3)
            tokens, logits = [], []
            for n in (5, 40, 97):
                prompt = [rng.randrange(3, 384) for _ in range(n)]
                with LogitsRecorder(llm.engine) as recorder:
                    (out,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                                          use_tqdm=False)
                tokens.append(out.outputs[0].token_ids)
                logits.append(torch.stack(recorder.logits[out.request_id]))
            return tokens, logits, llm.engine.executor.parallel.communicator.describe()
        finally:
            llm.shutdown()

    if __name__ == "__main__":
        folder, mode = sys.argv[1], sys.argv[2]
        ref_tokens, ref_logits, ref_account = one_request_at_a_time(folder, enable_symm_mem_all_reduce=False)
        tokens, logits, account = one_request_at_a_time(folder, enable_symm_mem_all_reduce=True,
                                                        enable_pushed_partial_sums=True, pushed_partial_sums_mode=mode)
        print("RESULT", json.dumps({
            "ref_pushed": ref_account["num_pushed"], "pushed": account["num_pushed"], "path": account["path"],
            "push_sites": account["num_push_sites"], "sites_pushed": account["num_sites_pushed"],
            "gathers_pushed": account["num_gathers_pushed"],
            "same_tokens": tokens == ref_tokens,
            "max_abs_diff": max(float((a.float() - b.float()).abs().max()) for a, b in zip(logits, ref_logits)),
            "same_bits": all(torch.equal(a, b) for a, b in zip(logits, ref_logits)),
        }), flush=True)
    """
)


@pytest.mark.parametrize("mode", ["gemv", "sum", "all_reduce"])
def test_pushed_partial_sums_give_the_all_reduce_bits(tiny_checkpoint, tmp_path, assert_no_workers_left, mode):
    """Two ranks' bfloat16 partial sums, pushed and added in each mode, are NCCL's correctly rounded sums, and the
    LM head's pushed all-gather NCCL's: every step's logits are the same bits as with every all-reduce and
    all-gather through NCCL (graphs captured both ways)."""
    script = tmp_path / "pushed_bits.py"
    script.write_text(PUSHED_BITS)
    run = subprocess.run([sys.executable, str(script), str(tiny_checkpoint("qwen3")), mode], capture_output=True,
                         text=True, timeout=300)
    lines = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result["ref_pushed"] == 0
    assert result["pushed"] > 0 and f"added by {mode}" in result["path"], result
    num_layers = json.loads((tiny_checkpoint("qwen3") / "config.json").read_text())["num_hidden_layers"]
    # prepare_model gave every row-parallel layer and the embedding a site, and each of them pushed
    assert result["push_sites"] == result["sites_pushed"] == 2 * num_layers + 1, result
    assert result["gathers_pushed"] > 0, result  # the LM head's logits too (their bits are the NCCL all-gather's)
    assert result["same_tokens"] and result["same_bits"], result
    assert_no_workers_left()


# In a process of its own: a communicator that a live CUDA graph captured cannot be destroyed, so a
# shutdown that left the group before freeing the graphs would hang here, not the suite.
SHUTDOWN_WITH_GRAPHS = textwrap.dedent(
    """
    import sys, time
    from infer_core import LLM, SamplingParams

    if __name__ == "__main__":
        llm = LLM(sys.argv[1], device="cuda", dtype="float32", attention="triton", tensor_parallel_size=2,
                  gpu_memory_utilization=0.5)
        print("GRAPHS", llm.engine.executor.worker.runner.graphs is not None, flush=True)
        params = SamplingParams(temperature=0.8, seed=1, max_tokens=32, ignore_eos=True)
        llm.generate([[3 + i, 4, 5] for i in range(8)], params, use_tqdm=False)
        start = time.monotonic()
        llm.shutdown()
        print("SHUTDOWN", time.monotonic() - start, flush=True)
    """
)


def test_shutdown_with_captured_graphs_returns(tiny_checkpoint, tmp_path):
    script = tmp_path / "shutdown_with_graphs.py"
    script.write_text(SHUTDOWN_WITH_GRAPHS)
    run = subprocess.Popen([sys.executable, str(script), str(tiny_checkpoint("qwen3"))], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    lines = dict(line.split(" ", 1) for line in stdout.splitlines() if line.startswith(("GRAPHS", "SHUTDOWN")))
    assert lines.get("GRAPHS") == "True", stdout[-2000:] + stderr[-3000:]
    assert "SHUTDOWN" in lines and float(lines["SHUTDOWN"]) < 10, stdout[-2000:] + stderr[-3000:]
    assert run.returncode == 0, stderr[-3000:]


# In a process of its own: a release that left the group before freeing the graphs, or that did not leave it,
# would hang or fail here, not the suite. The second engine is never shut down: the interpreter's exit releases it.
TWO_ENGINES_IN_ONE_PROCESS = textwrap.dedent(
    """
    import json, sys
    from infer_core import LLM, SamplingParams

    def run():
        llm = LLM(sys.argv[1], device="cuda", dtype="float32", attention="triton", tensor_parallel_size=2,
                  gpu_memory_utilization=0.5)
        outputs = llm.generate([[5, 6, 7], list(range(3, 70))], SamplingParams(temperature=0, max_tokens=16,
                               ignore_eos=True), use_tqdm=False)
        return llm, llm.engine.executor.worker.runner.graphs is not None, [o.outputs[0].token_ids for o in outputs]

    llm, first_graphs, first = run()
    pids = list(llm.engine.executor.worker_pids)
    del llm  # no shutdown: dropping the engine releases its workers, graphs and process group
    llm, second_graphs, second = run()
    pids += llm.engine.executor.worker_pids
    print("RESULT", json.dumps({"graphs": [first_graphs, second_graphs], "same": first == second, "pids": pids}),
          flush=True)
    """
)


def test_a_dropped_engine_frees_the_gpus_for_the_next(tiny_checkpoint, tmp_path):
    script = tmp_path / "two_engines.py"
    script.write_text(TWO_ENGINES_IN_ONE_PROCESS)
    run = subprocess.Popen([sys.executable, str(script), str(tiny_checkpoint("qwen3"))], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    assert run.returncode == 0 and lines, stdout[-2000:] + stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result["graphs"] == [True, True] and result["same"], result
    for pid in result["pids"]:  # every worker was reaped before the program ended
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "Traceback" not in stderr, stderr[-3000:]


def test_bfloat16_logits_of_a_real_shape_within_2e_2(tmp_path, assert_no_workers_left):
    # Qwen3-0.6B untied, so the LM head is its own vocabulary-parallel matrix
    write_config_checkpoint("Qwen3-0.6B", tmp_path, tie_word_embeddings=False)
    prompts = _prompts(151936, (16, 128, 500))
    _, ref_logits = _generate(tmp_path, prompts, 1, load_format="dummy")
    _, logits = _generate(tmp_path, prompts, 2, load_format="dummy")
    for prompt, got, expected in zip(prompts, logits, ref_logits):
        rel = ((got - expected).norm() / expected.norm()).item()
        assert rel < 2e-2, f"{len(prompt)}-token prompt: TP=2 logits off TP=1 by {rel:.3e}"
    assert_no_workers_left()


def test_worker_killed_between_steps_on_cuda(tiny_checkpoint, assert_no_workers_left):
    llm = LLM(str(tiny_checkpoint("llama")), device="cuda", tensor_parallel_size=2, gpu_memory_utilization=0.5)
    assert len(llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 16
    (pid,) = llm.engine.executor.worker_pids
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EngineDeadError, match="rank 1"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert time.monotonic() - start < 10
    llm.shutdown()
    assert_no_workers_left()


# In a process of its own: if a dead peer left rank 0 waiting inside NCCL, this test fails on its
# timeout instead of hanging the suite.
MID_STEP_KILL = textwrap.dedent(
    """
    import faulthandler, os, signal, sys, threading, time
    from infer_core import LLM, SamplingParams
    from infer_core.errors import EngineDeadError

    if __name__ == "__main__":
        faulthandler.dump_traceback_later(90, exit=True)  # a hang ends with every thread's stack on stderr
        path = sys.argv[2]
        pushed = path.startswith("pushed")
        half = {"dtype": "bfloat16"} if pushed else {}  # the GEMV that pushes runs in half precision
        mode = {"pushed-sum": "sum", "pushed-gemv": "gemv", "pushed-all-reduce": "all_reduce"}.get(path, "gemv")
        llm = LLM(sys.argv[1], device="cuda", tensor_parallel_size=2, gpu_memory_utilization=0.5,
                  enable_symm_mem_all_reduce=path != "NCCL", enable_pushed_partial_sums=pushed,
                  pushed_partial_sums_mode=mode, **half)
        (pid,) = llm.engine.executor.worker_pids
        print("PATH", llm.engine.executor.parallel.communicator.describe()["path"], flush=True)
        killed = []
        # 0.3 s into a generation of 1000 steps (a tiny model steps in ~1 ms): the kill lands mid-run
        threading.Timer(0.3, lambda: (os.kill(pid, signal.SIGKILL), killed.append(time.monotonic()))).start()
        params = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
        num_prompts = 1 if pushed else 32  # pushed: batch-1 decode, where the GEMV runs
        try:
            llm.generate([[3 + i, 4, 5] for i in range(num_prompts)], params, use_tqdm=False)
            print("NO ERROR", "killed before the end" if killed else "finished before the kill", flush=True)
        except EngineDeadError as e:
            print("DEAD", time.monotonic() - killed[0], repr(e)[:300], flush=True)
        llm.shutdown()
    """
)


@pytest.mark.parametrize("path", ["NCCL", "one-shot", "pushed-gemv", "pushed-sum", "pushed-all-reduce"])
def test_worker_killed_during_a_step_on_cuda(tiny_checkpoint, tmp_path, path):
    """With NCCL (the default), with the one-shot kernel, which NCCL's abort cannot stop, and with partial sums
    pushed (rank 0's readers wait for the dead rank's words until ``abort`` is raised).

    The kill lands 0.3 s into the run, well inside its generation, so the death is met mid-step (a kill later
    than the run's end would print NO ERROR, which fails).
    """
    script = tmp_path / "mid_step_kill.py"
    script.write_text(MID_STEP_KILL)
    run = subprocess.Popen(
        [sys.executable, str(script), str(tiny_checkpoint("qwen3")), path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    lines = [x for x in stdout.splitlines() if x.startswith(("DEAD", "NO ERROR"))]
    assert lines and lines[0].startswith("DEAD"), stdout[-2000:] + stderr[-3000:]
    assert float(lines[0].split()[1]) < 10, lines[0]
    # the path under test was in use (for one-shot: rank 0's kernels were released after the death)
    expected_path = {"pushed-sum": "added by sum", "pushed-gemv": "added by gemv",
                     "pushed-all-reduce": "added by all_reduce"}.get(path, f"PATH {path}")
    assert expected_path in stdout, stdout[-2000:]
