"""The settings the loaded plugins declare (the ``register_settings`` hook), and which plugin declared each.

Read before the engine's settings are validated, for the plugins ``INFER_PLUGINS`` allows: a
plugin that is not loaded declares nothing, so its variables are unknown names like any other.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass

from infer_core.errors import PluginError
from infer_core.interfaces.settings import PluginSettings
from infer_core.plugin_manager import call_per_plugin, create_plugin_manager

CORE_OWNER = "infer-core (the engine's own settings)"


@dataclass(frozen=True, slots=True)
class SettingsSection:
    """One declared ``PluginSettings`` class and the plugin (entry point, distribution) that declared it."""

    settings_class: type[PluginSettings]
    plugin: str
    distribution: str
    version: str

    @property
    def names(self) -> list[str]:
        return list(self.settings_class.model_fields)

    @property
    def title(self) -> str:
        return self.settings_class.section or self.plugin

    def describe(self) -> str:
        return f"plugin {self.plugin} of {self.distribution} {self.version}"


@dataclass(frozen=True, slots=True)
class _SettingsRegistrar:
    """The ``register`` callable one plugin's ``register_settings`` receives."""

    sections: list[SettingsSection]
    plugin: str
    distribution: str
    version: str

    def __call__(self, settings_class: type[PluginSettings]) -> None:
        where = f"plugin {self.plugin} ({self.distribution})"
        if not (isinstance(settings_class, type) and issubclass(settings_class, PluginSettings)):
            raise PluginError(f"{where} registered {settings_class!r} as settings; register a subclass of "
                              f"infer_core.interfaces.PluginSettings")
        path = f"{settings_class.__module__}.{settings_class.__qualname__}"
        module = sys.modules.get(settings_class.__module__)
        if getattr(module, settings_class.__qualname__, None) is not settings_class:
            raise PluginError(f"{where} registered settings class {path}, which cannot be imported by that name; "
                              f"define it at the top level of a module (the engine's settings reach worker "
                              f"processes pickled, each class by reference), not in a function or by create_model")
        if any(s.settings_class is settings_class for s in self.sections):
            return  # one class declared twice by one plugin is one declaration
        self.sections.append(SettingsSection(settings_class, self.plugin, self.distribution, self.version))


def check_unique(core_names: Iterable[str], sections: Iterable[SettingsSection]) -> None:
    """Every setting name is declared once, by the core or by one plugin; PluginError naming both otherwise."""
    owners = dict.fromkeys(core_names, CORE_OWNER)
    for section in sections:
        for name in section.names:
            owner = owners.get(name)
            if owner is not None:
                fix = "uninstall that plugin or leave it out of INFER_PLUGINS" if owner == CORE_OWNER else \
                    "uninstall one or restrict INFER_PLUGINS"
                raise PluginError(f"setting {name!r} is declared twice: by {owner} and by {section.describe()}; {fix}")
            owners[name] = section.describe()


def declare_settings(allowed: list[str] | None, core_names: Iterable[str]) -> tuple[SettingsSection, ...]:
    """The settings classes of the allowed plugins, each name checked against the core's and the others'."""
    pm, plugins = create_plugin_manager(allowed)
    sections: list[SettingsSection] = []
    call_per_plugin(pm, "register_settings", lambda name: _SettingsRegistrar(sections, name, *plugins[name]))
    check_unique(core_names, sections)
    return tuple(sections)
