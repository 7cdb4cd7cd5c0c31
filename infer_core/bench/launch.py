"""``infer bench serve --start-server FLAGS``: ``infer serve FLAGS`` started for the run, and stopped after it.

The server runs as a child process on a free port of 127.0.0.1, its log in a file whose path is
printed (its last lines come with any failure). Started this way, the command knows the engine
settings the server runs with, which the offline row (``--offline-row``) needs, and the device is
free again for the offline engine once the server has stopped.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infer_core.bench.config import BenchmarkError

STOP_TIMEOUT_S = 120.0
_LOG_TAIL_CHARS = 3000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchedServer:
    """``infer serve`` with ``flags`` (its own ``--host``/``--port`` are chosen here) until ``stop``."""

    def __init__(self, flags: list[str]) -> None:
        for taken in ("--host", "--port"):
            if any(f == taken or f.startswith(taken + "=") for f in flags):
                raise BenchmarkError(f"--start-server chooses {taken} itself (127.0.0.1 and a free port); "
                                     f"leave {taken} out of {shlex.join(flags)!r}")
        self.flags = flags
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkdtemp(prefix="infer-bench-serve-")) / "serve.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "infer_core.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                   *self.flags]
        print(f"starting: infer serve {shlex.join(self.flags)} at {self.base_url} (log: {self.log_path})",
              flush=True)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def check_running(self) -> None:
        """BenchmarkError with the log's tail if the server has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise BenchmarkError(f"infer serve {shlex.join(self.flags)} exited with code {self.process.returncode}"
                                 f"; the end of its log ({self.log_path}):\n{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"

    def stop(self) -> int | None:
        """SIGTERM (the server drains, then exits), then SIGKILL to its group after ``STOP_TIMEOUT_S``."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return process.returncode

    def wait_gone(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Wait until no process of the server's group is left (its engine core gives the device back)."""
        if self.process is None:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.killpg(self.process.pid, signal.SIGKILL)
