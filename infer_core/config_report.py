"""What ``infer config`` prints: every setting (the core's, then each plugin's), its value and its source.

A setting left unset for a default rule (the model, the implementation of each kind) shows what
the rule picks here, still marked as the rule's choice: the embedded model's name and file, the
attention backend the loaded plugins prefer on this device, and so on.
"""

from __future__ import annotations

from typing import Any

from infer_core.config import KINDS
from infer_core.settings import EngineSettings, describe_sources, load_settings

DEFAULT_RULES = {
    "model": "the embedded default model",
    "attention": "the best backend that can run here",
    "quantization": "the checkpoint's, else none",
    "parallel": "single on one device, else the strategy a plugin offers",
    "max_num_batched_tokens": "the device's: 8192 on a GPU, 2048 on the CPU",
    "async_scheduling": "the device's: on with a GPU, off on the CPU",
}


def resolve_defaults(settings: EngineSettings) -> tuple[dict[str, str], str | None]:
    """What each unset rule-chosen setting resolves to here, and why the rest could not be resolved (or None)."""
    from infer_core.loader import choose_names, load_catalog
    from infer_core.models.gguf_cache import locate_model
    from infer_core.models.source import read_model_config
    from infer_core.platform import DEVICE_DEFAULTS, make_runtime_context

    resolved: dict[str, str] = {}
    try:
        source = locate_model(settings.model, settings.load_format, settings.cache_dir)
        if not settings.model:
            resolved["model"] = f"{source.name} ({source.describe()})"
        ctx = make_runtime_context(settings, read_model_config(source))
        names = choose_names(settings, load_catalog(settings.plugins), ctx)
    except Exception as e:  # show what can be shown; the engine would stop with this error
        return resolved, str(e)
    resolved.update({kind: names[kind] for kind in KINDS if getattr(settings, kind) is None})
    resolved.update({name: str(getattr(ctx.settings, name)) for name in DEVICE_DEFAULTS[ctx.device]
                     if getattr(settings, name) is None})
    return resolved, None


def config_report(explicit: dict[str, Any]) -> str:
    settings = load_settings(**explicit)
    rows = describe_sources(settings, explicit)
    resolved, problem = resolve_defaults(settings)
    width = max(len(name) for name, _, _ in rows)
    lines = []
    for name, value, source in rows:
        if value is None and name in DEFAULT_RULES:
            rule = f"default rule: {DEFAULT_RULES[name]}"
            value, source = (resolved[name], rule) if name in resolved else (value, f"{rule}; not resolved: {problem}")
        lines.append(f"{name:<{width}}  {value!s:<28} ({source})")
    return "\n".join(lines)
