"""A rank that dies ends the engine with EngineDeadError in seconds, and leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from infer_core import LLM, SamplingParams
from infer_core.errors import EngineDeadError

DEADLINE_S = 10.0
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _tp2(folder) -> LLM:
    return LLM(str(folder), tensor_parallel_size=2, device="cpu", dtype="float32", num_kv_blocks=256)


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_worker_killed_between_steps(tiny_checkpoint, assert_no_workers_left):
    llm = _tp2(tiny_checkpoint("llama"))
    executor = llm.engine.executor
    assert len(llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 8
    (pid,) = executor.worker_pids
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EngineDeadError, match=rf"rank 1 \(pid {pid}\) exited with code -9"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert time.monotonic() - start < DEADLINE_S
    assert_no_workers_left()
    with pytest.raises(EngineDeadError):
        executor.check_health()  # what the server's /health asks
    with pytest.raises(EngineDeadError):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    llm.shutdown()
    llm.shutdown()  # a second shutdown does nothing
    assert_no_workers_left()


def test_worker_killed_during_generation(tiny_checkpoint, assert_no_workers_left):
    llm = _tp2(tiny_checkpoint("qwen3"))
    (pid,) = llm.engine.executor.worker_pids
    killed_at: list[float] = []

    def kill() -> None:
        os.kill(pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    prompts = [[3 + i, 4 + i, 5 + i] for i in range(8)]
    long = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)  # far longer than the kill delay
    timer = threading.Timer(1.0, kill)
    timer.start()
    try:
        with pytest.raises(EngineDeadError, match="rank 1"):
            llm.generate(prompts, long, use_tqdm=False)
    finally:
        timer.cancel()
    assert killed_at and time.monotonic() - killed_at[0] < DEADLINE_S
    llm.shutdown()
    assert_no_workers_left()


ENGINE_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from infer_core import LLM

    if __name__ == "__main__":
        llm = LLM(sys.argv[1], tensor_parallel_size=2, device="cpu", dtype="float32", num_kv_blocks=64)
        print(json.dumps(llm.engine.executor.worker_pids), flush=True)
        time.sleep(600)
    """
)


def test_workers_exit_when_the_engine_process_is_killed(tiny_checkpoint, tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    engine = subprocess.Popen(
        [sys.executable, str(script), str(tiny_checkpoint("llama"))], stdout=subprocess.PIPE, text=True
    )
    try:
        worker_pids = json.loads(engine.stdout.readline())
        assert worker_pids and all(_pid_alive(p) for p in worker_pids)
    finally:
        engine.kill()
        engine.wait()
    deadline = time.monotonic() + DEADLINE_S
    while any(_pid_alive(p) for p in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_pid_alive(p) for p in worker_pids)
