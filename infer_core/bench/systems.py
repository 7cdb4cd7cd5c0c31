"""Runs each system of an ``infer bench`` invocation in its own child process, one after the other.

A child that fails, or outlives its timeout, becomes a row with an ``error``; the others still run.
infer and the HF peers run ``infer_core.bench.child`` under this interpreter; a peer of another project
runs its own script, standalone, under the interpreter its spec names (``python``: a virtual environment
where that project is installed), isolated (``-I``) from this one's paths.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


# peers whose process runs a standalone script of this package (standard library and the peer's own package)
PEER_SCRIPTS = {"vllm": Path(__file__).with_name("vllm_peer.py")}


def child_command(spec: dict[str, Any], spec_path: Path, out_path: Path) -> list[str]:
    """The command line of one system's process."""
    script = PEER_SCRIPTS.get(spec["system"])
    if script is None:
        return [sys.executable, "-m", "infer_core.bench.child", str(spec_path), str(out_path)]
    return [spec.get("python") or sys.executable, "-I", "-u", str(script), str(spec_path), str(out_path)]


def run_system(spec: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], str | None]:
    """The row of one system (or an error row) and the device name the child saw."""
    label = {"system": spec["system"], **({"attention": spec["attention"]} if spec.get("attention") else {})}
    with tempfile.TemporaryDirectory(prefix="infer-bench-") as scratch:
        spec_path, out_path = Path(scratch) / "spec.json", Path(scratch) / "row.json"
        spec_path.write_text(json.dumps(spec))
        command = child_command(spec, spec_path, out_path)
        try:
            child = subprocess.Popen(command, start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        except OSError as e:  # --peer-python names no interpreter
            return {**label, "error": f"cannot start {command[0]}: {e}"}, None
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return {**label, "error": f"cut off after --timeout {timeout_s:.0f} s"}, None
        except BaseException:  # Ctrl-C: take the child (and its workers) down too
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise
        result = json.loads(out_path.read_text()) if out_path.is_file() else {}
        if code != 0 or "row" not in result:
            error = result.get("error") or f"exited with code {code}; its traceback is in the log above"
            return {**label, "error": error}, None
        return result["row"], result["device"]


def run_systems(specs: list[dict[str, Any]], timeout_s: float) -> tuple[list[dict[str, Any]], str]:
    rows, device = [], None
    for spec in specs:
        name = spec["system"] + (f" attention={spec['attention']}" if spec.get("attention") else "")
        print(f"--- {name} ---", flush=True)
        row, seen = run_system(spec, timeout_s)
        device = device or seen
        rows.append(row)
        print(f"--- {name}: {_summary(row)} ---", flush=True)
    return rows, device or "unknown"


def _summary(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"error: {row['error']}"
    return ", ".join(f"{key} {row[key]}" for key in ("output_tok_s", "ms_per_token") if key in row)


def add_floor_fractions(rows: list[dict[str, Any]], figure: str, higher_is_better: bool) -> None:
    """``fraction_of_floor`` on every measured row comparable with the floor row (same ``num_prompts``)."""
    floor = next((r for r in rows if r.get("system") == "floor" and figure in r), None)
    if floor is None:
        return
    for row in rows:
        if row is floor or figure not in row or row.get("num_prompts") != floor.get("num_prompts"):
            continue
        ratio = row[figure] / floor[figure] if higher_is_better else floor[figure] / row[figure]
        row["fraction_of_floor"] = float(f"{ratio:.4g}")


def format_rows(rows: list[dict[str, Any]], figures: tuple[str, ...]) -> str:
    """An aligned table: system, attention, then ``figures`` and fraction_of_floor; errors at the end."""
    columns = ("system", "attention", *figures, "fraction_of_floor")
    cells = [[str(row.get(c, "-")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    for row, line in zip(rows, cells):
        text = "  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip()
        lines.append(text + (f"  error: {row['error']}" if "error" in row else ""))
    return "\n".join(lines)
