"""Test helper: ``infer serve`` as a real child process on 127.0.0.1, as a user runs it.

For the core's server tests and for plugin suites that check the server with their plugin.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

START_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``infer serve`` in a child process; ``health_codes`` records every /health answer while starting."""

    def __init__(self, log_path: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.health_codes: list[int] = []
        full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "infer_core.cli", "serve", "--port", str(self.port), *flags],
            stdout=self._log, stderr=subprocess.STDOUT, env=full_env)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"infer serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                code = httpx.get(f"{self.base_url}/health", timeout=2).status_code
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            self.health_codes.append(code)
            if code == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"infer serve was not healthy within {START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:  # stop() closes it: an assertion after stop() still shows the log
            self._log.flush()
        return self.log_path.read_text()[-4000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {sample name with labels: value}."""
        values = {}
        for line in httpx.get(f"{self.base_url}/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values


