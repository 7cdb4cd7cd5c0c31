"""What ``infer plugins`` and ``GET /v1/plugins`` show: every kind, every implementation, can it run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infer_core.config import KINDS
from infer_core.interfaces import RuntimeContext
from infer_core.loader import KIND_INFO, Catalog, choose_names, load_catalog
from infer_core.platform import make_runtime_context
from infer_core.settings import load_settings


@dataclass(frozen=True, slots=True)
class ImplementationStatus:
    kind: str
    name: str
    aliases: tuple[str, ...]
    distribution: str
    version: str
    can_run: bool
    reasons: tuple[str, ...]
    selected: bool


def collect_status(catalog: Catalog, ctx: RuntimeContext | None, selected: dict[str, str]) -> list[ImplementationStatus]:
    rows = []
    for kind in (*KINDS, "model"):
        for impl in catalog.implementations(kind):
            reasons = tuple(impl.reasons(ctx)) if ctx is not None else ()
            rows.append(ImplementationStatus(kind, impl.name, impl.aliases, impl.distribution, impl.version,
                                             not reasons, reasons, selected.get(kind) == impl.name))
    return rows


def runtime_context(settings_kwargs: dict[str, Any]) -> tuple[Any, Catalog, RuntimeContext | None, str | None]:
    """Settings, catalog and the context of the configured model (None with the reason if unreadable)."""
    from infer_core.models.gguf_cache import locate_model
    from infer_core.models.source import read_model_config

    settings = load_settings(**settings_kwargs)
    catalog = load_catalog(settings.plugins)
    try:
        model = read_model_config(locate_model(settings.model, settings.load_format, settings.cache_dir))
    except Exception as e:  # report what can be reported without a model
        return settings, catalog, None, str(e)
    return settings, catalog, make_runtime_context(settings, model), None


def plugins_report(settings_kwargs: dict[str, Any]) -> str:
    settings, catalog, ctx, problem = runtime_context(settings_kwargs)
    selected = choose_names(settings, catalog, ctx) if ctx is not None else {}
    if ctx is not None:
        selected["model"] = ctx.model.architecture
    lines = []
    if ctx is None:
        lines.append(f"(could not read the model, so 'can run' is not checked: {problem})")
    else:
        lines.append(f"checked for {ctx.model.architecture} on {ctx.device} in {ctx.dtype}; * = chosen now")
    plugins = ", ".join(f"{name} ({dist} {version})" for name, (dist, version) in catalog.plugins.items())
    lines.append(f"plugins loaded: {plugins}")
    for kind in (*KINDS, "model"):
        lines.append(f"\n{KIND_INFO[kind].label}:")
        for row in (r for r in collect_status(catalog, ctx, selected) if r.kind == kind):
            mark = "*" if row.selected else " "
            alias = f" (alias {', '.join(row.aliases)})" if row.aliases else ""
            where = f"{row.distribution} {row.version}"
            state = "can run" if row.can_run else "cannot run: " + "; ".join(row.reasons)
            if ctx is None:
                state = "not checked"
            lines.append(f"  {mark} {row.name + alias:<28} {where:<30} {state}")
    return "\n".join(lines)
