"""Servers as users meet them: ``infer serve`` as a real process on 127.0.0.1, the default model."""

from __future__ import annotations

import pytest

from infer_core.testing_server import ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The default model behind ``infer serve`` with default settings, shared by the session."""
    proc = ServerProcess(tmp_path_factory.mktemp("server") / "serve.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def offline_llm():
    """The same model offline, for "the server's text equals LLM's"."""
    from infer_core import LLM

    llm = LLM()
    yield llm
    llm.shutdown()


@pytest.fixture
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c
