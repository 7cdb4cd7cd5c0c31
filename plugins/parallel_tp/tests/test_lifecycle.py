"""A tensor-parallel engine's end and a worker's failed start, on the CPU (gloo, float32).

- ``del llm``, with the collector off (so no reference cycle may be what holds it), stops the
  workers and leaves the process group at once; a second TP=2 engine in the same process then
  gives HF transformers' greedy tokens, undisturbed by a third one that is refused while it lives;
  one caught in a reference cycle is released by the collector's pass.
- A program that exits with a TP=2 engine it never shut down, and without an
  ``if __name__ == "__main__":`` guard, exits with status 0, its workers reaped, no error printed.
- A worker that fails while it starts (an exception, a process that ends abruptly, a configuration
  it cannot take before the group's rendezvous) is reported in the EngineDeadError with its own
  error, not only its exit code, soon, and leaves no process or process group behind. The failures are real: an attention backend, installed as a plugin, that
  fails on every rank but 0, as a library missing on one host or a device broken on one rank would.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time
import weakref

import pytest
import torch
import torch.distributed as dist
from infer_core import LLM, SamplingParams
from infer_core.interfaces import EngineDeadError
from infer_core.testing import LogitsRecorder, install_plugin_package

PROMPTS = [[5, 6, 7, 8], list(range(3, 70))]
NUM_NEW_TOKENS = 10
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)


def _tp2(folder, **settings) -> LLM:
    return LLM(str(folder), tensor_parallel_size=2, device="cpu", dtype="float32", num_kv_blocks=64, **settings)


def _hf_greedy(folder) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = []
    with torch.no_grad():
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW_TOKENS,
                                 min_new_tokens=NUM_NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
            tokens.append(out[0, len(prompt):].tolist())
    return tokens


def _generate(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_a_dropped_engine_frees_the_process_for_the_next(tiny_checkpoint, assert_no_workers_left):
    folder = tiny_checkpoint("llama")
    llm = _tp2(folder)
    executor = weakref.ref(llm.engine.executor)
    with LogitsRecorder(llm.engine) as recorder:  # which patches the executor, and must leave no cycle behind
        assert dist.is_initialized() and len(_generate(llm)) == len(recorder.logits) == len(PROMPTS)
    del recorder  # it refers to the engine
    gc.disable()
    try:
        del llm  # reference counting alone releases it
        assert executor() is None
        assert not dist.is_initialized()
        assert_no_workers_left()
    finally:
        gc.enable()

    llm = _tp2(folder)  # joins a new process group: it would raise "already exists" had the first kept it
    with pytest.raises(RuntimeError, match="process group already exists.*shut the other one down first"):
        _tp2(folder)  # one engine per process: this one fails, and must leave the live one's group alone
    assert _generate(llm) == _hf_greedy(folder)
    llm.itself = llm  # a reference cycle: only the collector can free it
    executor = weakref.ref(llm.engine.executor)
    gc.disable()
    try:
        del llm
        assert executor() is not None and dist.is_initialized()
        gc.collect()
        assert executor() is None and not dist.is_initialized()
        assert_no_workers_left()
    finally:
        gc.enable()


EXIT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from infer_core import LLM, SamplingParams

    # no `if __name__ == "__main__":` guard, and no shutdown: the workers must not run this again,
    # and the engine is released at exit
    llm = LLM(sys.argv[1], tensor_parallel_size=2, device="cpu", dtype="float32", num_kv_blocks=64)
    outputs = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    print(json.dumps({"pids": llm.engine.executor.worker_pids, "tokens": outputs[0].outputs[0].token_ids}))
    """
)


