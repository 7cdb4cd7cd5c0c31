"""The pluggy manager of one process: the built-ins, then the installed (and allowed) entry points.

``INFER_PLUGINS`` restricts the entry points; it is read before any plugin loads (it decides
which plugins, and so which plugin settings, exist). Nothing heavy is imported here: a plugin's
hook module registers class paths and settings classes only.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import pluggy

from infer_core import hookspecs
from infer_core.errors import PluginError, SettingsError

CORE_DISTRIBUTION = "infer-core"
BUILTIN_PLUGIN = "infer_core.builtin.plugin"

PluginOrigins = dict[str, tuple[str, str]]  # plugin name -> (distribution, version)


def _entry_points(allowed: list[str] | None) -> list[importlib.metadata.EntryPoint]:
    eps = list(importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP))
    if allowed is None:
        return eps
    names = {ep.name for ep in eps}
    missing = [n for n in allowed if n not in names]
    if missing:
        raise SettingsError(
            f"INFER_PLUGINS names {', '.join(missing)}, which is not installed; "
            f"installed plugins: {', '.join(sorted(names)) or 'none'}"
        )
    return [ep for ep in eps if ep.name in allowed]


def create_plugin_manager(allowed: list[str] | None = None) -> tuple[pluggy.PluginManager, PluginOrigins]:
    """A fresh manager with the built-ins and the (allowed) installed plugins registered."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    core_version = core_distribution_version()
    pm.register(importlib.import_module(BUILTIN_PLUGIN), name="builtin")
    plugins = {"builtin": (CORE_DISTRIBUTION, core_version)}
    for ep in _entry_points(allowed):
        if pm.has_plugin(ep.name):
            continue
        try:
            module = ep.load()
        except Exception as e:
            raise PluginError(f"plugin {ep.name!r} ({ep.value}) failed to load: {e}") from e
        if module in pm.get_plugins():
            continue  # two entry points naming one module register it once
        pm.register(module, name=ep.name)
        dist = ep.dist
        plugins[ep.name] = (dist.metadata["Name"], dist.version) if dist else (ep.name, "?")
    pm.check_pending()
    return pm, plugins


def core_distribution_version() -> str:
    try:
        return importlib.metadata.version(CORE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+local"


def call_per_plugin(pm: pluggy.PluginManager, hook: str, make_argument, argument: str = "register") -> None:
    """Call ``hook`` of each registered plugin alone, with ``make_argument(plugin_name)`` as its argument,
    so that what a plugin registers is known to come from it."""
    all_plugins = pm.get_plugins()
    for plugin_name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        others = [p for p in all_plugins if p is not plugin]
        pm.subset_hook_caller(hook, remove_plugins=others)(**{argument: make_argument(plugin_name)})
