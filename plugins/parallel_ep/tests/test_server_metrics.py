"""/metrics of a server whose experts are sharded: the load counters live in the engine-core process (rank 0's
communicator) and reach the server's /metrics across the core's pipe."""

from __future__ import annotations

import time

import httpx
from infer_core.testing_server import ServerProcess

NUM_PROMPT_TOKENS = 6
NUM_NEW_TOKENS = 4
COPY_WITHIN_S = 5.0  # the core sends a changed copy at most once a second; the rest is a loaded machine's slack


def test_the_expert_load_reaches_metrics_from_the_core(tiny_checkpoint, tmp_path):
    proc = ServerProcess(tmp_path / "serve.log", "--model", str(tiny_checkpoint("qwen3_moe")), "--served-model-name",
                         "moe", "--device", "cpu", "--dtype", "float32", "--expert-parallel-size", "2",
                         "--num-kv-blocks", "16", "--block-size", "16")
    try:
        proc.wait_ready()
        assert not [name for name in proc.metrics() if name.startswith("infer:moe_")]  # nothing dispatched yet
        r = httpx.post(f"{proc.base_url}/v1/completions", timeout=120, json={
            "model": "moe", "prompt": list(range(3, 3 + NUM_PROMPT_TOKENS)), "max_tokens": NUM_NEW_TOKENS,
            "ignore_eos": True})
        assert r.status_code == 200, r.text
        # qwen3_moe's tiny model: every layer sparse, each token to 4 of 16 experts; the prompt's tokens once,
        # each new token but the last fed back once
        expected = 4 * (NUM_PROMPT_TOKENS + NUM_NEW_TOKENS - 1) * 2
        deadline = time.monotonic() + COPY_WITHIN_S
        while True:
            metrics = proc.metrics()
            entries = sum(v for name, v in metrics.items() if name.startswith("infer:moe_expert_entries_total{"))
            if entries == expected or time.monotonic() > deadline:  # a copy sent mid-request is followed by the last
                break
            time.sleep(0.2)
        assert entries == expected, (entries, {k: v for k, v in metrics.items() if "moe" in k}, proc.log())
        assert sum(v for name, v in metrics.items() if name.startswith("infer:moe_rank_entries_total{")) == expected
    finally:
        proc.stop()
