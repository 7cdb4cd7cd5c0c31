"""What every benchmark records next to its figures: device, date, commit, versions, settings."""

from __future__ import annotations

import datetime as dt
import json
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def device_name() -> str:
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


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions(*names: str) -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("infer-core", "torch", "transformers", *names):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def write_result(benchmark: str, settings: dict[str, Any], results: list[dict[str, Any]],
                 out_dir: Path | None = None) -> Path:
    device = device_name()
    date = dt.date.today().isoformat()
    record = {"benchmark": benchmark, "device": device, "date": date, "commit": commit(), "versions": versions(),
              "settings": settings, "results": results}
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device.split("(")[0]).strip("-").lower()
    path = (out_dir or RESULTS) / f"{benchmark}-{slug}-{date}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
