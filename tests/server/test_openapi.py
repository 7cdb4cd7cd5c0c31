"""/openapi.json tells the truth: every route's bodies typed, and a schemathesis run against it finds nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
POSTS = ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize")
GETS = ("/v1/models", "/v1/plugins", "/health")
# The budget of the run, fixed and deterministic: the examples phase (the schema's own examples) and
# MAX_EXAMPLES generated cases per operation in the fuzzing phase, derandomized. The coverage phase is
# left out: it enumerates every boundary of every field, so its size grows with the request schema
# (tools, response formats, grammars) without bound.
PHASES = "examples,fuzzing"
MAX_EXAMPLES = 6
MAX_RESPONSE_S = 60  # the response-time check's limit: generous, a loaded 2-core machine runs the suite
RUN_TIMEOUT_S = 300  # a guard against a hang, not the budget: that is PHASES and MAX_EXAMPLES


@pytest.fixture(scope="module")
def document(server) -> dict:
    r = httpx.get(f"{server.base_url}/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def _schema(document: dict, ref_holder: dict) -> dict:
    ref = ref_holder["schema"]["$ref"]
    return document["components"]["schemas"][ref.rsplit("/", 1)[-1]]


def test_every_route_has_typed_bodies(document):
    assert document["openapi"].startswith("3.1")
    for path in POSTS:
        operation = document["paths"][path]["post"]
        request = _schema(document, operation["requestBody"]["content"]["application/json"])
        assert request["type"] == "object" and request["properties"], path
        ok = _schema(document, operation["responses"]["200"]["content"]["application/json"])
        assert ok["properties"], path
        error = _schema(document, operation["responses"]["400"]["content"]["application/json"])
        assert error["required"] == ["error"], path
    for path in GETS:
        ok = _schema(document, document["paths"][path]["get"]["responses"]["200"]["content"]["application/json"])
        assert ok["properties"], path
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert "text/event-stream" in document["paths"][path]["post"]["responses"]["200"]["content"]


def test_the_document_states_the_servers_own_limits(server, document):
    schemas = document["components"]["schemas"]
    detokenize = schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]
    assert detokenize["minimum"] == 0 and detokenize["maximum"] > 0, detokenize
    vocab = detokenize["maximum"] + 1
    r = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [vocab - 1]})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [vocab]})
    assert r.status_code == 400, r.text
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["top_logprobs"]["anyOf"][0]["maximum"] == 20
    assert "SmolLM2-135M-Instruct" in chat["model"]["examples"]


def test_swagger_reads_the_same_document(server, document):
    assert httpx.get(f"{server.base_url}/docs/openapi.json").json() == document
    assert httpx.get(f"{server.base_url}/docs").status_code == 200


def test_the_readme_links_the_document():
    assert "/openapi.json" in (ROOT / "README.md").read_text()
    assert "/openapi.json" in (ROOT / "docs" / "serving.md").read_text()


def test_schemathesis_finds_no_failure_and_no_5xx(server, tmp_path):
    """``schemathesis run`` with every check, a bounded budget, deterministic data; generations kept short by hooks."""
    report = tmp_path / "report.ndjson"
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{server.base_url}/openapi.json",
               "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--workers", "1",
               "--phases", PHASES, "--generation-deterministic", "--no-color",
               "--request-timeout", "90",
               "--max-response-time", str(MAX_RESPONSE_S), "--report", "ndjson", "--report-ndjson-path", str(report)]
    run = subprocess.run(command, check=False, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env,
                         cwd=tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    statuses = _response_statuses(report)
    assert statuses, output[-3000:]
    assert not [s for s in statuses if s >= 500], output[-6000:]
    assert any(200 <= s < 300 for s in statuses) and any(400 <= s < 500 for s in statuses), sorted(set(statuses))
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def _response_statuses(report: Path) -> list[int]:
    """The status of every response the run received, from its NDJSON event log."""
    statuses: list[int] = []
    for line in report.read_text().splitlines():
        _collect_statuses(json.loads(line), statuses)
    return statuses


def _collect_statuses(node, statuses: list[int]) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("status_code"), int) and "elapsed" in node:  # a recorded response
            statuses.append(node["status_code"])
        for value in node.values():
            _collect_statuses(value, statuses)
    elif isinstance(node, list):
        for value in node:
            _collect_statuses(value, statuses)
