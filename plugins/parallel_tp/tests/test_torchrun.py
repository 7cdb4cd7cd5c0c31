"""The same engine under torchrun (env:// rendezvous), as on several hosts: two ranks on this CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from infer_core import LLM, SamplingParams

PROMPTS = [[5, 6, 7, 8], list(range(3, 70))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

PROGRAM = textwrap.dedent(
    """
    import json, sys

    from infer_parallel_tp.launch import run_workers_under_torchrun

    run_workers_under_torchrun()  # ranks > 0 serve rank 0 and exit here

    from infer_core import LLM, SamplingParams

    llm = LLM(sys.argv[1], tensor_parallel_size=2, device="cpu", dtype="float32", num_kv_blocks=64)
    outputs = llm.generate(json.loads(sys.argv[2]), SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                           use_tqdm=False)
    print("TOKENS", json.dumps([o.outputs[0].token_ids for o in outputs]), flush=True)
    llm.shutdown()
    """
)


def test_torchrun_two_ranks_match_one(tiny_checkpoint, tmp_path):
    folder = tiny_checkpoint("llama")
    with LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=64) as llm:
        expected = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(program),
        str(folder),
        json.dumps(PROMPTS),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    # A session of its own, so a hang is ended with every rank torchrun started.
    run = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, stderr[-3000:]
    (line,) = [x for x in stdout.splitlines() if x.startswith("TOKENS ")]
    assert json.loads(line.removeprefix("TOKENS ")) == expected


def test_rank_0_runs_the_infer_command_line(monkeypatch, capsys):
    """``-m infer_parallel_tp.launch ARGS`` on rank 0 is ``infer ARGS``, reached through the console-script entry
    point (the plugin imports no core module but the public ones)."""
    from infer_core import cli

    from infer_parallel_tp import launch

    assert launch.infer_command() is cli.main
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_:
        launch.main(["generate", "--help"])
    assert exit_.value.code == 0 and "usage: infer generate" in capsys.readouterr().out
