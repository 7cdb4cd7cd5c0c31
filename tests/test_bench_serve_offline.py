"""``infer bench serve --start-server FLAGS --offline-row``: the server's rows and the offline engine's, in one command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from infer_core.testing import make_tiny_checkpoint, write_word_tokenizer

pytestmark = pytest.mark.slow


def _bench(*flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infer_core.cli", "bench", "serve", *flags], check=False,
                          capture_output=True,
                          text=True, timeout=timeout)


def test_one_command_gives_the_server_rows_and_the_offline_row(tmp_path):
    model = write_word_tokenizer(make_tiny_checkpoint("llama", tmp_path / "model"))  # streams carry text
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": [3 + i, 40 + i, 7, 9, 11]}) + "\n" for i in range(6)))
    record_path = tmp_path / "serving.json"
    done = _bench("--start-server", f"--model {model} --served-model-name tiny --device cpu",
                  "--prompts-file", str(prompts), "--num-prompts", "6", "--output-len", "8", "--concurrency", "1", "3",
                  "--offline-row", "--json", str(record_path), "--no-progress")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "of offline" in done.stdout and "== offline engine (LLM.generate" in done.stdout, done.stdout
    rows = json.loads(record_path.read_text())["results"]
    server_rows, offline = rows[:-1], rows[-1]
    assert [r["concurrency"] for r in server_rows] == [1, 3]
    assert all(r["completed"] == 6 and r["total_output_tokens"] == 48 for r in server_rows), server_rows
    assert offline["system"] == "offline" and offline["prompts_of"] == "concurrency 3", offline
    assert offline["completed"] == 6 and offline["total_output_tokens"] == 48
    assert offline["total_input_tokens"] == 30 and offline["output_tok_s"] > 0
    for row in server_rows:
        assert row["fraction_of_offline"] == pytest.approx(row["output_tok_s"] / offline["output_tok_s"], rel=1e-3)
    # the engine core's step timeline beside the offline engine's: both ran every prompt token and 7 decodes each
    assert done.stdout.count("core steps") == 3 and "sending outputs" in done.stdout, done.stdout
    for row in [*server_rows, offline]:
        timeline = row["core_timeline"]
        assert timeline["prefill"]["steps"] >= 1 and timeline["decode"]["steps"] >= 7, row
        assert timeline["prefill"]["tokens"] + timeline["decode"]["tokens"] >= 30 + 6 * 7, row
        assert 0 < timeline["busy_s"] <= timeline["window_s"] + 1e-3, row
    assert server_rows[0]["core_timeline"]["decode"]["tokens_per_step"] == 1.0  # one request at a time


def test_the_offline_row_needs_a_server_this_command_starts():
    done = _bench("--base-url", "http://127.0.0.1:9", "--offline-row", timeout=60)
    assert done.returncode == 2 and "--start-server" in done.stderr, done.stderr
    done = _bench("--start-server", "--port 8000", timeout=60)
    assert done.returncode == 2 and "leave --port out" in done.stderr, done.stderr
    done = _bench("--base-url", "http://127.0.0.1:9", "--offline-rows", timeout=60)
    assert done.returncode == 2 and "did you mean --offline-row?" in done.stderr, done.stderr
