"""The results record (docs/benchmarks.md): ``<benchmark>-<device>-<date>.json`` with device, date, commit,
versions, settings and one row per system measured in the run."""

from __future__ import annotations

import datetime as dt
import json
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def device_name() -> str:
    """The GPU's name, else the CPU model and thread count."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    except OSError:
        pass
    return platform.processor() or "cpu"


def git_commit() -> str:
    """The infer checkout's commit (``-dirty`` with local changes), or "unknown" outside git."""
    source = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if status else "")


def versions(*names: str) -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("infer-core", "torch", "transformers", "triton", "flash-attn", "infer-attention-flash",
                 "infer-attention-triton", *names):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def device_slug(device: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", device.split("(")[0]).strip("-").lower()


def write_results(benchmark: str, device: str, settings: dict[str, Any], rows: list[dict[str, Any]],
                  out_dir: Path, name: str | None = None) -> Path:
    """``<name>-<device>-<date>.json`` under ``out_dir``; ``name`` defaults to the benchmark's."""
    date = dt.date.today().isoformat()
    record = {"benchmark": benchmark, "device": device, "date": date, "commit": git_commit(), "versions": versions(),
              "settings": settings, "results": rows}
    path = Path(out_dir) / f"{name or benchmark}-{device_slug(device)}-{date}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
