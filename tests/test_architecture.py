"""The architecture, machine-checked: import layering (``.importlinter``), no import cycles, small modules.

The layering: server/cli -> engine -> runner -> models -> layers -> interfaces; builtin implementations use
only what a plugin may; plugins use only the public modules (hookspecs, interfaces, layers, distributed, testing) and never
each other. docs/architecture.md explains each rule.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "infer_core"
MAX_MODULE_LINES = 300


def test_the_import_contracts_hold():
    """Every contract of ``.importlinter`` is kept (its report names the offending import when one is not).

    In a process of its own: import-linter configures logging with ``dictConfig``, which would disable
    the loggers of every module imported before it for the rest of this test process.
    """
    pytest.importorskip("importlinter.cli")
    lint = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(ROOT / '.importlinter')!r}, no_cache=True, no_logo=True))")
    result = subprocess.run([sys.executable, "-c", lint], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (each is an import cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges)))
    try:
        for module in sorted(edges):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return cycles


def test_no_module_of_the_core_is_in_an_import_cycle():
    """Counting every import a module makes (function-level ones too; ``TYPE_CHECKING`` ones aside)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("infer_core", exclude_type_checking_imports=True, cache_dir=None)
    modules = set(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    assert _strongly_connected(edges) == []


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a cycle of three modules and a self-contained one are told apart."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _strongly_connected(edges) == [["a", "b", "c"]]


def test_every_core_module_is_at_most_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in CORE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these by job (at most {MAX_MODULE_LINES} lines each): {long}"


def test_the_core_knows_nothing_of_pushed_partial_sums():
    """The tensor-parallel fast path lives in its plugin: no core module imports anything named push or
    symm_mem, and the model has no parallel mechanics."""
    imports = re.compile(r"^\s*(from|import)\s+\S*(push|symm_mem)", re.M)
    offenders = [str(p.relative_to(ROOT)) for p in CORE.rglob("*.py") if imports.search(p.read_text())]
    assert offenders == []
    mechanics = re.compile(r"defer_reduce|reduced\(|push")
    offenders = [str(p.relative_to(ROOT)) for p in (CORE / "models").rglob("*.py") if mechanics.search(p.read_text())]
    assert offenders == []