def test_a_program_that_never_shuts_its_engine_down_exits_cleanly(tiny_checkpoint, tmp_path):
    script = tmp_path / "program.py"
    script.write_text(EXIT_SCRIPT)
    run = subprocess.run([sys.executable, str(script), str(tiny_checkpoint("llama"))], capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(result["tokens"]) == 4 and len(result["pids"]) == 1
    for pid in result["pids"]:  # reaped by the engine's process before it exited
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for sign in ("Traceback", "died", "ERROR", "leaked"):
        assert sign not in run.stderr, run.stderr[-3000:]


FAILING_PLUGIN = textwrap.dedent(
    """
    from infer_core.hookspecs import hookimpl

    @hookimpl
    def register_attention_backends(register):
        register("raises-on-workers", "infer_rank_failure.backends:RaisesOnWorkers")
        register("exits-on-workers", "infer_rank_failure.backends:ExitsOnWorkers")
    """
)

FAILING_BACKENDS = textwrap.dedent(
    """
    import os
    import sys

    import torch.distributed as dist
    from infer_core.builtin.attention_torch import TorchAttentionBackend

    def on_a_worker():
        return dist.is_initialized() and dist.get_rank() > 0

    class RaisesOnWorkers(TorchAttentionBackend):
        def __init__(self, ctx):
            super().__init__(ctx)
            if on_a_worker():
                raise RuntimeError("the paged-attention library is missing on this host (pip install paged-lib)")

    class ExitsOnWorkers(TorchAttentionBackend):
        def __init__(self, ctx):
            super().__init__(ctx)
            if on_a_worker():  # as a native library that prints its reason and aborts the process
                sys.stderr.write("fatal: device 1 is in an unrecoverable state (Xid 79)\\n")
                sys.stderr.flush()
                os._exit(3)
    """
)


# A worker factory that another rank cannot unpickle, as one whose module is missing on that rank's host.
UNPICKLABLE_FACTORY = textwrap.dedent(
    """
    def _refuse():
        raise ImportError("infer_rank_failure.factory cannot be imported on this host")

    class ArrivesBroken:
        def __call__(self, engine_config, parallel, local_device=None):
            raise AssertionError("rank 0 must not get this far: a rank failed to take the configuration")

        def __reduce__(self):
            return (_refuse, ())
    """
)


@pytest.fixture
def failing_plugin(tmp_path, monkeypatch):
    root = install_plugin_package(tmp_path / "site", "infer-rank-failure", "rank-failure", "infer_rank_failure",
                                  {"plugin.py": FAILING_PLUGIN, "backends.py": FAILING_BACKENDS,
                                   "factory.py": UNPICKLABLE_FACTORY})
    monkeypatch.syspath_prepend(str(root))  # the spawned workers get this process's sys.path
    return root


@pytest.mark.parametrize(
    ("attention", "expected"),
    [
        ("raises-on-workers", r"rank 1.*RuntimeError: the paged-attention library is missing on this host"),
        ("exits-on-workers",
         r"rank 1 \(pid \d+\) exited with code 3.*\n.*fatal: device 1 is in an unrecoverable state"),
    ],
)
def test_a_worker_that_fails_at_start_reports_its_own_error(tiny_checkpoint, failing_plugin, assert_no_workers_left,
                                                            attention, expected):
    with pytest.raises(EngineDeadError, match=f"(?s){expected}"):
        _tp2(tiny_checkpoint("llama"), attention=attention)
    assert not dist.is_initialized()
    assert_no_workers_left()


def test_a_worker_that_cannot_take_the_configuration_is_reported_before_the_rendezvous(
        tiny_checkpoint, failing_plugin, assert_no_workers_left):
    """Rank 0 hears of it while it waits for the workers' replies, not after waiting COLLECTIVE_TIMEOUT for the
    dead rank in the process group's rendezvous."""
    from infer_core.loader import assemble
    from infer_core.settings import load_settings
    from infer_rank_failure.factory import ArrivesBroken

    from infer_parallel_tp.executor import TensorParallelExecutor
    from infer_parallel_tp.group import COLLECTIVE_TIMEOUT

    config = assemble(load_settings(model=str(tiny_checkpoint("llama")), tensor_parallel_size=2, device="cpu",
                                    dtype="float32")).config
    start = time.monotonic()
    with pytest.raises(EngineDeadError, match=r"(?s)rank 1 \(pid \d+\) exited with code 1.*\n.*"
                                              r"ImportError: infer_rank_failure.factory cannot be imported"):
        TensorParallelExecutor(config, 2, ArrivesBroken())
    assert time.monotonic() - start < COLLECTIVE_TIMEOUT.total_seconds() / 5
    assert not dist.is_initialized()
    assert_no_workers_left()
