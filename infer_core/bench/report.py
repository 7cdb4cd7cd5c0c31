"""How a serving benchmark is shown: an aligned table per load point, and the JSON record.

The record has the keys of every benchmark in ``benchmarks/results/``: ``benchmark``, ``device``,
``date``, ``commit``, ``versions``, ``settings``, ``results`` (one flat row per system and load).
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from infer_core.bench.core_timeline import format_core_timeline
from infer_core.bench.offline_row import fraction_of, format_offline
from infer_core.bench.results import LoadPointResult

if TYPE_CHECKING:
    from infer_core.bench.serve import ServeBenchResult

BENCHMARK = "serving"
# Settings that must agree for rows of two runs to share one record; the load (and so how
# many requests it takes to measure it) may differ, and every row names its own.
_LOAD_KEYS = ("concurrency", "request_rate", "num_prompts", "warmup")
_COLUMN = 10


class RecordFileError(ValueError):
    """The --json file cannot take this run's rows."""


def format_table(result: ServeBenchResult) -> str:
    header = f"{result.label or result.model} at {result.base_url} ({result.endpoint})"
    offline = [format_offline(result.offline, result.runs)] if result.offline is not None else []
    return "\n\n".join([header, *(_format_run(run) for run in result.runs), *offline])


def _format_run(run: LoadPointResult) -> str:
    width = 20
    lines = [
        f"== {run.load.name} ==",
        f"{'requests':<{width}}{run.num_completed} completed, {run.num_failed} failed",
        f"{'max in flight':<{width}}{run.max_in_flight}",
    ]
    if run.first_error:
        lines.append(f"{'first error':<{width}}{run.first_error}")
    lines += [
        f"{'duration':<{width}}{run.duration_s:.3f} s",
        f"{'request throughput':<{width}}{run.request_throughput:.3f} req/s",
        f"{'output throughput':<{width}}{run.output_tok_s:.1f} tok/s",
        f"{'input throughput':<{width}}{run.input_tok_s:.1f} tok/s",
        f"{'tokens out / in':<{width}}{run.total_output_tokens} / {run.total_input_tokens}",
        f"{'':<{width}}"
        + "".join(f"{s:>{_COLUMN}}" for s in ("mean", "p50", "p90", "p99")),
    ]
    for metric in ("ttft", "tpot", "itl", "e2e"):
        summary = getattr(run, f"{metric}_ms")
        figures = (summary.mean, summary.p50, summary.p90, summary.p99)
        cells = "".join(f"{_cell(v):>{_COLUMN}}" for v in figures)
        lines.append(f"{metric.upper() + ' (ms)':<{width}}{cells}")
    if run.core_timeline is not None:
        lines += format_core_timeline(run.core_timeline, width)
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def build_record(result: ServeBenchResult) -> dict[str, Any]:
    system = result.label or result.model
    device = result.label or f"{result.model} @ {urlsplit(result.base_url).netloc}"
    rows = []
    for run in result.runs:
        row = run.as_row(system)
        row["model"] = result.model
        row["url"] = result.base_url
        if result.offline is not None and "error" not in result.offline:
            row["fraction_of_offline"] = float(f"{fraction_of(run.output_tok_s, result.offline):.4g}")
        rows.append(row)
    if result.offline is not None:
        rows.append(dict(result.offline))
    return {
        "benchmark": BENCHMARK,
        "device": device,
        "date": dt.date.today().isoformat(),
        "commit": _commit(),
        "versions": _versions(),
        "settings": result.settings,
        "results": rows,
    }


def check_appendable(path: Path, settings: dict[str, Any]) -> None:
    """Refuse to mix rows of a different workload into an existing record."""
    if not path.exists():
        return
    existing = _read_record(path)
    differing = sorted(
        key
        for key in set(existing.get("settings", {})) | set(settings)
        if key not in _LOAD_KEYS
        and existing.get("settings", {}).get(key) != settings.get(key)
    )
    if differing:
        raise RecordFileError(
            f"{path} holds a run with other settings ({', '.join(differing)}); its rows would not"
            " be comparable: write to another --json file or drop --append"
        )


def write_record(result: ServeBenchResult, path: Path, append: bool = False) -> Path:
    """Write the record to ``path``; with ``append``, add the rows to the record already there."""
    record = build_record(result)
    if append and path.exists():
        check_appendable(path, result.settings)
        existing = _read_record(path)
        existing["results"] = [*existing.get("results", []), *record["results"]]
        record = existing
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RecordFileError(f"cannot read {path} as a results record: {e}") from e
    if not isinstance(record, dict) or record.get("benchmark") != BENCHMARK:
        raise RecordFileError(
            f"{path} is not a {BENCHMARK!r} results record; cannot append"
        )
    return record


def _commit() -> str:
    """The infer checkout's commit (``-dirty`` with local changes), or "unknown" outside git."""
    source = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if status else "")


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("infer-core", "httpx"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found
