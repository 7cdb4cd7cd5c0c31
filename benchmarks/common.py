"""What every benchmark script records next to its figures: device, date, commit, versions, settings.

The record itself is ``infer_core.bench.record``'s (the one ``infer bench`` writes); this module
only adds the default folder, ``benchmarks/results``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infer_core.bench.record import device_name, git_commit, versions, write_results

RESULTS = Path(__file__).parent / "results"

commit = git_commit
__all__ = ["RESULTS", "commit", "device_name", "versions", "write_result"]


def write_result(benchmark: str, settings: dict[str, Any], results: list[dict[str, Any]],
                 out_dir: Path | None = None) -> Path:
    return write_results(benchmark, device_name(), settings, results, out_dir or RESULTS)
